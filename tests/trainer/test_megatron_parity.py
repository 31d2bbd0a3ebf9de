"""The megatron model's forward on a CPU against transformers for the same weights: dense Qwen3
and Qwen3-MoE, ``config.json`` written by transformers 5 (``save_pretrained``) or in the old
style, fp32; several trajectories packed into one micro-batch (the backend's own forward step)
against each trajectory through transformers alone. Also: the start-up check of the built model,
the logits left untouched by the logprob computation, and checkpoints saved with the distributed
optimizer's metadata.

megatron-core 0.16 asks CUDA for "the current device" in its rotary embedding (to move the
frequencies there once); on a host without a GPU the tests answer "cpu" (``torch.cuda.
current_device`` patched), which is the only change: the model, the SDPA core attention, the MoE
router (with ``te_general_gemm`` defined as None, as on a GPU without Transformer Engine) and the
packed rotary embedding are megatron's and the backend's own code.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core", reason="the megatron extra (pip install 'agentrl[megatron]')")
pytest.importorskip("transformers")

import transformers

from agentrl.api.trainer import TrainerSpec
from agentrl.trainer.batching import TokenSequence
from agentrl.trainer.hf_config import HFModelConfig, read_hf_config
from agentrl.trainer.megatron_backend import (
    MegatronBackend,
    check_built_model,
    checkpoint_metadata,
    content_metadata,
    pack_microbatches,
    packed_row,
    token_logprobs,
)
from tests.trainer.megatron_ranks import close_world, open_world

pytestmark = [
    pytest.mark.slow,  # megatron-core takes seconds to import
    # megatron's forward warns that its own callers do not pass process groups yet.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

CPU = torch.device("cpu")
TRAINER = TrainerSpec.model_validate({"backend": "megatron", "gpusPerNode": 1})
VOCAB = 96
SHAPE = {
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": VOCAB,
    "max_position_embeddings": 64,
    "rope_theta": 1e6,
}
MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16}


@pytest.fixture(scope="module")
def world() -> Iterator[None]:
    open_world()
    yield
    close_world()


@pytest.fixture
def cpu_is_current(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")


def _hf_model(tmp_path: Path, *, moe: bool, old_style: bool) -> Any:
    torch.manual_seed(0)
    if moe:
        config = transformers.Qwen3MoeConfig(**SHAPE, **MOE, norm_topk_prob=True)
        model = transformers.Qwen3MoeForCausalLM(config)
    else:
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**SHAPE))
    model.eval().save_pretrained(tmp_path)
    if old_style:  # as transformers 4 wrote it: top-level rope_theta, num_experts
        data = json.loads((tmp_path / "config.json").read_text())
        data["rope_theta"] = data.pop("rope_parameters")["rope_theta"]
        if moe:
            data["num_experts"] = data.pop("num_local_experts")
        (tmp_path / "config.json").write_text(json.dumps(data))
    return model


def _backend(hf: HFModelConfig, model_dir: Path | None) -> MegatronBackend:
    backend = MegatronBackend(
        hf, TRAINER, temperature=1.0, model_dir=model_dir, params_dtype=torch.float32
    )
    backend.model.eval()
    return backend


def _seqs(lengths: list[int]) -> list[TokenSequence]:
    g = torch.Generator().manual_seed(5)
    return [
        TokenSequence(
            index=i,
            token_ids=torch.randint(0, VOCAB, (n,), generator=g).tolist(),
            spans=[(1, n)],
            engine_logprobs=[0.0] * (n - 1),
            advantage=1.0,
            carries_loss=True,
        )
        for i, n in enumerate(lengths)
    ]


def _packed_logprobs(
    backend: MegatronBackend, seqs: list[TokenSequence], *, pad_to: int | None = None
) -> list[torch.Tensor]:
    """The backend's own micro-batch forward step (what megatron's schedule calls; the
    schedule itself is not run here: it allocates on CUDA)."""
    out: list[torch.Tensor] = []

    def keep(_: TokenSequence, lp: torch.Tensor) -> torch.Tensor:
        out.append(lp.detach())
        return lp.sum() * 0.0

    with torch.no_grad():
        logits, loss_func = backend._forward_step(
            seqs, backend.model, pad_to=pad_to, microbatches=1, loss_fn=keep, device=CPU
        )
        loss_func(logits)
    return out


def _hf_logprobs(model: Any, seq: TokenSequence) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([seq.token_ids])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    ids = torch.tensor(seq.token_ids)
    return logp[torch.arange(len(ids) - 1), ids[1:]]


@pytest.mark.parametrize("moe", [False, True], ids=["qwen3", "qwen3-moe"])
@pytest.mark.parametrize("old_style", [False, True], ids=["transformers5", "old-style"])
def test_packed_logprobs_match_transformers_for_the_same_weights(
    world: None, cpu_is_current: None, tmp_path: Path, moe: bool, old_style: bool
) -> None:
    model = _hf_model(tmp_path, moe=moe, old_style=old_style)
    hf = read_hf_config(tmp_path)
    assert hf.rope_theta == 1e6 and hf.is_moe == moe
    backend = _backend(hf, tmp_path)
    seqs = _seqs([7, 12, 5])
    got = _packed_logprobs(backend, seqs)  # one row of 24 tokens, positions restarting
    for seq, lp in zip(seqs, got, strict=True):
        torch.testing.assert_close(lp, _hf_logprobs(model, seq), rtol=0, atol=2e-5)
    # Padded to a pipeline's fixed width: the padding is a sequence of its own, nothing moves.
    padded = _packed_logprobs(backend, seqs, pad_to=40)
    for a, b in zip(got, padded, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_the_rope_base_of_the_old_reading_is_visibly_wrong(
    world: None, cpu_is_current: None, tmp_path: Path
) -> None:
    # What reading rope_theta from a transformers 5 file used to give: 10,000. The test above
    # would see it: the logprobs move by far more than its tolerance.
    model = _hf_model(tmp_path, moe=False, old_style=False)
    wrong = read_hf_config(tmp_path).model_copy(update={"rope_theta": 10_000.0})
    seq = _seqs([24])[0]
    lp = _packed_logprobs(_backend(wrong, tmp_path), [seq])[0]
    assert float((lp - _hf_logprobs(model, seq)).abs().max()) > 1e-3


def test_a_built_model_is_checked_against_the_hf_config_field_by_field(world: None) -> None:
    hf = HFModelConfig.model_validate(
        {"architectures": ["Qwen3MoeForCausalLM"], **SHAPE, **MOE, "rms_norm_eps": 1e-5}
    )
    backend = _backend(hf, None)
    check_built_model(hf, backend.model)  # built from it: no error
    other = hf.model_copy(update={"rope_theta": 10_000.0, "num_experts": 8, "head_dim": 8})
    with pytest.raises(ValueError) as caught:
        check_built_model(other, backend.model)
    message = str(caught.value)
    assert "rotary_base: built" in message and "config.json says 10000.0" in message
    assert "num_moe_experts: built 4, config.json says 8" in message
    assert "kv_channels: built 16, config.json says 8" in message
    assert "hidden_size" not in message


def test_token_logprobs_leave_fp32_logits_as_they_were(world: None) -> None:
    logits = torch.randn(1, 5, VOCAB)
    before = logits.clone()
    token_logprobs(logits, torch.randint(0, VOCAB, (1, 5)), temperature=1.0)
    assert torch.equal(logits, before)


def test_micro_batches_pack_consecutive_trajectories_up_to_the_budget() -> None:
    assert pack_microbatches([5, 4, 3, 9, 2], 10) == [[0, 1], [2], [3], [4]]
    assert pack_microbatches([12, 1], 10) == [[0], [1]]  # too long: a micro-batch of its own
    row = packed_row([[7, 8, 9], [4, 5]], pad_to=8)
    assert row.token_ids == [7, 8, 9, 4, 5, 0, 0, 0]
    assert row.position_ids == [0, 1, 2, 0, 1, 0, 1, 2]
    assert row.cu_seqlens == [0, 3, 5, 8]
    assert row.offsets == [0, 3]
    assert row.max_seqlen == 3


def test_checkpoints_carry_the_distributed_optimizer_metadata(
    world: None, tmp_path: Path
) -> None:
    from megatron.core import dist_checkpointing, parallel_state

    metadata = checkpoint_metadata()
    assert metadata["distrib_optim_sharding_type"] == "dp_reshardable"
    assert metadata["singleton_local_shards"] is False
    assert metadata["chained_optim_avoid_prefix"] is True
    assert metadata["dp_cp_group"] is parallel_state.get_data_parallel_group(
        with_context_parallel=True
    )

    hf = HFModelConfig.model_validate({"architectures": ["Qwen3MoeForCausalLM"], **SHAPE, **MOE})
    backend = _backend(hf, None)
    backend.iteration = 3
    before = {k: v.clone() for k, v in backend.model.named_parameters()}
    backend.save_state(tmp_path)
    assert dist_checkpointing.load_content_metadata(str(tmp_path / "model")) == {
        "distrib_optim_sharding_type": "dp_reshardable",
        "singleton_local_shards": False,
        "chained_optim_avoid_prefix": True,
    } == content_metadata(metadata)
    with torch.no_grad():
        for p in backend.model.parameters():
            p.add_(1.0)
    backend.iteration = 0
    backend.load_state(tmp_path)
    assert backend.iteration == 3
    assert all(torch.equal(p, before[n]) for n, p in backend.model.named_parameters())
