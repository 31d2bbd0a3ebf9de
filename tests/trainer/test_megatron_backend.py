"""The megatron backend on CPU (gloo, world size 1): model construction from an HF config and the
spec, ``torch_dist`` checkpoints, HF weight conversion, and the GRPO loss on logits.

megatron-core's forward pass needs a GPU (its rotary embedding calls
``torch.cuda.current_device()``), so the loss is checked from logits given by hand; the full step
runs in ``bench/device/megatron_one_step.py`` on a lent GPU.
"""

from __future__ import annotations

import json
import math
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core", reason="the megatron extra (pip install 'agentrl[megatron]')")

from agentrl.api.trainer import (
    Algorithm,
    CorrectionMode,
    LossAggregation,
    OffPolicyCorrection,
    TrainerSpec,
)
from agentrl.trainer import megatron_weights
from agentrl.trainer.batching import TokenSequence
from agentrl.trainer.hf_config import HFModelConfig, read_hf_config
from agentrl.trainer.loss import grpo_loss
from agentrl.trainer.megatron_backend import (
    MegatronBackend,
    initialize_parallel,
    microbatch_weights,
    token_logprobs,
)

pytestmark = pytest.mark.slow  # megatron-core takes seconds to import

TRAINER = TrainerSpec.model_validate({"backend": "megatron", "gpusPerNode": 1})

# Qwen2-style: GQA (4 query heads over 2 key/value groups) and a bias on q/k/v only.
DENSE = {
    "architectures": ["Qwen2ForCausalLM"],
    "num_hidden_layers": 2,
    "hidden_size": 16,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 24,
    "vocab_size": 64,
    "max_position_embeddings": 32,
}
# Qwen3-MoE-style: q/k norms, head_dim given, 4 experts of FFN 6.
MOE = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "num_hidden_layers": 1,
    "hidden_size": 8,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 4,
    "intermediate_size": 16,
    "moe_intermediate_size": 6,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "vocab_size": 32,
    "max_position_embeddings": 32,
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def parallel() -> Iterator[None]:
    from megatron.core import parallel_state

    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
    )
    initialize_parallel(TRAINER)
    yield
    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()


def _backend(config: dict[str, object], **kwargs: object) -> MegatronBackend:
    return MegatronBackend(
        HFModelConfig.model_validate(config),
        TRAINER,
        temperature=1.0,
        params_dtype=torch.float32,
        **kwargs,  # type: ignore[arg-type]
    )


def _count(backend: MegatronBackend) -> int:
    return sum(p.numel() for p in backend.model.parameters())


def test_a_dense_gqa_model_has_the_parameter_count_worked_out_by_hand(parallel: None) -> None:
    # head_dim = 16 / 4 = 4; q/k/v rows = (4 query heads + 2 × 2 kv groups) × 4 = 32.
    per_layer = (
        32 * 16  # linear_qkv weight
        + 32  # linear_qkv bias (Qwen2)
        + 16 * 16  # linear_proj
        + 16  # input RMSNorm
        + 16  # pre-MLP RMSNorm
        + 2 * 24 * 16  # linear_fc1 = [gate; up]
        + 24 * 16  # linear_fc2
    )  # = 1984
    total = 2 * per_layer + 64 * 16 + 16 + 64 * 16  # layers, embedding, final norm, lm head
    assert total == 6032
    assert _count(_backend(DENSE)) == total


def test_a_moe_model_builds_its_router_and_every_expert(parallel: None) -> None:
    per_layer = (
        (2 + 2 * 1) * 4 * 8  # linear_qkv: (2 query heads + 2 × 1 kv group) × head_dim 4 rows
        + 8 * (2 * 4)  # linear_proj: hidden × (heads × head_dim)
        + 4
        + 4  # q and k RMSNorm over head_dim
        + 8
        + 8  # input and pre-MLP RMSNorm
        + 4 * 8  # router: one row per expert
        + 4 * (2 * 6 * 8 + 8 * 6)  # 4 experts of fc1 [gate; up] and fc2
    )  # = 824
    assert _count(_backend(MOE)) == per_layer + 32 * 8 + 8 + 32 * 8 == 1344


def test_a_checkpoint_round_trip_restores_identical_weights_and_the_step_counter(
    parallel: None, tmp_path: Path
) -> None:
    backend = _backend(DENSE)
    backend.iteration = 5
    before = {k: v.clone() for k, v in backend.model.state_dict().items() if v is not None}
    backend.save_state(tmp_path)
    assert (tmp_path / "model" / "metadata.json").is_file()
    assert (
        json.loads((tmp_path / "model" / "metadata.json").read_text())["sharded_backend"]
        == "torch_dist"
    )
    with torch.no_grad():
        for p in backend.model.parameters():
            p.add_(1.0)
    backend.iteration = 0

    backend.load_state(tmp_path)

    assert backend.iteration == 5
    after = backend.model.state_dict()
    assert [k for k, v in before.items() if isinstance(v, torch.Tensor)] and all(
        torch.equal(v, after[k]) for k, v in before.items() if isinstance(v, torch.Tensor)
    )


