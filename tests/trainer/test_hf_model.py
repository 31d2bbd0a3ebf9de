"""Loading an HF model directory for training: the weights checked against ``config.json``
before and after transformers builds the model, a Qwen3-MoE model (transformers' own classes,
written here) with its experts, and the tensors the distributed weight sync sends under the
names of the safetensors files.

References are independent of the code under test: shapes and numbers passed to transformers'
config classes, tensor names and values read from the safetensors files with ``safetensors``,
files edited by hand."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from agentrl.api.trainer import TrainerSpec
from agentrl.trainer import hf_model
from agentrl.trainer.batching import TrainSample
from agentrl.trainer.hf_config import read_hf_config
from agentrl.trainer.torch_backend import TorchBackend
from tests.trainer.factories import make_trajectory

SPEC = TrainerSpec(backend="torch", gpus_per_node=0, optimizer={"lr": 0.01})


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {
        "mini": hf_model.create_model(root / "mini", seed=0, preset="mini"),
        "small": hf_model.create_model(root / "small", seed=0, preset="small"),
    }


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _refused(directory: Path) -> str:
    with pytest.raises(ValueError) as caught:
        hf_model.load_causal_lm(directory)
    return str(caught.value)


def test_weights_of_another_width_are_refused_naming_the_fields(
    models: dict[str, Path], tmp_path: Path
) -> None:
    """mini's config.json (hidden 64, 2 layers, head 16, FFN 128) with small's weights (128,
    4, 32, 384: PRESETS)."""
    wrong = _copy(models["mini"], tmp_path / "wrong")
    shutil.copyfile(models["small"] / "model.safetensors", wrong / "model.safetensors")
    message = _refused(wrong)
    assert "the weights do not fit config.json" in message
    for field in (
        "hidden_size: the weights have 128, config.json says 64",
        "num_layers: the weights have 4, config.json says 2",
        "kv_channels: the weights have 32, config.json says 16",
        "ffn_hidden_size: the weights have 384, config.json says 128",
    ):
        assert field in message
    assert "vocab_size" not in message  # the same tokenizer: the same vocabulary


def test_a_config_with_more_layers_than_the_weights_is_refused_not_filled_at_random(
    models: dict[str, Path], tmp_path: Path
) -> None:
    """transformers alone would build 3 layers and leave the third at its random init."""
    more = _copy(models["mini"], tmp_path / "more")
    config = json.loads((more / "config.json").read_text())
    config["num_hidden_layers"] = 3
    config.pop("layer_types")  # one per layer: transformers derives them again
    (more / "config.json").write_text(json.dumps(config))
    assert "num_layers: the weights have 2, config.json says 3" in _refused(more)


def test_a_tensor_missing_from_the_weights_is_refused_by_name(
    models: dict[str, Path], tmp_path: Path
) -> None:
    """A tensor no field describes (a per-head norm of the last layer): named, not left at
    random."""
    holed = _copy(models["mini"], tmp_path / "holed")
    tensors = load_file(str(holed / "model.safetensors"))
    del tensors["model.layers.1.self_attn.k_norm.weight"]
    save_file(tensors, str(holed / "model.safetensors"), metadata={"format": "pt"})
    message = _refused(holed)
    assert re.search(r"not in the weights.*model\.layers\.1\.self_attn\.k_norm\.weight", message)


def test_the_dense_models_tensors_carry_the_names_and_values_of_its_file(
    models: dict[str, Path],
) -> None:
    model = hf_model.load_causal_lm(models["mini"])
    file = load_file(str(models["mini"] / "model.safetensors"))
    sent = dict(hf_model.checkpoint_tensors(model))
    assert sorted(sent) == sorted(file)  # tied: no lm_head.weight in either
    for name, tensor in file.items():
        assert torch.equal(sent[name], tensor), name


# -- a Qwen3-MoE model ---------------------------------------------------------------------

MOE = {
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 64,
    "moe_intermediate_size": 16,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
}


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("moe")
    torch.manual_seed(0)
    Qwen3MoeForCausalLM(Qwen3MoeConfig(**MOE, rope_theta=1e6)).save_pretrained(str(out))
    return out


def test_a_qwen3_moe_model_loads_with_its_experts(moe_dir: Path) -> None:
    model = hf_model.load_causal_lm(moe_dir)
    built = hf_model.built_model_fields(model)
    assert built["num_moe_experts"] == 4
    assert built["moe_router_topk"] == 2
    assert built["moe_ffn_hidden_size"] == 16
    assert (built["num_layers"], built["hidden_size"], built["kv_channels"]) == (2, 32, 8)
    assert abs(built["rotary_base"] - 1e6) < 1.0
    assert hf_model.weight_file_fields(moe_dir)["num_moe_experts"] == 4


def test_an_old_style_moe_config_of_the_same_weights_loads(moe_dir: Path, tmp_path: Path) -> None:
    """transformers 4's keys, hand-written: top-level rope_theta, num_experts."""
    old = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        **MOE,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
    }
    (tmp_path / "config.json").write_text(json.dumps(old))
    shutil.copyfile(moe_dir / "model.safetensors", tmp_path / "model.safetensors")
    built = hf_model.built_model_fields(hf_model.load_causal_lm(tmp_path))
    assert (built["num_moe_experts"], built["moe_router_topk"]) == (4, 2)
    assert abs(built["rotary_base"] - 1e6) < 1.0


