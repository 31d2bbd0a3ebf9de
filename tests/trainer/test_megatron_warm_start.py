"""The warm-start stage on the megatron backend, stepped on the CPU: megatron-core's own
``DistributedDataParallel``, distributed optimizer and forward-backward schedule, on a gloo world of
one rank.

megatron-core 0.16's optimizer makes a few buffers on the device named ``"cuda"`` and accepts
parameters by their CUDA type names (``torch.cuda.FloatTensor``); its rotary embedding asks CUDA
for the current device. :class:`CudaIsCpu` answers all three with the CPU (a torch function mode:
``device="cuda"`` becomes the CPU, ``.cuda()`` a no-op, ``Tensor.type()`` the CUDA name); nothing
else changes, so what runs is the backend's ``sft_step``, checkpoints and ``finish_warm_start``
as on a GPU, in fp32. ``bench/device/megatron_one_step.py`` runs the same on a GPU.

Independent checks: the update's loss against transformers scoring each conversation alone with
the same weights; the warm start's and RL's learning rates read off the first update after a
reset (a fresh Adam moves every weight by ``lr`` times the sign of its gradient, weight decay
off and epsilon negligible); a checkpoint from the middle of the stage resumed in a new backend,
and the whole :class:`~agentrl.trainer.warm_start.WarmStart` stage stopped and resumed, against
an uninterrupted run, update by update.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

pytest.importorskip("megatron.core", reason="the megatron extra (pip install 'agentrl[megatron]')")
pytest.importorskip("transformers")

import transformers

from agentrl.api.rollout import ClassAction, TerminalClass
from agentrl.api.trainer import TrainerSpec, WarmStartSpec
from agentrl.rollout.conversations import RenderedConversation, WarmStartReport
from agentrl.rollout.trajectory import Trajectory
from agentrl.trainer.assembly import restore_state
from agentrl.trainer.batching import TrainSample
from agentrl.trainer.checkpoint import CheckpointStore, DriverState
from agentrl.trainer.hf_config import read_hf_config
from agentrl.trainer.megatron_backend import REFERENCE_FLAG, MegatronBackend
from agentrl.trainer.megatron_sft import learning_rates
from agentrl.trainer.sft_batches import SFTBatch
from agentrl.trainer.warm_start import WARM_START_LOG, WarmStart
from tests.trainer.megatron_ranks import close_world, open_world

pytestmark = [
    pytest.mark.slow,  # megatron-core takes seconds to import
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

CPU = torch.device("cpu")
VOCAB = 96
SHAPE = {
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": VOCAB,
    "max_position_embeddings": 512,
    "rope_theta": 1e6,
}
RL_LR = 1e-3
WARM_LR = 1e-2
#: The rollout temperature: logprobs of RL are at it, the warm start's at 1.
TEMPERATURE = 0.7


def _spec(**algorithm: Any) -> TrainerSpec:
    return TrainerSpec.model_validate(
        {
            "backend": "megatron",
            "gpusPerNode": 1,
            # weight decay off: a fresh Adam's first update is then ±lr on every weight
            "optimizer": {"lr": RL_LR, "weightDecay": 0.0},
            "algorithm": {"miniBatches": 1, "epochs": 1, **algorithm},
            "checkpoint": {"intervalSteps": 2},
        }
    )


def _cpu(device: Any) -> Any:
    if isinstance(device, str) and device.startswith("cuda"):
        return "cpu"
    if isinstance(device, torch.device) and device.type == "cuda":
        return CPU
    return "cpu" if isinstance(device, int) and not isinstance(device, bool) else device


class CudaIsCpu(TorchFunctionMode):
    """Tensors asked for on CUDA are made on the CPU, and CPU tensors name their type as CUDA's
    (see the module docstring)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if "device" in kwargs:
            kwargs["device"] = _cpu(kwargs["device"])
        name = getattr(func, "__name__", "")
        if name == "cuda":
            return args[0]
        if name == "type" and len(args) == 1 and not kwargs:
            out = str(func(*args))
            return out if out.startswith("torch.cuda.") else out.replace("torch.", "torch.cuda.", 1)
        if name == "to":
            args = tuple(_cpu(a) if isinstance(a, str | torch.device) else a for a in args)
        return func(*args, **kwargs)


@pytest.fixture(scope="module")
def world() -> Iterator[None]:
    open_world()
    yield
    close_world()


