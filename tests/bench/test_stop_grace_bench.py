"""``bench/stop_grace.py`` at its smallest size, run as a user runs it (a subprocess printing one
JSON object): each stop went through the real driver to a checkpoint whose bytes are the files
on disk, the volume was left as the trainer leaves it (the oldest checkpoint and export
pruned), and the figures are consistent with each other. No figure is a timing assertion. The
projection's arithmetic is checked by hand, and the default grace period against it."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from agentrl.api.trainer import Checkpoint
from agentrl.trainer.checkpoint import DriverState

pytestmark = pytest.mark.slow  # a subprocess that imports torch and transformers

BENCH = Path(__file__).resolve().parents[2] / "bench" / "stop_grace.py"
#: ``mini``: 2 layers of q 64×64, k and v 64×32 each, o 64×64, q/k norms 2×16, gate/up/down
#: 3×64×128, two norms 2×64; the tied 739×64 embedding; the final norm.
MINI_PARAMS = 2 * (4096 + 2 * 2048 + 4096 + 32 + 3 * 64 * 128 + 128) + 739 * 64 + 64


def _bench_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("stop_grace", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    keep = tmp_path_factory.mktemp("stop-grace")
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--sizes", "mini", "--repeats", "1", "--tokens", "16",
         "--no-projection", "--raw-write-mb", "16", "--keep-dir", str(keep), "--json"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, proc.stdout
    result: dict[str, Any] = json.loads(lines[0])
    return result


def test_the_report_has_one_size_with_both_cases(report: dict[str, Any]) -> None:
    assert report.keys() >= {
        "date", "command", "machine", "sizes", "fit", "margin", "projection", "work_dir",
    }  # fmt: skip
    (size,) = report["sizes"]
    assert size["size"] == "mini"
    assert size["parameters"] == MINI_PARAMS == 121_408
    assert size["vocab_size"] == 739
    for case in ("between_steps", "mid_step"):
        (run,) = size[case]["runs"]
        # one run: its median is itself
        for key, value in size[case].items():
            if key != "runs":
                assert value == run[key], (case, key)
    # one size: no line to fit; no projection asked for
    assert report["fit"] == {"durable": None, "page_cache": None}
    assert report["projection"] == []


@pytest.mark.parametrize("case", ["between_steps", "mid_step"])
def test_each_stop_wrote_the_checkpoint_whose_bytes_are_on_disk(
    report: dict[str, Any], case: str
) -> None:
    (size,) = report["sizes"]
    (run,) = size[case]["runs"]
    volume = Path(report["work_dir"]) / f"volume-mini-{case}-0"
    checkpoint = volume / run["checkpoint"]
    files = {p.relative_to(checkpoint).as_posix(): p.stat().st_size
             for p in checkpoint.rglob("*") if p.is_file()}  # fmt: skip
    assert run["checkpoint_bytes"] == sum(files.values())
    assert {"driver.json", "optimizer.pt", "model/model.safetensors", "model/config.json"} <= set(
        files
    )
    # fp32 weights and two fp32 Adam moments at least (tokenizer files and headers on top)
    assert run["checkpoint_bytes"] >= 12 * size["parameters"]
    # the stop checkpointed the step after the volume's last one, tasks in flight pending
    saved = DriverState.model_validate_json((checkpoint / "driver.json").read_text())
    assert run["checkpoint"] == "step-00000011" and saved.step == 11
    assert len(saved.pending_positions) == run["pending_tasks"] > 0
    # the volume as the trainer leaves it: three checkpoints (step 8 pruned), two exports
    assert run["checkpoints_kept"] == [9, 10, 11]
    assert sorted(p.name for p in volume.glob("step-*")) == [f"step-{s:08d}" for s in (9, 10, 11)]
    assert run["exports_kept"] == ["v10", "v11"]
    assert not list(volume.glob(".tmp-*"))


def test_the_figures_of_a_stop_add_up(report: dict[str, Any]) -> None:
    (size,) = report["sizes"]
    between, mid = size["between_steps"], size["mid_step"]
    for run in (between, mid):
        assert run["signal_to_durable_s"] == pytest.approx(
            run["signal_to_checkpoint_s"] + run["fsync_s"]
        )
        assert run["signal_to_exit_s"] >= run["signal_to_checkpoint_s"] > 0
        assert run["step_s"] > 0 and run["push_s"] > 0
    # mid-step: the signal came as the step started, so the step, the push and the checkpoint
    # after it all lie between the signal and the checkpoint
    assert mid["signal_to_checkpoint_s"] >= mid["step_s"] + mid["checkpoint_after_step_s"]
    assert mid["checkpoint_after_step_s"] > 0
    assert size["checkpoint_bytes"] == between["runs"][0]["checkpoint_bytes"]
    assert size["bytes_per_parameter"] == round(size["checkpoint_bytes"] / MINI_PARAMS, 3)


def test_the_grace_formula_is_a_step_a_checkpoint_and_a_margin_in_whole_minutes() -> None:
    bench = _bench_module()
    # 641.1 s + 427.4 GB at 1 GB/s = 1,068.5 s; 10 % margin: 1,175.35 s; up to 1,200 s
    assert bench.grace_seconds(641.1, 427.4e9, 1.0) == 1200
    # 328.5 s + 114.7 s = 443.2 s; the margin's floor is 60 s: 503.2 s; up to 540 s
    assert bench.grace_seconds(328.5, 114.7e9, 1.0) == 540
    # half the throughput doubles the write: 641.1 + 854.8 = 1,495.9 s; ×1.1 = 1,645.5; 1,680
    assert bench.grace_seconds(641.1, 427.4e9, 0.5) == 1680
    assert bench.grace_seconds(0.0, 0.0, 1.0) == 60


def test_the_default_grace_period_covers_the_target_examples_at_1_gb_per_s() -> None:
    """The default of ``stopGracePeriodSeconds`` is the projection's largest figure: the
    examples' step and checkpoint as ``agentrl plan`` computes them, written at 1 GB/s."""
    rows = _bench_module().projection(1.0, None)
    assert [r["example"] for r in rows] == list(_bench_module().TARGETS)
    for row in rows:
        assert row["grace_s"] == _bench_module().grace_seconds(
            row["step_s"], row["checkpoint_bytes"], 1.0
        )
        assert row["checkpoint_bytes"] == 14 * row["parameters"]
    default = Checkpoint().stop_grace_period_seconds
    assert default >= max(r["grace_s"] for r in rows)
