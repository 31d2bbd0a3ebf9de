"""Trainer first: the engine StatefulSet stays at 0 replicas until every trainer pod is
scheduled, never takes running engines down, and the status says why the engines wait."""

from __future__ import annotations

from datetime import UTC, datetime

from agentrl.reconcile.children import desired_children
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.observed import observe
from agentrl.reconcile.policies import placement
from agentrl.reconcile.policies.suspend import workload_scale
from agentrl.reconcile.status import compute_status
from tests.factories import make_job, make_pod, make_statefulset, make_trainer_job

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
SCHEDULER = "0/6 nodes are available: 4 Insufficient amd.com/gpu, 2 node(s) didn't match."


def _replicas(job, observed) -> int:
    scale = workload_scale(job, observed=observed)
    children = desired_children(job, BuildContext.for_job(job), scale=scale, observed=observed)
    (sts,) = [c for c in children if c["kind"] == "StatefulSet"]
    return int(sts["spec"]["replicas"])


def _gpu_job(engines: int = 24, trainer_nodes: int = 1):
    return make_job().with_engines(engines).with_trainer(nodes=trainer_nodes).obj()


def _trainer_pod(i: int, *, scheduled: bool):
    pod = make_pod(f"demo-trainer-{i}-x", "trainer")
    return (pod.running() if scheduled else pod.unschedulable(SCHEDULER)).obj()


def test_a_new_job_creates_its_engines_at_zero_until_the_trainer_pod_is_scheduled():
    job = _gpu_job()
    # first reconcile: nothing exists yet
    assert _replicas(job, observe()) == 0
    # the trainer Job's pod is pending: still 0
    waiting = observe(
        statefulset=make_statefulset(0),
        trainer_job=make_trainer_job(active=1),
        pods=[_trainer_pod(0, scheduled=False)],
    )
    assert _replicas(job, waiting) == 0
    # it is bound to a node: the engines follow
    placed = observe(
        statefulset=make_statefulset(0),
        trainer_job=make_trainer_job(active=1),
        pods=[_trainer_pod(0, scheduled=True)],
    )
    assert _replicas(job, placed) == 24


def test_every_trainer_pod_must_be_scheduled_before_the_engines():
    job = _gpu_job(trainer_nodes=2)
    one_of_two = observe(
        statefulset=make_statefulset(0),
        pods=[_trainer_pod(0, scheduled=True), _trainer_pod(1, scheduled=False)],
    )
    assert _replicas(job, one_of_two) == 0
    both = observe(
        statefulset=make_statefulset(0),
        pods=[_trainer_pod(0, scheduled=True), _trainer_pod(1, scheduled=True)],
    )
    assert _replicas(job, both) == 24


def test_running_engines_are_kept_while_the_trainer_restarts():
    job = _gpu_job()
    # the failed attempt's pod is gone and the next one is not placed yet
    restarting = observe(
        statefulset=make_statefulset(24, 24),
        pods=[make_pod(f"demo-engine-{i}", "engine").running().obj() for i in range(24)],
    )
    assert _replicas(job, restarting) == 24


def test_suspend_scales_the_engines_to_zero_once_the_trainer_stopped_and_resume_waits_again():
    suspended = make_job().with_engines(24).suspended().obj()
    # suspending: the trainer pod is still checkpointing, its last step may push weights
    placed = observe(statefulset=make_statefulset(24), pods=[_trainer_pod(0, scheduled=True)])
    assert _replicas(suspended, placed) == 24
    assert _replicas(suspended, observe(statefulset=make_statefulset(24))) == 0
    resumed = _gpu_job()
    assert _replicas(resumed, observe(statefulset=make_statefulset(0))) == 0


def test_jobs_whose_engines_or_trainer_take_no_gpus_are_not_held():
    tiny = (
        make_job()
        .with_spec("inference.server", "tiny")
        .with_engines(2, gpus_per_engine=0)
        .with_trainer(backend="torch", gpusPerNode=0)
        .obj()
    )
    assert placement.trainer_first(tiny) is False
    assert _replicas(tiny, observe()) == 2


def test_render_shows_the_steady_state():
    job = _gpu_job()
    children = desired_children(job, BuildContext.for_job(job))
    (sts,) = [c for c in children if c["kind"] == "StatefulSet"]
    assert sts["spec"]["replicas"] == 24


def _conditions(job, observed):
    result = compute_status(job, observed, generation=1, now=NOW)
    return {c.type: c for c in result.status.conditions}, result.events


def test_engines_ready_says_the_engines_wait_for_the_trainer_and_why_it_waits():
    job = _gpu_job()
    conditions, _ = _conditions(
        job,
        observe(
            statefulset=make_statefulset(0),
            trainer_job=make_trainer_job(active=1),
            pods=[_trainer_pod(0, scheduled=False)],
        ),
    )
    engines = conditions["EnginesReady"]
    assert (engines.status, engines.reason) == ("False", "WaitingForTrainerPlacement")
    assert engines.message == (
        "0/24 engines: created once the trainer's pods are scheduled, so whole nodes stay free "
        "for them (0/1 scheduled): 1 trainer pod Unschedulable; demo-trainer-0-x: " + SCHEDULER
    )
    # the trainer's own condition lifts the scheduler's words too
    trainer = conditions["TrainerReady"]
    assert (trainer.status, trainer.reason) == ("False", "Unschedulable")
    assert SCHEDULER in trainer.message


def test_a_pending_trainer_pod_the_scheduler_has_not_looked_at_yet_gives_no_detail():
    job = _gpu_job()
    conditions, _ = _conditions(
        job,
        observe(
            statefulset=make_statefulset(0),
            pods=[make_pod("demo-trainer-0-x", "trainer").obj()],
        ),
    )
    assert conditions["EnginesReady"].message == (
        "0/24 engines: created once the trainer's pods are scheduled, so whole nodes stay free "
        "for them (0/1 scheduled)"
    )
