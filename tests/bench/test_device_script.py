"""``bench/device/megatron_one_step.py --cpu``: the device script's CPU-checkable part runs here
(a MoE model built, checkpointed and exported, the distributed push into a receiver process,
one torch-backend step) and prints the one JSON line the GPU run prints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core", reason="the megatron extra (pip install 'agentrl[megatron]')")

from agentrl.tiny.tokenizer import get_tokenizer

pytestmark = pytest.mark.slow  # a subprocess that imports megatron-core and spawns a receiver

SCRIPT = Path("bench/device/megatron_one_step.py")


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
    assert result["model"] == "Qwen3MoeForCausalLM"
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
