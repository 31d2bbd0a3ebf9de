"""Hugging Face causal LMs on the torch backend: a small model made here, loaded and checked.

:func:`create_model` writes a complete HF model directory with nothing downloaded: a Qwen3
``config.json`` from transformers' own ``Qwen3Config`` (a preset of :data:`PRESETS`, sized for a
few CPU cores), random initial weights of ``Qwen3ForCausalLM`` seeded with ``seed``
(``model.safetensors``), ``generation_config.json`` ending generation at ``<|im_end|>``, and the
project's tokenizer with its tool-calling chat template
(:func:`agentrl.rollout.hf_model_files.write_tokenizer_files`). The same seed and preset give
the same bytes of weights.

:func:`load_causal_lm` loads any such directory with ``AutoModelForCausalLM`` (float32, CPU,
eval) and runs the start-up check: the module transformers built is read back field by field
(:func:`built_model_fields`: layers counted, widths read off the weight shapes, the RoPE base
off the rotary frequencies, experts off the expert tensors) and compared with ``config.json``
as :func:`agentrl.trainer.hf_config.read_hf_config` reads it (transformers 5 keys resolved), so
a model built with the wrong RoPE base or dense where the file says MoE is refused with the
field named before a step is trained.

:func:`token_logprobs` is what the torch backend scores an HF model with: one forward per
sequence, ``log_softmax(logits / temperature)`` at ``j − 1`` for every scored token ``j``.

Callers: :mod:`agentrl.trainer.torch_backend`, :mod:`agentrl.trainer.factories`,
``agentrl model create`` (:mod:`agentrl.trainer.model_cli`), tests.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from pydantic import BaseModel

# a config.json with a model_type (the tiny policy's has none), decided as the engine does
from agentrl.tiny.served import is_hf_model_dir as is_hf_model_dir
from agentrl.trainer.hf_config import (
    HFModelConfig,
    compare_model_fields,
    expected_model_fields,
    read_hf_config,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class ModelPreset(BaseModel):
    """The shape of a model :func:`create_model` makes (Qwen3 names)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = 4096
    rope_theta: float = 1_000_000.0
    tie_word_embeddings: bool = True


#: Presets by name: ``mini`` has about 0.12 M parameters (0.05 M of them the tied embeddings),
#: ``small`` twice the width and twice the depth.
PRESETS: dict[str, ModelPreset] = {
    "mini": ModelPreset(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    ),
    "small": ModelPreset(
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
    ),
}


def create_model(
    directory: str | Path,
    *,
    seed: int = 0,
    preset: str | ModelPreset = "mini",
    template: str | None = None,
) -> Path:
    """Write a Qwen3-architecture model with random weights and the project's tokenizer into
    ``directory`` (created if absent); returns it. ``preset``: a name of :data:`PRESETS` or a
    shape of its own (``bench/stop_grace.py`` sizes models so). ``template`` is a bundled chat
    template's name (default: the tokenizer's, Qwen3 Instruct with tool calls)."""
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    from agentrl.rollout.hf_model_files import EOS_TOKEN, PAD_TOKEN, write_tokenizer_files

    if isinstance(preset, str) and preset not in PRESETS:
        raise ValueError(f"no model preset {preset!r}; the presets are {', '.join(PRESETS)}")
    out = Path(directory)
    kwargs: dict[str, Any] = {} if template is None else {"template": template}
    write_tokenizer_files(out, **kwargs)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(out))
    shape = PRESETS[preset] if isinstance(preset, str) else preset
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    pad = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=shape.max_position_embeddings,
        rope_theta=shape.rope_theta,
        tie_word_embeddings=shape.tie_word_embeddings,
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=None,
    )
    config.architectures = ["Qwen3ForCausalLM"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.save_pretrained(str(out))
    GenerationConfig(eos_token_id=[eos], pad_token_id=pad, bos_token_id=None).save_pretrained(
        str(out)
    )
    return out


def built_model_fields(model: PreTrainedModel) -> dict[str, Any]:
    """The shape of the module transformers built, read off the module itself (the keys of
    :func:`agentrl.trainer.hf_config.expected_model_fields`)."""
    inner = model.model  # type: ignore[attr-defined]
    layer = inner.layers[0]
    attn = layer.self_attn
    embed = inner.embed_tokens
    kv_channels = int(attn.k_proj.out_features) // int(
        getattr(attn, "num_key_value_heads", 0) or model.config.num_key_value_heads
    )
    inv_freq = inner.rotary_emb.inv_freq
    # inv_freq[i] = base ** (-2 i / dim): the base is inv_freq[1] ** (-dim / 2)
    rotary_dim = 2 * int(inv_freq.numel())
    base = float(inv_freq[1]) ** (-rotary_dim / 2) if inv_freq.numel() > 1 else math.nan
    fields: dict[str, Any] = {
        "num_layers": len(inner.layers),
        "hidden_size": int(embed.embedding_dim),
        "num_attention_heads": int(attn.q_proj.out_features) // kv_channels,
        "num_query_groups": int(attn.k_proj.out_features) // kv_channels,
        "kv_channels": kv_channels,
        "layernorm_epsilon": float(inner.norm.variance_epsilon),
        "rotary_base": base,
        "tie_word_embeddings": model.lm_head.weight is embed.weight,  # type: ignore[attr-defined]
        "vocab_size": int(embed.num_embeddings),
    }
    experts = getattr(layer.mlp, "experts", None)
    if experts is None:
        fields["ffn_hidden_size"] = int(layer.mlp.gate_proj.out_features)
        fields["num_moe_experts"] = None
    else:
        down = experts.down_proj  # [experts, hidden, moe ffn]
        fields["num_moe_experts"] = int(down.shape[0])
        fields["moe_ffn_hidden_size"] = int(down.shape[-1])
        fields["moe_router_topk"] = int(layer.mlp.gate.top_k)
        # a MoE model has no dense FFN to read back: the config's value is what it has
        fields["ffn_hidden_size"] = int(model.config.intermediate_size)
    return fields


