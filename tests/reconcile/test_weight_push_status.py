"""Weight pushes that keep failing reach the job's status: from the third failed push in a row
to one engine (as the trainer reports it in ``agentrl.dev/progress``) the job is
``Degraded=True``/``WeightPushFailing`` and ``WeightsSynced=False`` with the engine and the
error, the ``Degraded`` printer column shows the reason and a Warning event is posted once; a
push the engine takes clears both. Pure: compute_status over observed pods."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from agentrl.reconcile.observed import observe
from agentrl.reconcile.status import (
    WEIGHT_PUSH_FAILURES_DEGRADED,
    StatusResult,
    compute_status,
    status_body,
)
from tests.factories import make_deployment, make_job, make_pod, make_statefulset, make_trainer_job

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
ENGINE_1 = "http://demo-engine-1.demo-engine.team.svc:30000"
ERROR = "EngineUnavailable: POST /update_weights_from_disk: connection refused"


def _engine(name: str, version: str, *, state: str = "Ready") -> dict[str, Any]:
    report: dict[str, Any] = {"state": state, "ready": True, "weightVersion": version}
    if state == "Degraded":
        report.update(restarts=6, restartsInWindow=6, faults=6)
    return make_pod(name, "engine").running().annotated("agentrl.dev/watchdog", report).obj()


def _objects(progress: dict[str, Any], engine_1_state: str = "Ready") -> dict[str, Any]:
    trainer = (
        make_pod("demo-trainer-0-x", "trainer")
        .running()
        .annotated("batch.kubernetes.io/job-completion-index", "0")
        .annotated("agentrl.dev/progress", progress)
        .obj()
    )
    return {
        "statefulset": make_statefulset(2, 2),
        "trainer_job": make_trainer_job(active=1),
        "deployment": make_deployment(1, 1),
        "pods": [
            _engine("demo-engine-0", progress["weightVersion"]),
            _engine("demo-engine-1", "4", state=engine_1_state),
            trainer,
            make_pod("demo-rollout-0", "rollout").running().obj(),
        ],
    }


def _progress(step: int, failures: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {"step": step, "weightVersion": str(step)}
    if failures is not None:
        out["weightPushFailures"] = [
            {"engine": ENGINE_1, "failures": failures, "error": ERROR, "version": str(step)}
        ]
    return out


def _cond(result: StatusResult, type_: str) -> tuple[str, str, str]:
    c = next(c for c in result.status.conditions if c.type == type_)
    return c.status, c.reason, c.message


def _step(previous: StatusResult | None, progress: dict[str, Any], minutes: int) -> StatusResult:
    job = make_job().with_engines(2)
    if previous is not None:
        job = job.with_status(status_body(previous.status))
    return compute_status(
        job.obj(),
        observe(**_objects(progress)),
        generation=1,
        now=NOW + timedelta(minutes=minutes),
    )


def test_the_threshold_is_three_failed_pushes_in_a_row() -> None:
    assert WEIGHT_PUSH_FAILURES_DEGRADED == 3


def test_degraded_from_the_third_failed_push_and_cleared_by_a_push_taken() -> None:
    # pushes 5 and 6 fail: reported, but one or two failures are left to the retries
    first = _step(None, _progress(5, 1), 0)
    second = _step(first, _progress(6, 2), 1)
    for result in (first, second):
        assert _cond(result, "Degraded")[:2] == ("False", "AsExpected")
        assert result.status.degraded_reason is None
        # the watchdogs' versions still say which engine is behind
        assert _cond(result, "WeightsSynced")[:2] == ("False", "WeightsBehind")
    assert [e for e in second.events if e.reason == "WeightPushFailing"] == []

    # the third failed push: Degraded, with the engine, the count and the error
    third = _step(second, _progress(7, 3), 2)
    status, reason, message = _cond(third, "Degraded")
    assert (status, reason) == ("True", "WeightPushFailing")
    assert message == (
        "the trainer keeps training, its weights do not reach every engine: "
        f"{ENGINE_1}: 3 weight pushes in a row failed (last: weight version 7): {ERROR}"
    )
    assert _cond(third, "WeightsSynced") == (
        "False",
        "WeightPushFailing",
        f"{ENGINE_1}: 3 weight pushes in a row failed (last: weight version 7): {ERROR}",
    )
    assert third.status.degraded_reason == "WeightPushFailing"  # the Degraded column
    assert third.status.ready_reason == "AllComponentsReady"  # it keeps running
    assert [(e.type, e.reason) for e in third.events] == [("Warning", "WeightPushFailing")]

    # a fourth: still Degraded, no new event, the message follows the count
    fourth = _step(third, _progress(8, 4), 3)
    assert _cond(fourth, "Degraded")[2].endswith(
        "4 weight pushes in a row failed (last: weight version 8): " + ERROR
    )
    assert [e for e in fourth.events if e.type == "Warning"] == []
    degraded_since = next(c for c in fourth.status.conditions if c.type == "Degraded")
    assert degraded_since.last_transition_time == "2026-03-01T12:02:00Z"

    # the engine takes push 9: the trainer reports no failure; both conditions clear
    cleared = _step(fourth, _progress(9, None), 4)
    assert _cond(cleared, "Degraded")[:2] == ("False", "AsExpected")
    assert cleared.status.degraded_reason is None
    assert _cond(cleared, "WeightsSynced")[1] != "WeightPushFailing"
    assert [(e.type, e.reason) for e in cleared.events] == [("Normal", "AsExpected")]


def test_a_crash_looping_engine_names_both_and_keeps_the_crash_loop_as_reason() -> None:
    result = compute_status(
        make_job().with_engines(2).obj(),
        observe(**_objects(_progress(7, 3), engine_1_state="Degraded")),
        generation=1,
        now=NOW,
    )
    status, reason, message = _cond(result, "Degraded")
    assert (status, reason) == ("True", "WatchdogCrashLoop")
    assert "demo-engine-1: 6 restarts within the watchdog's window" in message
    assert f"{ENGINE_1}: 3 weight pushes in a row failed" in message
    assert result.status.degraded_reason == "WatchdogCrashLoop"
