"""Real GRPO steps of the megatron backend on one GPU (prepared for a lent accelerator; NOT run
in this repository's CI, and not yet run anywhere).

    python bench/device/megatron_one_step.py [--layers 2 --hidden 256 --heads 4 --kv-heads 2
                                              --vocab 1024 --seq 512 --trajectories 8 --steps 2]

It drives :class:`agentrl.trainer.megatron_backend.MegatronBackend` exactly as the trainer pod
does on rank 0, world size 1 (TP=PP=CP=EP=1): a GPTModel built from a Qwen2-shaped
``config.json`` written here (random weights), trajectories with random token ids, a loss mask
over the second half and engine logprobs near the model's own, then ``train_step`` (logprob
recomputation + one distributed-optimizer update on the clipped, importance-corrected GRPO loss),
a ``torch_dist`` checkpoint save and load (weights and step counter compared), and an HF export.
It prints one JSON object: per-step seconds (recompute / update), loss, grad norm, ESS, peak GPU
memory, and whether the checkpoint round trip restored the weights exactly.

Requires the ``megatron`` and ``training`` extras and a CUDA/ROCm device.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import tempfile
from pathlib import Path

import torch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    parser.add_argument(
        "--mini-batches",
        type=int,
        default=2,
        help="trainer.algorithm.miniBatches: updates after the first are off-policy, so their "
        "clip fraction (printed per step) shows the PPO clip acting on a GPU",
    )
    args = parser.parse_args()

    from agentrl.api.rollout import ClassAction, TerminalClass
    from agentrl.api.trainer import TrainerSpec
    from agentrl.rollout.trajectory import Trajectory
    from agentrl.trainer.batching import TrainSample
    from agentrl.trainer.hf_config import read_hf_config
    from agentrl.trainer.megatron_backend import MegatronBackend, initialize_parallel

    torch.cuda.set_device(0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    torch.distributed.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
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
    (work / "hf" / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["Qwen2ForCausalLM"],
                "num_hidden_layers": args.layers,
                "hidden_size": args.hidden,
                "num_attention_heads": args.heads,
                "num_key_value_heads": args.kv_heads,
                "intermediate_size": args.ffn,
                "vocab_size": args.vocab,
                "max_position_embeddings": args.seq,
            }
        )
    )
    backend = MegatronBackend(
        read_hf_config(work / "hf"),
        spec,
        temperature=1.0,
        model_dir=work / "hf",
        params_dtype=torch.bfloat16,
    )
    rng = random.Random(0)
    half = args.seq // 2
    samples = []
    for i in range(args.trajectories):
        ids = [rng.randrange(args.vocab) for _ in range(args.seq)]
        mask = [0] * half + [1] * (args.seq - half)
        # Engine logprobs near the model's (uniform-ish at random init): log(1/V) ± noise.
        lps = [0.0] * half + [
            -float(torch.log(torch.tensor(args.vocab))) + rng.gauss(0, 0.05)
            for _ in range(args.seq - half)
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

    steps = []
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
    before = {k: v.detach().clone() for k, v in backend.model.named_parameters()}
    backend.save_state(work / "ckpt")
    with torch.no_grad():
        for p in backend.model.parameters():
            p.add_(1.0)
    iteration = backend.iteration
    backend.iteration = 0
    backend.load_state(work / "ckpt")
    restored = all(torch.equal(p, before[n]) for n, p in backend.model.named_parameters())
    backend.export_weights(work / "export")
    print(
        json.dumps(
            {
                "steps": steps,
                "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
                "checkpoint_restored_weights": restored,
                "checkpoint_restored_iteration": backend.iteration == iteration == args.steps,
                "exported_files": sorted(p.name for p in (work / "export").iterdir()),
                "device": torch.cuda.get_device_name(0),
            }
        )
    )
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
