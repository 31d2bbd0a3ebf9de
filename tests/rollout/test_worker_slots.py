"""Rollout workers hold slots the driver grants and start prefetched orders on their own; the
driver keeps the job's live episodes under the in-effect concurrency through scale-downs and
scale-ups, and never stops a running episode to do it.

The worker and driver classes of :mod:`agentrl.rollout.ray_workers` run here in this process:
each "actor" is a :class:`RolloutWorker` whose methods are called the way Ray calls them
(``actor.method.remote(...)`` returning an awaitable, arguments and answers as plain data), and
each episode is a gate the test opens, so what starts when is decided by the test alone."""

from __future__ import annotations

import asyncio
import inspect
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from agentrl.api.rollout import TerminalClass
from agentrl.rollout.ray_workers import (
    EpisodeOrder,
    RemoteEpisodes,
    RolloutWorker,
    RolloutWorkerConfig,
)
from agentrl.rollout.scheduler import RolloutScheduler, SlottedEpisodes
from agentrl.rollout.trajectory import Trajectory
from tests.factories import make_job
from tests.rollout.fakes import toy_task

pytest.importorskip("ray", reason="the driver reads Ray's exception types")


class Gates:
    """Every episode of every worker waits for the test to end it; counts live episodes over
    all workers and every start that found them at the capacity in effect."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.live = 0
        self.peak = 0
        self.started = 0
        self.over_cap: list[tuple[int, int]] = []
        self.waiting: dict[int, list[asyncio.Event]] = defaultdict(list)

    def end(self, worker: int, count: int = 1) -> None:
        """End the ``count`` oldest running episodes of ``worker``."""
        for _ in range(count):
            self.waiting[worker].pop(0).set()

    def running(self, worker: int) -> int:
        return len(self.waiting[worker])


class GatedRunner:
    def __init__(self, gates: Gates, index: int) -> None:
        self.gates, self.index = gates, index

    async def run(
        self, task: Any, *, group_id: str, policy_version: int, attempt: int = 0
    ) -> Trajectory:
        gates = self.gates
        gates.live += 1
        gates.started += 1
        gates.peak = max(gates.peak, gates.live)
        if gates.live > gates.capacity:
            gates.over_cap.append((gates.live, gates.capacity))
        event = asyncio.Event()
        gates.waiting[self.index].append(event)
        try:
            await event.wait()
        finally:
            gates.live -= 1
        return Trajectory(
            episode_id=f"{task.id}-{gates.started}",
            task_id=task.id,
            group_id=group_id,
            policy_version=policy_version,
            attempt=attempt,
            terminal_class=TerminalClass.COMPLETED,
            reward=1.0,
        )


class _Method:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> asyncio.Future[Any]:
        result = self.fn(*args)
        if inspect.isawaitable(result):
            return asyncio.ensure_future(result)
        future = asyncio.get_running_loop().create_future()
        future.set_result(result)
        return future


class LocalActor:
    """A :class:`RolloutWorker` called as Ray calls an actor."""

    def __init__(self, worker: RolloutWorker) -> None:
        self.worker = worker
        for name in ("open", "submit", "collect", "cancel", "withdraw", "stats", "close"):
            setattr(self, name, _Method(getattr(worker, name)))


def _workers(gates: Gates, concurrency: int, count: int) -> list[RolloutWorker]:
    job = (
        make_job("slots", None)
        .with_model_path("tiny")
        .with_rollout(groupSize=2, workers=count)
        .with_sandbox(provider="local", concurrency=concurrency)
        .manifest()
    )
    config = RolloutWorkerConfig(job=job, engine_urls=["http://unused"], workers=count).model_dump()
    return [RolloutWorker(config, i, runner=GatedRunner(gates, i)) for i in range(count)]


def _order(key: int) -> dict[str, Any]:
    order = EpisodeOrder(key=key, task=toy_task(f"t{key}"), group_id=f"g{key}", policy_version=0)
    return order.model_dump(mode="json")


async def _turns(n: int = 10) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.002)

    await asyncio.wait_for(poll(), timeout)


# -- one worker ----------------------------------------------------------------------------


async def test_a_worker_starts_a_queued_order_the_moment_one_of_its_episodes_ends() -> None:
    gates = Gates(capacity=2)
    (worker,) = _workers(gates, 2, 1)
    await worker.open()
    report = await worker.submit([_order(k) for k in range(4)], 2)
    assert (report["running"], report["queued"], report["slots"]) == (2, 2, 2)
    await _turns()
    assert gates.started == 2
    gates.end(0)
    await _turns()
    # no call reached the worker in between: it refilled from its own queue
    assert gates.started == 3
    assert worker.stats()["in_flight"] == 2
    assert worker.stats()["queued"] == 1
    assert gates.peak == 2
    collected = await worker.collect(0)
    assert [d["key"] for d in collected["done"]] == [0]
    assert collected["report"]["running"] == 2
    await worker.close()


async def test_a_worker_over_a_lowered_grant_lets_its_episodes_finish_and_starts_none() -> None:
    gates = Gates(capacity=3)
    (worker,) = _workers(gates, 3, 1)
    await worker.open()
    await worker.submit([_order(k) for k in range(5)], 3)
    await _turns()
    assert gates.running(0) == 3
    report = await worker.submit([], 1)
    assert (report["running"], report["queued"], report["slots"]) == (3, 2, 1)
    gates.end(0)
    await _turns()
    assert (gates.running(0), gates.started) == (2, 3)  # nothing started at 2 of 1
    gates.end(0)
    await _turns()
    assert (gates.running(0), gates.started) == (1, 3)
    gates.end(0)
    await _turns()
    assert (gates.running(0), gates.started) == (1, 4)  # back under the grant: one starts
    assert worker.stats()["cancelled"] == 0  # none of the running ones was stopped
    await worker.close()


async def test_withdrawing_drops_only_the_orders_that_never_started() -> None:
    gates = Gates(capacity=2)
    (worker,) = _workers(gates, 2, 1)
    await worker.open()
    await worker.submit([_order(k) for k in range(5)], 2)
    await _turns()
    assert sorted(await worker.withdraw()) == [2, 3, 4]
    gates.end(0, 2)
    await _turns()
    assert gates.started == 2
    collected = await worker.collect(0)
    assert sorted(d["key"] for d in collected["done"]) == [0, 1]
    assert worker.stats()["cancelled"] == 0
    await worker.close()


async def test_cancelling_reaches_queued_and_running_orders() -> None:
    gates = Gates(capacity=1)
    (worker,) = _workers(gates, 1, 1)
    await worker.open()
    await worker.submit([_order(k) for k in range(3)], 1)
    await _turns()
    await worker.cancel([0, 2])  # 0 runs, 2 is queued
    await _turns()
    # 0 was stopped (counted as killed), its slot went to 1, and 2 never starts
    assert worker.stats()["cancelled"] == 1
    assert gates.started == 2
    assert worker.stats()["queued"] == 0
    await worker.close()


# -- the driver over several workers -------------------------------------------------------


class Rollout:
    """The driver's scheduler over :class:`RemoteEpisodes` of in-process workers."""

    def __init__(self, *, concurrency: int, workers: int, episodes: int) -> None:
        self.gates = Gates(concurrency)
        self.workers = _workers(self.gates, concurrency, workers)
        spec = (
            make_job("slots", None)
            .with_model_path("tiny")
            .with_rollout(groupSize=2, workers=workers)
            .with_sandbox(provider="local", concurrency=concurrency)
            .obj()
            .spec
        )
        self.remote = RemoteEpisodes(
            [LocalActor(w) for w in self.workers], spec, collect_wait_seconds=0.05
        )
        self.tasks = [toy_task(f"t{i}") for i in range(episodes)]
        self.got: list[Trajectory] = []
        self.scheduler: RolloutScheduler | None = None

    async def __aenter__(self) -> Rollout:
        await self.remote.start()
        self.scheduler = RolloutScheduler(
            runner=self.remote, tasks=self.tasks, concurrency=self.gates.capacity
        )
        self.scheduler.start()
        self.consumer = asyncio.create_task(self._consume())
        return self

    async def _consume(self) -> None:
        assert self.scheduler is not None
        async for trajectory in self.scheduler.trajectories():
            self.got.append(trajectory)

    async def __aexit__(self, *exc: object) -> None:
        assert self.scheduler is not None
        if exc[0] is not None:
            await self.scheduler.cancel()
        await asyncio.wait_for(self.consumer, 10)
        await self.remote.aclose()

    def settled(self) -> bool:
        """Every grant the driver decided has reached its worker, and no call is on its way."""
        return all(
            not d.flushing
            and not d.orders
            and d.grant == w._slots
            and d.sent_grant in (None, d.grant)  # None: it never needed a call
            for d, w in zip(self.remote.workers, self.workers, strict=True)
        )

    async def settle(self) -> None:
        """Wait until the driver and the workers are quiet (everything here runs in this
        process: a short sleep lets every pending callback run)."""
        for _ in range(2):
            await asyncio.sleep(0.01)
            await wait_for(self.settled)

    async def drain(self, total: int) -> None:
        """End the oldest episode of the busiest worker, one at a time, until ``total``
        trajectories reached the consumer."""
        while len(self.got) < total:
            assert self.gates.live > 0, f"{len(self.got)} of {total} and nothing running"
            self.gates.end(max(range(len(self.workers)), key=self.gates.running))
            await self.settle()

    def scale(self, concurrency: int) -> None:
        """``kubectl scale``: the in-effect figure changes (the test's cap with it)."""
        assert self.scheduler is not None
        self.gates.capacity = concurrency
        self.scheduler.set_concurrency(concurrency)


