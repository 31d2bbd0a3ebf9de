"""``agentrl plan`` as a user runs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from agentrl.cli import main
from tests.factories import make_job

FAST = ("sim:\n  warmup_seconds: 300\n  measure_seconds: 600\n  measure_steps: 1\n"
        "  measure_steps_async: 1\n")


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    manifest = (make_job("cli", namespace=None).with_spec("model.architecture", "Qwen3-8B")
                .with_spec("rollout.maxTurns", 10).with_spec("sandbox.concurrency", 8)
                .with_spec("trainer.trajectoriesPerStep", 16).manifest())
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(manifest))
    params = tmp_path / "params.yaml"
    params.write_text(FAST)
    return job, params


def test_json_output_has_the_promised_keys(files: tuple[Path, Path]) -> None:
    job, params = files
    result = CliRunner().invoke(main, ["plan", str(job), "--json", "--params", str(params)])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    for key in ("kv_bytes_per_token", "kv_pool_tokens_per_engine", "trajectories_per_hour",
                "step_seconds", "bottleneck", "warnings"):
        assert key in out
    # Qwen3-8B: 2 × 36 layers × 8 KV heads × 128 × 2 B = 147,456 B.
    assert out["kv_bytes_per_token"] == 147_456
    # No product label: the default GPU is assumed and the plan says so.
    assert any("assumed MI355X" in n for n in out["plan"]["static"]["notes"])


def test_table_output_names_the_bottleneck(files: tuple[Path, Path]) -> None:
    job, params = files
    result = CliRunner().invoke(main, ["plan", str(job), "--params", str(params)])
    assert result.exit_code == 0, result.output
    assert "bottleneck:" in result.output
    assert "KV per token" in result.output


def test_unknown_architecture_is_a_clear_error(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(make_job("x", namespace=None)
                                  .with_spec("model.architecture", "GPT-9").manifest()))
    result = CliRunner().invoke(main, ["plan", str(job)])
    assert result.exit_code != 0
    assert "unknown architecture 'GPT-9'" in result.output


def test_plot_writes_three_pngs(files: tuple[Path, Path], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the plots extra is not installed")
    job, params = files
    out = tmp_path / "charts"
    result = CliRunner().invoke(main, ["plan", str(job), "--params", str(params),
                                       "--plot", str(out)])
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in out.glob("*.png"))
    assert names == ["length_distribution.png", "step_breakdown.png",
                     "throughput_vs_concurrency.png"]
    assert all(p.stat().st_size > 1000 for p in out.glob("*.png"))


def test_without_a_file_or_reproduce_report_it_says_what_is_missing() -> None:
    result = CliRunner().invoke(main, ["plan"])
    assert result.exit_code == 2
    assert "--reproduce-report" in result.output
