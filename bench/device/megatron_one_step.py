"""The pieces only an accelerator runs, on one GPU, as ONE JSON line (prepared for a lent
accelerator; NOT run in this repository's CI; its CPU part runs in the unit tests). Budgeted
for 8 minutes on one H200: no throughput case starts after ``--budget-s`` (420 s by default);
not yet run on a GPU in this form.

    python bench/device/megatron_one_step.py [--layers 2 --hidden 256 --heads 4 --kv-heads 2
        --vocab 1024 --seq 512 --trajectories 8 --steps 2 --experts 0
        --bench-shapes 0.6b,1.7b --bench-tokens 4096,16384 --budget-s 420]
    python bench/device/megatron_one_step.py --cpu      # what a host without a GPU can check

0. **Logprob parity with transformers** (``parity``) — tiny Qwen3 and Qwen3-MoE models made by
   transformers with random weights and saved (``config.json`` as transformers 5 writes it, and
   rewritten in the old style: top-level ``rope_theta``, ``num_experts``); the megatron backend
   built from each directory scores the same trajectories (three, packed into one micro-batch:
   :meth:`~agentrl.trainer.megatron_backend.MegatronBackend.score`) as transformers does, in
   fp32 and bf16; max and mean absolute logprob differences per case.
1. **megatron-core steps** — :class:`agentrl.trainer.megatron_backend.MegatronBackend` driven as
   the trainer pod drives it on rank 0, world size 1 (TP=PP=CP=EP=1), nccl: a GPTModel built from
   a Qwen2-shaped ``config.json`` written here (``--experts N``: Qwen3-MoE-shaped), random
   weights, trajectories with random token ids, a loss mask over the second half and engine
   logprobs near the model's own, then ``--steps`` ``train_step`` calls (logprob recomputation
   and distributed-optimizer updates on the clipped, importance-corrected GRPO loss); a
   ``torch_dist`` checkpoint save, one more step, a load (weights bit-equal to the saved ones,
   step counter restored) and the same step again (``resume_bit_equal``: the resumed step gives
   the same weights as the first time, so the optimizer state came back too); the HF export.
   ``checkpoint_saves``: the stop's checkpoint timed (:func:`timed_checkpoint`: a
   :class:`~agentrl.trainer.checkpoint.CheckpointStore` save, as the driver writes it on
   SIGTERM, then every file fsynced; bytes, seconds, GB/s), here and after each throughput
   shape's steps, the figure ``bench/stop_grace.py`` measures for the torch backend.
1b. **The warm start** (``warm_start``, :func:`warm_start_check`) — a second backend (KL
   reference on) takes ``sft_step`` updates on one packed batch of two conversations (two
   trajectories' tokens, trained on their second halves): the first update's loss against the
   NLL that :meth:`~agentrl.trainer.megatron_backend.MegatronBackend.score` gives the same
   tokens (temperature 1), the loss falling over three updates, the learning rate at the warm
   start's; a checkpoint in the middle, one more update, then a **new** backend loading the
   checkpoint and taking the same update (``resume_bit_equal``: the same weights, so the Adam
   moments and step counts came back); ``finish_warm_start`` (learning rate back at
   ``optimizer.lr``, Adam moments zero, the KL reference equal to the weights) and one GRPO
   step after it. ``ok`` sums it up.
2. **The distributed weight push** — :class:`~agentrl.trainer.weight_sync.DistributedWeightSync`
   streams the model (``MegatronBackend.named_tensors``: names, dtypes and shapes announced,
   then tensor by tensor) into a tiny engine in a **separate process** that joins the weight
   group through SGLang's ``/init_weights_update_group`` and receives through
   ``/update_weights_from_distributed`` into a module with the HF names. Two processes on one
   GPU cannot share an NCCL communicator (NCCL refuses two ranks on one device), so the weight
   group is gloo over loopback and the receiver is on the CPU; the trainer's tensors leave the
   GPU as host copies. What it proves: the GPU-resident model yields every HF tensor with the
   names and shapes an engine loads, the announce-then-stream protocol and the receiving
   endpoint agree, and what the receiver holds equals the HF export bit for bit. What it does
   not prove: NCCL/RCCL as the weight group's transport (that needs a second GPU).
3. **One torch-backend step** — :class:`agentrl.trainer.torch_backend.TorchBackend` on the tiny
   policy (CPU, as ``agentrl run`` trains it).
4. **Throughput** (``throughput``) — Qwen3-0.6B- and Qwen3-1.7B-shaped models (random weights,
   bf16, SDPA attention, packed micro-batches, activation recompute above 8k tokens) taking GRPO
   steps on one trajectory of 4k and of 16k tokens: tokens/s and model TFLOP/s under the
   convention of :data:`FLOPS_CONVENTION` (:func:`model_flops`), peak memory. Cases that would
   start after ``--budget-s`` seconds are listed as skipped. After a shape's steps its
   checkpoint save is timed (``checkpoint_saves``, 14 bytes per parameter: bf16 weights, fp32
   main weights and two Adam moments; 8.3 GB for 0.6B, 23.8 GB for 1.7B), unless
   ``--no-bench-checkpoint``; each is deleted once measured.

``--cpu`` runs the same script without a GPU: gloo instead of nccl, float32, no megatron step
(megatron-core's schedules and gradient buffers need CUDA) — the parity check (megatron's
forward runs on the CPU once its "current CUDA device" is answered with the CPU), model build,
checkpoint round trip, export, the push to the receiver process and the torch step. Requires the
``megatron`` and ``training`` extras and transformers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import random
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def hf_skeleton(shapes: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A module whose parameters are zeros named and shaped like ``shapes`` (HF names)."""
    root = torch.nn.Module()
    for name, tensor in shapes.items():
        *path, leaf = name.split(".")
        module = root
        for part in path:
            if part not in module._modules:
                module.add_module(part, torch.nn.Module())
            module = module._modules[part]  # type: ignore[assignment]
        module.register_parameter(
            leaf, torch.nn.Parameter(torch.zeros_like(tensor), requires_grad=False)
        )
    return root