async def test_the_slotted_runner_gets_a_prefetch_window_from_the_scheduler() -> None:
    async with Rollout(concurrency=6, workers=3, episodes=40) as rollout:
        assert isinstance(rollout.remote, SlottedEpisodes)
        await rollout.settle()
        assert rollout.scheduler is not None
        # 6 running, 6 more admitted and waiting in the workers' queues
        assert rollout.gates.live == 6
        assert rollout.scheduler.in_flight == 12
        assert rollout.remote.grants() == [2, 2, 2]
        assert [w.stats()["queued"] for w in rollout.workers] == [2, 2, 2]
        await rollout.drain(40)
    assert len(rollout.got) == 40
    assert rollout.gates.over_cap == []
    assert rollout.gates.peak == 6


async def test_scaling_down_and_up_never_exceeds_the_cap_and_never_stops_an_episode() -> None:
    async with Rollout(concurrency=9, workers=3, episodes=80) as rollout:
        gates = rollout.gates
        await rollout.settle()
        assert gates.live == 9 and rollout.remote.grants() == [3, 3, 3]

        # Down to 4 under 9 running: nobody may start until the live ones fit.
        rollout.scale(4)
        await rollout.settle()
        assert gates.live == 9  # nothing was stopped
        # Worker 0 drains first, the others hold on: worker 0 must not refill into the room
        # that the others' episodes still take.
        for _ in range(3):
            gates.end(0)
            await rollout.settle()
        assert gates.running(0) == 0 and gates.live == 6
        gates.end(1, 2)
        await rollout.settle()
        assert gates.live <= 4
        gates.end(2, 3)
        await rollout.settle()
        assert gates.live == 4  # refilled to the new figure, not beyond

        # Up to 12 without any episode ending: the queued orders start at once, the new
        # orders follow.
        rollout.scale(12)
        await rollout.settle()
        await wait_for(lambda: gates.live == 12)
        assert rollout.remote.grants() == [4, 4, 4]

        await rollout.drain(80)

    assert gates.over_cap == []
    assert len(rollout.got) == gates.started == 80  # every episode ran once, to its end
    assert {t.terminal_class for t in rollout.got} == {TerminalClass.COMPLETED}
    assert sum(w.cancelled for w in rollout.remote.final_stats) == 0
    assert gates.peak == 12


