"""The torch backend on a real HF model format: the small Qwen3 model made here (transformers'
own config and model classes, the project's tokenizer and tool-calling chat template), its
start-up field check, the logprobs it trains with, GRPO steps, export and resume.

References are independent of the code under test: logprobs from one plain forward of the
model transformers loads, gathered by hand; the model reloaded by ``AutoModelForCausalLM``;
config fields edited by hand."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.api.trainer import TrainerSpec
from agentrl.rollout.swe_tools import tool_schemas
from agentrl.trainer import hf_model
from agentrl.trainer.batching import TrainSample
from agentrl.trainer.checkpoint import CheckpointStore, DriverState
from agentrl.trainer.hf_config import read_hf_config
from agentrl.trainer.torch_backend import TorchBackend
from tests.trainer.factories import make_trajectory

SPEC = TrainerSpec(backend="torch", gpus_per_node=0, optimizer={"lr": 0.01})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hf_model.create_model(tmp_path_factory.mktemp("qwen3") / "model", seed=0)


def _digest(path: Path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_the_same_seed_makes_the_same_weights_and_another_seed_others(
    model_dir: Path, tmp_path: Path
) -> None:
    again = hf_model.create_model(tmp_path / "again", seed=0)
    other = hf_model.create_model(tmp_path / "other", seed=1)
    assert _digest(again) == _digest(model_dir)
    assert _digest(other) != _digest(model_dir)


def test_the_directory_is_a_qwen3_model_with_a_tool_calling_template(model_dir: Path) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "qwen3"
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    assert config["vocab_size"] == len(tok)
    assert json.loads((model_dir / "generation_config.json").read_text())["eos_token_id"] == [
        tok.convert_tokens_to_ids("<|im_end|>")
    ]
    text = tok.apply_chat_template(
        [{"role": "user", "content": "fix it"}],
        tools=tool_schemas(),
        tokenize=False,
        add_generation_prompt=True,
    )
    assert '"name": "str_replace_editor"' in text and "<tool_call>" in text
    model = hf_model.load_causal_lm(model_dir)
    assert type(model).__name__ == "Qwen3ForCausalLM"


def _edited(model_dir: Path, tmp_path: Path, **changes: object) -> Path:
    """A copy of the model's config.json with ``changes`` (only the config: for the check)."""
    out = tmp_path / "edited"
    out.mkdir()
    config = json.loads((model_dir / "config.json").read_text())
    for key, value in changes.items():
        if key == "rope_theta":
            config["rope_parameters"]["rope_theta"] = value
        else:
            config[key] = value
    if "num_hidden_layers" in changes:
        config.pop("layer_types")  # one per layer: transformers derives them again
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"rope_theta": 10_000.0}, "rotary_base: built 1000000"),
        ({"intermediate_size": 256}, "ffn_hidden_size: built 128, config.json says 256"),
        ({"num_key_value_heads": 4}, "num_query_groups: built 2, config.json says 4"),
        ({"num_hidden_layers": 3}, "num_layers: built 2, config.json says 3"),
    ],
)
def test_a_model_built_unlike_its_config_is_refused_naming_the_field(
    model_dir: Path, tmp_path: Path, changes: dict[str, object], field: str
) -> None:
    model = hf_model.load_causal_lm(model_dir)
    with pytest.raises(ValueError, match=re.escape(field)) as refused:
        hf_model.check_built_model(read_hf_config(_edited(model_dir, tmp_path, **changes)), model)
    assert str(refused.value).startswith("the model transformers built does not match")


def test_a_config_that_says_moe_refuses_a_dense_model(model_dir: Path, tmp_path: Path) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    moe = {**config, "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"]}
    moe.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
    (tmp_path / "config.json").write_text(json.dumps(moe))
    model = hf_model.load_causal_lm(model_dir)
    with pytest.raises(
        ValueError, match=re.escape("num_moe_experts: built None, config.json says 4")
    ):
        hf_model.check_built_model(read_hf_config(tmp_path), model)


def test_an_old_style_config_loads_with_its_rope_base(model_dir: Path, tmp_path: Path) -> None:
    """A config.json in transformers 4's keys (top-level rope_theta) of the same weights."""
    old = tmp_path / "old"
    old.mkdir()
    config = json.loads((model_dir / "config.json").read_text())
    config["rope_theta"] = config.pop("rope_parameters")["rope_theta"]
    (old / "config.json").write_text(json.dumps(config))
    (old / "model.safetensors").write_bytes((model_dir / "model.safetensors").read_bytes())
    model = hf_model.load_causal_lm(old)
    assert abs(hf_model.built_model_fields(model)["rotary_base"] - 1e6) < 1.0


