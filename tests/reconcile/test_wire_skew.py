"""WireCompatible (``reconcile.wire_skew``): the versions the workloads wrote, against this
operator's, in the job's status; a trainer that refused ``runtime.yaml`` fails the job at once.

The refusal is the trainer's own: the message its ``WireSkewError`` prints as the last line of
its log, which the kubelet keeps as the container's termination message."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from agentrl.api import Condition, Reason
from agentrl.api.wire import ANNOTATION_PROGRESS, ANNOTATION_WATCHDOG, WireSkewError
from agentrl.reconcile import wire_skew
from agentrl.reconcile.observed import observe
from agentrl.reconcile.status import compute_status, status_body
from tests.factories import make_deployment, make_job, make_pod, make_statefulset, make_trainer_job

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
OURS = "this operator speaks wire contract 1.1 and reads 1.0 to 1.2"
HELP = (
    ": run the operator and the job's images at most one minor version apart "
    "(docs/install.md, Upgrades and version skew)"
)
REFUSAL = str(WireSkewError("runtime.yaml", "1.1", reader="this trainer", ours="1.3"))


def _objects(
    *, progress: dict[str, Any] | str | None = None, watchdog: dict[str, Any] | None = None
) -> dict[str, Any]:
    engine = make_pod("demo-engine-0", "engine").running()
    if watchdog is not None:
        engine.annotated(ANNOTATION_WATCHDOG, watchdog)
    trainer = (
        make_pod("demo-trainer-0-x", "trainer")
        .running()
        .annotated("batch.kubernetes.io/job-completion-index", "0")
    )
    if progress is not None:
        trainer.annotated(ANNOTATION_PROGRESS, progress)
    return {
        "statefulset": make_statefulset(1, 1),
        "trainer_job": make_trainer_job(active=1),
        "deployment": make_deployment(1, 1),
        "pods": [
            engine.obj(),
            trainer.obj(),
            make_pod("demo-rollout-0", "rollout").running().obj(),
        ],
    }


def _refused_objects() -> dict[str, Any]:
    """The trainer's first attempt failed: it refused runtime.yaml and exited 1."""
    failed = (
        make_pod("demo-trainer-0-x", "trainer")
        .annotated("batch.kubernetes.io/job-completion-index", "0")
        .failed("trainer", 1, f"2026-03-01 INFO loading /etc/agentrl/job.yaml\nError: {REFUSAL}")
        .obj()
    )
    job = make_trainer_job(
        failed=1,
        condition=("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit"),
    )
    return {"trainer_job": job, "pods": [failed]}


def _compute(objects: dict[str, Any], status: dict[str, Any] | None = None) -> Any:
    job = make_job().with_engines(1)
    if status is not None:
        job = job.with_status(status)
    return compute_status(job.obj(), observe(**objects), generation=1, now=NOW)


def _condition(result: Any, type_: str = "WireCompatible") -> Condition:
    return next(c for c in result.status.conditions if c.type == type_)


def test_workloads_of_the_operators_version_are_compatible() -> None:
    result = _compute(_objects(progress={"wireVersion": "1.1", "step": 4}, watchdog={}))
    cond = _condition(result)
    assert (cond.status, cond.reason) == ("True", "VersionsCompatible")
    # the watchdog's report without a version is a 1.0 watchdog's
    assert cond.message == f"{OURS}; the workloads: engine 1.0, trainer 1.1"
    assert result.status.trainer.step == 4


def test_a_trainers_progress_two_minors_ahead_is_ignored_and_named() -> None:
    result = _compute(_objects(progress={"wireVersion": "1.3", "step": 4}))
    cond = _condition(result)
    assert (cond.status, cond.reason) == ("False", "VersionSkew")
    assert cond.message == (
        f"{OURS}; pod demo-trainer-0-x wrote agentrl.dev/progress in 1.3 (ignored){HELP}"
    )
    assert result.status.trainer.step == 0  # nothing of it reaches the status
    warning = [e for e in result.events if e.reason == "VersionSkew"]
    assert [e.type for e in warning] == ["Warning"]
    assert warning[0].message == f"WireCompatible: {cond.message}"


def test_an_engine_watchdog_of_another_major_is_named() -> None:
    result = _compute(_objects(watchdog={"wireVersion": "2.0", "state": "Degraded"}))
    cond = _condition(result)
    assert (cond.status, cond.reason) == ("False", "VersionSkew")
    assert "pod demo-engine-0 wrote agentrl.dev/watchdog in 2.0 (ignored)" in cond.message
    # its Degraded state is not acted on: the operator cannot read that report
    assert _condition(result, "Degraded").status == "False"


def test_keys_of_a_newer_minor_are_ignored_and_named() -> None:
    progress = {"wireVersion": "1.2", "step": 9, "rolloutLagSteps": 2, "tools": {"newRate": 0.5}}
    cond = _condition(_compute(_objects(progress=progress)))
    assert (cond.status, cond.reason) == ("True", "VersionsCompatible")
    assert cond.message == (
        f"{OURS}; the workloads: trainer 1.2; keys this operator does not know, ignored: "
        "agentrl.dev/progress rolloutLagSteps, agentrl.dev/progress tools.newRate (a newer "
        "workload's, or one this operator no longer reads)"
    )


def test_a_trainer_that_refused_runtime_yaml_fails_the_job_naming_both_versions() -> None:
    result = _compute(_refused_objects())
    cond = _condition(result)
    assert (cond.status, cond.reason) == ("False", "VersionSkew")
    assert cond.message == (
        f"{OURS}; pod demo-trainer-0-x speaks 1.3 and refused runtime.yaml ({REFUSAL}){HELP}"
    )
    failed = _condition(result, "Failed")
    assert (failed.status, failed.reason) == ("True", "VersionSkew")
    assert failed.message == (
        "the trainer refused the operator's runtime.yaml, and a restart of the same image would "
        f"refuse it again: pod demo-trainer-0-x: {REFUSAL}"
    )
    # no restart spent on it, and the failed Job stays for its logs
    assert result.trainer.restarts == 0
    assert not result.trainer.delete_failed_job


def test_the_verdict_stands_while_no_workload_reports() -> None:
    first = _compute(_objects(progress={"wireVersion": "1.3"}))
    # between two states the pods are gone: what was last seen stands
    later = _compute({"pods": []}, status=status_body(first.status))
    assert _condition(later) == _condition(first)
    fresh = _condition(_compute({"pods": []}))
    assert (fresh.status, fresh.reason) == ("Unknown", "VersionsNotReported")
    assert fresh.message == f"no workload has reported its wire contract version yet ({OURS})"


def test_a_malformed_annotation_says_nothing_of_a_version() -> None:
    assert wire_skew.readings(observe(**_objects(progress="{not json"))) == []
    previous = Condition(
        type="WireCompatible",
        status="True",
        reason=Reason.VERSIONS_COMPATIBLE,
        message="kept",
        last_transition_time="2026-03-01T11:00:00Z",
    )
    kept = wire_skew.verdict(observe(**_objects(progress="{not json")), previous)
    assert (kept.status, kept.message) == ("True", "kept")
