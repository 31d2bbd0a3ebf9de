"""Weight export and the distributed weight push of the megatron backend with pipeline and
expert parallelism (and tensor parallelism, whose gathered shapes the push announces), on CPU:
gloo ranks spawned on loopback, megatron-core's real ``parallel_state`` groups, a tiny
Qwen3-MoE-style GPT (local layer spec, ``SequentialMLP`` experts: no grouped GEMM, no
Transformer Engine).

The unsharded model is the HF state dict this test writes from a seeded generator; every rank
loads its shard of it (its pipeline stage's layers, its expert-parallel rank's experts, its
tensor-parallel piece). What comes back — the safetensors files the ranks export, and what an
engine holds after a distributed push — must be that state dict: the same names, every tensor
``torch.equal``.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core", reason="the megatron extra (pip install 'agentrl[megatron]')")

from safetensors.torch import load_file, save_file

from tests.trainer import megatron_ranks

pytestmark = pytest.mark.slow  # spawns ranks that import megatron-core

LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, EXPERTS, EXPERT_FFN, VOCAB = 2, 8, 4, 2, 4, 4, 6, 32
CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "num_hidden_layers": LAYERS,
    "hidden_size": HIDDEN,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "intermediate_size": 16,
    "moe_intermediate_size": EXPERT_FFN,
    "num_experts": EXPERTS,
    "num_experts_per_tok": 2,
    "vocab_size": VOCAB,
    "max_position_embeddings": 32,
    "tie_word_embeddings": False,
}


def hf_state() -> dict[str, torch.Tensor]:
    """The whole model in HF names and shapes (Qwen3-MoE's checkpoint layout), written down
    here rather than taken from the code under test."""
    g = torch.Generator().manual_seed(1234)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    state = {"model.embed_tokens.weight": rand(VOCAB, HIDDEN)}
    for layer in range(LAYERS):
        p = f"model.layers.{layer}."
        state[p + "input_layernorm.weight"] = rand(HIDDEN)
        state[p + "self_attn.q_proj.weight"] = rand(HEADS * HEAD_DIM, HIDDEN)
        state[p + "self_attn.k_proj.weight"] = rand(KV_HEADS * HEAD_DIM, HIDDEN)
        state[p + "self_attn.v_proj.weight"] = rand(KV_HEADS * HEAD_DIM, HIDDEN)
        state[p + "self_attn.o_proj.weight"] = rand(HIDDEN, HEADS * HEAD_DIM)
        state[p + "self_attn.q_norm.weight"] = rand(HEAD_DIM)
        state[p + "self_attn.k_norm.weight"] = rand(HEAD_DIM)
        state[p + "post_attention_layernorm.weight"] = rand(HIDDEN)
        state[p + "mlp.gate.weight"] = rand(EXPERTS, HIDDEN)
        for e in range(EXPERTS):
            state[p + f"mlp.experts.{e}.gate_proj.weight"] = rand(EXPERT_FFN, HIDDEN)
            state[p + f"mlp.experts.{e}.up_proj.weight"] = rand(EXPERT_FFN, HIDDEN)
            state[p + f"mlp.experts.{e}.down_proj.weight"] = rand(HIDDEN, EXPERT_FFN)
    state["model.norm.weight"] = rand(HIDDEN)
    state["lm_head.weight"] = rand(VOCAB, HIDDEN)
    return state


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> list[str]:
    """Names whose tensors differ (or are missing on either side)."""
    bad = sorted(set(got) ^ set(want))
    bad += [n for n in sorted(set(got) & set(want)) if not torch.equal(got[n], want[n])]
    return bad


@pytest.mark.parametrize(
    ("world", "parallelism", "writers"),
    [
        # pp2: one owner per stage.
        (2, {"pipeline": 2}, 2),
        # ep2 (data-parallel 2): rank 0 owns the dense part and experts 0-1, rank 1 experts 2-3.
        (2, {"expert": 2}, 2),
        # pp2 × ep2 (data-parallel 2 per stage): every rank owns the experts of its stage and
        # expert-parallel rank; ranks 0 and 2 also own their stage's dense part.
        (4, {"pipeline": 2, "expert": 2}, 4),
        # tp2: one owner (tensor-parallel rank 0) gathers both halves of every sharded tensor,
        # the experts' included (expert tensor parallelism is the tensor-parallel size).
        (2, {"tensor": 2}, 1),
    ],
    ids=["pp2", "ep2", "pp2-ep2", "tp2"],
)
def test_export_and_push_return_the_unsharded_models_tensors(
    tmp_path: Path, world: int, parallelism: dict[str, int], writers: int
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(CONFIG))
    want = hf_state()
    save_file(want, str(model / "model.safetensors"))
    assert len(want) == 3 + LAYERS * (9 + 3 * EXPERTS)  # 45 tensors

    torch.multiprocessing.spawn(
        megatron_ranks.run_rank,
        args=(world, _free_port(), _free_port(), parallelism, str(model), str(tmp_path)),
        nprocs=world,
        join=True,
    )

    export = tmp_path / "export"
    files = sorted(export.glob("*.safetensors"))
    assert len(files) == writers
    exported: dict[str, torch.Tensor] = {}
    for f in files:
        part = load_file(str(f))
        assert not set(part) & set(exported), f"{f.name} repeats tensors of another shard"
        exported.update(part)
    assert _same(exported, want) == []
    index = json.loads((export / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(want)
    assert {index["weight_map"][n] for n in want} == {f.name for f in files}
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in want.values())
    assert (export / "config.json").is_file()

    pushed = torch.load(tmp_path / "pushed.pt")
    assert pushed["failed"] == []
    assert pushed["version"] == "1"
    assert _same(pushed["tensors"], want) == []
