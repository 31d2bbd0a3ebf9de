"""The model's Hugging Face ``config.json`` read into the shape megatron-core builds from.

:func:`read_hf_config` reads it as transformers does (``AutoConfig``, when transformers is
installed and knows the ``model_type``), else from the JSON, in both cases with the key changes
of transformers 5 resolved (:func:`normalise_hf_dict`): the RoPE base in
``rope_parameters["rope_theta"]`` (a file written by transformers 5 has no top-level
``rope_theta``), Qwen3-MoE's experts as ``num_local_experts``, ``head_dim`` absent meaning
``hidden_size / num_attention_heads``, ``architectures`` absent meaning the ``model_type``'s
causal LM. :func:`expected_model_fields` and :func:`compare_model_fields` are the start-up check
that the model megatron built has the HF config's shape, field by field.

:class:`HFModelConfig` keeps the fields of the decoder-only families the megatron backend builds
(Llama, Mistral, Qwen2, Qwen3 and Qwen3-MoE): layers, hidden size, heads, key/value heads (GQA),
FFN size, vocabulary, RoPE, norms, and the MoE fields when the architecture has experts.
:func:`transformer_config_kwargs` turns it, with ``spec.trainer``, into the keyword arguments of
``megatron.core.transformer.TransformerConfig`` (after :func:`check_layout` has refused a
parallel layout the model cannot be split into); :func:`optimizer_config_kwargs` turns
``spec.trainer.optimizer`` into those of ``megatron.core.optimizer.OptimizerConfig``.

Both are plain dicts on purpose: this module never imports megatron (or torch; transformers only
inside :func:`read_hf_config`, when installed), so the mapping is tested without the ``megatron``
extra. Callers: :mod:`agentrl.trainer.megatron_backend`.
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
#: ``model_type`` → the causal-LM architecture (a config saved from a config class alone, as
#: ``Qwen3Config().save_pretrained``, has no ``architectures``).
ARCHITECTURE_OF_MODEL_TYPE = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}


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


def normalise_hf_dict(data: dict[str, Any]) -> dict[str, Any]:
    """A ``config.json``'s keys (written by transformers 4 or 5) as :class:`HFModelConfig`'s.

    * RoPE base: ``rope_parameters["rope_theta"]`` (transformers 5), else top-level
      ``rope_theta`` (transformers 4), else 10,000 (transformers' default);
    * experts: ``num_experts``, else ``num_local_experts`` (what transformers 5 writes for
      Qwen3-MoE, whose class maps one name to the other);
    * architecture: ``architectures``, else the ``model_type``'s causal LM;
    * a multimodal config's ``text_config`` is the language model's.

    Raises:
        ValueError: a layout the uniform megatron model cannot represent (MoE only on some
            layers, sliding-window attention, RoPE scaling other than the default).
    """
    if isinstance(data.get("text_config"), dict):
        data = {**data["text_config"], "architectures": data.get("architectures")}
    out = dict(data)
    rope = data.get("rope_parameters") or data.get("rope_scaling") or {}
    theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    if theta is None:
        theta = data.get("rope_theta")
    out["rope_theta"] = float(theta) if theta is not None else 10_000.0
    rope_type = None
    if isinstance(rope, dict):
        rope_type = rope.get("rope_type", rope.get("type", "default"))
    experts = data.get("num_experts") or data.get("num_local_experts")
    out["num_experts"] = experts or None
    if not data.get("architectures"):
        model_type = str(data.get("model_type", ""))
        if model_type in ARCHITECTURE_OF_MODEL_TYPE:
            out["architectures"] = [ARCHITECTURE_OF_MODEL_TYPE[model_type]]
        else:
            out.pop("architectures", None)
    if out.get("head_dim") is None:
        out.pop("head_dim", None)  # hidden_size / num_attention_heads (HFModelConfig.kv_channels)
    problems = []
    if rope_type not in (None, "default"):
        problems.append(f"rope_type {rope_type!r} (only the default RoPE is built)")
    if experts and (data.get("mlp_only_layers") or int(data.get("decoder_sparse_step") or 1) != 1):
        problems.append("mlp_only_layers/decoder_sparse_step (experts on some layers only)")
    if data.get("use_sliding_window"):
        problems.append("use_sliding_window (sliding-window attention)")
    if problems:
        raise ValueError("config.json: not built by the megatron backend: " + "; ".join(problems))
    return out


def _auto_config_dict(model_dir: Path) -> dict[str, Any] | None:
    """The config as transformers reads it (its text config), keyed for
    :func:`normalise_hf_dict`; None when transformers is absent or does not know the model."""
    try:
        from transformers import AutoConfig
    except ImportError:
        return None
    try:
        config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    except (ValueError, KeyError, OSError):
        return None  # no model_type transformers knows: the JSON is read as it is
    text = config.get_text_config()
    data: dict[str, Any] = text.to_dict()
    # Attributes the class maps (Qwen3-MoE: num_experts → num_local_experts) or derives.
    for name in HFModelConfig.model_fields:
        value = getattr(text, name, None)
        if value is not None:
            data[name] = value
    rope = getattr(text, "rope_parameters", None)
    if isinstance(rope, dict):
        data["rope_parameters"] = rope
    data.setdefault("architectures", getattr(config, "architectures", None))
    return data


def read_hf_config(model_dir: Path) -> HFModelConfig:
    """``model_dir/config.json`` as :class:`HFModelConfig`, read with transformers'
    ``AutoConfig`` semantics (see :func:`normalise_hf_dict`).

    Raises:
        FileNotFoundError: no ``config.json`` there.
        ValueError: an architecture or layout the megatron backend does not build.
    """
    raw: dict[str, Any] = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    data = _auto_config_dict(model_dir) or raw
    config = HFModelConfig.model_validate(normalise_hf_dict(data))
    if config.architecture not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"{model_dir}/config.json: architecture {config.architecture} is not one the megatron "
            f"backend builds ({', '.join(sorted(SUPPORTED_ARCHITECTURES))})"
        )
    return config


def expected_model_fields(hf: HFModelConfig) -> dict[str, Any]:
    """What the built megatron model must have, by field (the names
    :func:`compare_model_fields` reports)."""
    fields: dict[str, Any] = {
        "num_layers": hf.num_hidden_layers,
        "hidden_size": hf.hidden_size,
        "num_attention_heads": hf.num_attention_heads,
        "num_query_groups": hf.kv_heads,
        "kv_channels": hf.kv_channels,
        "ffn_hidden_size": hf.intermediate_size,
        "layernorm_epsilon": hf.rms_norm_eps,
        "rotary_base": hf.rope_theta,
        "tie_word_embeddings": hf.tie_word_embeddings,
        "vocab_size": hf.vocab_size,
        "num_moe_experts": hf.num_experts,
    }
    if hf.is_moe:
        fields["moe_ffn_hidden_size"] = hf.moe_intermediate_size or hf.intermediate_size
        fields["moe_router_topk"] = hf.num_experts_per_tok or 1
    return fields


def compare_model_fields(
    hf: HFModelConfig, built: dict[str, Any], *, subject: str = "the megatron model"
) -> None:
    """Refuse a built model whose shape differs from the HF config's, naming every field.

    ``built`` has :func:`expected_model_fields`'s keys, read from the model megatron built
    (:func:`agentrl.trainer.megatron_backend.built_model_fields`, or
    :func:`agentrl.trainer.hf_model.built_model_fields` for the model transformers built:
    ``subject`` says which). Floats (norm epsilon, RoPE
    base) compare to a relative 1e-4: the RoPE base is read back from the rotary frequencies.

    Raises:
        ValueError: some field differs.
    """
    problems = []
    for name, want in expected_model_fields(hf).items():
        got = built.get(name)
        if isinstance(want, float) and isinstance(got, int | float) and not isinstance(got, bool):
            same = abs(float(got) - want) <= 1e-4 * abs(want)
        else:
            same = got == want
        if not same:
            problems.append(f"{name}: built {got!r}, config.json says {want!r}")
    if problems:
        raise ValueError(
            f"{subject} does not match {hf.architecture}'s config.json: " + "; ".join(problems)
        )


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
