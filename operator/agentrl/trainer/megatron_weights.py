"""Weights between megatron-core's GPTModel layout and Hugging Face's (what SGLang loads).

Engines serve HF-named tensors, the trainer holds megatron's. Two pure conversions on whole
(unsharded) tensors, per parameter:

* :func:`to_hf` — one megatron parameter → the HF tensors it holds. ``linear_qkv`` interleaves
  per key/value group ``[q heads of the group; k; v]`` and splits into ``q_proj``/``k_proj``/
  ``v_proj``; the SwiGLU ``linear_fc1`` is ``[gate; up]``.
* :func:`from_hf` — an HF state dict → megatron names (the inverse, used to start training from
  the model in ``spec.model.source``).

Sharding is handled apart, so the conversions stay testable on one CPU: :func:`shard` cuts a
whole tensor into the piece one tensor-parallel rank holds (``[gate_r; up_r]`` for ``fc1``, a
plain cut along the partition dimension otherwise; a ``linear_qkv`` cut keeps whole groups
because the layout is group-major), :func:`unshard` glues the pieces back. Layer and expert
indices in names are global (the backend adds the pipeline-stage and expert-parallel offsets).

Both the local layer spec and Transformer Engine's spec are understood: TE fuses the
pre-attention and pre-MLP RMSNorm weights into ``linear_qkv.layer_norm_weight`` and
``linear_fc1.layer_norm_weight``. Callers: :mod:`agentrl.trainer.megatron_backend`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import torch

from agentrl.trainer.hf_config import HFModelConfig

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc1|linear_fc2)\.weight$")

#: megatron per-layer suffix → HF per-layer suffix, for the parameters that map one to one.
_LAYER_SIMPLE: dict[str, str] = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "post_attention_layernorm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
    "mlp.router.weight": "mlp.gate.weight",
}
_TOP_SIMPLE: dict[str, str] = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
    "output_layer.weight": "lm_head.weight",
}


def split_qkv(
    qkv: torch.Tensor, hf: HFModelConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Megatron's group-interleaved ``linear_qkv`` (weight or bias) → q, k, v."""
    groups, d = hf.kv_heads, hf.kv_channels
    per_group = hf.num_attention_heads // groups
    rest = qkv.shape[1:]
    grouped = qkv.reshape(groups, (per_group + 2) * d, *rest)
    q = grouped[:, : per_group * d].reshape(groups * per_group * d, *rest)
    k = grouped[:, per_group * d : (per_group + 1) * d].reshape(groups * d, *rest)
    v = grouped[:, (per_group + 1) * d :].reshape(groups * d, *rest)
    return q, k, v


def merge_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hf: HFModelConfig) -> torch.Tensor:
    """Inverse of :func:`split_qkv`."""
    groups, d = hf.kv_heads, hf.kv_channels
    per_group = hf.num_attention_heads // groups
    rest = q.shape[1:]
    parts = (
        q.reshape(groups, per_group * d, *rest),
        k.reshape(groups, d, *rest),
        v.reshape(groups, d, *rest),
    )
    return torch.cat(parts, dim=1).reshape(groups * (per_group + 2) * d, *rest)


def hf_names(name: str) -> list[str]:
    """The HF names one megatron parameter (global layer/expert indices) becomes, in the order
    :func:`to_hf` yields them.

    Raises:
        KeyError: a parameter this conversion does not know (a new layer type).
    """
    if name in _TOP_SIMPLE:
        return [_TOP_SIMPLE[name]]
    match = _LAYER.match(name)
    if match is None:
        raise KeyError(f"no HF name for megatron parameter {name}")
    prefix, suffix = f"model.layers.{int(match.group(1))}.", match.group(2)
    if suffix in _LAYER_SIMPLE:
        return [prefix + _LAYER_SIMPLE[suffix]]
    if suffix in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        kind = suffix.rsplit(".", 1)[1]
        return [f"{prefix}self_attn.{p}_proj.{kind}" for p in "qkv"]
    if suffix == "mlp.linear_fc1.weight":
        return [prefix + "mlp.gate_proj.weight", prefix + "mlp.up_proj.weight"]
    expert = _EXPERT.match(suffix)
    if expert is not None:
        e = f"{prefix}mlp.experts.{int(expert.group(1))}."
        if expert.group(2) == "linear_fc2":
            return [e + "down_proj.weight"]
        return [e + "gate_proj.weight", e + "up_proj.weight"]
    raise KeyError(f"no HF name for megatron parameter {name}")


def to_hf(name: str, tensor: torch.Tensor, hf: HFModelConfig) -> list[tuple[str, torch.Tensor]]:
    """The HF tensors one whole megatron parameter holds (global layer/expert indices)."""
    names = hf_names(name)
    if len(names) == 3:
        return list(zip(names, split_qkv(tensor, hf), strict=True))
    if len(names) == 2:
        return list(zip(names, tensor.chunk(2, dim=0), strict=True))  # [gate; up]
    return [(names[0], tensor)]


def from_hf(
    state: Mapping[str, torch.Tensor], names: Sequence[str], hf: HFModelConfig
) -> dict[str, torch.Tensor]:
    """Whole megatron tensors for ``names`` (the model's parameter names with global indices)
    from an HF state dict. A tied model (``tie_word_embeddings``) has no ``lm_head``; its
    ``output_layer`` is then read from the embedding.

    Raises:
        KeyError: an HF tensor the model needs is missing.
    """
    out: dict[str, torch.Tensor] = {}
    for name in names:
        keys = hf_names(name)
        if keys == ["lm_head.weight"] and "lm_head.weight" not in state:
            keys = ["model.embed_tokens.weight"]
        missing = [k for k in keys if k not in state]
        if missing:
            raise KeyError(f"{name} needs {', '.join(missing)}, which the HF weights lack")
        parts = [state[k] for k in keys]
        if len(parts) == 1:
            out[name] = parts[0]
        elif len(parts) == 3:
            out[name] = merge_qkv(parts[0], parts[1], parts[2], hf)
        else:
            out[name] = torch.cat(parts, dim=0)  # [gate; up]
    return out


def is_gated_fc1(name: str) -> bool:
    """``linear_fc1`` weights of a SwiGLU MLP hold ``[gate; up]``."""
    return name.endswith("linear_fc1.weight")


def shard(
    name: str, tensor: torch.Tensor, *, partition_dim: int | None, rank: int, size: int
) -> torch.Tensor:
    """The piece of a whole tensor that tensor-parallel ``rank`` of ``size`` holds;
    ``partition_dim`` None: a replicated parameter (returned whole)."""
    if partition_dim is None or size == 1:
        return tensor
    if is_gated_fc1(name):
        gate, up = tensor.chunk(2, dim=0)
        return torch.cat([gate.chunk(size, dim=0)[rank], up.chunk(size, dim=0)[rank]], dim=0)
    return tensor.chunk(size, dim=partition_dim)[rank]


def unshard(
    name: str, pieces: Sequence[torch.Tensor], *, partition_dim: int | None
) -> torch.Tensor:
    """Inverse of :func:`shard` over every rank's piece, in rank order."""
    if partition_dim is None or len(pieces) == 1:
        return pieces[0]
    if is_gated_fc1(name):
        halves = [p.chunk(2, dim=0) for p in pieces]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    return torch.cat(list(pieces), dim=partition_dim)