def serve_receiver(export_dir: str, out_file: str, ports: Any, stop: Any) -> None:
    """The receiving engine (its own process, CPU): a tiny engine whose model has the export's
    HF names and shapes (zeros), serving SGLang's weight-update routes on loopback until
    ``stop``; then what it holds is written to ``out_file``."""
    from aiohttp import web
    from safetensors.torch import load_file, save_file

    from agentrl.tiny.server import TinyEngine, build_app

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    shapes: dict[str, torch.Tensor] = {}
    for f in sorted(Path(export_dir).glob("*.safetensors")):
        shapes.update(load_file(str(f)))

    async def run() -> None:
        engine = TinyEngine(hf_skeleton(shapes), model_path="start")  # type: ignore[arg-type]
        runner = web.AppRunner(build_app(engine))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        ports.put(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        await asyncio.get_running_loop().run_in_executor(None, stop.wait)
        held = {n: p.detach().contiguous() for n, p in engine.model.named_parameters()}
        save_file(held, out_file)
        await runner.cleanup()

    asyncio.run(run())


class HostCopies:
    """A weight stream whose tensors are copied to the host as they come (the weight group is
    gloo: the receiver is a CPU process)."""

    def __init__(self, stream: Any) -> None:
        self.specs = stream.specs
        self.tensors = ((name, t.detach().to("cpu")) for name, t in stream.tensors)


def push_to_receiver(backend: Any, export: Path, work: Path) -> dict[str, Any]:
    """Stream the backend's weights into a receiver process; compare with ``export``."""
    from safetensors.torch import load_file

    from agentrl.engine_client.client import EngineClient
    from agentrl.trainer.weight_sync import DistributedWeightSync

    ctx = multiprocessing.get_context("spawn")
    ports, stop = ctx.Queue(), ctx.Event()
    out = work / "received.safetensors"
    child = ctx.Process(target=serve_receiver, args=(str(export), str(out), ports, stop))
    child.start()
    try:
        port = ports.get(timeout=300)

        async def push() -> Any:
            client = EngineClient(f"http://127.0.0.1:{port}", max_connections=4)
            sync = DistributedWeightSync(
                [client],
                tensors=lambda: HostCopies(backend.named_tensors()),
                master_address="127.0.0.1",
                master_port=_free_port(),
                backend="gloo",
                interface="lo",
                timeout_seconds=300.0,
            )
            try:
                return await sync.push(1)
            finally:
                sync.close()
                await client.close()

        start = time.monotonic()
        report = asyncio.run(push())
        seconds = time.monotonic() - start
    finally:
        stop.set()
        child.join(timeout=300)
    want: dict[str, torch.Tensor] = {}
    for f in sorted(export.glob("*.safetensors")):
        want.update(load_file(str(f)))
    got = load_file(str(out))
    return {
        "failed": report.failed,
        "tensors": len(got),
        "bytes": sum(t.numel() * t.element_size() for t in got.values()),
        "seconds": round(seconds, 3),
        "matches_export": got.keys() == want.keys()
        and all(torch.equal(got[n], want[n]) for n in want),
        "transport": "gloo over loopback to a CPU receiver process (not NCCL: one GPU)",
    }


def torch_backend_step() -> dict[str, Any]:
    """One GRPO step of the torch backend on the tiny policy (CPU)."""
    from agentrl.api.rollout import ClassAction, TerminalClass
    from agentrl.api.trainer import TrainerSpec
    from agentrl.rollout.trajectory import Trajectory
    from agentrl.tiny import policy as tiny
    from agentrl.tiny.tokenizer import get_tokenizer
    from agentrl.trainer.batching import TrainSample
    from agentrl.trainer.torch_backend import TorchBackend

    tok = get_tokenizer()
    prompt = tok.encode_message("user", "the test fails: fix the bug in the repository")
    samples = []
    for i in range(4):
        answer = tok.encode_message(
            "assistant", f"edit file {i} then run the tests", end_of_turn=True
        )
        ids = prompt + answer
        trajectory = Trajectory(
            episode_id=f"t{i}",
            task_id="t",
            group_id="t#0",
            policy_version=0,
            terminal_class=TerminalClass.COMPLETED,
            reward=float(i % 2),
            training_action=ClassAction.TRAIN,
            token_ids=ids,
            logprobs=[0.0] * len(prompt) + [-2.0] * len(answer),
            loss_mask=[0] * len(prompt) + [1] * len(answer),
        )
        samples.append(
            TrainSample(trajectory=trajectory, advantage=1.0 if i % 2 else -1.0, carries_loss=True)
        )
    spec = TrainerSpec.model_validate({"backend": "torch", "gpusPerNode": 0})
    backend = TorchBackend(tiny.new_policy(0, dim=16), spec, temperature=1.0)
    start = time.monotonic()
    stats = backend.train_step(samples)
    return {
        "loss": stats.loss,
        "grad_norm": stats.grad_norm,
        "tokens": stats.loss_stats.tokens,
        "finite": math.isfinite(stats.loss) and math.isfinite(stats.grad_norm),
        "seconds": round(time.monotonic() - start, 3),
    }


#: How the TFLOP/s figures count work: per trained token, 2 FLOPs per parameter for the logprob
#: recomputation's forward and 6 for the update's forward and backward.
FLOPS_CONVENTION = (
    "model FLOPs = 8 x parameters x tokens per GRPO step (2 for the logprob recompute forward "
    "+ 6 for the update's forward and backward; attention's L^2 term and activation recompute "
    "not counted), over the step's recompute + update seconds; parameters = every parameter "
    "of the built model, a tied embedding once"
)
#: Model shapes of the throughput cases (Qwen3's published sizes; random weights).
BENCH_SHAPES: dict[str, dict[str, Any]] = {
    "0.6b": {
        "architectures": ["Qwen3ForCausalLM"],
        "num_hidden_layers": 28,
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 3072,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "rope_theta": 1000000.0,
    },
    "1.7b": {
        "architectures": ["Qwen3ForCausalLM"],
        "num_hidden_layers": 28,
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 6144,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "rope_theta": 1000000.0,
    },
}
#: Top-level keys of the JSON line (both modes).
RESULT_KEYS = frozenset(
    {
        "mode", "device", "model", "parity", "steps", "checkpoint_restored_weights",
        "checkpoint_restored_iteration", "resume_bit_equal", "warm_start", "exported_files", "push",
        "torch_step", "throughput", "flops_convention", "seconds", "init", "checkpoint_saves",
    }
)  # fmt: skip
#: Parity tolerances on the max absolute logprob difference (fp32) and the mean one (bf16).
PARITY_FP32_MAX = 1e-4
PARITY_BF16_MEAN = 0.05


def model_flops(params: int, tokens: int) -> float:
    """FLOPs of one GRPO step on ``tokens`` tokens under :data:`FLOPS_CONVENTION`."""
    return 8.0 * params * tokens


def tflops_per_second(params: int, tokens: int, seconds: float) -> float:
    """Model TFLOP/s of a step that took ``seconds``."""
    return model_flops(params, tokens) / seconds / 1e12 if seconds > 0 else 0.0


def dense_params(config: dict[str, Any]) -> int:
    """Parameters of a dense Qwen3-style model from its config (q/k norms, no biases, SwiGLU;
    a tied embedding counted once)."""
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    d = config.get("head_dim") or h // heads
    ffn, vocab = config["intermediate_size"], config["vocab_size"]
    attention = h * heads * d + 2 * h * kv * d + heads * d * h + 2 * d  # q, k, v, o, q/k norms
    per_layer = attention + 3 * h * ffn + 2 * h  # gate, up, down; two RMSNorms
    embeddings = vocab * h * (1 if config.get("tie_word_embeddings") else 2)
    return layers * per_layer + embeddings + h  # + final norm


def _config(args: argparse.Namespace) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": ["Qwen2ForCausalLM"],
        "num_hidden_layers": args.layers,
        "hidden_size": args.hidden,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "intermediate_size": args.ffn,
        "vocab_size": args.vocab,
        "max_position_embeddings": args.seq,
    }
    if args.experts:
        config.update(
            architectures=["Qwen3MoeForCausalLM"],
            num_experts=args.experts,
            num_experts_per_tok=min(2, args.experts),
            moe_intermediate_size=args.ffn // 4,
        )
    return config


