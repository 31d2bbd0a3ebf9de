"""One gate of live episodes for a runner in this process (``agentrl run``, a trainer without
rollout workers): training's scheduler and a held-out evaluation beside it together never run
more episodes than the concurrency in effect; lowering the concurrency lowers the gate; the
evaluation's scheduler leaves the gate and the process's concurrency gauges to training's."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

from agentrl.rollout import metrics
from agentrl.rollout.admission import OpenAdmission
from agentrl.rollout.evaluation import Evaluation, run_evaluation
from agentrl.rollout.scheduler import (
    Episodes,
    GatedEpisodes,
    RolloutScheduler,
    SlottedEpisodes,
)
from agentrl.rollout.tasks.model import Task
from agentrl.rollout.trajectory import Trajectory
from tests.rollout.fakes import toy_task
from tests.trainer.factories import make_trajectory


class _Live:
    """A plain runner (episodes in this process) that records how many run at once, in all
    and of the held-out tasks (ids starting with ``H``)."""

    def __init__(self, seconds: float = 0.01) -> None:
        self.seconds = seconds
        self.live = 0
        self.peak = 0
        self.live_held_out = 0
        self.started: list[str] = []
        self.overlapped = False
        """A held-out episode ran while a training one did."""

    async def run(self, task: Task, *, group_id: str, policy_version: int) -> Trajectory:
        held_out = task.id.startswith("H")
        self.live += 1
        self.live_held_out += held_out
        self.peak = max(self.peak, self.live)
        self.started.append(group_id)
        if held_out and self.live > self.live_held_out:
            self.overlapped = True
        try:
            await asyncio.sleep(self.seconds * (1 if held_out else 2))
            return make_trajectory(group_id, 1.0, version=policy_version)
        finally:
            self.live -= 1
            self.live_held_out -= held_out


class _Held:
    """A plain runner whose episodes run until the test releases them, oldest first."""

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0
        self.running: list[asyncio.Event] = []
        self.started: list[str] = []

    async def run(self, task: Task, *, group_id: str, policy_version: int) -> Trajectory:
        done = asyncio.Event()
        self.running.append(done)
        self.started.append(group_id)
        self.live += 1
        self.peak = max(self.peak, self.live)
        try:
            await done.wait()
            return make_trajectory(group_id, 1.0, version=policy_version)
        finally:
            self.live -= 1

    def finish(self, count: int) -> None:
        for _ in range(count):
            self.running.pop(0).set()


async def _until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.002)

    await asyncio.wait_for(poll(), timeout)


def _training(runner: Episodes, concurrency: int, count: int = 40) -> RolloutScheduler:
    return RolloutScheduler(
        runner=runner,
        tasks=[toy_task(f"t{i}") for i in range(count)],
        concurrency=concurrency,
        admission=OpenAdmission(),
    )


async def _side_by_side(
    training_runner: Episodes, evaluation_runner: Episodes, plain: _Live, c: int, share: float
) -> tuple[list[Trajectory], Evaluation]:
    """Training at ``c`` and, once it runs ``c`` episodes, an evaluation at ceil(c × share)."""
    scheduler = _training(training_runner, c)
    async with scheduler:
        collected = asyncio.create_task(_collect(scheduler))
        await _until(lambda: plain.live == c)
        result = await run_evaluation(
            evaluation_runner,
            [toy_task(f"H{i}") for i in range(3)],
            attempts=2,
            concurrency=math.ceil(c * share),
        )
        trained = await collected
    return trained, result


async def _collect(scheduler: RolloutScheduler) -> list[Trajectory]:
    return [t async for t in scheduler.trajectories()]


async def test_training_and_an_evaluation_beside_it_never_run_more_than_the_concurrency() -> None:
    c, share = 4, 0.5
    plain = _Live()
    gate = GatedEpisodes(plain, c)
    trained, result = await _side_by_side(gate, gate, plain, c, share)
    assert plain.peak == c  # never above, and training alone reached it
    assert plain.overlapped  # the evaluation did run beside training, on training's slots
    assert len(trained) == 40
    assert (result.episodes, result.passed, result.tasks) == (6, 6, 3)  # 3 tasks × 2 attempts
    assert (gate.live, gate.waiting, gate.capacity) == (0, 0, c)


async def test_without_the_gate_training_and_an_evaluation_add_up_above_the_concurrency() -> None:
    # What a plain runner handed to both did (before the gate): C + ceil(C × share) at once.
    c, share = 4, 0.5
    plain = _Live()
    await _side_by_side(plain, plain, plain, c, share)
    assert plain.peak == c + math.ceil(c * share) == 6


async def test_training_alone_over_the_gate_runs_as_over_the_plain_runner() -> None:
    alone, gated = _Live(), _Live()
    gate = GatedEpisodes(gated, 0)  # the scheduler sets the capacity
    for runner in (alone, gate):
        scheduler = _training(runner, 3, count=12)
        async with scheduler:
            assert len(await _collect(scheduler)) == 12
        assert scheduler.peak_in_flight == 3
    assert gated.started == alone.started
    assert gated.peak == alone.peak == 3
    assert (gate.capacity, gate.waiting) == (3, 0)


async def test_lowering_the_concurrency_lowers_the_gate_and_stops_nothing() -> None:
    held = _Held()
    gate = GatedEpisodes(held)
    scheduler = _training(gate, 4, count=8)
    assert gate.capacity == 4
    async with scheduler:
        collected = asyncio.create_task(_collect(scheduler))
        await _until(lambda: held.live == 4)
        scheduler.set_concurrency(2)
        assert gate.capacity == 2
        # an evaluation asks for 2 more: nothing frees a slot while 4 (> 2) still run
        evaluation = asyncio.create_task(
            run_evaluation(gate, [toy_task("H0")], attempts=2, concurrency=2)
        )
        await _until(lambda: gate.waiting == 2)
        assert held.live == 4  # running episodes were not stopped
        held.finish(2)  # 2 still run: the gate is full
        await _until(lambda: gate.live == 2)
        await asyncio.sleep(0.01)
        assert (held.live, gate.waiting) == (2, 2)
        # A slot frees: the oldest waiter (the evaluation's) takes it; training, down to 1 of
        # its 2, admits one more, which waits behind the evaluation's second.
        held.finish(1)
        await _until(lambda: gate.waiting == 2 and held.live == 2)
        assert held.started[-1] == "H0#0" and held.started.count("H0#0") == 1
        # Raising it again hands the room to both waiters at once (4 live: 2 training, 2
        # evaluation); training counts them among its 4 and admits 2 more, which wait.
        scheduler.set_concurrency(4)
        assert gate.capacity == 4
        await _until(lambda: gate.waiting == 2 and held.live == 4)
        assert held.started.count("H0#0") == 2 and scheduler.in_flight == 4
        while not (evaluation.done() and collected.done()):
            if held.running:
                held.finish(1)
            await asyncio.sleep(0.002)
    assert (await evaluation).episodes == 2
    assert len(await collected) == 8
    assert held.peak == 4


async def test_a_provider_limit_caps_the_gate_too() -> None:
    gate = GatedEpisodes(_Live())
    RolloutScheduler(runner=gate, tasks=[], concurrency=10, provider_limit=6)
    assert gate.capacity == 6


async def test_withdraw_cancels_the_calls_waiting_for_a_slot_only() -> None:
    held = _Held()
    gate = GatedEpisodes(held, 1)
    running = asyncio.create_task(gate.run(toy_task("a"), group_id="a#0", policy_version=0))
    waiting = [
        asyncio.create_task(gate.run(toy_task(x), group_id=f"{x}#0", policy_version=0))
        for x in ("b", "c")
    ]
    await _until(lambda: held.live == 1 and gate.waiting == 2)
    gate.withdraw()
    await asyncio.gather(*waiting, return_exceptions=True)
    assert all(task.cancelled() for task in waiting)
    assert (held.live, gate.waiting) == (1, 0)
    held.finish(1)
    assert (await running).group_id == "a#0"
    # a call cancelled while it waits leaves the queue; the next one still gets the slot
    blocker = asyncio.create_task(gate.run(toy_task("d"), group_id="d#0", policy_version=0))
    await _until(lambda: held.live == 1)
    cancelled = asyncio.create_task(gate.run(toy_task("e"), group_id="e#0", policy_version=0))
    later = asyncio.create_task(gate.run(toy_task("f"), group_id="f#0", policy_version=0))
    await _until(lambda: gate.waiting == 2)
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    assert gate.waiting == 1
    held.finish(1)
    await blocker
    await _until(lambda: held.live == 1)
    held.finish(1)
    assert (await later).group_id == "f#0"
    assert (gate.live, gate.waiting, held.peak) == (0, 0, 1)


class _Spy:
    """A :class:`SlottedEpisodes` that records what schedulers tell it."""

    def __init__(self) -> None:
        self.inner = _Live()
        self.concurrency: list[int] = []
        self.withdrawn = 0

    async def run(self, task: Task, *, group_id: str, policy_version: int) -> Trajectory:
        return await self.inner.run(task, group_id=group_id, policy_version=policy_version)

    def set_concurrency(self, concurrency: int) -> None:
        self.concurrency.append(concurrency)

    @property
    def prefetch(self) -> int:
        return 0

    def withdraw(self) -> None:
        self.withdrawn += 1


async def test_an_evaluation_neither_resizes_nor_withdraws_the_shared_runner() -> None:
    spy = _Spy()
    assert isinstance(spy, SlottedEpisodes)
    result = await run_evaluation(
        spy,
        [toy_task("H0")],
        attempts=3,
        concurrency=2,
        on_scheduler=lambda s: s.set_concurrency(5),  # as PeriodicEvaluation.finish does
    )
    assert result.episodes == 3
    assert (spy.concurrency, spy.withdrawn) == ([], 0)


async def test_the_concurrency_gauges_keep_trainings_figures_while_an_evaluation_runs() -> None:
    plain = _Live()
    gate = GatedEpisodes(plain)
    scheduler = RolloutScheduler(
        runner=gate,
        tasks=[toy_task(f"t{i}") for i in range(40)],
        concurrency=8,
        provider_limit=6,
        admission=OpenAdmission(),
    )

    def gauges() -> tuple[float, float]:
        return (
            metrics.CONCURRENCY_CONFIGURED._value.get(),
            metrics.CONCURRENCY_EFFECTIVE._value.get(),
        )

    seen: list[tuple[float, float]] = []

    def watch(evaluation: RolloutScheduler) -> None:
        seen.append(gauges())
        evaluation.set_concurrency(3)  # the evaluation's own figure changes: still not exported
        seen.append(gauges())

    async with scheduler:
        collected = asyncio.create_task(_collect(scheduler))
        await _until(lambda: plain.live == 6)
        result = await run_evaluation(
            gate, [toy_task("H0")], attempts=4, concurrency=2, on_scheduler=watch
        )
        seen.append(gauges())
        await collected
    assert result.episodes == 4
    assert seen == [(8.0, 6.0)] * 3
    assert gauges() == (8.0, 6.0)
    assert gate.capacity == 6  # the evaluation never resized the gate
    assert plain.peak == 6
