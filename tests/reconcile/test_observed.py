"""Parsing the objects the API server returns into the snapshot."""

from __future__ import annotations

from agentrl.reconcile.constants import Component
from agentrl.reconcile.observed import observe, pod_from_object
from tests.factories import make_pod, make_trainer_job


def test_a_pod_keeps_phase_conditions_and_container_states():
    pod = pod_from_object(
        make_pod("demo-engine-0", "engine")
        .waiting(
            "engine",
            "CrashLoopBackOff",
            "back-off",
            restarts=3,
            last_reason="OOMKilled",
            last_exit_code=137,
        )
        .obj()
    )
    assert (pod.name, pod.component, pod.phase, pod.ready) == (
        "demo-engine-0",
        "engine",
        "Pending",
        False,
    )
    (container,) = pod.containers
    assert (container.waiting_reason, container.restart_count) == ("CrashLoopBackOff", 3)
    assert (container.last_terminated_reason, container.last_terminated_exit_code) == (
        "OOMKilled",
        137,
    )


def test_a_malformed_watchdog_annotation_is_ignored():
    pod = pod_from_object(
        make_pod("demo-engine-0", "engine").annotated("agentrl.dev/watchdog", "{not json").obj()
    )
    assert pod.watchdog is None


def test_pods_are_sorted_into_components_and_deleting_ones_are_left_out():
    observed = observe(
        pods=[
            make_pod("demo-sbx-b", "sandbox").obj(),
            make_pod("demo-sbx-a", "sandbox").obj(),
            make_pod("demo-sbx-c", "sandbox").deleting().obj(),
            make_pod("demo-engine-0", "engine").obj(),
        ]
    )
    assert [p.name for p in observed.pods_of(Component.SANDBOX)] == ["demo-sbx-a", "demo-sbx-b"]
    assert [p.name for p in observed.pods_of(Component.ENGINE)] == ["demo-engine-0"]


def test_a_trainer_job_reads_its_attempt_and_failure():
    observed = observe(
        trainer_job=make_trainer_job(attempt=2, failed=1, condition=("Failed", "X", "boom"))
    )
    job = observed.trainer_job
    assert job is not None
    assert (job.attempt, job.failed, job.complete) == (2, 1, False)
    assert job.failed_condition is not None
    assert job.failed_condition.message == "boom"


def test_absent_children_are_none():
    observed = observe()
    assert (observed.engine_set, observed.trainer_job, observed.rollout) == (None, None, None)
