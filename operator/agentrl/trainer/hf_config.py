"""The model's Hugging Face ``config.json`` read into the shape megatron-core builds from.

:class:`HFModelConfig` keeps the fields of the decoder-only families the megatron backend builds
(Llama, Mistral, Qwen2, Qwen3 and Qwen3-MoE): layers, hidden size, heads, key/value heads (GQA),
FFN size, vocabulary, RoPE, norms, and the MoE fields when the architecture has experts.
:func:`transformer_config_kwargs` turns it, with ``spec.trainer``, into the keyword arguments of
``megatron.core.transformer.TransformerConfig`` (after :func:`check_layout` has refused a
parallel layout the model cannot be split into); :func:`optimizer_config_kwargs` turns
``spec.trainer.optimizer`` into those of ``megatron.core.optimizer.OptimizerConfig``.

Both are plain dicts on purpose: this module never imports megatron (or torch), so the mapping is
tested without the ``megatron`` extra. Callers: :mod:`agentrl.trainer.megatron_backend`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentrl.api.trainer import TrainerSpec

#: Architectures whose attention has q/k RMSNorm (``q_norm``/``k_norm`` in the HF weights).
QK_NORM_ARCHITECTURES = frozenset({"Qwen3ForCausalLM", "Qwen3MoeForCausalLM"})
#: Architectures whose q/k/v projections carry a bias while every other linear has none.
QKV_BIAS_ARCHITECTURES = frozenset({"Qwen2ForCausalLM"})
#: What the backend knows how to build and convert.
SUPPORTED_ARCHITECTURES = frozenset(
    {
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
    }
)


class HFModelConfig(BaseModel):
    """The fields of ``config.json`` the trainer needs (HF names; unknown keys ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    architectures: list[str] = Field(default_factory=lambda: ["LlamaForCausalLM"])
    num_hidden_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_key_value_heads: int | None = Field(default=None, ge=1)
    """Key/value heads (GQA); unset means as many as query heads (MHA)."""
    intermediate_size: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    max_position_embeddings: int = Field(default=4096, ge=1)
    head_dim: int | None = Field(default=None, ge=1)
    """Per-head size when it is not ``hidden_size / num_attention_heads`` (Qwen3)."""
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    hidden_act: str = "silu"
    num_experts: int | None = Field(default=None, ge=1)
    """Routed experts (Qwen3-MoE); unset for dense models."""
    num_experts_per_tok: int | None = Field(default=None, ge=1)
    moe_intermediate_size: int | None = Field(default=None, ge=1)
    norm_topk_prob: bool = True

    @property
    def architecture(self) -> str:
        return self.architectures[0]

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def kv_channels(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def qk_layernorm(self) -> bool:
        return self.architecture in QK_NORM_ARCHITECTURES

    @property
    def qkv_bias(self) -> bool:
        return self.attention_bias or self.architecture in QKV_BIAS_ARCHITECTURES

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None


def read_hf_config(model_dir: Path) -> HFModelConfig:
    """``model_dir/config.json`` as :class:`HFModelConfig`.

    Raises:
        FileNotFoundError: no ``config.json`` there.
        ValueError: an architecture the megatron backend does not build.
    """
    data: dict[str, Any] = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    config = HFModelConfig.model_validate(data)
    if config.architecture not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"{model_dir}/config.json: architecture {config.architecture} is not one the megatron "
            f"backend builds ({', '.join(sorted(SUPPORTED_ARCHITECTURES))})"
        )
    return config


def transformer_config_kwargs(hf: HFModelConfig, trainer: TrainerSpec) -> dict[str, Any]:
    """``TransformerConfig`` keyword arguments, without the dtype and activation (the backend
    adds those, as torch objects)."""
    if hf.hidden_act != "silu":
        raise ValueError(f"hidden_act {hf.hidden_act!r}: only SwiGLU (silu) models are built")
    p = trainer.parallelism
    kwargs: dict[str, Any] = {
        "num_layers": hf.num_hidden_layers,
        "hidden_size": hf.hidden_size,
        "num_attention_heads": hf.num_attention_heads,
        "num_query_groups": hf.kv_heads,
        "kv_channels": hf.kv_channels,
        "ffn_hidden_size": hf.intermediate_size,
        "normalization": "RMSNorm",
        "layernorm_epsilon": hf.rms_norm_eps,
        "gated_linear_unit": True,
        "add_bias_linear": False,
        "add_qkv_bias": hf.qkv_bias,
        "qk_layernorm": hf.qk_layernorm,
        # Dropout is off in every RL recipe: the logprobs must match the engine's.
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "tensor_model_parallel_size": p.tensor,
        "pipeline_model_parallel_size": p.pipeline,
        "context_parallel_size": p.context,
        "expert_model_parallel_size": p.expert,
        "sequence_parallel": False,
        # No apex on ROCm images (slime's AMD recipe passes --no-gradient-accumulation-fusion).
        "gradient_accumulation_fusion": False,
        "use_cpu_initialization": True,
    }
    if hf.is_moe:
        kwargs.update(
            num_moe_experts=hf.num_experts,
            moe_router_topk=hf.num_experts_per_tok or 1,
            moe_ffn_hidden_size=hf.moe_intermediate_size or hf.intermediate_size,
            moe_router_pre_softmax=not hf.norm_topk_prob,
            # all-to-all moves tokens between expert-parallel ranks; without expert parallelism
            # the all-gather dispatcher does the same work without side streams.
            moe_token_dispatcher_type="alltoall" if p.expert > 1 else "allgather",
            moe_grouped_gemm=False,
            moe_aux_loss_coeff=0.0,
        )
    return kwargs


def check_layout(hf: HFModelConfig, trainer: TrainerSpec) -> None:
    """Refuse a parallel layout this model cannot be split into, naming the field (the spec's
    own rules, checked at apply time, cannot see the model's ``config.json``): the megatron
    backend calls it before building the model, ``agentrl trainer --dry-run`` with the plan.

    Raises:
        ValueError: a size megatron-core would reject or mis-split the model with.
    """
    p = trainer.parallelism
    problems = []
    if hf.vocab_size % p.tensor:
        problems.append(f"vocab_size {hf.vocab_size} is not divisible by parallelism.tensor")
    if hf.num_attention_heads % p.tensor or hf.kv_heads % p.tensor:
        problems.append(
            f"attention heads ({hf.num_attention_heads}) and key/value heads ({hf.kv_heads}) "
            f"must be divisible by parallelism.tensor ({p.tensor})"
        )
    if hf.num_hidden_layers % p.pipeline:
        problems.append(
            f"num_hidden_layers ({hf.num_hidden_layers}) must be divisible by "
            f"parallelism.pipeline ({p.pipeline})"
        )
    if p.expert > 1 and not hf.is_moe:
        problems.append(f"parallelism.expert is {p.expert} but the model has no experts (dense)")
    if hf.num_experts is not None and hf.num_experts % p.expert:
        problems.append(
            f"num_experts ({hf.num_experts}) must be divisible by parallelism.expert ({p.expert})"
        )
    if problems:
        raise ValueError(
            f"spec.trainer.parallelism does not fit {hf.architecture}: " + "; ".join(problems)
        )


def optimizer_config_kwargs(trainer: TrainerSpec, *, bf16: bool) -> dict[str, Any]:
    """``OptimizerConfig`` keyword arguments from ``spec.trainer.optimizer``: Adam with
    decoupled weight decay (megatron's ``adam`` is AdamW), the global gradient-norm clip, and
    the distributed optimizer (state sharded over data-parallel ranks)."""
    opt = trainer.optimizer
    return {
        "optimizer": "adam",
        "lr": opt.lr,
        "min_lr": opt.lr,
        "weight_decay": opt.weight_decay,
        "adam_beta1": opt.beta1,
        "adam_beta2": opt.beta2,
        "clip_grad": opt.grad_clip,
        "bf16": bf16,
        "use_distributed_optimizer": True,
    }
