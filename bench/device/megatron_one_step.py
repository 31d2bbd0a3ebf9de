"""One GRPO-shaped training step of a small megatron-core GPTModel on one GPU (prepared for a
lent accelerator; NOT run in this repository's CI, and not yet run anywhere).

    python bench/device/megatron_one_step.py [--layers 2 --hidden 256 --heads 4 --seq 512]

What it checks: model construction from parallel sizes (TP=PP=CP=EP=1 on one GPU), a forward and
backward of the clipped GRPO loss from ``agentrl.trainer.loss`` on random token ids with random
advantages, one optimizer step, and a ``torch_dist`` checkpoint save. It prints the step time
and peak memory. Requires the ``megatron`` and ``training`` extras and a CUDA/ROCm device.

agentrl has no megatron backend module yet (``trainer.backend: megatron`` is not implemented);
this script is the first device check for it.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()

    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_config import TransformerConfig

    from agentrl.api.trainer import Algorithm
    from agentrl.trainer.loss import grpo_loss

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29512")
    torch.distributed.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(0)
    config = TransformerConfig(
        num_layers=args.layers,
        hidden_size=args.hidden,
        num_attention_heads=args.heads,
        use_cpu_initialization=True,
        pipeline_dtype=torch.float32,
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=args.vocab,
        max_sequence_length=args.seq,
    ).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

    ids = torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda")
    positions = torch.arange(args.seq, device="cuda").unsqueeze(0).expand(args.batch, -1)
    mask = torch.ones(args.batch, 1, args.seq, args.seq, dtype=torch.bool, device="cuda").tril()
    torch.cuda.synchronize()
    start = time.monotonic()
    logits = model(ids, positions, ~mask)  # [b, s, v]
    logp_all = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    logp = logp_all.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1).flatten()
    old = logp.detach()
    loss, stats = grpo_loss(
        logp=logp,
        logp_old=old,
        logp_engine=old + 0.01 * torch.randn_like(old),
        advantages=torch.randn(args.batch, device="cuda").repeat_interleave(args.seq - 1),
        mask=torch.ones_like(old),
        seq_index=torch.arange(args.batch, device="cuda").repeat_interleave(args.seq - 1),
        num_seqs=args.batch,
        algorithm=Algorithm(),
    )
    loss.backward()
    optimizer.step()
    torch.cuda.synchronize()
    step = time.monotonic() - start
    with tempfile.TemporaryDirectory() as ckpt:
        dist_checkpointing.save(model.sharded_state_dict(prefix=""), ckpt)
        saved = sorted(os.listdir(ckpt))
    print(f"step {step:.3f}s loss {float(loss.detach()):.4f} ess {stats.ess:.3f} "
          f"peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB ckpt files {len(saved)}")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
