"""Suspend policy: what runs at which scale."""

from __future__ import annotations

from agentrl.reconcile.policies.suspend import WorkloadScale, is_suspended, workload_scale
from tests.factories import make_job


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