def _by_hand(model_dir: Path, ids: list[int], positions: list[int], t: float) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0]
    logp = torch.log_softmax(logits / t, dim=-1)
    return torch.stack([logp[j - 1, ids[j]] for j in positions])


def _sample(ids: list[int], mask: list[int], advantage: float) -> TrainSample:
    logprobs = [-1.0 if m else 0.0 for m in mask]
    t = make_trajectory("a#0", 1.0, tokens=(ids, logprobs, mask))
    return TrainSample(trajectory=t, advantage=advantage, carries_loss=True)


IDS = [1, 40, 41, 42, 2, 1, 43, 44, 45, 46, 2]
MASK = [0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1]  # two generated runs: [3, 5) and [8, 11)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_backend_scores_the_generated_tokens_from_the_logits_before_them(
    model_dir: Path, temperature: float
) -> None:
    backend = TorchBackend(
        hf_model.load_causal_lm(model_dir), SPEC, temperature=temperature, source=model_dir
    )
    batch = backend._prepare([_sample(IDS, MASK, 1.0)])
    want = _by_hand(model_dir, IDS, [3, 4, 8, 9, 10], temperature)
    assert torch.allclose(batch.logp_old, want, atol=1e-5)


def test_a_positive_advantage_step_raises_its_tokens_logprob(model_dir: Path) -> None:
    backend = TorchBackend(
        hf_model.load_causal_lm(model_dir), SPEC, temperature=1.0, source=model_dir
    )
    sample = _sample(IDS, MASK, 1.0)
    before = backend._prepare([sample]).logp_old.sum()
    stats = backend.train_step([sample])
    after = backend._prepare([sample]).logp_old.sum()
    assert stats.grad_norm > 0
    assert after > before


def test_exported_weights_reload_in_transformers_with_identical_logits(
    model_dir: Path, tmp_path: Path
) -> None:
    backend = TorchBackend(
        hf_model.load_causal_lm(model_dir), SPEC, temperature=1.0, source=model_dir
    )
    backend.train_step([_sample(IDS, MASK, 1.0)])
    out = tmp_path / "export"
    backend.export_weights(out)
    reloaded = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        ours = backend.model(input_ids=torch.tensor([IDS])).logits
        theirs = reloaded(input_ids=torch.tensor([IDS])).logits
    assert torch.equal(ours, theirs)
    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok.chat_template == AutoTokenizer.from_pretrained(str(model_dir)).chat_template
    # trained: not the initial weights any more
    with torch.no_grad():
        start = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        assert not torch.equal(start(input_ids=torch.tensor([IDS])).logits, theirs)


def test_a_resumed_backend_takes_the_same_next_step(model_dir: Path, tmp_path: Path) -> None:
    def backend() -> TorchBackend:
        return TorchBackend(
            hf_model.load_causal_lm(model_dir), SPEC, temperature=1.0, source=model_dir
        )

    first = backend()
    first.train_step([_sample(IDS, MASK, 1.0)])
    store = CheckpointStore(tmp_path)
    store.save(first, DriverState(step=1))
    resumed = backend()
    assert store.load(resumed) is not None
    nxt = [_sample(IDS, MASK, -0.5)]
    assert first.train_step(nxt).loss == resumed.train_step(nxt).loss
    for (name, a), (_, b) in zip(
        first.model.named_parameters(), resumed.model.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name


def test_agentrl_model_create_writes_a_directory_transformers_loads(tmp_path: Path) -> None:
    from agentrl.cli import main

    out = tmp_path / "m"
    result = CliRunner().invoke(main, ["model", "create", str(out), "--seed", "0"])
    assert result.exit_code == 0, result.output
    assert f"{out}: Qwen3ForCausalLM, preset mini" in result.output
    AutoModelForCausalLM.from_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(out))