def test_moe_weights_with_other_experts_are_refused_naming_the_field(
    moe_dir: Path, tmp_path: Path
) -> None:
    edited = _copy(moe_dir, tmp_path / "edited")
    config = json.loads((edited / "config.json").read_text())
    config["num_local_experts"] = 8  # the key transformers 5 writes
    (edited / "config.json").write_text(json.dumps(config))
    assert "num_moe_experts: the weights have 4, config.json says 8" in _refused(edited)


def test_a_dense_model_under_a_moe_config_is_refused(moe_dir: Path, tmp_path: Path) -> None:
    model = hf_model.load_causal_lm(moe_dir)
    dense = {**MOE, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}
    for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
        dense.pop(key)
    (tmp_path / "config.json").write_text(json.dumps(dense))
    with pytest.raises(ValueError, match=re.escape("num_moe_experts: built 4, config.json says")):
        hf_model.check_built_model(read_hf_config(tmp_path), model)


def test_the_moe_models_tensors_carry_the_per_expert_names_of_its_file(moe_dir: Path) -> None:
    """transformers 5 fuses the experts in memory; the sync sends them as the file has them
    (what SGLang's weight loading reads)."""
    model = hf_model.load_causal_lm(moe_dir)
    file = load_file(str(moe_dir / "model.safetensors"))
    assert "model.layers.0.mlp.experts.3.down_proj.weight" in file
    sent = dict(hf_model.checkpoint_tensors(model))
    assert sorted(sent) == sorted(file)
    for name, tensor in file.items():
        assert torch.equal(sent[name], tensor), name


def test_a_grpo_step_on_the_moe_model_exports_what_transformers_reloads(
    moe_dir: Path, tmp_path: Path
) -> None:
    """The export carries the trained weights under the file's names (the experts split
    again): transformers reloads them with the trainer's logits, and the distributed sync
    sends the same tensors."""
    backend = TorchBackend(hf_model.load_causal_lm(moe_dir), SPEC, temperature=1.0, source=moe_dir)
    ids, mask = [1, 40, 41, 42, 43, 44], [0, 0, 0, 1, 1, 1]
    t = make_trajectory("a#0", 1.0, tokens=(ids, [-1.0 if m else 0.0 for m in mask], mask))
    stats = backend.train_step([TrainSample(trajectory=t, advantage=1.0, carries_loss=True)])
    assert stats.grad_norm > 0
    out = tmp_path / "export"
    backend.export_weights(out)
    reloaded = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    start = AutoModelForCausalLM.from_pretrained(str(moe_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        ours = backend.model(input_ids=torch.tensor([ids])).logits
        assert torch.equal(ours, reloaded(input_ids=torch.tensor([ids])).logits)
        assert not torch.equal(ours, start(input_ids=torch.tensor([ids])).logits)
    file = load_file(str(out / "model.safetensors"))
    sent = dict(backend.named_tensors())
    assert sorted(sent) == sorted(file)
    for name, tensor in file.items():
        assert torch.equal(sent[name], tensor), name


def test_the_cli_offers_every_preset() -> None:
    """``agentrl model create --preset`` lists its choices without importing torch; they must
    be the presets create_model knows."""
    import click

    from agentrl.trainer.model_cli import create

    option = next(p for p in create.params if p.name == "preset")
    assert isinstance(option.type, click.Choice)
    assert list(option.type.choices) == list(hf_model.PRESETS)
