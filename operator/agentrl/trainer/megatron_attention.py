"""Core attention through ``torch.nn.functional.scaled_dot_product_attention`` for megatron-core's
local layer spec, and the activation-recompute settings for long trajectories.

Without Transformer Engine, megatron's local spec computes attention with ``DotProductAttention``:
unfused, it materialises the ``[batch, heads, L, L]`` scores (32 heads × 32k² × 2 bytes ≈ 69 GB
per layer) and rejects packed sequences. :class:`SDPACoreAttention` takes its place
(:func:`local_layer_spec`) with the same constructor and forward signature; torch picks the
flash or memory-efficient kernel on a GPU and the math kernel on a CPU. It supports

* grouped-query attention (key/value heads repeated per query group, as megatron does);
* causal masking (``attn_mask_type`` causal and no mask given), or a boolean mask megatron-style
  (True = masked);
* packed sequences (``PackedSeqParams`` with ``qkv_format='thd'``): several trajectories in one
  row, each attending only within itself (one kernel call per sequence, so no ``L × L`` mask is
  built); megatron's rotary embedding then restarts positions at every ``cu_seqlens`` boundary.

:func:`recompute_kwargs` chooses activation recompute (``TransformerConfig``'s
``recompute_granularity``/``recompute_method``/``recompute_num_layers``) for long sequences.

Callers: :func:`agentrl.trainer.megatron_backend.build_gpt_model`.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
import torch.nn.functional as F

#: Longest micro-batch (tokens) trained without activation recompute by default: above it the
#: activations of every layer are recomputed in the backward pass.
RECOMPUTE_ABOVE_TOKENS = 8192


def recompute_kwargs(mode: str, *, max_tokens: int) -> dict[str, Any]:
    """``TransformerConfig`` keyword arguments for activation recompute.

    ``mode``: ``"full"`` (every layer's activations recomputed, one layer at a time:
    ``recompute_granularity='full'``, ``recompute_method='uniform'``, ``recompute_num_layers=1``),
    ``"selective"`` (megatron's selective recompute of the attention core), ``"none"``, or
    ``"auto"``: full when ``max_tokens`` exceeds :data:`RECOMPUTE_ABOVE_TOKENS`, none otherwise.
    """
    if mode == "auto":
        mode = "full" if max_tokens > RECOMPUTE_ABOVE_TOKENS else "none"
    if mode == "none":
        return {}
    if mode == "full":
        return {
            "recompute_granularity": "full",
            "recompute_method": "uniform",
            "recompute_num_layers": 1,
        }
    if mode == "selective":
        return {"recompute_granularity": "selective"}
    raise ValueError(f"recompute mode {mode!r}: one of auto, full, selective, none")


def _megatron_module() -> type:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # megatron's notices that TE and Apex are absent
        from megatron.core.transformer.module import MegatronModule

    return MegatronModule  # type: ignore[no-any-return]


class SDPACoreAttention(_megatron_module()):  # type: ignore[misc]
    """Drop-in for megatron-core 0.16's ``DotProductAttention`` (same arguments) computed with
    ``scaled_dot_product_attention``.

    Shapes as megatron's attention hands them over: ``query [sq, b, np, hn]``,
    ``key``/``value [sk, b, ng, hn]`` (``ng`` query groups), output ``[sq, b, np × hn]``; packed
    (``thd``): ``[t, np, hn]``/``[t, ng, hn]`` in, ``[t, np × hn]`` out.
    """

    def __init__(
        self,
        config: Any,
        layer_number: int,
        attn_mask_type: Any,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: Any = None,
    ) -> None:
        from megatron.core.process_groups_config import ProcessGroupCollection
        from megatron.core.utils import divide

        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("SDPACoreAttention: context parallelism needs Transformer Engine")
        if getattr(config, "softmax_type", "vanilla") != "vanilla":
            raise ValueError(f"SDPACoreAttention: softmax_type {config.softmax_type!r}")
        if getattr(config, "window_size", None) is not None:
            raise ValueError("SDPACoreAttention: sliding-window attention is not supported")
        self.config = config
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.attention_type = attention_type
        if pg_collection is None:
            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp"])
        self.pg_collection = pg_collection
        tp = pg_collection.tp.size()
        self.heads = divide(config.num_attention_heads, tp)
        self.groups = divide(config.num_query_groups, tp)
        self.head_dim = config.kv_channels
        # megatron's query-key layer scaling divides the scores by the layer number and
        # multiplies them back inside the softmax: the net scale is the plain one.
        self.softmax_scale = (
            softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(self.head_dim)
        )
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout

    def _causal(self, attn_mask_type: Any) -> bool:
        from megatron.core.transformer.enums import AttnMaskType

        kind = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        return bool(kind == AttnMaskType.causal)

    def _sdpa(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, causal: bool
    ) -> torch.Tensor:
        """``q [b, np, sq, hn]``, ``k``/``v [b, ng, sk, hn]`` → ``[b, np, sq, hn]``."""
        if self.heads != self.groups:
            k = k.repeat_interleave(self.heads // self.groups, dim=1)
            v = v.repeat_interleave(self.heads // self.groups, dim=1)
        p = self.dropout if self.training else 0.0
        if p > 0:
            from megatron.core import tensor_parallel

            with tensor_parallel.get_cuda_rng_tracker().fork():
                return F.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal and mask is None,
                    scale=self.softmax_scale,
                )  # fmt: skip
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal and mask is None, scale=self.softmax_scale
        )

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        if attention_bias is not None:
            raise ValueError("SDPACoreAttention: attention bias is not supported")
        causal = self._causal(attn_mask_type)
        if packed_seq_params is not None:
            return self._packed(query, key, value, packed_seq_params, causal)
        # [s, b, h, d] -> [b, h, s, d]
        q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))
        mask = None
        if attention_mask is not None:
            # megatron: True = masked; SDPA: True = attend. [b|1, 1, sq, sk] broadcasts.
            mask = ~attention_mask.bool()
        out = self._sdpa(q, k, v, mask, causal)
        sq, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(sq, b, self.heads * self.head_dim)

    def _packed(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, params: Any, causal: bool
    ) -> torch.Tensor:
        if params.qkv_format != "thd":
            # Megatron applies RoPE per packed sequence (cu_seqlens) only for 'thd'.
            raise ValueError(f"SDPACoreAttention: packed format {params.qkv_format!r}, not 'thd'")
        cu_q = params.cu_seqlens_q_padded
        if cu_q is None:
            cu_q = params.cu_seqlens_q
        cu_k = params.cu_seqlens_kv_padded
        if cu_k is None:
            cu_k = params.cu_seqlens_kv if params.cu_seqlens_kv is not None else cu_q
        bounds_q = [int(x) for x in cu_q.tolist()]
        bounds_k = [int(x) for x in cu_k.tolist()]
        if query.dim() == 4:  # [t, 1, h, d]: the batch dimension not yet squeezed
            query, key, value = query.squeeze(1), key.squeeze(1), value.squeeze(1)
        out = query.new_zeros(query.shape[0], self.heads, self.head_dim)
        for i in range(len(bounds_q) - 1):
            qa, qb, ka, kb = bounds_q[i], bounds_q[i + 1], bounds_k[i], bounds_k[i + 1]
            if qb <= qa:
                continue
            # [len, h, d] -> [1, h, len, d]
            q = query[qa:qb].transpose(0, 1).unsqueeze(0)
            k = key[ka:kb].transpose(0, 1).unsqueeze(0)
            v = value[ka:kb].transpose(0, 1).unsqueeze(0)
            out[qa:qb] = self._sdpa(q, k, v, None, causal)[0].transpose(0, 1)
        return out.reshape(query.shape[0], self.heads * self.head_dim)


def local_layer_spec(*, num_experts: int | None, qk_layernorm: bool) -> Any:
    """megatron-core's local (no Transformer Engine) GPT layer spec with RMSNorm and
    :class:`SDPACoreAttention` as the self-attention's core."""
    with warnings.catch_warnings():
        # "Apex is not installed. Falling back to Torch Norm": the torch norm is what we want.
        warnings.simplefilter("ignore")
        from megatron.core.models.gpt import gpt_layer_specs as specs

        spec = specs.get_gpt_layer_local_spec(
            num_experts=num_experts,
            moe_grouped_gemm=False,
            qk_layernorm=qk_layernorm,
            normalization="RMSNorm",
        )
    spec.submodules.self_attention.submodules.core_attention = SDPACoreAttention
    return spec