@pytest.fixture
def steps_on_cpu(world: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    with CudaIsCpu():
        yield


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen3 model made by transformers with random weights."""
    directory = tmp_path_factory.mktemp("qwen3")
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**SHAPE)).save_pretrained(directory)
    return directory


def _backend(model_dir: Path, spec: TrainerSpec) -> MegatronBackend:
    """The backend a trainer rank builds on a GPU, built here on the CPU."""
    backend = MegatronBackend(
        read_hf_config(model_dir),
        spec,
        temperature=TEMPERATURE,
        model_dir=model_dir,
        params_dtype=torch.float32,
    )
    backend.device = CPU
    backend._setup_training()
    return backend


def _batch(seed: int = 5) -> SFTBatch:
    """Two conversations packed (11 and 8 tokens), trained on the assistant tokens; a third, a
    prompt alone, trains nothing."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (22,), generator=g).tolist()
    mask = [*[0, 0, 0, 0, 1, 1, 1, 0, 0, 1, 1], *[0, 0, 1, 1, 1, 1, 0, 1], *[0, 0, 0]]
    return SFTBatch(token_ids=ids, loss_mask=mask, cu_seqlens=[0, 11, 19, 22], lines=[1, 2, 3])


def _params(backend: MegatronBackend) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in backend.model.named_parameters()}