def _samples(
    args: argparse.Namespace, *, seq: int | None = None, count: int | None = None, seed: int = 0
) -> list[Any]:
    from agentrl.api.rollout import ClassAction, TerminalClass
    from agentrl.rollout.trajectory import Trajectory
    from agentrl.trainer.batching import TrainSample

    rng = random.Random(seed)
    length = seq or args.seq
    half = length // 2
    samples = []
    for i in range(count or args.trajectories):
        ids = [rng.randrange(args.vocab) for _ in range(length)]
        mask = [0] * half + [1] * (length - half)
        # Engine logprobs near the model's (uniform-ish at random init): log(1/V) ± noise.
        lps = [0.0] * half + [
            -math.log(args.vocab) + rng.gauss(0, 0.05) for _ in range(length - half)
        ]
        trajectory = Trajectory(
            episode_id=f"e{i}",
            task_id=f"t{i // 4}",
            group_id=f"t{i // 4}#0",
            policy_version=0,
            terminal_class=TerminalClass.COMPLETED,
            reward=float(i % 2),
            training_action=ClassAction.TRAIN,
            token_ids=ids,
            logprobs=lps,
            loss_mask=mask,
        )
        samples.append(
            TrainSample(trajectory=trajectory, advantage=1.0 if i % 2 else -1.0, carries_loss=True)
        )
    return samples