def test_the_trainer_builds_the_hf_backend_for_a_model_directory(
    model_dir: Path, tmp_path: Path
) -> None:
    """``trainer.backend: torch`` with ``model.source.path`` an HF directory: the trainer pod's
    backend choice loads it (checked) and exports what the engines reload."""
    import yaml

    from agentrl.api.validation import load_job
    from agentrl.reconcile import configmap
    from agentrl.reconcile.context import BuildContext
    from agentrl.reconcile.policies.suspend import workload_scale
    from agentrl.trainer.config import TrainerConfig, TrainerEnv
    from agentrl.trainer.factories import build_backend

    doc = yaml.safe_load((Path(__file__).parents[2] / "examples/quickstart.yaml").read_text())
    doc["spec"]["model"]["source"]["path"] = str(model_dir)
    job = load_job(yaml.safe_dump(doc))
    config = TrainerConfig(
        job=job,
        runtime=configmap.runtime_config(job, BuildContext.for_job(job), workload_scale(job)),
        env=TrainerEnv(checkpoint_dir=tmp_path),
    )
    backend = build_backend(config)
    assert isinstance(backend, TorchBackend) and backend.first_position == 1
    assert type(backend.model).__name__ == "Qwen3ForCausalLM"
    backend.export_weights(tmp_path / "w")
    assert hf_model.is_hf_model_dir(tmp_path / "w")
    assert (tmp_path / "w" / "tokenizer.json").is_file()


class _Packed:
    """Two conversations back to back, as the warm start packs them."""

    def __init__(self, convs: list[tuple[list[int], list[int]]]) -> None:
        self.token_ids = [t for ids, _ in convs for t in ids]
        self.loss_mask = [m for _, mask in convs for m in mask]
        self.cu_seqlens = [0]
        for ids, _ in convs:
            self.cu_seqlens.append(self.cu_seqlens[-1] + len(ids))


CONV_A = ([1, 40, 41, 2, 1, 42, 43, 2], [0, 0, 0, 0, 0, 1, 1, 1])
CONV_B = ([1, 50, 2, 1, 51, 52, 2, 1, 53, 54, 2], [0, 0, 0, 0, 1, 1, 1, 0, 1, 1, 1])


def test_a_warm_start_step_is_the_mean_nll_of_the_assistant_tokens_per_conversation(
    model_dir: Path,
) -> None:
    """Packed conversations do not see each other: the loss equals the sum of each one's own
    negative logprobs (a plain forward of that conversation alone), over all trained tokens."""
    backend = TorchBackend(
        hf_model.load_causal_lm(model_dir), SPEC, temperature=0.7, source=model_dir
    )
    want = 0.0
    for ids, mask in (CONV_A, CONV_B):
        trained = [j for j, m in enumerate(mask) if m]
        want -= float(_by_hand(model_dir, ids, trained, 1.0).sum())  # SFT: temperature 1
    want /= sum(CONV_A[1]) + sum(CONV_B[1])
    packed = _Packed([CONV_A, CONV_B])
    first = backend.sft_step(packed, lr=0.01)
    assert first.tokens == 9
    assert abs(first.loss - want) < 1e-5
    for _ in range(5):
        last = backend.sft_step(packed, lr=0.01)
    assert last.loss < first.loss


def test_the_warm_start_refuses_the_tiny_policy() -> None:
    from agentrl.tiny import policy as tiny

    backend = TorchBackend(tiny.new_policy(0, dim=8), SPEC, temperature=1.0)
    with pytest.raises(ValueError, match="warm start trains HF models"):
        backend.sft_step(_Packed([CONV_A]), lr=0.01)


def test_a_checkpoint_in_the_warm_start_resumes_its_optimizer(
    model_dir: Path, tmp_path: Path
) -> None:
    def backend() -> TorchBackend:
        return TorchBackend(
            hf_model.load_causal_lm(model_dir), SPEC, temperature=1.0, source=model_dir
        )

    first = backend()
    packed = _Packed([CONV_A, CONV_B])
    first.sft_step(packed, lr=0.01)
    first.save_state(tmp_path)
    resumed = backend()
    resumed.load_state(tmp_path)
    assert first.sft_step(packed, lr=0.01).loss == resumed.sft_step(packed, lr=0.01).loss
    for (name, a), (_, b) in zip(
        first.model.named_parameters(), resumed.model.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name


def test_rl_after_the_warm_start_keeps_the_warm_started_weights_as_its_kl_reference(
    model_dir: Path,
) -> None:
    spec = TrainerSpec(
        backend="torch", gpus_per_node=0, optimizer={"lr": 0.01}, algorithm={"klCoef": 0.1}
    )
    backend = TorchBackend(
        hf_model.load_causal_lm(model_dir), spec, temperature=1.0, source=model_dir
    )
    backend.sft_step(_Packed([CONV_A, CONV_B]), lr=0.05)
    backend.finish_warm_start()
    for (name, a), (_, b) in zip(
        backend.model.named_parameters(), backend.reference.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name
