"""The architecture table, the HF config.json reader and GPU products."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.sim import architectures, hardware


def test_builtin_names_cover_the_qwen3_family_and_llama_gqa_models() -> None:
    names = architectures.builtin_names()
    for expected in ("Qwen3-0.6B", "Qwen3-8B", "Qwen3-32B", "Qwen3-30B-A3B", "Qwen3-235B-A22B",
                     "Llama-3.1-8B", "Llama-3.1-70B"):
        assert expected in names


def test_builtin_lookup_ignores_case_and_hub_prefixes() -> None:
    assert architectures.builtin("qwen/QWEN3-30B-A3B").name == "Qwen3-30B-A3B"
    assert architectures.builtin("Qwen3-30B-A3B-Instruct-2507").name == "Qwen3-30B-A3B"


def test_unknown_architecture_names_the_way_out() -> None:
    with pytest.raises(architectures.UnsupportedArchitectureError, match="--config"):
        architectures.builtin("GPT-9")


def test_a_config_json_is_read_from_a_model_directory(tmp_path: Path) -> None:
    config = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
              "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
              "max_position_embeddings": 131072}
    (tmp_path / "config.json").write_text(json.dumps(config))
    arch = architectures.load_hf_config(tmp_path)
    assert arch.head_dim == 128  # no head_dim field: 4096 / 32
    # 32 layers × (4096×4096 + 2×4096×1024 + 4096×4096 + 3×4096×14336) + 2 × 128256 × 4096
    # = 32 × 218,103,808 + 1,050,673,152 = 8,029,995,008. Llama-3.1-8B's published count,
    # 8,030,261,248, adds the 266,240 norm weights (32 × 2 × 4096 + 4096) the planner ignores.
    assert arch.total_params == 8_029_995_008
    assert architectures.builtin("Llama-3.1-8B").total_params == 8_029_995_008


def test_multi_head_latent_attention_is_refused_rather_than_mis_sized() -> None:
    with pytest.raises(architectures.UnsupportedArchitectureError, match="latent"):
        architectures.from_hf_config({"kv_lora_rank": 512, "num_attention_heads": 128})


def test_gpu_product_comes_from_the_amd_node_label() -> None:
    gpu = hardware.gpu_from_node_selector({"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM"})
    assert gpu is not None and gpu.name == "MI300X" and gpu.memory_gib == 192
    assert hardware.gpu_from_node_selector({}) is None