def check_built_model(hf: HFModelConfig, model: PreTrainedModel) -> None:
    """Refuse ``model`` when its shape differs from ``config.json``'s, naming every field."""
    compare_model_fields(hf, built_model_fields(model), subject="the model transformers built")


def weight_file_fields(directory: str | Path) -> dict[str, Any]:
    """The shape of the weights in ``directory``'s ``*.safetensors``, read off the tensors'
    shapes in the file headers (nothing loaded): the keys of
    :func:`agentrl.trainer.hf_config.expected_model_fields` that HF's tensor names show —
    vocabulary and hidden size (the embedding), layers (counted), FFN size, heads and key/value
    heads where a per-head norm gives the head size (Qwen3's ``q_norm``), experts (the
    router's rows) and their FFN size, in the per-expert format transformers saves or fused."""
    shapes = _tensor_shapes(Path(directory))
    fields: dict[str, Any] = {}
    embed = shapes.get("model.embed_tokens.weight")
    if embed is not None:
        fields["vocab_size"], fields["hidden_size"] = embed
    layers = {int(m.group(1)) for n in shapes if (m := re.match(r"model\.layers\.(\d+)\.", n))}
    if layers:
        fields["num_layers"] = max(layers) + 1
    first = "model.layers.0."
    head = shapes.get(first + "self_attn.q_norm.weight")
    q, k = (
        shapes.get(first + "self_attn.q_proj.weight"),
        shapes.get(first + "self_attn.k_proj.weight"),
    )
    if head is not None and q is not None and k is not None:
        fields["kv_channels"] = head[0]
        fields["num_attention_heads"] = q[0] // head[0]
        fields["num_query_groups"] = k[0] // head[0]
    gate = shapes.get(first + "mlp.gate_proj.weight")
    router = shapes.get(first + "mlp.gate.weight")
    if gate is not None:
        fields["ffn_hidden_size"] = gate[0]
        fields["num_moe_experts"] = None
    elif router is not None:
        fields["num_moe_experts"] = router[0]
        down = shapes.get(first + "mlp.experts.0.down_proj.weight") or shapes.get(
            first + "mlp.experts.down_proj"
        )
        if down is not None:
            fields["moe_ffn_hidden_size"] = down[-1]
    return fields


