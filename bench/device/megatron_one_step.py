"""The pieces only an accelerator runs, on one GPU, as ONE JSON line (prepared for a lent
accelerator; NOT run in this repository's CI; its CPU part runs in the unit tests).

    python bench/device/megatron_one_step.py [--layers 2 --hidden 256 --heads 4 --kv-heads 2
        --vocab 1024 --seq 512 --trajectories 8 --steps 2 --experts 0]
    python bench/device/megatron_one_step.py --cpu      # what a host without a GPU can check

1. **megatron-core steps** — :class:`agentrl.trainer.megatron_backend.MegatronBackend` driven as
   the trainer pod drives it on rank 0, world size 1 (TP=PP=CP=EP=1), nccl: a GPTModel built from
   a Qwen2-shaped ``config.json`` written here (``--experts N``: Qwen3-MoE-shaped), random
   weights, trajectories with random token ids, a loss mask over the second half and engine
   logprobs near the model's own, then ``train_step`` (logprob recomputation and
   distributed-optimizer updates on the clipped, importance-corrected GRPO loss), a
   ``torch_dist`` checkpoint save and load (weights and step counter compared) and the HF export.
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

``--cpu`` runs the same script without a GPU: gloo instead of nccl, float32, no megatron step
(megatron-core's forward needs CUDA) — model build, checkpoint round trip, export, the push to
the receiver process and the torch step. Requires the ``megatron`` and ``training`` extras.
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


def _samples(args: argparse.Namespace) -> list[Any]:
    from agentrl.api.rollout import ClassAction, TerminalClass
    from agentrl.rollout.trajectory import Trajectory
    from agentrl.trainer.batching import TrainSample

    rng = random.Random(0)
    half = args.seq // 2
    samples = []
    for i in range(args.trajectories):
        ids = [rng.randrange(args.vocab) for _ in range(args.seq)]
        mask = [0] * half + [1] * (args.seq - half)
        # Engine logprobs near the model's (uniform-ish at random init): log(1/V) ± noise.
        lps = [0.0] * half + [
            -math.log(args.vocab) + rng.gauss(0, 0.05) for _ in range(args.seq - half)
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


def main() -> None:
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
        "--cpu",
        "--dry-run",
        dest="cpu",
        action="store_true",
        help="no GPU: gloo, float32, no megatron step; everything else as on the GPU",
    )
    args = parser.parse_args()

    from agentrl.api.trainer import TrainerSpec
    from agentrl.trainer.hf_config import read_hf_config
    from agentrl.trainer.megatron_backend import MegatronBackend, initialize_parallel

    gpu = not args.cpu
    if gpu:
        torch.cuda.set_device(0)
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
    initialize_parallel(spec)
    work = Path(tempfile.mkdtemp(prefix="megatron-one-step-"))
    (work / "hf").mkdir()
    (work / "hf" / "config.json").write_text(json.dumps(_config(args)))
    backend = MegatronBackend(
        read_hf_config(work / "hf"),
        spec,
        temperature=1.0,
        model_dir=work / "hf",
        params_dtype=torch.bfloat16 if gpu else torch.float32,
    )
    result: dict[str, Any] = {
        "mode": "gpu" if gpu else "cpu",
        "device": torch.cuda.get_device_name(0) if gpu else "cpu",
        "model": _config(args)["architectures"][0],
    }

    steps = []
    if gpu:
        samples = _samples(args)
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
    before = {k: v.detach().clone() for k, v in backend.model.named_parameters()}
    backend.save_state(work / "ckpt")
    with torch.no_grad():
        for p in backend.model.parameters():
            p.add_(1.0)
    iteration = backend.iteration
    backend.iteration = 0
    backend.load_state(work / "ckpt")
    result["checkpoint_restored_weights"] = all(
        torch.equal(p, before[n]) for n, p in backend.model.named_parameters()
    )
    result["checkpoint_restored_iteration"] = backend.iteration == iteration == len(steps)
    backend.export_weights(work / "export")
    result["exported_files"] = sorted(p.name for p in (work / "export").iterdir())
    result["push"] = push_to_receiver(backend, work / "export", work)
    torch.distributed.destroy_process_group()
    result["torch_step"] = torch_backend_step()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
