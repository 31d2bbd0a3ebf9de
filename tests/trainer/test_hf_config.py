"""Reading a model's ``config.json`` as transformers does: files written here by transformers 5's
own config classes (``save_pretrained``: RoPE base inside ``rope_parameters``, Qwen3-MoE's experts
as ``num_local_experts``) and hand-written transformers-4-style files (top-level ``rope_theta``,
``num_experts``). The expected values are the numbers passed in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.trainer.hf_config import (
    HFModelConfig,
    compare_model_fields,
    expected_model_fields,
    normalise_hf_dict,
    read_hf_config,
)

pytest.importorskip("transformers")

import transformers

SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
}


def _saved(tmp_path: Path, config: object) -> Path:
    config.save_pretrained(tmp_path)  # type: ignore[attr-defined]
    return tmp_path


def test_a_qwen3_config_written_by_transformers_5_keeps_its_rope_base_and_head_dim(
    tmp_path: Path,
) -> None:
    written = _saved(tmp_path, transformers.Qwen3Config(**SHAPE, head_dim=32, rope_theta=1e6))
    raw = json.loads((written / "config.json").read_text())
    assert "rope_theta" not in raw  # the key the trainer used to read is not there
    assert raw["rope_parameters"]["rope_theta"] == 1e6

    hf = read_hf_config(written)
    assert hf.architecture == "Qwen3ForCausalLM"  # from model_type: no "architectures" saved
    assert hf.rope_theta == 1e6
    assert hf.kv_channels == 32  # head_dim given, not 64 / 4
    assert (hf.num_hidden_layers, hf.hidden_size, hf.kv_heads) == (3, 64, 2)
    assert hf.rms_norm_eps == 1e-5
    assert not hf.is_moe
    assert hf.qk_layernorm


def test_a_qwen3_moe_config_written_by_transformers_5_is_built_with_its_experts(
    tmp_path: Path,
) -> None:
    config = transformers.Qwen3MoeConfig(
        **SHAPE,
        head_dim=16,
        rope_theta=1e6,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=24,
        norm_topk_prob=True,
    )
    written = _saved(tmp_path, config)
    raw = json.loads((written / "config.json").read_text())
    assert "num_experts" not in raw and raw["num_local_experts"] == 8

    hf = read_hf_config(written)
    assert hf.architecture == "Qwen3MoeForCausalLM"
    assert hf.is_moe
    assert (hf.num_experts, hf.num_experts_per_tok, hf.moe_intermediate_size) == (8, 2, 24)
    assert hf.rope_theta == 1e6
    assert hf.kv_channels == 16


def test_a_qwen2_config_without_head_dim_falls_back_to_hidden_over_heads(tmp_path: Path) -> None:
    written = _saved(tmp_path, transformers.Qwen2Config(**SHAPE, rope_theta=5e5))
    hf = read_hf_config(written)
    assert hf.architecture == "Qwen2ForCausalLM"
    assert hf.kv_channels == 64 // 4
    assert hf.rope_theta == 5e5
    assert hf.qkv_bias


def test_a_transformers_5_config_with_no_rope_base_gets_transformers_default(
    tmp_path: Path,
) -> None:
    written = _saved(tmp_path, transformers.Qwen2Config(**SHAPE))
    assert read_hf_config(written).rope_theta == 10_000.0


@pytest.mark.parametrize("moe", [False, True])
def test_an_old_style_config_reads_top_level_rope_theta_and_num_experts(
    tmp_path: Path, moe: bool
) -> None:
    data: dict[str, object] = {
        "architectures": ["Qwen3MoeForCausalLM" if moe else "Qwen3ForCausalLM"],
        "model_type": "qwen3_moe" if moe else "qwen3",
        **SHAPE,
        "head_dim": 32,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
    }
    if moe:
        data.update(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=24)
    (tmp_path / "config.json").write_text(json.dumps(data))
    hf = read_hf_config(tmp_path)
    assert hf.rope_theta == 1e6
    assert hf.kv_channels == 32
    assert hf.num_experts == (8 if moe else None)


def test_a_config_transformers_does_not_know_is_read_from_its_json(tmp_path: Path) -> None:
    # No model_type: AutoConfig refuses it, the JSON is read with the same key rules.
    data = {"architectures": ["Qwen2ForCausalLM"], **SHAPE}
    data["rope_parameters"] = {"rope_theta": 2e6, "rope_type": "default"}
    (tmp_path / "config.json").write_text(json.dumps(data))
    assert read_hf_config(tmp_path).rope_theta == 2e6


def test_the_json_rules_alone_resolve_both_formats() -> None:
    new = normalise_hf_dict(
        {**SHAPE, "model_type": "qwen3_moe", "num_local_experts": 4,
         "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}}
    )  # fmt: skip
    assert (new["rope_theta"], new["num_experts"], new["architectures"]) == (
        1e6,
        4,
        ["Qwen3MoeForCausalLM"],
    )
    old = normalise_hf_dict({**SHAPE, "rope_theta": 5e5, "num_experts": 2})
    assert (old["rope_theta"], old["num_experts"]) == (5e5, 2)


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"rope_parameters": {"rope_theta": 1e6, "rope_type": "yarn", "factor": 4.0}}, "yarn"),
        ({"num_experts": 4, "mlp_only_layers": [0]}, "mlp_only_layers"),
        ({"use_sliding_window": True}, "use_sliding_window"),
    ],
)
def test_layouts_the_uniform_megatron_model_cannot_represent_are_refused(
    extra: dict[str, object], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        normalise_hf_dict({**SHAPE, **extra})


def test_a_built_model_that_differs_from_the_config_is_named_field_by_field() -> None:
    hf = HFModelConfig.model_validate({**SHAPE, "rope_theta": 1e6})
    built = expected_model_fields(hf)
    compare_model_fields(hf, built)  # the same: no error
    wrong = {**built, "rotary_base": 10_000.0, "num_query_groups": 4}
    with pytest.raises(ValueError) as caught:
        compare_model_fields(hf, wrong)
    assert "rotary_base: built 10000.0, config.json says 1000000.0" in str(caught.value)
    assert "num_query_groups: built 4, config.json says 2" in str(caught.value)
    assert "hidden_size" not in str(caught.value)
