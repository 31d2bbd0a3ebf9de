"""Model architectures the planner knows: a built-in table and a reader for HF ``config.json``.

The planner needs only what decides memory and decode cost: layers, attention and KV heads, head
dimension, hidden and MLP sizes, vocabulary, experts (MoE) and the native context. The built-in
entries are written as HF config fields, so a table entry and a ``config.json`` go through the
same code (``from_hf_config``) and the parameter count is *computed* from the shapes rather than
copied from a model card.

Called by ``agentrl.sim.static_plan`` (via ``resolve_architecture``) and by tests. Left out on
purpose: multi-head latent attention (DeepSeek MLA) and sliding-window layers, whose KV formulas
differ; ``from_hf_config`` refuses configs that declare them rather than mis-size them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ModelArchitecture(BaseModel):
    """The shapes of a decoder-only transformer (dense or MoE) that size KV and weights."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    name: str
    """Display name (``Qwen3-30B-A3B``)."""
    num_layers: int = Field(ge=1)
    """Transformer layers (``num_hidden_layers``)."""
    hidden_size: int = Field(ge=1)
    """Model width (``hidden_size``)."""
    num_attention_heads: int = Field(ge=1)
    """Query heads."""
    num_kv_heads: int = Field(ge=1)
    """Key/value heads (GQA groups; equals query heads for MHA)."""
    head_dim: int = Field(ge=1)
    """Channels per head (``head_dim``, else hidden_size / heads)."""
    intermediate_size: int = Field(ge=0)
    """Dense MLP width (0 when every layer is MoE)."""
    vocab_size: int = Field(ge=1)
    """Vocabulary size."""
    tie_word_embeddings: bool = False
    """Input and output embeddings share one matrix."""
    num_experts: int = Field(default=0, ge=0)
    """Routed experts per MoE layer (0: dense)."""
    num_experts_per_tok: int = Field(default=0, ge=0)
    """Experts each token is routed to."""
    moe_intermediate_size: int = Field(default=0, ge=0)
    """MLP width of one expert."""
    max_position_embeddings: int = Field(ge=1)
    """Native context length of the checkpoint (longer needs rope scaling)."""

    @property
    def is_moe(self) -> bool:
        """Whether the MLPs are mixtures of experts."""
        return self.num_experts > 0

    def _attention_params_per_layer(self) -> int:
        q_out = self.num_attention_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        # q, k, v projections in, o projection out.
        return self.hidden_size * q_out + 2 * self.hidden_size * kv_out + q_out * self.hidden_size

    @property
    def attention_params_per_layer(self) -> int:
        """q, k, v and o projections of one layer."""
        return self._attention_params_per_layer()

    @property
    def dense_mlp_params_per_layer(self) -> int:
        """Gate, up and down projections of one dense MLP (0 for an MoE model)."""
        return 0 if self.is_moe else 3 * self.hidden_size * self.intermediate_size

    @property
    def expert_params_per_layer(self) -> int:
        """Every routed expert of one MoE layer (gate, up, down each); 0 for a dense model."""
        return self.num_experts * 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def router_params_per_layer(self) -> int:
        """The router of one MoE layer (hidden × experts); 0 for a dense model."""
        return self.hidden_size * self.num_experts

    def _embedding_params(self) -> int:
        copies = 1 if self.tie_word_embeddings else 2
        return copies * self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        """Parameters stored (all experts). Norms and biases are ignored: < 0.1%."""
        if self.is_moe:
            mlp = self.num_experts * 3 * self.hidden_size * self.moe_intermediate_size
            mlp += self.hidden_size * self.num_experts  # router
        else:
            mlp = 3 * self.hidden_size * self.intermediate_size  # gate, up, down
        per_layer = self._attention_params_per_layer() + mlp
        return self.num_layers * per_layer + self._embedding_params()

    @property
    def active_params(self) -> int:
        """Parameters one token reads (routed experts only): what sets decode weight traffic."""
        if not self.is_moe:
            return self.total_params
        mlp = self.num_experts_per_tok * 3 * self.hidden_size * self.moe_intermediate_size
        per_layer = self._attention_params_per_layer() + mlp
        return self.num_layers * per_layer + self._embedding_params()


class UnsupportedArchitectureError(ValueError):
    """A config this planner cannot size correctly (MLA, sliding windows, missing fields)."""


def from_hf_config(config: dict[str, Any], name: str | None = None) -> ModelArchitecture:
    """Build an architecture from the fields of a HF ``config.json``.

    Raises ``UnsupportedArchitectureError`` for attention variants whose KV cache is not
    ``2 × layers × kv_heads × head_dim`` per token.
    """
    if "kv_lora_rank" in config:
        raise UnsupportedArchitectureError(
            "multi-head latent attention (kv_lora_rank) is not supported by the planner's KV "
            "formula; the planner sizes GQA/MHA models only"
        )
    if config.get("sliding_window") and config.get("use_sliding_window"):
        raise UnsupportedArchitectureError(
            "sliding-window attention is not supported by the planner's KV formula"
        )
    text = config.get("text_config")
    if isinstance(text, dict):  # multimodal wrappers keep the LM under text_config
        config = {**config, **text}
    try:
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        arch_name = name or str(config.get("_name_or_path") or config.get("model_type") or "hf")
        experts = int(config.get("num_experts") or config.get("num_local_experts") or 0)
        return ModelArchitecture(
            name=arch_name,
            num_layers=int(config["num_hidden_layers"]),
            hidden_size=hidden,
            num_attention_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate_size=int(config.get("intermediate_size") or 0),
            vocab_size=int(config["vocab_size"]),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            num_experts=experts,
            num_experts_per_tok=int(config.get("num_experts_per_tok") or 0) if experts else 0,
            moe_intermediate_size=int(config.get("moe_intermediate_size") or 0) if experts else 0,
            max_position_embeddings=int(config.get("max_position_embeddings") or 4096),
        )
    except KeyError as exc:
        raise UnsupportedArchitectureError(
            f"config.json lacks {exc.args[0]!r}, which the planner needs"
        ) from exc


