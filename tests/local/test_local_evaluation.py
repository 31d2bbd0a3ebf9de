"""Held-out evaluation in a real ``agentrl run`` with the torch backend: pass@1 before the first
step, at every ``intervalSteps`` beside training, in ``logs/evaluations.jsonl``, the run's log
and the report (that its episodes never reach a step: tests/trainer/test_periodic_evaluation.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from tests.local.test_local_run import _short_manifest

from agentrl.local.cli import run


@pytest.mark.slow
def test_pass_at_1_is_recorded_at_the_start_and_every_interval(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _short_manifest(tmp_path)
    manifest = yaml.safe_load(path.read_text())
    assert manifest["spec"]["trainer"]["backend"] == "torch"
    manifest["spec"]["trainer"]["evaluation"] = {
        "intervalSteps": 2,
        "tasks": 2,  # of the 3 held-out tasks (12 × 0.25)
        "attemptsPerTask": 2,
    }
    path.write_text(yaml.safe_dump(manifest))
    run_dir, report = tmp_path / "run", tmp_path / "report"

    with caplog.at_level(logging.INFO, logger="agentrl.trainer.evaluation"):
        result = CliRunner().invoke(
            run,
            [str(path), "--quiet", "--no-ray", "--max-steps", "4",
             "--run-dir", str(run_dir), "--report", str(report)],
        )  # fmt: skip
    assert result.exit_code == 0, result.output

    lines = [json.loads(x) for x in (run_dir / "logs" / "evaluations.jsonl").read_text().split()]
    # before training (step 0), then after steps 2 and 4 (the last also the "after" figure)
    assert [line["step"] for line in lines] == [0, 2, 4]
    for line in lines:
        assert line["episodes"] + line["infra_errors"] == 4  # 2 tasks × 2 attempts
        assert line["pass_at_1"] is None or 0.0 <= line["pass_at_1"] <= 1.0
    logged = [r.getMessage() for r in caplog.records if "pass@1" in r.getMessage()]
    # "evaluation after step N (STAGE): pass@1 …"
    assert sorted(" ".join(m.split()[3:5]) for m in logged) == [
        "0 (base):",
        "2 (rl):",
        "4 (rl):",
    ]
    assert [line["stage"] for line in lines] == ["base", "rl", "rl"]

    summary = json.loads((report / "summary.json").read_text())
    assert [e["step"] for e in summary["evaluations"]] == [0, 2, 4]
    assert summary["pass_at_1_before"] == lines[0]["pass_at_1"]
    assert summary["pass_at_1_after"] == lines[-1]["pass_at_1"]
    assert 0.0 < summary["evaluation_share_of_rollout"] < 1.0
    # evaluation episodes are not counted as training's: 4 steps of 4
    steps = [json.loads(x) for x in (run_dir / "logs" / "steps.jsonl").read_text().splitlines()]
    assert [s["trajectories"] for s in steps] == [4, 4, 4, 4]
