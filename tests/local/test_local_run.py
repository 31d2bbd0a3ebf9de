"""A short ``agentrl run``: real episodes, real steps; its summary agrees with its own logs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from agentrl.local.cli import run

QUICKSTART = Path(__file__).parents[2] / "examples" / "quickstart.yaml"


def _short_manifest(tmp_path: Path, **failure_policy: object) -> Path:
    """The quickstart cut to a few-second run: 12 tasks, steps of 4, groups of 2."""
    manifest = yaml.safe_load(QUICKSTART.read_text())
    spec = manifest["spec"]
    spec["trainer"]["trajectoriesPerStep"] = 4
    spec["rollout"]["groupSize"] = 2
    spec["rollout"]["maxTurns"] = 3
    if failure_policy:
        spec["rollout"]["failurePolicy"] = failure_policy
    spec["sandbox"]["concurrency"] = 4
    spec["dataset"]["maxTasks"] = 12
    spec["dataset"]["heldOutFraction"] = 0.25
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def _run(path: Path, run_dir: Path, report: Path, *flags: str) -> dict[str, Any]:
    """``agentrl run`` on ``path`` in-process (no Ray); asserts it succeeded, returns its
    ``summary.json``."""
    args = [str(path), "--quiet", "--no-ray", *flags, "--run-dir", str(run_dir)]
    result = CliRunner().invoke(run, [*args, "--report", str(report)])
    assert result.exit_code == 0, result.output
    return json.loads((report / "summary.json").read_text())  # type: ignore[no-any-return]


@pytest.mark.slow
def test_a_two_step_run_reports_figures_consistent_with_its_step_log(tmp_path: Path) -> None:
    path = _short_manifest(tmp_path)
    run_dir, report = tmp_path / "run", tmp_path / "report"

    summary = _run(path, run_dir, report, "--max-steps", "2", "--eval-samples", "1")
    steps = [json.loads(x) for x in (run_dir / "logs" / "steps.jsonl").read_text().splitlines()]
    assert summary["steps"] == len(steps) == 2
    assert summary["trained_trajectories"] == sum(s["trajectories"] for s in steps)
    assert summary["infra_errors_in_training"] == 0
    assert summary["reward_mean_last_step"] == steps[-1]["reward_mean"]
    for part, seconds in summary["step_time_seconds"].items():
        assert seconds == pytest.approx(sum(s["times"][part] for s in steps))
    # every trajectory the trainer received has exactly one terminal class
    assert sum(summary["classes"].values()) == summary["trajectories"]
    # pass@1 was measured on the held-out tasks (12 tasks × 0.25 = 3, one episode each)
    assert summary["held_out_tasks"] == 3
    assert summary["eval_before"]["episodes"] + summary["eval_before"]["infra_errors"] == 3
    assert 0.0 <= summary["pass_at_1_before"] <= 1.0
    for png in ("reward.png", "lengths.png", "step_time.png"):
        assert (report / png).stat().st_size > 0
    # the last step was checkpointed, so --resume has something to continue from
    assert (run_dir / "checkpoints" / "step-00000002" / "driver.json").is_file()


@pytest.mark.slow
def test_a_chaos_run_counts_infra_errors_trains_none_and_a_resume_counts_on(tmp_path: Path) -> None:
    # Half the sandbox creations fail (seeded), engines crash now and then; no retries, so
    # every failed attempt reaches the trainer as an infra_error trajectory and must be kept
    # out of every step.
    path = _short_manifest(tmp_path, infraRetries=0)
    run_dir, report = tmp_path / "run", tmp_path / "report"

    summary = _run(path, run_dir, report, "--max-steps", "2", "--skip-eval", "--chaos", "0.5")
    steps = [json.loads(x) for x in (run_dir / "logs" / "steps.jsonl").read_text().splitlines()]
    assert summary["steps"] == len(steps) == 2
    assert summary["infra_errors"] > 0
    assert summary["infra_errors_in_training"] == 0
    # the trainer received the dropped attempts as infra_error trajectories ...
    received = summary["classes"].get("infra_error", 0)
    assert summary["infra_errors_dropped"] == received > 0
    # ... its step log saw them arrive (those after the last step are in no line) ...
    logged = sum(s["infra_errors"] for s in steps)
    assert 0 < logged <= received <= summary["infra_errors"]
    assert all(s["infra_errors"] == s["classes"].get("infra_error", 0) for s in steps)
    # ... and its tool health counts them per end reason and in no rate
    tools = summary["tools"]
    assert sum(tools["end_reasons"].values()) == summary["trajectories"]
    assert tools["end_reasons"]["infra_error"] == received
    assert tools["episodes"] == summary["trajectories"] - received
    assert all(s["tools"]["end_reasons"]["infra_error"] == s["infra_errors"] for s in steps)
    # ... and by every step, no more trajectories were trained on than non-infra ones received
    trained = usable = 0
    for s in steps:
        trained += s["trajectories"]
        usable += sum(s["classes"].values()) - s["infra_errors"]
        assert trained <= usable
    assert summary["trained_trajectories"] == sum(s["trajectories"] for s in steps)

    # The attempts are checkpointed with the step: a resumed run (one more step, no chaos)
    # goes on from the checkpoint's count instead of starting again from 0.
    driver = json.loads((run_dir / "checkpoints" / "step-00000002" / "driver.json").read_text())
    checkpointed = driver["infra_error_attempts"]
    # every infra-error trajectory the checkpoint's counters hold ended as an attempt before it
    assert 0 < driver["counters"]["infra_errors"] <= checkpointed <= summary["infra_errors"]
    resumed = _run(path, run_dir, report, "--max-steps", "3", "--skip-eval", "--resume")
    assert (resumed["steps"], resumed["restarts"]) == (3, 1)
    assert resumed["infra_errors"] >= checkpointed
    assert resumed["infra_errors"] >= resumed["infra_errors_dropped"] >= received
