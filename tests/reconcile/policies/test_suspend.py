"""Suspend policy: what runs at which scale."""

from __future__ import annotations

from datetime import UTC, datetime

from agentrl.reconcile.observed import observe
from agentrl.reconcile.policies.suspend import (
    WorkloadScale,
    is_suspended,
    seconds_until_trainer_stopped,
    workload_scale,
)
from tests.factories import make_job, make_pod

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def _trainer(phase: str = "running", until: str | None = None) -> dict:
    pod = make_pod("demo-trainer-0-x", "trainer")
    pod = pod.running() if phase == "running" else pod.failed("trainer", 143)
    return (pod.deleting(until) if until else pod).obj()


def test_a_running_job_runs_at_the_spec_scale():
    job = make_job().with_engines(24).with_workers(8).with_concurrency(384).obj()
    assert not is_suspended(job)
    assert workload_scale(job) == WorkloadScale(
        engines=24,
        rollout_workers=8,
        sandbox_concurrency=384,
        concurrency_limited_by=None,
        trainer_suspended=False,
    )


def test_a_suspended_job_runs_nothing_and_says_why_concurrency_is_zero():
    job = make_job().with_engines(24).with_workers(8).with_concurrency(384).suspended().obj()
    assert is_suspended(job)
    assert workload_scale(job) == WorkloadScale(
        engines=0,
        rollout_workers=0,
        sandbox_concurrency=0,
        concurrency_limited_by="spec.suspend",
        trainer_suspended=True,
    )


def test_a_finished_job_runs_nothing_but_is_not_suspended():
    job = make_job().with_engines(2).obj()
    scale = workload_scale(job, finished=True)
    assert (scale.engines, scale.rollout_workers, scale.sandbox_concurrency) == (0, 0, 0)
    assert scale.concurrency_limited_by == "finished"
    assert not is_suspended(job)


def test_e2b_plan_limit_caps_the_concurrency_in_effect():
    job = make_job().with_concurrency(384).with_e2b(max_concurrent=100).obj()
    scale = workload_scale(job)
    assert scale.sandbox_concurrency == 100
    assert scale.concurrency_limited_by == "spec.sandbox.e2b.maxConcurrent"


def test_e2b_plan_limit_above_the_desired_concurrency_caps_nothing():
    job = make_job().with_concurrency(50).with_e2b(max_concurrent=100).obj()
    scale = workload_scale(job)
    assert (scale.sandbox_concurrency, scale.concurrency_limited_by) == (50, None)


def test_a_suspending_job_keeps_engines_and_workers_until_the_trainer_has_checkpointed():
    job = make_job().with_engines(24).with_workers(8).with_concurrency(384).suspended().obj()
    scale = workload_scale(job, observed=observe(pods=[_trainer()]), now=NOW)
    assert scale == WorkloadScale(
        engines=24,
        rollout_workers=8,
        sandbox_concurrency=0,  # no new episode starts
        concurrency_limited_by="spec.suspend",
        trainer_suspended=True,  # Kubernetes sends the trainer SIGTERM
        trainer_stopping=1,
    )
    assert scale.suspending


def test_a_deleted_trainer_pod_holds_the_engines_only_within_its_grace_period():
    job = make_job().with_engines(24).suspended().obj()
    terminating = observe(pods=[_trainer(until="2026-03-01T12:15:00Z")])
    assert workload_scale(job, observed=terminating, now=NOW).engines == 24
    assert seconds_until_trainer_stopped(job, terminating, NOW) == 15 * 60 + 1
    past = observe(pods=[_trainer(until="2026-03-01T11:59:00Z")])  # e.g. an unreachable node
    assert workload_scale(job, observed=past, now=NOW).engines == 0
    assert seconds_until_trainer_stopped(job, past, NOW) is None


def test_once_the_trainer_pods_are_gone_or_exited_the_job_is_suspended_at_zero():
    job = make_job().with_engines(24).with_workers(8).suspended().obj()
    for observed in (observe(), observe(pods=[_trainer("failed")])):
        scale = workload_scale(job, observed=observed, now=NOW)
        assert (scale.engines, scale.rollout_workers, scale.trainer_stopping) == (0, 0, 0)
        assert scale.trainer_suspended and not scale.suspending


def test_a_running_or_finished_job_is_never_suspending():
    running = make_job().with_engines(2).obj()
    assert (
        workload_scale(running, observed=observe(pods=[_trainer()]), now=NOW).trainer_stopping == 0
    )
    assert seconds_until_trainer_stopped(running, observe(pods=[_trainer()]), NOW) is None
    finished = workload_scale(
        make_job().with_engines(2).suspended().obj(),
        finished=True,
        observed=observe(pods=[_trainer()]),
        now=NOW,
    )
    assert (finished.engines, finished.trainer_stopping) == (0, 0)
