"""Checkpoint saves that fail reach the job's status at the next reconcile: from the first failed
save the trainer reports (``checkpointSaveFailure`` in ``agentrl.dev/progress``, each save after
``checkpoint.saveAttempts`` tries) the job is ``Degraded=True``/``CheckpointSaveFailing`` and
``CheckpointSaved=False``, naming the step, the error, the last checkpoint and when the trainer
gives up; one Warning event; a save that succeeds clears both. With no trainer reporting (it
exited over the failures and restarts) the last word stands. A progress annotation from a
trainer older than the field reads as before. Pure: compute_status over observed pods."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from agentrl.api.wire import TrainerProgress
from agentrl.reconcile.observed import observe
from agentrl.reconcile.status import (
    CHECKPOINT_SAVE_FAILURES_DEGRADED,
    StatusResult,
    compute_status,
    status_body,
)
from tests.factories import make_deployment, make_job, make_pod, make_statefulset, make_trainer_job

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
ERROR = "OSError: [Errno 28] No space left on device"


def _objects(progress: dict[str, Any] | None) -> dict[str, Any]:
    pods = [
        make_pod("demo-engine-0", "engine").running().obj(),
        make_pod("demo-rollout-0", "rollout").running().obj(),
    ]
    if progress is not None:
        pods.append(
            make_pod("demo-trainer-0-x", "trainer")
            .running()
            .annotated("batch.kubernetes.io/job-completion-index", "0")
            .annotated("agentrl.dev/progress", progress)
            .obj()
        )
    return {
        "statefulset": make_statefulset(1, 1),
        "trainer_job": make_trainer_job(active=1),
        "deployment": make_deployment(1, 1),
        "pods": pods,
    }


def _progress(step: int, last: int, failures: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"step": step, "lastCheckpointStep": last, "weightVersion": str(step)}
    if failures is not None:
        out["checkpointSaveFailure"] = {"failures": failures, "step": step, "error": ERROR}
    return out


def _cond(result: StatusResult, type_: str) -> tuple[str, str, str]:
    c = next(c for c in result.status.conditions if c.type == type_)
    return c.status, c.reason, c.message


def _step(
    previous: StatusResult | None, progress: dict[str, Any] | None, minutes: int
) -> StatusResult:
    job = make_job()
    if previous is not None:
        job = job.with_status(status_body(previous.status))
    return compute_status(
        job.obj(), observe(**_objects(progress)), generation=1, now=NOW + timedelta(minutes=minutes)
    )


def test_the_first_failed_save_degrades_the_job() -> None:
    assert CHECKPOINT_SAVE_FAILURES_DEGRADED == 1


def test_degraded_from_the_first_failed_save_and_cleared_by_a_save_that_succeeds() -> None:
    # before any checkpoint: Unknown; after the first: True
    fresh = _step(None, _progress(3, 0), 0)
    assert _cond(fresh, "CheckpointSaved") == (
        "Unknown",
        "NoCheckpointYet",
        "no checkpoint since the start (one every 10 steps)",
    )
    saved = _step(fresh, _progress(10, 10), 1)
    assert _cond(saved, "CheckpointSaved") == (
        "True",
        "CheckpointWritten",
        "the last checkpoint is step 10",
    )
    assert _cond(saved, "Degraded")[:2] == ("False", "AsExpected")
    assert [e for e in saved.events if "heckpoint" in e.reason] == []  # no event of its own

    # step 20's save fails after its tries: the next reconcile shows it
    failing = _step(saved, _progress(20, 10, failures=1), 2)
    detail = (
        f"1 checkpoint save in a row failed, the last of step 20 after 3 tries: {ERROR}; the "
        "last checkpoint is step 10; the trainer keeps training and exits at 3 failed saves "
        "in a row (checkpoint.maxFailedSaves)"
    )
    assert _cond(failing, "CheckpointSaved") == ("False", "CheckpointSaveFailing", detail)
    assert _cond(failing, "Degraded") == ("True", "CheckpointSaveFailing", detail)
    assert failing.status.degraded_reason == "CheckpointSaveFailing"  # the Degraded column
    assert failing.status.ready_reason == "AllComponentsReady"  # it keeps running
    assert failing.status.trainer.last_checkpoint_step == 10
    assert [(e.type, e.reason) for e in failing.events] == [("Warning", "CheckpointSaveFailing")]

    # a second in a row: still Degraded, no new event, the message follows the count
    again = _step(failing, _progress(21, 10, failures=2), 3)
    assert _cond(again, "Degraded")[2].startswith("2 checkpoint saves in a row failed")
    assert [e for e in again.events if e.type == "Warning"] == []

    # the trainer exited over them and restarts: no trainer reports, the last word stands
    restarting = _step(again, None, 4)
    assert _cond(restarting, "CheckpointSaved") == _cond(again, "CheckpointSaved")
    assert _cond(restarting, "Degraded")[:2] == ("True", "CheckpointSaveFailing")

    # a save succeeds: both clear, with one Normal event
    cleared = _step(restarting, _progress(22, 22), 5)
    assert _cond(cleared, "CheckpointSaved")[:2] == ("True", "CheckpointWritten")
    assert _cond(cleared, "Degraded")[:2] == ("False", "AsExpected")
    assert cleared.status.degraded_reason is None
    degraded_events = [e for e in cleared.events if e.message == _cond(cleared, "Degraded")[2]]
    assert [(e.type, e.reason) for e in degraded_events] == [("Normal", "AsExpected")]
    assert [e for e in cleared.events if e.type == "Warning"] == []


def test_failing_saves_lead_the_degraded_reason_and_the_message_names_every_cause() -> None:
    progress = _progress(20, 10, failures=1)
    progress["weightPushFailures"] = [
        {"engine": "http://e-0:30000", "failures": 3, "error": "refused", "version": "20"}
    ]
    result = _step(None, progress, 0)
    status, reason, message = _cond(result, "Degraded")
    assert (status, reason) == ("True", "CheckpointSaveFailing")
    assert "the last checkpoint is step 10" in message
    assert "http://e-0:30000: 3 weight pushes in a row failed" in message


def test_a_progress_annotation_without_the_field_reads_as_before() -> None:
    # a trainer older than checkpointSaveFailure; and a newer one's unknown keys are ignored
    old = TrainerProgress.model_validate({"step": 5, "lastCheckpointStep": 5})
    assert old.checkpoint_save_failure is None
    newer = TrainerProgress.model_validate(
        {"step": 5, "checkpointSaveFailure": {"failures": 1, "step": 5, "error": "e", "x": 1}}
    )
    assert newer.checkpoint_save_failure is not None
    assert newer.checkpoint_save_failure.failures == 1
    result = _step(None, {"step": 5, "lastCheckpointStep": 5}, 0)
    assert _cond(result, "CheckpointSaved")[:2] == ("True", "CheckpointWritten")
