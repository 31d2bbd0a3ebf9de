"""Episodes run in Ray worker actors, scheduled by the driver: against the real tiny engine over
HTTP and local sandboxes, in real worker processes.

The driver (this test's event loop) holds the scheduler with the whole concurrency; each worker
runs the episodes it is handed and streams the trajectories back."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrl.api.rollout import ClassAction, TerminalClass
from agentrl.engine_client.client import CONTROL_CONNECTIONS
from agentrl.ray_cluster.node import init_ray
from agentrl.rollout.ray_workers import (
    RemoteEpisodes,
    RolloutWorkerConfig,
    open_remote_rollout,
    run_on_actors,
    start_workers,
)
from agentrl.rollout.tasks import generate_toy_tasks
from tests.rollout.remote_parts import MAX_RUNNING, tiny_engine_url, worker_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # Ray starts slowly on 2 busy cores


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    ray = pytest.importorskip("ray", reason="the ray extra")
    init_ray(num_cpus=2)
    yield
    ray.shutdown()


@pytest.fixture
async def engine_url() -> AsyncIterator[str]:
    async with tiny_engine_url() as url:
        yield url


def _spec(config: RolloutWorkerConfig) -> Any:
    from agentrl.api import AgentRLJob

    return AgentRLJob.model_validate(config.job).spec


async def test_two_workers_run_the_episodes_the_driver_schedules_and_stream_them_back(
    ray_cluster: None, engine_url: str, tmp_path: Path
) -> None:
    tasks = generate_toy_tasks()[:4]  # 4 groups of 2: 8 episodes at concurrency 4
    run = await run_on_actors(worker_config(engine_url, tmp_path), tasks)

    assert len(run.trajectories) == 8
    assert Counter(t.task_id for t in run.trajectories) == {t.id: 2 for t in tasks}
    assert all(n == 2 for n in Counter(t.group_id for t in run.trajectories).values())
    for t in run.trajectories:
        assert t.terminal_class in (TerminalClass.COMPLETED, TerminalClass.TRUNCATED)
        assert t.reward in (0.0, 1.0)
        assert 1 <= len(t.turns) <= 2
    # two processes, neither of them this one, and both ran episodes
    assert [w.worker_index for w in run.workers] == [0, 1]
    assert len({w.pid for w in run.workers}) == 2 and os.getpid() not in {
        w.pid for w in run.workers
    }
    assert sum(w.episodes for w in run.workers) == 8
    assert all(w.episodes > 0 for w in run.workers)
    # each worker holds half of the 4 slots and never runs more than its grant
    assert all(1 <= w.peak_in_flight <= 2 for w in run.workers)
    assert all(w.cancelled == 0 for w in run.workers)
    # each worker's pool towards the engine: 2 × maxRunningRequests + the control connections
    assert all(w.engine_pool_size == 2 * MAX_RUNNING + CONTROL_CONNECTIONS for w in run.workers)
    # The cap over both processes: the episodes' own clocks (each sandbox lives inside its
    # episode's [started, finished]) never show more than 4 at once.
    edges = sorted(
        [(t.timings.started_at, 1) for t in run.trajectories]
        + [(t.timings.finished_at, -1) for t in run.trajectories]
    )  # at equal times the end (-1) sorts first
    live = peak = 0
    for _, change in edges:
        live += change
        peak = max(peak, live)
    assert peak <= 4


async def _run_killing_worker_zero(config: RolloutWorkerConfig) -> tuple[list[Any], Any, int]:
    """8 episodes; worker 0 is killed as soon as it holds an episode after the first
    trajectory arrived. The trajectories, the runner, and what worker 0 held then."""
    import ray

    spec = _spec(config)
    actors = start_workers(config)
    episodes = RemoteEpisodes(actors, spec)
    got = []
    held = 0
    try:
        async with open_remote_rollout(spec, episodes, tasks=generate_toy_tasks()[:4]) as scheduler:
            async for trajectory in scheduler.trajectories():
                got.append(trajectory)
                if not held:
                    for _ in range(200):  # the scheduler refills at once; wait for worker 0
                        if episodes.outstanding()[0]:
                            break
                        await asyncio.sleep(0.01)
                    held = episodes.outstanding()[0]
                    ray.kill(actors[0], no_restart=True)
    finally:
        for actor in actors:
            ray.kill(actor)
    return got, episodes, held


async def test_a_dead_workers_episodes_fail_over_to_the_live_one(
    ray_cluster: None, engine_url: str, tmp_path: Path
) -> None:
    got, episodes, held = await _run_killing_worker_zero(worker_config(engine_url, tmp_path))
    assert held > 0
    assert episodes.alive == 1
    assert episodes.lost_episodes >= 1  # what worker 0 held did not come back from it
    # ... and was run again on worker 1 (one retry allowed): every episode ended normally
    assert len(got) == 8
    assert all(t.terminal_class != TerminalClass.INFRA_ERROR for t in got)
    assert all(t.reward in (0.0, 1.0) for t in got)
    assert any(t.attempt == 1 for t in got)  # the retried ones say so


async def test_without_retries_a_dead_workers_episodes_are_infra_errors_never_rewards(
    ray_cluster: None, engine_url: str, tmp_path: Path
) -> None:
    config = worker_config(engine_url, tmp_path, infra_retries=0)
    got, episodes, held = await _run_killing_worker_zero(config)
    assert held > 0
    assert len(got) == 8
    lost = [t for t in got if t.terminal_class == TerminalClass.INFRA_ERROR]
    assert len(lost) == episodes.lost_episodes >= 1
    for t in lost:
        assert t.reward is None
        assert t.training_action == ClassAction.DROP
        assert t.infra_reason is not None
        assert t.infra_reason.startswith("rollout_worker: worker 0 died")
    assert all(t.reward in (0.0, 1.0) for t in got if t not in lost)


async def test_workers_whose_processes_die_are_restarted_and_given_episodes_again(
    ray_cluster: None, engine_url: str, tmp_path: Path
) -> None:
    """What a rolling update of the rollout Deployment does to the driver: every worker's
    process dies at once. Ray restarts the actors; the driver waits for them rather than
    failing episodes, opens them again and the run ends with every episode scored. Two
    retries: an episode of the worker noticed dead first may be handed to the other before
    its death is noticed too, and then to a restarted one."""
    import signal

    import ray

    from agentrl.rollout import metrics

    config = worker_config(engine_url, tmp_path, infra_retries=2)
    spec = _spec(config)
    actors = start_workers(config)
    episodes = RemoteEpisodes(actors, spec)
    restarts_before = metrics.ROLLOUT_WORKER_RESTARTS._value.get()
    got = []
    old_pids: list[int] = []
    try:
        async with open_remote_rollout(spec, episodes, tasks=generate_toy_tasks()[:4]) as scheduler:
            async for trajectory in scheduler.trajectories():
                got.append(trajectory)
                if not old_pids:
                    for _ in range(200):  # both workers hold episodes
                        if all(episodes.outstanding()):
                            break
                        await asyncio.sleep(0.01)
                    assert all(episodes.outstanding()), episodes.outstanding()
                    old_pids = [w.pid for w in episodes.workers]
                    for pid in old_pids:
                        os.kill(pid, signal.SIGKILL)
                    # The run goes on meanwhile. Without this wait the other worker's episodes
                    # may all finish on the first one back, and leaving the run stops reopening
                    # a worker Ray has not restarted yet (CI once saw restarts [1, 0]).
                    for _ in range(1200):
                        if [w.restarts for w in episodes.workers] == [1, 1]:
                            break
                        await asyncio.sleep(0.05)
    finally:
        for actor in actors:
            ray.kill(actor)
    assert len(got) == 8
    assert all(t.terminal_class != TerminalClass.INFRA_ERROR for t in got), [
        t.infra_reason for t in got
    ]
    assert episodes.lost_episodes >= 2  # what both held when they died
    assert 1 <= sum(t.attempt for t in got) == episodes.lost_episodes  # each loss retried
    assert [w.restarts for w in episodes.workers] == [1, 1]
    assert all(w.pid not in old_pids for w in episodes.workers)
    assert episodes.alive == 2
    assert metrics.ROLLOUT_WORKER_RESTARTS._value.get() - restarts_before == 2


async def test_cancelling_the_scheduler_cancels_the_episodes_in_the_workers(
    ray_cluster: None, engine_url: str, tmp_path: Path
) -> None:
    import ray

    config = worker_config(engine_url, tmp_path)
    spec = _spec(config)
    actors = start_workers(config)
    episodes = RemoteEpisodes(actors, spec)
    try:
        async with open_remote_rollout(spec, episodes, tasks=generate_toy_tasks()[:8]) as scheduler:
            # 4 running and as many admitted ahead, waiting in the workers for a slot
            assert scheduler.window == 8
            for _ in range(500):
                if sum(episodes.outstanding()) == 8:
                    break
                await asyncio.sleep(0.01)
            assert sum(episodes.outstanding()) == 8
            await scheduler.cancel()
            assert episodes.outstanding() == [0, 0]
            held: list[tuple[int, int]] = []
            for _ in range(100):  # the cancels travel in the next flush
                held = [
                    (s["in_flight"], s["queued"])
                    for s in ray.get([a.stats.remote() for a in actors])
                ]
                if held == [(0, 0), (0, 0)]:
                    break
                await asyncio.sleep(0.05)
            assert held == [(0, 0), (0, 0)]
    finally:
        for actor in actors:
            ray.kill(actor)


def test_a_late_failure_of_a_workers_earlier_incarnation_does_not_lose_the_restarted_one(
    tmp_path: Path,
) -> None:
    """A call to a worker that died can fail after the driver already reopened the restarted
    actor; that failure is about the dead incarnation and leaves the live one alone. A failure
    of a call to the live incarnation loses it."""
    pytest.importorskip("ray", reason="the ray extra")
    episodes = RemoteEpisodes([object()], _spec(worker_config("http://unused", tmp_path)))
    (worker,) = episodes.workers
    worker.restarts = 1  # reopened once: incarnation 1 is the live one
    episodes._lose(worker, RuntimeError("the dead incarnation's call"), 0)
    assert worker.alive
    episodes._lose(worker, RuntimeError("the live incarnation's call"), 1)
    assert not worker.alive


async def test_closing_a_worker_does_not_cut_the_cleanup_of_an_episode_being_cancelled(
    tmp_path: Path,
) -> None:
    """The driver cancels an episode, then closes the worker (a stopping trainer does both
    at once): the episode's cleanup (its sandbox pod's deletion) is cancelled once, not cut
    short by a second cancel. Cut short, a just-created sandbox pod stayed after a suspend."""
    from agentrl.rollout.ray_workers import RolloutWorker

    cleaned: list[str] = []

    class SlowCleanup:
        async def run(self, task: Any, **_: Any) -> Any:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                await asyncio.sleep(0.2)  # the sandbox pod's deletion
                cleaned.append(task.id)
                raise

    config = worker_config("http://engine.invalid", tmp_path, workers=1, concurrency=1)
    worker = RolloutWorker(config.model_dump(), 0, runner=SlowCleanup())
    await worker.open()
    task = generate_toy_tasks()[0]
    order = {"key": 7, "task": task.model_dump(mode="json"), "group_id": "g", "policy_version": 0}
    await worker.submit([order], 1)
    await asyncio.sleep(0.05)  # the episode runs
    await worker.cancel([7])
    await asyncio.sleep(0.05)  # (two calls of the driver's: the cleanup has begun)
    await worker.close()
    assert cleaned == [task.id]


def test_ray_tells_a_restarting_worker_actor_from_one_gone_for_good(ray_cluster: None) -> None:
    """:func:`agentrl.rollout.ray_workers.actor_state` against a real Ray: an actor killed
    with a restart to come is never DEAD, one killed for good is."""
    import time

    import ray

    from agentrl.rollout.ray_workers import actor_state

    @ray.remote(max_restarts=-1, num_cpus=0)
    class Probe:
        def pid(self) -> int:
            return os.getpid()

    actor = Probe.remote()  # type: ignore[attr-defined]
    first = ray.get(actor.pid.remote())
    assert actor_state(actor) == "ALIVE"
    ray.kill(actor, no_restart=False)
    seen = set()
    restarted = None
    deadline = time.monotonic() + 60
    while restarted is None and time.monotonic() < deadline:
        seen.add(actor_state(actor))
        try:
            pid = ray.get(actor.pid.remote())
        except ray.exceptions.RayActorError:  # restarting: calls fail meanwhile
            continue
        restarted = pid if pid != first else None
        time.sleep(0.05)
    assert restarted is not None and "DEAD" not in seen, seen
    ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + 30
    while actor_state(actor) != "DEAD" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert actor_state(actor) == "DEAD"