def _tensor_shapes(directory: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{directory}: no *.safetensors weights beside config.json")
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


def check_weight_files(directory: str | Path, hf: HFModelConfig) -> None:
    """Refuse weights whose shape differs from ``config.json``'s, naming every field, before
    transformers builds the model (it would stop at the first tensor of another size, or
    initialise at random the layers the file lacks)."""
    expected = expected_model_fields(hf)
    found = weight_file_fields(directory)
    problems = [
        f"{name}: the weights have {got!r}, config.json says {expected[name]!r}"
        for name, got in found.items()
        if name in expected and got != expected[name]
    ]
    if problems:
        raise ValueError(
            f"{directory}: the weights do not fit config.json ({hf.architecture}): "
            + "; ".join(problems)
        )


def _check_loading_info(directory: str | Path, info: dict[str, Any]) -> None:
    """Refuse a load in which some tensor of the model was not in the file, or the other way
    round, or had another shape (what :func:`check_weight_files` cannot name as a field)."""
    problems = []
    if info.get("missing_keys"):
        problems.append(f"not in the weights (left at random): {_names(info['missing_keys'])}")
    if info.get("unexpected_keys"):
        problems.append(f"in the weights, not in the model: {_names(info['unexpected_keys'])}")
    mismatched = info.get("mismatched_keys") or []
    if mismatched:
        shown = ", ".join(
            f"{name} {list(file_shape)} in the weights, {list(model_shape)} built"
            for name, file_shape, model_shape in list(mismatched)[:5]
        )
        problems.append(f"another shape: {shown}")
    if problems:
        raise ValueError(
            f"{directory}: the weights do not fit the model config.json builds: "
            + "; ".join(problems)
        )


def _names(names: Any) -> str:
    listed = sorted(names)
    more = f" and {len(listed) - 5} more" if len(listed) > 5 else ""
    return ", ".join(listed[:5]) + more


def load_causal_lm(directory: str | Path) -> PreTrainedModel:
    """The causal LM in ``directory`` (float32, CPU, eval), checked three ways: the weights'
    shapes against ``config.json`` (:func:`check_weight_files`), every tensor loaded
    (none missing, extra or of another size), and the module transformers built against
    ``config.json`` (:func:`check_built_model`). Each refusal is a ``ValueError`` naming the
    fields (or tensors) and both values."""
    from transformers import AutoModelForCausalLM

    hf = read_hf_config(Path(directory))
    check_weight_files(directory, hf)
    loaded: Any = AutoModelForCausalLM.from_pretrained(
        str(directory),
        dtype=torch.float32,
        local_files_only=True,
        output_loading_info=True,
        ignore_mismatched_sizes=True,  # refused below, naming the tensors
    )
    model, info = loaded
    _check_loading_info(directory, info)
    check_built_model(hf, model)
    built: PreTrainedModel = model.eval()
    return built


def checkpoint_tensors(model: PreTrainedModel) -> list[tuple[str, torch.Tensor]]:
    """``model``'s parameters (detached) under the names its safetensors files use, which is
    what SGLang's weight loading expects: transformers 5 keeps some weights fused in memory
    (Qwen3-MoE's experts as one tensor per layer) and splits them again when saving, as here;
    a dense model's parameters keep their names. A tied output layer is not repeated."""
    params = {name: p.detach() for name, p in model.named_parameters()}
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers 4: the names in memory are the file's
        return list(params.items())
    reverted: dict[str, torch.Tensor] = revert_weight_conversion(model, params)
    tied = getattr(model.config, "tie_word_embeddings", False)
    return [(n, t) for n, t in reverted.items() if not (tied and n == "lm_head.weight")]


def token_logprobs(
    model: PreTrainedModel,
    items: Sequence[tuple[Sequence[int], Sequence[tuple[int, int]]]],
    *,
    temperature: float = 1.0,
) -> list[torch.Tensor]:
    """For each ``(ids, spans)``: the logprobs (with gradient) of ``ids[a:b]`` for every
    ``(a, b)`` in ``spans`` (``a ≥ 1``), concatenated; token ``j`` is scored from the logits at
    ``j − 1`` divided by ``temperature``, as the engine sampled it."""
    out: list[torch.Tensor] = []
    scale = max(temperature, 1e-6)
    for ids, spans in items:
        positions = [j for a, b in spans for j in range(a, b)]
        if not positions:
            out.append(torch.zeros(0))
            continue
        if positions[0] < 1:
            raise ValueError("token 0 has no logits before it: spans must start at 1 or later")
        end = positions[-1] + 1
        inputs = torch.tensor([list(ids[:end])], dtype=torch.long)
        logits = model(input_ids=inputs).logits[0] / scale  # type: ignore[operator]
        logp = torch.log_softmax(logits, dim=-1)
        at = torch.tensor(positions, dtype=torch.long)
        targets = torch.tensor([ids[j] for j in positions], dtype=torch.long)
        out.append(logp[at - 1, targets])
    return out


def save_model(model: PreTrainedModel, directory: str | Path, *, source: str | Path) -> Path:
    """``model``'s weights as safetensors in ``directory``, with the tokenizer files, chat
    template and generation config of ``source`` beside them: a directory both
    ``AutoModelForCausalLM`` and ``AutoTokenizer`` load (what engines reload)."""
    import shutil

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
        "generation_config.json",
    ):
        src = Path(source) / name
        if src.is_file() and src.resolve() != (out / name).resolve():
            shutil.copyfile(src, out / name)
    return out