# -- the warm start -----------------------------------------------------------------------------

#: The warm start's learning rate in :func:`warm_start_check` (RL's is the spec's ``1e-5``).
WARM_LR = 1e-4


def _packed(samples: list[Any]) -> Any:
    """The trajectories' tokens as conversations packed into one warm-start batch."""
    from agentrl.trainer.sft_batches import SFTBatch

    ids: list[int] = []
    mask: list[int] = []
    cu = [0]
    for s in samples:
        ids += s.trajectory.token_ids
        mask += s.trajectory.loss_mask
        cu.append(len(ids))
    return SFTBatch(token_ids=ids, loss_mask=mask, cu_seqlens=cu, lines=list(range(1, len(cu))))


def warm_start_check(build: Any, samples: list[Any], work: Path) -> dict[str, Any]:
    """The warm start on backends from ``build()`` (stepping ones, temperature 1, KL reference
    on), on two of ``samples`` packed; see the module docstring (1b)."""
    from agentrl.trainer.megatron_sft import inner_optimizers, learning_rates

    backend = build()
    rl_lr = backend.spec.optimizer.lr
    conversations = samples[:2]
    batch = _packed(conversations)
    nll = -float(torch.cat(backend.score(conversations)).double().mean())
    losses = [backend.sft_step(batch, lr=WARM_LR).loss for _ in range(3)]
    lr_during = learning_rates(backend.optimizer)
    backend.save_state(work / "warm-start-ckpt")
    backend.sft_step(batch, lr=WARM_LR)
    after = _params(backend)
    resumed = build()
    resumed.load_state(work / "warm-start-ckpt")
    resumed.sft_step(batch, lr=WARM_LR)
    again = _params(resumed)
    del resumed
    backend.finish_warm_start()
    moments = [
        float(t.abs().max())
        for inner in inner_optimizers(backend.optimizer)
        for state in inner.state.values()
        for k, t in state.items()
        if k in ("exp_avg", "exp_avg_sq") and t.numel()
    ]
    reference = dict(backend.reference.named_parameters())
    trained = _params(backend)
    stats = backend.train_step(samples)
    out = {
        "losses": losses,
        "tokens": sum(batch.loss_mask),
        "nll_before": nll,
        "matches_score": abs(losses[0] - nll) < 1e-2 * max(1.0, abs(nll)),
        "loss_falls": losses[-1] < losses[0],
        "lr_during": sorted(set(lr_during)),
        "lr_during_ok": set(lr_during) == {WARM_LR},
        "resume_bit_equal": _equal(again, after),
        "resume_max_abs_diff": max(float((again[n] - after[n]).abs().max()) for n in after),
        "lr_after": sorted(set(learning_rates(backend.optimizer))),
        "lr_after_ok": set(learning_rates(backend.optimizer)) == {rl_lr},
        "moments_zero": bool(moments) and max(moments) == 0.0,
        "reference_is_trained": all(torch.equal(reference[n], trained[n]) for n in trained),
        "rl_loss": stats.loss,
        "rl_finite": math.isfinite(stats.loss) and math.isfinite(stats.grad_norm),
        "iteration": backend.iteration,
    }
    out["ok"] = all(
        out[k]
        for k in (
            "matches_score", "loss_falls", "lr_during_ok", "resume_bit_equal", "lr_after_ok",
            "moments_zero", "reference_is_trained", "rl_finite",
        )
    ) and out["iteration"] == 1  # fmt: skip
    return out


