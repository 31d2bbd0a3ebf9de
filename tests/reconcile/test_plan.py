"""One reconcile decided: children, status write, deletes, TTL, requeue."""

from __future__ import annotations

from datetime import UTC, datetime

import yaml

from agentrl.reconcile.children import ChildRef
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.observed import observe
from agentrl.reconcile.plan import plan
from agentrl.reconcile.status import status_body
from tests.factories import make_job, make_pod, make_trainer_job

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def _plan(factory, **objects):
    job = factory.obj()
    return plan(job, BuildContext.for_job(job), observe(**objects), generation=1, now=NOW)


def _kinds(p):
    return [(c["kind"], c["metadata"]["name"]) for c in p.children]


def test_a_new_job_applies_every_child_and_writes_its_first_status():
    p = _plan(make_job("swe", "rl"))
    assert len(p.children) == 18
    assert ("Job", "swe-trainer") in _kinds(p)
    assert p.write_status
    assert p.delete == []
    assert not p.delete_job
    assert p.requeue_after_seconds is None


def test_a_failed_trainer_attempt_is_deleted_not_reapplied():
    failed = make_trainer_job(attempt=0, condition=("Failed", "PodFailurePolicy", "exit 1"))
    p = _plan(make_job("swe", "rl").with_trainer(backoffLimit=3), trainer_job=failed)
    assert ("Job", "swe-trainer") not in _kinds(p)
    assert p.delete == [
        ChildRef(api_version="batch/v1", kind="Job", name="swe-trainer", namespace="rl")
    ]
    assert p.status.trainer.restarts == 1


def test_after_the_failed_attempt_is_gone_the_next_attempt_is_created():
    factory = make_job("swe").with_status({"trainer": {"restarts": 1}})
    p = _plan(factory)
    (job,) = [c for c in p.children if c["kind"] == "Job"]
    assert job["metadata"]["annotations"] == {"agentrl.dev/trainer-attempt": "1"}


def test_a_completed_trainer_job_is_left_alone_and_workloads_scale_down():
    done = make_trainer_job(succeeded=1, condition=("Complete", "", ""))
    p = _plan(make_job("swe").with_engines(2).with_ttl(600), trainer_job=done)
    kinds = _kinds(p)
    assert ("Job", "swe-trainer") not in kinds
    sts = next(c for c in p.children if c["kind"] == "StatefulSet")
    assert sts["spec"]["replicas"] == 0
    assert p.requeue_after_seconds == 600.0  # the TTL falls due in 600 s


def _runtime(p):
    (cm,) = [c for c in p.children if c["kind"] == "ConfigMap"]
    return yaml.safe_load(cm["data"]["runtime.yaml"])


def _replicas(p, kind):
    return next(c for c in p.children if c["kind"] == kind)["spec"]["replicas"]


def test_a_finished_job_suspended_with_a_trainer_pod_left_waits_for_nothing():
    # finished first, then suspended while a trainer pod still runs: a finished job keeps
    # nothing running, so no trainer pod counts as stopping (the job is Suspended, not
    # Suspending) and children and status agree on zero
    done = make_trainer_job(succeeded=1, condition=("Complete", "", ""))
    finished = _plan(make_job("swe").with_engines(2), trainer_job=done)
    trainer = make_pod("swe-trainer-0-x", "trainer", job="swe").running().obj()
    p = _plan(
        make_job("swe").with_engines(2).suspended().with_status(status_body(finished.status)),
        trainer_job=done,
        pods=[trainer],
    )
    suspended = next(c for c in p.status.conditions if c.type == "Suspended")
    assert (suspended.status, suspended.reason) == ("True", "JobSuspended")
    assert (p.status.engines.replicas, _replicas(p, "StatefulSet")) == (0, 0)
    assert (p.status.sandbox.concurrency, _runtime(p)["sandbox"]["concurrency"]) == (0, 0)
    assert _replicas(p, "Deployment") == 0


def test_a_job_past_its_ttl_is_deleted_and_nothing_is_applied():
    done = (
        make_job("swe")
        .with_ttl(60)
        .with_status(
            {
                "completionTime": "2026-03-01T11:58:00Z",
                "conditions": [
                    {
                        "type": "Complete",
                        "status": "True",
                        "reason": "TrainerSucceeded",
                        "lastTransitionTime": "2026-03-01T11:58:00Z",
                    }
                ],
            }
        )
    )
    p = _plan(done)
    assert p.delete_job
    assert p.children == []


def test_a_running_job_with_a_deadline_is_requeued_when_it_falls_due():
    factory = make_job("swe").with_deadline(3600).with_status({"startTime": "2026-03-01T11:30:00Z"})
    # 11:30 + 3600 s = 12:30, 1800 s after NOW.
    assert _plan(factory).requeue_after_seconds == 1800.0


def test_a_spec_the_engine_flags_refuse_applies_nothing_and_says_invalid_spec():
    p = _plan(make_job("swe").with_spec("inference.extraArgs", ["--tp-size", "4"]))
    assert p.children == []
    ready = next(c for c in p.status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", "InvalidSpec")
    assert "spec.inference.gpusPerEngine" in ready.message
    assert [e.reason for e in p.events] == ["InvalidSpec"]
    assert p.write_status


def test_a_second_identical_reconcile_writes_nothing():
    first = _plan(make_job("swe"))
    again = _plan(make_job("swe").with_status(status_body(first.status)))
    assert not again.write_status
    assert again.events == []
    assert again.children == first.children