def load_hf_config(path: str | Path) -> ModelArchitecture:
    """Read ``config.json`` from a model directory (or the file itself)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    with p.open(encoding="utf-8") as fh:
        return from_hf_config(json.load(fh), name=p.parent.name or None)


def _qwen3_dense(layers: int, hidden: int, heads: int, inter: int, tied: bool) -> dict[str, Any]:
    return {
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": inter,
        "vocab_size": 151936,
        "tie_word_embeddings": tied,
        "max_position_embeddings": 40960,
    }


def _qwen3_moe(layers: int, hidden: int, heads: int, kv: int, experts: int, moe_inter: int,
               max_pos: int = 40960) -> dict[str, Any]:
    return {
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": 128,
        "intermediate_size": 0,
        "vocab_size": 151936,
        "num_experts": experts,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": moe_inter,
        "max_position_embeddings": max_pos,
    }


def _llama(layers: int, hidden: int, heads: int, inter: int, head_dim: int = 128,
           tied: bool = False) -> dict[str, Any]:
    return {
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": 8,
        "head_dim": head_dim,
        "intermediate_size": inter,
        "vocab_size": 128256,
        "tie_word_embeddings": tied,
        "max_position_embeddings": 131072,
    }


#: Built-in architectures as HF config fields (from the models' published config.json files).
BUILTIN_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen3-0.6B": _qwen3_dense(28, 1024, 16, 3072, tied=True),
    "Qwen3-1.7B": _qwen3_dense(28, 2048, 16, 6144, tied=True),
    "Qwen3-4B": _qwen3_dense(36, 2560, 32, 9728, tied=True),
    "Qwen3-8B": _qwen3_dense(36, 4096, 32, 12288, tied=False),
    "Qwen3-14B": _qwen3_dense(40, 5120, 40, 17408, tied=False),
    "Qwen3-32B": _qwen3_dense(64, 5120, 64, 25600, tied=False),
    "Qwen3-30B-A3B": _qwen3_moe(48, 2048, 32, 4, 128, 768),
    "Qwen3-235B-A22B": _qwen3_moe(94, 4096, 64, 4, 128, 1536),
    "Qwen3-Coder-30B-A3B": _qwen3_moe(48, 2048, 32, 4, 128, 768, max_pos=262144),
    "Qwen3-Coder-480B-A35B": _qwen3_moe(62, 6144, 96, 8, 160, 2560, max_pos=262144),
    "Llama-3.2-1B": _llama(16, 2048, 32, 8192, head_dim=64, tied=True),
    "Llama-3.2-3B": _llama(28, 3072, 24, 8192, tied=True),
    "Llama-3.1-8B": _llama(32, 4096, 32, 14336),
    "Llama-3.1-70B": _llama(80, 8192, 64, 28672),
    "Llama-3.1-405B": _llama(126, 16384, 128, 53248),
    # The tiny CPU policy of `agentrl run` (model.source.path: tiny): a few MB, so every
    # GPU-side figure is trivially satisfied; planned so the quickstart plans without error.
    "agentrl-tiny": {
        "num_hidden_layers": 2,
        "hidden_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "intermediate_size": 512,
        "vocab_size": 4096,
        "tie_word_embeddings": True,
        "max_position_embeddings": 1_048_576,
    },
}

_ALIASES = {
    "qwen3-30b-a3b-instruct-2507": "Qwen3-30B-A3B",
    "qwen3-30b-a3b-instruct": "Qwen3-30B-A3B",
    "qwen3-coder-30b-a3b-instruct": "Qwen3-Coder-30B-A3B",
    "meta-llama-3.1-8b-instruct": "Llama-3.1-8B",
    "llama-3.1-8b-instruct": "Llama-3.1-8B",
    "llama-3.1-70b-instruct": "Llama-3.1-70B",
    "tiny": "agentrl-tiny",
}


def builtin_names() -> list[str]:
    """Names accepted by ``builtin``."""
    return sorted(BUILTIN_CONFIGS)


def builtin(name: str) -> ModelArchitecture:
    """A built-in architecture by name (case-insensitive; ``Qwen/`` prefixes are ignored)."""
    key = name.split("/")[-1].strip()
    lowered = {k.lower(): k for k in BUILTIN_CONFIGS}
    canonical = lowered.get(key.lower()) or _ALIASES.get(key.lower())
    if canonical is None:
        raise UnsupportedArchitectureError(
            f"unknown architecture {name!r}; built-in: {', '.join(builtin_names())}, or point "
            "agentrl plan at a config.json with --config"
        )
    return from_hf_config(BUILTIN_CONFIGS[canonical], name=canonical)