# -- parity with transformers -------------------------------------------------------------------

PARITY_SHAPE = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 512,
    "max_position_embeddings": 512,
    "rope_theta": 1000000.0,
}
PARITY_MOE = {
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "norm_topk_prob": True,
}
PARITY_LENGTHS = (200, 57, 128)


def _write_hf_model(directory: Path, *, moe: bool, old_style: bool) -> Any:
    """A transformers model with random weights saved in ``directory`` (``config.json`` as
    transformers 5 writes it, or rewritten in the old style); returns the model."""
    import transformers

    torch.manual_seed(0)
    if moe:
        model = transformers.Qwen3MoeForCausalLM(
            transformers.Qwen3MoeConfig(**PARITY_SHAPE, **PARITY_MOE)
        )
    else:
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**PARITY_SHAPE))
    model.eval().save_pretrained(directory)
    if old_style:
        path = directory / "config.json"
        data = json.loads(path.read_text())
        data["rope_theta"] = data.pop("rope_parameters")["rope_theta"]
        if moe:
            data["num_experts"] = data.pop("num_local_experts")
        path.write_text(json.dumps(data))
    return model


def _parity_samples() -> list[Any]:
    """Trajectories scored on every token after the first."""
    args = argparse.Namespace(vocab=PARITY_SHAPE["vocab_size"], seq=0, trajectories=0)
    out: list[Any] = []
    for i, n in enumerate(PARITY_LENGTHS):
        (sample,) = _samples(args, seq=n, count=1, seed=i)
        t = sample.trajectory
        mask = [0] + [1] * (n - 1)
        out.append(
            sample.model_copy(
                update={
                    "trajectory": t.model_copy(
                        update={"loss_mask": mask, "logprobs": [0.0, *t.logprobs[1:]]}
                    )
                }
            )
        )
    return out


def _reference_logprobs(model: Any, samples: list[Any], device: str) -> list[torch.Tensor]:
    out = []
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s.trajectory.token_ids], device=device)
            logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
            out.append(logp[torch.arange(ids.shape[1] - 1), ids[0, 1:]].cpu())
    return out