async def test_stopping_the_scheduler_withdraws_the_orders_that_never_started() -> None:
    async with Rollout(concurrency=4, workers=2, episodes=40) as rollout:
        await rollout.settle()
        assert rollout.scheduler is not None
        assert rollout.scheduler.in_flight == 8
        rollout.scheduler.stop()
        await wait_for(lambda: all(w.stats()["queued"] == 0 for w in rollout.workers))
        for w in range(2):
            rollout.gates.end(w, rollout.gates.running(w))
    assert len(rollout.got) == rollout.gates.started == 4
    assert rollout.remote.outstanding() == [0, 0]


async def test_a_worker_without_a_share_gets_no_orders_and_hands_its_queue_over() -> None:
    # concurrency 1 over 2 workers: worker 1's share is 0, so it never holds an order
    async with Rollout(concurrency=1, workers=2, episodes=5) as rollout:
        await rollout.settle()
        assert rollout.remote.grants() == [1, 0]
        assert rollout.remote.outstanding() == [2, 0]
        await rollout.drain(5)
    assert rollout.gates.running(1) == 0 and rollout.gates.over_cap == []

    # lowered below the number of workers with orders queued in both: worker 1's queue moves
    # to worker 0 (none of them would ever get a slot there) and every episode still ends
    async with Rollout(concurrency=4, workers=2, episodes=20) as rollout:
        await rollout.settle()
        assert [w.stats()["queued"] for w in rollout.workers] == [2, 2]
        rollout.scale(1)
        await rollout.settle()
        assert rollout.workers[1].stats()["queued"] == 0
        await rollout.drain(20)
    assert rollout.gates.over_cap == []
    assert sum(w.cancelled for w in rollout.remote.final_stats) == 0