def _moved(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> torch.Tensor:
    """How far each weight moved, of those that moved."""
    delta = torch.cat([(after[n] - before[n]).flatten().abs() for n in before])
    return delta[delta > 0]


def test_an_update_is_the_mean_nll_transformers_gives_each_conversation_alone(
    steps_on_cpu: None, model_dir: Path
) -> None:
    reference = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    batch = _batch()
    expected = torch.zeros((), dtype=torch.float64)
    for a, b in zip(batch.cu_seqlens, batch.cu_seqlens[1:], strict=False):
        ids = torch.tensor([batch.token_ids[a:b]])
        with torch.no_grad():
            logp = torch.log_softmax(reference(ids).logits[0].double(), dim=-1)  # temperature 1
        for j in range(1, b - a):
            if batch.loss_mask[a + j]:
                expected -= logp[j - 1, batch.token_ids[a + j]]
    expected /= 10  # 5 + 5 trained tokens, counted by hand

    backend = _backend(model_dir, _spec())
    first = backend.sft_step(batch, lr=WARM_LR)
    assert first.tokens == 10
    assert first.loss == pytest.approx(float(expected), abs=2e-5)
    assert first.grad_norm > 0

    losses = [backend.sft_step(batch, lr=WARM_LR).loss for _ in range(5)]
    assert losses[-1] < 0.7 * first.loss and losses == sorted(losses, reverse=True)
    assert backend.iteration == 0  # warm-start updates are not RL steps


def _samples() -> list[TrainSample]:
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(2):
        ids = torch.randint(0, VOCAB, (12,), generator=g).tolist()
        trajectory = Trajectory(
            episode_id=f"e{i}",
            task_id="t",
            group_id="t#0",
            policy_version=0,
            terminal_class=TerminalClass.COMPLETED,
            reward=float(i),
            training_action=ClassAction.TRAIN,
            token_ids=ids,
            logprobs=[0.0] * 6 + [-4.5] * 6,
            loss_mask=[0] * 6 + [1] * 6,
        )
        out.append(TrainSample(trajectory=trajectory, advantage=1.0 - 2 * i, carries_loss=True))
    return out


def _by_the_rate(moved: torch.Tensor, lr: float) -> bool:
    return moved.numel() > 1000 and torch.allclose(moved, torch.full_like(moved, lr), rtol=1e-4)


def test_the_warm_start_trains_at_its_rate_and_rl_starts_at_optimizer_lr_with_fresh_moments(
    steps_on_cpu: None, model_dir: Path
) -> None:
    backend = _backend(model_dir, _spec())
    # Adam's epsilon negligible: a fresh Adam's first update moves every weight that has a
    # gradient by exactly the rate (m / sqrt(v) = g / |g| after the bias correction)
    for group in backend.optimizer.param_groups:
        group["eps"] = 1e-30
    batch = _batch()
    before = _params(backend)
    backend.sft_step(batch, lr=WARM_LR)
    assert _by_the_rate(_moved(before, _params(backend)), WARM_LR)
    assert set(learning_rates(backend.optimizer)) == {WARM_LR}
    for _ in range(3):
        backend.sft_step(batch, lr=WARM_LR)

    backend.finish_warm_start()
    assert set(learning_rates(backend.optimizer)) == {RL_LR}
    before = _params(backend)
    stats = backend.train_step(_samples())
    assert stats.loss == stats.loss  # not NaN
    # RL's first update is again a fresh Adam's (±lr everywhere), at optimizer.lr; with the
    # warm start's moments kept it would not be
    assert _by_the_rate(_moved(before, _params(backend)), RL_LR)
    assert backend.iteration == 1


def test_a_stage_stopped_in_the_middle_resumes_in_a_new_backend_identically(
    steps_on_cpu: None, model_dir: Path, tmp_path: Path
) -> None:
    batches = [_batch(seed) for seed in (5, 6, 7, 8)]
    whole = _backend(model_dir, _spec())
    whole_losses = [whole.sft_step(b, lr=WARM_LR).loss for b in batches]

    cut = _backend(model_dir, _spec())
    cut_losses = [cut.sft_step(b, lr=WARM_LR).loss for b in batches[:2]]
    cut.save_state(tmp_path)
    del cut
    # a new process: the start weights from the model directory, the rest from the checkpoint
    resumed = _backend(model_dir, _spec())
    resumed.load_state(tmp_path)
    cut_losses += [resumed.sft_step(b, lr=WARM_LR).loss for b in batches[2:]]

    assert cut_losses == whole_losses
    after, want = _params(resumed), _params(whole)
    assert all(torch.equal(after[n], want[n]) for n in want)


def test_finishing_makes_the_weights_the_kl_reference_and_checkpoints_carry_it(
    steps_on_cpu: None, model_dir: Path, tmp_path: Path
) -> None:
    backend = _backend(model_dir, _spec(klCoef=0.1))
    start = {n: p.detach().clone() for n, p in backend.reference.named_parameters()}
    for seed in (5, 6):
        backend.sft_step(_batch(seed), lr=WARM_LR)
    backend.save_state(tmp_path / "middle")
    backend.finish_warm_start()
    trained = _params(backend)
    reference = dict(backend.reference.named_parameters())
    assert all(torch.equal(reference[n], trained[n]) for n in trained)
    assert not all(torch.equal(start[n], trained[n]) for n in trained)
    backend.save_state(tmp_path / "done")

    def restarted(directory: Path) -> dict[str, torch.Tensor]:
        fresh = _backend(model_dir, _spec(klCoef=0.1))
        fresh.load_state(directory)
        return {n: p.detach().clone() for n, p in fresh.reference.named_parameters()}

    # a checkpoint from the middle of the stage has none: the reference is the model as given
    meta = json.loads((tmp_path / "middle" / "model" / "metadata.json").read_text())
    assert REFERENCE_FLAG not in json.dumps(meta)
    middle = restarted(tmp_path / "middle")
    assert all(torch.equal(middle[n], start[n]) for n in start)
    # one from after it has the warm-started weights
    done = restarted(tmp_path / "done")
    assert all(torch.equal(done[n], trained[n]) for n in trained)


def _report() -> WarmStartReport:
    """Six conversations of 150 to 300 tokens (a prompt, then an answer trained on): two or three
    to a 512-token batch."""
    g = torch.Generator().manual_seed(9)
    conversations = []
    for line, n in enumerate((300, 150, 220, 180, 260, 200), start=1):
        prompt = n // 3
        conversations.append(
            RenderedConversation(
                token_ids=torch.randint(0, VOCAB, (n,), generator=g).tolist(),
                loss_mask=[0] * prompt + [1] * (n - prompt),
                line=line,
            )
        )
    return WarmStartReport(conversations=conversations, errors=[])


def _stage(backend: MegatronBackend, root: Path, state: DriverState) -> WarmStart:
    spec = WarmStartSpec(dataset="warm.jsonl", epochs=2, lr=WARM_LR, tokens_per_batch=512)
    return WarmStart(
        spec,
        backend.spec,
        _report(),
        backend=backend,
        checkpoints=CheckpointStore(root / "checkpoints"),
        state=state,
        log_path=root / WARM_START_LOG,
    )


def _losses(log: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in log.read_text().splitlines()]


def test_the_stage_on_megatron_stopped_and_resumed_ends_as_an_uninterrupted_one(
    steps_on_cpu: None, model_dir: Path, tmp_path: Path
) -> None:
    spec = _spec(klCoef=0.1)
    whole = _backend(model_dir, spec)
    done = _stage(whole, tmp_path / "whole", DriverState()).run()
    assert done.done and done.updates == done.total_updates >= 4
    losses = _losses(tmp_path / "whole" / WARM_START_LOG)
    assert losses[-1] < losses[0]

    # stopped after 3 updates (the interval checkpoint was at 2; the stop checkpoints at 3)
    first = _backend(model_dir, spec)
    cut = _stage(first, tmp_path / "cut", DriverState())
    cut.run(should_stop=lambda: cut.progress.updates == 3)
    assert not cut.progress.done
    del first
    resumed = _backend(model_dir, spec)
    state = restore_state(CheckpointStore(tmp_path / "cut" / "checkpoints"), resumed)
    assert state.warm_start is not None and state.warm_start.updates == 3
    assert _stage(resumed, tmp_path / "cut", state).run().done

    assert _losses(tmp_path / "cut" / WARM_START_LOG) == losses
    want, got = _params(whole), _params(resumed)
    assert all(torch.equal(got[n], want[n]) for n in want)
    # RL's KL reference is the warm-started model in both
    reference = dict(resumed.reference.named_parameters())
    assert all(torch.equal(reference[n], want[n]) for n in want)