def test_qkv_rows_split_per_group_into_q_k_and_v() -> None:
    # 4 query heads over 2 groups, head_dim 1: each group's rows are [q, q, k, v].
    hf = HFModelConfig.model_validate({**DENSE, "hidden_size": 4})
    qkv = torch.arange(8.0).unsqueeze(1)
    q, k, v = megatron_weights.split_qkv(qkv, hf)
    assert q.flatten().tolist() == [0, 1, 4, 5]
    assert k.flatten().tolist() == [2, 6]
    assert v.flatten().tolist() == [3, 7]
    assert torch.equal(megatron_weights.merge_qkv(q, k, v, hf), qkv)


def test_a_gated_fc1_shards_gate_and_up_halves_to_each_tensor_parallel_rank() -> None:
    # Rows g0 g1 | u0 u1: rank 0 holds [g0; u0], rank 1 [g1; u1].
    fc1 = torch.tensor([[10.0], [11.0], [20.0], [21.0]])
    name = "decoder.layers.0.mlp.linear_fc1.weight"
    pieces = [megatron_weights.shard(name, fc1, partition_dim=0, rank=r, size=2) for r in (0, 1)]
    assert [p.flatten().tolist() for p in pieces] == [[10, 20], [11, 21]]
    assert torch.equal(megatron_weights.unshard(name, pieces, partition_dim=0), fc1)


def test_exported_hf_weights_load_back_into_a_fresh_model_unchanged(
    parallel: None, tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(DENSE))
    trained = _backend(DENSE)
    trained.export_weights(tmp_path)
    names = set()
    for f in tmp_path.glob("*.safetensors"):
        from safetensors.torch import load_file

        names |= set(load_file(str(f)))
    assert "model.layers.1.self_attn.k_proj.bias" in names
    assert "model.layers.0.mlp.gate_proj.weight" in names
    # Per layer: q, k, v weights and biases, o, 2 norms, gate, up, down = 12;
    # plus embedding, final norm and lm head.
    assert len(names) == 2 * 12 + 3

    fresh = _backend(read_hf_config(tmp_path).model_dump(), model_dir=tmp_path)
    want = dict(trained.model.named_parameters())
    assert all(torch.equal(p, want[n]) for n, p in fresh.model.named_parameters())


def test_token_logprobs_are_of_the_temperature_scaled_softmax(parallel: None) -> None:
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]])  # p(1) = 3/4
    targets = torch.tensor([[1, 0]])
    got = token_logprobs(logits, targets, temperature=1.0)
    assert got.tolist()[0] == pytest.approx([math.log(0.75), math.log(0.25)])
    # At T = 2 the logits halve: p(1) = √3 / (1 + √3).
    hot = token_logprobs(logits, targets, temperature=2.0)
    assert float(hot[0, 0]) == pytest.approx(math.log(math.sqrt(3) / (1 + math.sqrt(3))))


def test_the_grpo_loss_on_logits_clips_a_ratio_above_one_plus_clip_high(parallel: None) -> None:
    logits = torch.tensor([[[0.0, math.log(3.0)], [math.log(3.0), 0.0]]], requires_grad=True)
    logp = token_logprobs(logits, torch.tensor([[1, 0]]), temperature=1.0)[0]
    old = logp.detach() - math.log(1.5)  # ratio 1.5 on both tokens
    loss, stats = grpo_loss(
        logp=logp,
        logp_old=old,
        logp_engine=old,  # no train/inference mismatch: importance weight 1
        advantages=torch.tensor([0.5, 0.5]),
        mask=torch.ones(2),
        seq_index=torch.zeros(2, dtype=torch.long),
        num_seqs=1,
        algorithm=Algorithm(),
    )
    # -min(1.5 × 0.5, clamp(1.5, 0.8, 1.28) × 0.5) = -0.64 per token; token-mean = -0.64.
    assert float(loss.detach()) == pytest.approx(-0.64)
    assert stats.clip_fraction == 1.0
    loss.backward()
    assert logits.grad is not None and float(logits.grad.abs().sum()) == 0.0  # clipped: no grad