def parity(spec: Any, work: Path, *, gpu: bool) -> list[dict[str, Any]]:
    """Logprobs of the megatron backend against transformers for the same weights."""
    from agentrl.trainer.hf_config import read_hf_config
    from agentrl.trainer.megatron_backend import MegatronBackend

    device = "cuda" if gpu else "cpu"
    samples = _parity_samples()
    cases = []
    for moe in (False, True):
        for old_style in (False, True):
            directory = work / f"parity-{'moe' if moe else 'dense'}-{int(old_style)}"
            directory.mkdir()
            model = _write_hf_model(directory, moe=moe, old_style=old_style)
            hf = read_hf_config(directory)
            for dtype in (torch.float32, torch.bfloat16):
                backend = MegatronBackend(
                    hf, spec, temperature=1.0, model_dir=directory, params_dtype=dtype
                )
                got = backend.score(samples)
                want = _reference_logprobs(model.to(device, dtype), samples, device)
                diff = torch.cat([(g - w).abs() for g, w in zip(got, want, strict=True)])
                max_diff, mean_diff = float(diff.max()), float(diff.mean())
                ok = (
                    max_diff < PARITY_FP32_MAX
                    if dtype == torch.float32
                    else mean_diff < PARITY_BF16_MEAN
                )
                cases.append(
                    {
                        "model": hf.architecture,
                        "config": "old-style" if old_style else "transformers5",
                        "dtype": "fp32" if dtype == torch.float32 else "bf16",
                        "rope_theta": hf.rope_theta,
                        "experts": hf.num_experts,
                        "tokens": int(diff.numel()),
                        "max_abs_diff": max_diff,
                        "mean_abs_diff": mean_diff,
                        "ok": ok,
                    }
                )
                del backend
                if gpu:
                    torch.cuda.empty_cache()
            model.to("cpu", torch.float32)
    return cases


# -- the stop's checkpoint, timed ---------------------------------------------------------------


