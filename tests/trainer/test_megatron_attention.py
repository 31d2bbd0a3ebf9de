"""The SDPA core attention against megatron-core's own unfused ``DotProductAttention`` (the module
it replaces in the local layer spec) on the same inputs, with GQA; packed input against each
sequence attended on its own; the activation-recompute choice; the packing of a micro-batch.

megatron's ``DotProductAttention`` runs on a CPU here with two arrangements that do not change
its arithmetic: its scratch buffer (``GlobalMemoryBuffer``, allocated on the current CUDA device)
is given a CPU tensor beforehand, and its RNG fork around attention dropout (p = 0 here) is a
no-op context (the model-parallel CUDA RNG states need a GPU).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core", reason="the megatron extra (pip install 'agentrl[megatron]')")

from tests.trainer.megatron_ranks import close_world, open_world

pytestmark = pytest.mark.slow  # megatron-core takes seconds to import

HEADS, GROUPS, HEAD_DIM = 4, 2, 8


@pytest.fixture(scope="module")
def world() -> Iterator[None]:
    open_world()
    yield
    close_world()


def _config(**overrides: Any) -> Any:
    from megatron.core.transformer.transformer_config import TransformerConfig

    kwargs: dict[str, Any] = {
        "num_layers": 1,
        "hidden_size": HEADS * HEAD_DIM,
        "num_attention_heads": HEADS,
        "num_query_groups": GROUPS,
        "kv_channels": HEAD_DIM,
        "attention_dropout": 0.0,
        "hidden_dropout": 0.0,
        "use_cpu_initialization": True,
        "params_dtype": torch.float32,
    }
    kwargs.update(overrides)
    with __import__("warnings").catch_warnings():
        __import__("warnings").simplefilter("ignore")
        return TransformerConfig(**kwargs)


def _megatron_reference(config: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    buffer = parallel_state.get_global_memory_buffer()
    monkeypatch.setitem(buffer.buffer, ("mpu", torch.float32), torch.empty(1 << 16))
    tracker = tensor_parallel.get_cuda_rng_tracker()
    monkeypatch.setattr(tracker, "fork", lambda *a, **k: contextlib.nullcontext())
    return DotProductAttention(config, 1, AttnMaskType.causal, "self").eval()


def _sdpa(config: Any) -> Any:
    from megatron.core.transformer.enums import AttnMaskType

    from agentrl.trainer.megatron_attention import SDPACoreAttention

    return SDPACoreAttention(config, 1, AttnMaskType.causal, "self").eval()


def _qkv(s: int, b: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(s, b, HEADS, HEAD_DIM, generator=g)
    k = torch.randn(s, b, GROUPS, HEAD_DIM, generator=g)
    v = torch.randn(s, b, GROUPS, HEAD_DIM, generator=g)
    return q, k, v


def _causal_mask(s: int) -> torch.Tensor:
    return torch.ones(1, 1, s, s, dtype=torch.bool).triu(diagonal=1)  # True = masked


def test_sdpa_equals_megatrons_unfused_attention_with_gqa_and_a_causal_mask(
    world: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config()
    q, k, v = _qkv(9, 2)
    with torch.no_grad():
        want = _megatron_reference(config, monkeypatch)(q, k, v, _causal_mask(9))
        ours = _sdpa(config)
        got_masked = ours(q, k, v, _causal_mask(9))
        got_causal = ours(q, k, v, None)  # no mask: causal from attn_mask_type
    assert want.shape == got_masked.shape == (9, 2, HEADS * HEAD_DIM)
    torch.testing.assert_close(got_masked, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_causal, want, rtol=1e-5, atol=1e-5)


def test_query_heads_share_their_groups_key_and_value_as_megatron_maps_them(
    world: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Query heads 0 and 1 read group 0, heads 2 and 3 group 1: with group 1's values zero,
    # heads 2 and 3 output zeros and heads 0 and 1 do not.
    config = _config()
    q, k, v = _qkv(5, 1, seed=3)
    v[:, :, 1] = 0.0
    with torch.no_grad():
        out = _sdpa(config)(q, k, v, None).view(5, 1, HEADS, HEAD_DIM)
        want = _megatron_reference(config, monkeypatch)(q, k, v, _causal_mask(5))
    assert float(out[:, :, 2:].abs().max()) == 0.0
    assert float(out[:, :, :2].abs().max()) > 0.0
    torch.testing.assert_close(out.reshape(5, 1, -1), want, rtol=1e-5, atol=1e-5)


def test_packed_sequences_attend_only_within_themselves(
    world: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from megatron.core.packed_seq_params import PackedSeqParams

    config = _config()
    lengths = [4, 7, 1, 5]
    parts = [_qkv(n, 1, seed=10 + i) for i, n in enumerate(lengths)]
    # thd: [t, heads, dim], as megatron's attention hands packed tensors to its core.
    q, k, v = (torch.cat([p[j] for p in parts]).squeeze(1) for j in range(3))
    cu = torch.tensor([0, 4, 11, 12, 17], dtype=torch.int32)
    params = PackedSeqParams(
        qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=7, max_seqlen_kv=7
    )
    reference = _megatron_reference(config, monkeypatch)
    with torch.no_grad():
        packed = _sdpa(config)(q, k, v, None, packed_seq_params=params)
        alone = [reference(*p, _causal_mask(n))[:, 0] for p, n in zip(parts, lengths, strict=True)]
    assert packed.shape == (17, HEADS * HEAD_DIM)
    torch.testing.assert_close(packed, torch.cat(alone), rtol=1e-5, atol=1e-5)
    # Without the boundaries the last sequence would see the others: the outputs would differ.
    whole = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    with torch.no_grad():
        crossing = reference(whole[0], whole[1], torch.cat([p[2] for p in parts]), _causal_mask(17))
    assert not torch.allclose(crossing[12:, 0], packed[12:], atol=1e-3)


def test_gradients_flow_through_packed_attention(world: None) -> None:
    from megatron.core.packed_seq_params import PackedSeqParams

    q, k, v = (x.squeeze(1).requires_grad_() for x in _qkv(6, 1))
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu)
    _sdpa(_config())(q, k, v, None, packed_seq_params=params).sum().backward()
    assert q.grad is not None and k.grad is not None and v.grad is not None
    # Sequence 0 (tokens 0-1) never attends to sequence 1: its keys get no gradient from it.
    assert float(k.grad[:2].abs().sum()) > 0.0


def test_the_local_layer_spec_uses_the_sdpa_core(world: None) -> None:
    from agentrl.trainer.megatron_attention import SDPACoreAttention, local_layer_spec

    spec = local_layer_spec(num_experts=None, qk_layernorm=True)
    assert spec.submodules.self_attention.submodules.core_attention is SDPACoreAttention


@pytest.mark.parametrize(
    ("mode", "tokens", "expected"),
    [
        ("auto", 4096, {}),
        ("auto", 16384, {"recompute_granularity": "full", "recompute_method": "uniform",
                         "recompute_num_layers": 1}),
        ("full", 10, {"recompute_granularity": "full", "recompute_method": "uniform",
                      "recompute_num_layers": 1}),
        ("selective", 10, {"recompute_granularity": "selective"}),
        ("none", 10**6, {}),
    ],
)  # fmt: skip
def test_activation_recompute_is_full_for_long_micro_batches_or_as_chosen(
    mode: str, tokens: int, expected: dict[str, object]
) -> None:
    from agentrl.trainer.megatron_attention import recompute_kwargs

    assert recompute_kwargs(mode, max_tokens=tokens) == expected


def test_the_recompute_settings_are_ones_megatron_accepts(world: None) -> None:
    from agentrl.trainer.megatron_attention import recompute_kwargs

    for mode in ("full", "selective"):
        config = _config(**recompute_kwargs(mode, max_tokens=0))
        assert config.recompute_granularity == mode