def _seq(index: int, n: int, *, loss: bool = True) -> TokenSequence:
    return TokenSequence(
        index=index,
        token_ids=list(range(n + 1)),
        spans=[(1, n + 1)],
        engine_logprobs=[-1.0] * n,
        advantage=1.0,
        carries_loss=loss,
    )


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (LossAggregation.TOKEN_MEAN, [2 / 5, 3 / 5, 0.0]),  # share of the 5 loss tokens
        (LossAggregation.SEQ_MEAN_TOKEN_MEAN, [1 / 2, 1 / 2, 0.0]),  # 2 trajectories with loss
        (LossAggregation.SEQ_MEAN_TOKEN_SUM, [1 / 2, 1 / 2, 0.0]),
    ],
)
def test_micro_batch_weights_make_per_trajectory_losses_sum_to_the_step_loss(
    mode: LossAggregation, expected: list[float]
) -> None:
    algorithm = Algorithm(
        loss_aggregation=mode,
        off_policy_correction=OffPolicyCorrection(mode=CorrectionMode.NONE),
    )
    seqs = [_seq(0, 2), _seq(1, 3), _seq(2, 2, loss=False)]
    old = [torch.full((len(s.positions),), -1.0, dtype=torch.float64) for s in seqs]
    weights = microbatch_weights(seqs, old, algorithm)
    assert weights == pytest.approx(expected)

    # The invariant: Σ weight × (loss of one trajectory) = loss of the whole step at once.
    logp = [torch.tensor(v, dtype=torch.float64) for v in ([-0.5, -2.0], [-1.2, -0.9, -1.0])]
    logp.append(torch.tensor([-0.3, -0.4], dtype=torch.float64))
    advs = [1.0, -0.5, 2.0]

    def one(i: int) -> torch.Tensor:
        n = len(logp[i])
        return grpo_loss(
            logp=logp[i],
            logp_old=old[i],
            logp_engine=old[i],
            advantages=torch.full((n,), advs[i], dtype=torch.float64),
            mask=torch.full((n,), float(seqs[i].carries_loss), dtype=torch.float64),
            seq_index=torch.zeros(n, dtype=torch.long),
            num_seqs=1,
            algorithm=algorithm,
        )[0]

    whole = grpo_loss(
        logp=torch.cat(logp),
        logp_old=torch.cat(old),
        logp_engine=torch.cat(old),
        advantages=torch.tensor([1.0] * 2 + [-0.5] * 3 + [2.0] * 2, dtype=torch.float64),
        mask=torch.tensor([1.0] * 5 + [0.0] * 2, dtype=torch.float64),
        seq_index=torch.tensor([0, 0, 1, 1, 1, 2, 2]),
        num_seqs=3,
        algorithm=algorithm,
    )[0]
    assert float(sum(w * one(i) for i, w in enumerate(weights))) == pytest.approx(float(whole))


def test_icepop_tokens_outside_the_bounds_do_not_count_in_the_token_mean() -> None:
    algorithm = Algorithm(off_policy_correction=OffPolicyCorrection(mode=CorrectionMode.ICEPOP))
    seqs = [_seq(0, 2), _seq(1, 2)]
    # Engine logprobs are all -1. Sequence 0's second token: weight exp(1 - (-1)) = e² ≈ 7.4,
    # above high = 2, so ICEPOP drops it; the other three weigh exp(0) = 1: counts 1 and 2.
    old = [torch.tensor([-1.0, 1.0]), torch.tensor([-1.0, -1.0])]
    assert microbatch_weights(seqs, old, algorithm) == pytest.approx([1 / 3, 2 / 3])


@pytest.mark.parametrize(
    ("config", "parallelism", "problem"),
    [
        (DENSE, {"expert": 2}, "parallelism.expert is 2 but the model has no experts (dense)"),
        (MOE, {"expert": 3}, "num_experts (4) must be divisible by parallelism.expert (3)"),
        (DENSE, {"pipeline": 4}, "num_hidden_layers (2) must be divisible by parallelism.pipeline"),
        (
            DENSE,
            {"tensor": 4},
            "attention heads (4) and key/value heads (2) must be divisible by parallelism.tensor",
        ),
    ],
)
def test_a_layout_the_model_cannot_be_split_into_is_refused_naming_the_field(
    config: dict[str, object], parallelism: dict[str, int], problem: str
) -> None:
    from agentrl.trainer.hf_config import check_layout

    trainer = TrainerSpec.model_validate(
        {"backend": "megatron", "gpusPerNode": 8, "parallelism": parallelism}
    )
    with pytest.raises(ValueError, match=r"spec\.trainer\.parallelism does not fit") as caught:
        check_layout(HFModelConfig.model_validate(config), trainer)
    assert problem in str(caught.value)


def test_layouts_that_divide_the_model_are_accepted() -> None:
    from agentrl.trainer.hf_config import check_layout

    for parallelism in ({"pipeline": 1}, {"expert": 4}, {"expert": 2, "tensor": 1}):
        trainer = TrainerSpec.model_validate(
            {"backend": "megatron", "gpusPerNode": 8, "parallelism": parallelism}
        )
        check_layout(HFModelConfig.model_validate(MOE), trainer)  # no error