def timed_checkpoint(backend: Any, root: Path, *, label: str, gpu: bool) -> dict[str, Any]:
    """One checkpoint of ``backend`` written as the driver writes the stop's
    (:meth:`CheckpointStore.save`: the backend's ``torch_dist`` save into a temporary
    directory, ``driver.json``, the rename into place), timed; then every file and directory of
    it fsynced (the bytes on the device), timed apart; then deleted. The figure
    ``bench/stop_grace.py`` measures for the torch backend: seconds per GB of checkpoint."""
    import shutil

    from agentrl.trainer.checkpoint import CheckpointStore, DriverState

    store = CheckpointStore(root)
    if gpu:
        torch.cuda.synchronize()
    os.sync()
    start = time.monotonic()
    path = store.save(backend, DriverState(step=int(getattr(backend, "iteration", 0))))
    save_s = time.monotonic() - start
    entries = sorted(path.rglob("*"))
    files = [p for p in entries if p.is_file()]
    start = time.monotonic()
    for entry in [*files, *(p for p in entries if p.is_dir()), path, root]:
        fd = os.open(entry, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fsync_s = time.monotonic() - start
    size = sum(p.stat().st_size for p in files)
    params = sum(p.numel() for p in backend.model.parameters())
    shutil.rmtree(root)
    durable = save_s + fsync_s
    return {
        "label": label,
        "parameters": params,
        "bytes": size,
        "files": len(files),
        "bytes_per_parameter": round(size / params, 3) if params else None,
        "save_s": round(save_s, 3),
        "fsync_s": round(fsync_s, 3),
        "durable_s": round(durable, 3),
        "gb_per_s": round(size / 1e9 / durable, 3) if durable > 0 else None,
    }


# -- throughput ---------------------------------------------------------------------------------


def throughput(
    spec: Any,
    work: Path,
    shapes: list[str],
    tokens: list[int],
    deadline: float,
    saves: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """GRPO steps of bench-shaped models on one trajectory of each length: tokens/s, TFLOP/s.
    ``saves``: each shape's checkpoint save, timed after its steps, is appended to it."""
    from agentrl.trainer.hf_config import read_hf_config
    from agentrl.trainer.megatron_backend import MegatronBackend

    cases: list[dict[str, Any]] = []
    for shape in shapes:
        if time.monotonic() > deadline:
            cases += [{"shape": shape, "tokens": n, "skipped": "budget"} for n in tokens]
            continue
        config = {**BENCH_SHAPES[shape], "max_position_embeddings": max(tokens)}
        directory = work / f"bench-{shape}"
        directory.mkdir()
        (directory / "config.json").write_text(json.dumps(config))
        start = time.monotonic()
        backend = MegatronBackend(
            read_hf_config(directory),
            spec,
            temperature=1.0,
            model_dir=directory,
            params_dtype=torch.bfloat16,
        )
        build_s = time.monotonic() - start
        params = sum(p.numel() for p in backend.model.parameters())
        vocab = argparse.Namespace(vocab=config["vocab_size"], seq=0, trajectories=0)
        for n in tokens:
            if time.monotonic() > deadline:
                cases.append({"shape": shape, "tokens": n, "skipped": "budget"})
                continue
            samples = _samples(vocab, seq=n, count=1)
            torch.cuda.reset_peak_memory_stats()
            backend.train_step(samples)  # warm-up (allocations, kernels)
            torch.cuda.synchronize()
            stats = backend.train_step(samples)
            torch.cuda.synchronize()
            seconds = stats.recompute_seconds + stats.update_seconds
            cases.append(
                {
                    "shape": shape,
                    "params": params,
                    "params_by_formula": dense_params(config),
                    "tokens": n,
                    "build_s": round(build_s, 2),
                    "step_s": round(seconds, 4),
                    "recompute_s": round(stats.recompute_seconds, 4),
                    "update_s": round(stats.update_seconds, 4),
                    "tokens_per_s": round(n / seconds, 1) if seconds else 0.0,
                    "model_tflops_per_s": round(tflops_per_second(params, n, seconds), 2),
                    "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
                    "loss_finite": math.isfinite(stats.loss),
                }
            )
        if saves is not None and backend.iteration > 0 and time.monotonic() < deadline:
            saves.append(timed_checkpoint(backend, work / f"ckpt-{shape}", label=shape, gpu=True))
        del backend
        torch.cuda.empty_cache()
    return cases


# -- the script ---------------------------------------------------------------------------------


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--ffn", type=int, default=688)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--trajectories", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--experts", type=int, default=0, help="MoE experts (0: dense)")
    parser.add_argument(
        "--mini-batches",
        type=int,
        default=2,
        help="trainer.algorithm.miniBatches: updates after the first are off-policy, so their "
        "clip fraction (printed per step) shows the PPO clip acting on a GPU",
    )
    parser.add_argument(
        "--parity",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="logprob parity with transformers (dense and MoE, fp32 and bf16, both config styles)",
    )
    parser.add_argument(
        "--bench-shapes",
        type=_csv,
        default=_csv("0.6b,1.7b"),
        help=f"throughput model shapes, of {', '.join(BENCH_SHAPES)} ('' for none; GPU only)",
    )
    parser.add_argument(
        "--bench-tokens",
        type=lambda t: [int(x) for x in _csv(t)],
        default=[4096, 16384],
        help="trajectory lengths of the throughput cases",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=420.0,
        help="throughput cases that would start later than this (seconds from the start) are "
        "skipped",
    )
    parser.add_argument(
        "--bench-checkpoint",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="time a checkpoint save of each throughput shape after its steps (the stop grace "
        "period's figure: bench/stop_grace.py)",
    )
    parser.add_argument(
        "--cpu",
        "--dry-run",
        dest="cpu",
        action="store_true",
        help="no GPU: gloo, float32, no megatron step; everything else as on the GPU",
    )
    args = parser.parse_args(argv)
    unknown = [s for s in args.bench_shapes if s not in BENCH_SHAPES]
    if unknown:
        parser.error(f"--bench-shapes: unknown {unknown}; known: {sorted(BENCH_SHAPES)}")
    return args


def _params(backend: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in backend.model.named_parameters()}


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started = time.monotonic()

    from agentrl.api.trainer import TrainerSpec
    from agentrl.trainer.hf_config import read_hf_config
    from agentrl.trainer.megatron_backend import MegatronBackend, initialize_parallel

    gpu = not args.cpu
    if gpu:
        torch.cuda.set_device(0)
    else:
        # megatron-core 0.16's rotary embedding moves its frequencies to "the current CUDA
        # device" at the first forward: on a host without one, that is the CPU.
        torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    torch.distributed.init_process_group(
        "nccl" if gpu else "gloo",
        init_method=f"tcp://127.0.0.1:{_free_port()}",
        rank=0,
        world_size=1,
    )
    spec = TrainerSpec.model_validate(
        {
            "backend": "megatron",
            "gpusPerNode": 1,
            "optimizer": {"lr": 1e-5},
            "algorithm": {"miniBatches": args.mini_batches},
        }
    )
    init = initialize_parallel(spec)
    work = Path(tempfile.mkdtemp(prefix="megatron-one-step-"))
    result: dict[str, Any] = {
        "mode": "gpu" if gpu else "cpu",
        "device": torch.cuda.get_device_name(0) if gpu else "cpu",
        "model": _config(args)["architectures"][0],
        "init": init.model_dump(),
        "flops_convention": FLOPS_CONVENTION,
    }
    result["parity"] = parity(spec, work, gpu=gpu) if args.parity else []

    (work / "hf").mkdir()
    (work / "hf" / "config.json").write_text(json.dumps(_config(args)))
    backend = MegatronBackend(
        read_hf_config(work / "hf"),
        spec,
        temperature=1.0,
        model_dir=work / "hf",
        params_dtype=torch.bfloat16 if gpu else torch.float32,
    )
    samples = _samples(args)
    steps = []
    if gpu:
        for _ in range(args.steps):
            torch.cuda.synchronize()
            stats = backend.train_step(samples)
            torch.cuda.synchronize()
            steps.append(
                {
                    "recompute_s": round(stats.recompute_seconds, 4),
                    "update_s": round(stats.update_seconds, 4),
                    "loss": stats.loss,
                    "grad_norm": stats.grad_norm,
                    "ess": stats.loss_stats.ess,
                    "tokens": stats.loss_stats.tokens,
                    "clip_fraction": stats.loss_stats.clip_fraction,
                }
            )
        result["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    result["steps"] = steps
    saved = _params(backend)
    backend.save_state(work / "ckpt")
    iteration = backend.iteration
    after_one_more: dict[str, torch.Tensor] | None = None
    if gpu:
        backend.train_step(samples)  # moves the weights and the optimizer state on
        after_one_more = _params(backend)
    else:
        with torch.no_grad():
            for p in backend.model.parameters():
                p.add_(1.0)
        backend.iteration = 0
    backend.load_state(work / "ckpt")
    result["checkpoint_restored_weights"] = _equal(_params(backend), saved)
    result["checkpoint_restored_iteration"] = backend.iteration == iteration == len(steps)
    result["resume_bit_equal"] = None
    result["warm_start"] = None
    if gpu and after_one_more is not None:
        backend.train_step(samples)  # the same step from the restored state
        result["resume_bit_equal"] = _equal(_params(backend), after_one_more)
        result["resume_iteration"] = backend.iteration == iteration + 1
    result["checkpoint_saves"] = [
        timed_checkpoint(backend, work / "ckpt-store", label="one-step model", gpu=gpu)
    ]
    backend.export_weights(work / "export")
    result["exported_files"] = sorted(p.name for p in (work / "export").iterdir())
    result["push"] = push_to_receiver(backend, work / "export", work)
    del backend
    if gpu:
        torch.cuda.empty_cache()
        with_reference = spec.model_copy(
            update={"algorithm": spec.algorithm.model_copy(update={"kl_coef": 0.01})}
        )
        result["warm_start"] = warm_start_check(
            lambda: MegatronBackend(
                read_hf_config(work / "hf"),
                with_reference,
                temperature=1.0,
                model_dir=work / "hf",
                params_dtype=torch.bfloat16,
            ),
            samples,
            work,
        )
        torch.cuda.empty_cache()
        deadline = started + args.budget_s
        one_update = spec.model_copy(
            update={"algorithm": spec.algorithm.model_copy(update={"mini_batches": 1})}
        )  # one trajectory per step: one mini-batch
        result["throughput"] = throughput(
            one_update,
            work,
            args.bench_shapes,
            args.bench_tokens,
            deadline,
            saves=result["checkpoint_saves"] if args.bench_checkpoint else None,
        )
    else:
        result["throughput"] = []
    torch.distributed.destroy_process_group()
    result["torch_step"] = torch_backend_step()
    result["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
