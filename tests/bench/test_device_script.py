"""``bench/device/megatron_one_step.py --cpu``: the device script's CPU-checkable part runs here
(logprob parity with transformers, a MoE model built, checkpointed and exported, the distributed
push into a receiver process, one torch-backend step) and prints the one JSON line the GPU run
prints; its pure parts (command line, FLOP arithmetic, parameter counts) are checked by hand."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("megatron.core", reason="the megatron extra (pip install 'agentrl[megatron]')")

from agentrl.tiny.tokenizer import get_tokenizer

pytestmark = pytest.mark.slow  # a subprocess that imports megatron-core and spawns a receiver

SCRIPT = Path("bench/device/megatron_one_step.py")


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("megatron_one_step", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_command_line_defaults_and_choices() -> None:
    script = _script()
    args = script.parse_args([])
    assert args.bench_shapes == ["0.6b", "1.7b"]
    assert args.bench_tokens == [4096, 16384]
    assert args.parity is True and args.cpu is False
    assert args.budget_s == 420.0
    assert args.bench_checkpoint is True
    assert script.parse_args(["--no-bench-checkpoint"]).bench_checkpoint is False
    other = script.parse_args(
        ["--no-parity", "--bench-shapes", "", "--bench-tokens", "1024, 2048", "--cpu"]
    )
    assert other.parity is False and other.bench_shapes == [] and other.cpu is True
    assert other.bench_tokens == [1024, 2048]
    with pytest.raises(SystemExit):
        script.parse_args(["--bench-shapes", "7b"])


def test_model_flops_are_eight_per_parameter_per_token() -> None:
    script = _script()
    assert script.model_flops(1_000_000, 4096) == 32_768_000_000.0
    # 1.7e9 parameters, 16384 tokens in one second: 8 × 1.7e9 × 16384 = 2.228224e14 FLOP/s.
    assert script.tflops_per_second(1_700_000_000, 16384, 1.0) == pytest.approx(222.8224)
    assert script.tflops_per_second(10, 10, 0.0) == 0.0
    assert "8 x parameters x tokens" in script.FLOPS_CONVENTION


def test_the_0_6b_shape_has_qwen3_0_6bs_parameter_count_worked_out_by_hand() -> None:
    script = _script()
    # Per layer: q 1024×2048, k and v 1024×1024 each, o 2048×1024, q/k norms 2×128,
    # gate/up/down 3×1024×3072, two RMSNorms 2×1024.
    per_layer = 1024 * 2048 + 2 * 1024 * 1024 + 2048 * 1024 + 256 + 3 * 1024 * 3072 + 2048
    assert per_layer == 15_730_944
    # 28 layers (0.44B: Qwen3-0.6B's published non-embedding count), tied embedding, final norm.
    total = 28 * per_layer + 151936 * 1024 + 1024
    assert script.dense_params(script.BENCH_SHAPES["0.6b"]) == total == 596_049_920


@pytest.mark.parametrize("tied", [False, True])
def test_the_parameter_formula_agrees_with_transformers(tied: bool) -> None:
    transformers = pytest.importorskip("transformers")
    script = _script()
    shape = {
        "hidden_size": 48, "intermediate_size": 80, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "vocab_size": 100, "tie_word_embeddings": tied,
    }  # fmt: skip
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**shape))
    assert script.dense_params(shape) == model.num_parameters()


def test_the_cpu_mode_pushes_every_tensor_and_takes_a_torch_step() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu", "--layers", "2", "--hidden", "32", "--heads", "4",
         "--kv-heads", "2", "--ffn", "64", "--vocab", "128", "--seq", "32", "--experts", "4"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, proc.stdout
    result = json.loads(lines[0])

    assert result["mode"] == "cpu"
    assert result.keys() >= _script().RESULT_KEYS
    assert result["model"] == "Qwen3MoeForCausalLM"
    assert result["init"]["moe_te_gemm_patched"] is True
    # Parity: dense and MoE, both config styles, fp32 and bf16, all with the 1e6 RoPE base.
    parity = result["parity"]
    assert len(parity) == 8 and all(case["ok"] for case in parity)
    assert {(c["model"], c["config"], c["dtype"]) for c in parity} == {
        (m, c, d)
        for m in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
        for c in ("transformers5", "old-style")
        for d in ("fp32", "bf16")
    }
    assert all(c["rope_theta"] == 1e6 for c in parity)
    assert all(c["max_abs_diff"] < 1e-4 for c in parity if c["dtype"] == "fp32")
    assert [c["experts"] for c in parity if c["model"] == "Qwen3MoeForCausalLM"] == [8] * 4
    assert result["throughput"] == [] and result["resume_bit_equal"] is None
    assert result["steps"] == []  # megatron-core steps only on a GPU
    assert result["checkpoint_restored_weights"] is True
    assert result["checkpoint_restored_iteration"] is True
    assert result["exported_files"] == [
        "config.json",
        "model-rank00000.safetensors",
        "model.safetensors.index.json",
    ]
    push = result["push"]
    # Per layer: input norm, q, k, v, o, q norm, k norm, post-attention norm, router, and
    # gate/up/down of 4 experts = 9 + 12; two layers, plus embedding, final norm and lm head.
    assert push["tensors"] == 2 * (9 + 3 * 4) + 3 == 45
    assert push["failed"] == []
    assert push["matches_export"] is True

    tok = get_tokenizer()
    answers = sum(
        len(tok.encode_message("assistant", f"edit file {i} then run the tests", end_of_turn=True))
        for i in range(4)
    )
    assert result["torch_step"]["tokens"] == answers
    assert result["torch_step"]["finite"] is True
    # the stop's checkpoint, timed (the figure of bench/stop_grace.py): the one-step model's
    # here, the throughput shapes' too on a GPU
    (save,) = result["checkpoint_saves"]
    assert save["label"] == "one-step model" and save["files"] > 0
    assert save["bytes"] > 4 * save["parameters"] > 0  # fp32 weights and more
    assert save["durable_s"] == pytest.approx(save["save_s"] + save["fsync_s"], abs=2e-3)
