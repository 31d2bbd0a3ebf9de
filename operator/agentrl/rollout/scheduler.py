"""The rollout scheduler: keeps ``spec.sandbox.concurrency`` episodes in flight and hands
finished trajectories to whoever trains on them.

* Concurrency is live: :meth:`RolloutScheduler.set_concurrency` raises it (more episodes start at
  once) or lowers it (running episodes finish; fewer are admitted). Nothing is ever killed to
  honour a lower number. The effective number is ``min(configured, provider limit)``, and both
  are exported; the provider limit (E2B's plan) is given only where no operator applied it
  already (``agentrl run``: :func:`agentrl.rollout.runtime.provider_limit`).
* Every episode start goes through admission control (:mod:`agentrl.rollout.admission`): the
  trainer's staleness bound holds new episodes back, it never throws finished ones away.
* Episodes of a task start as a GRPO group (``rollout.groupSize`` episodes, one ``group_id``);
  each is admitted on its own, so a group never waits for a free block of slots.
* Admission runs in its own task and finished trajectories go to an unbounded queue, so a slow
  consumer never lowers achieved concurrency (the staleness bound is the backpressure).
* The long-tail figure is computed per batch of ``trainer.trajectoriesPerStep`` episodes in
  admission order.
* A runner that keeps the cap itself (:class:`SlottedEpisodes`: the driver's
  :class:`~agentrl.rollout.ray_workers.RemoteEpisodes`, whose worker actors hold slots and start
  prefetched orders locally) is told the effective concurrency and gets up to
  :attr:`SlottedEpisodes.prefetch` admitted orders beyond it; the scheduler then counts as in
  flight every admitted episode not finished yet, started or waiting for a slot. On
  :meth:`~RolloutScheduler.stop` such a runner drops the orders that never started.
* A runner in this process that another scheduler shares (a held-out evaluation beside
  training) goes behind a :class:`GatedEpisodes`: one gate of live episodes, a
  :class:`SlottedEpisodes` with no prefetch, so both together never exceed the concurrency.
* The concurrency gauges are the process's; a scheduler built with ``export_metrics=False``
  (an evaluation's) leaves them to training's.

Callers: :mod:`agentrl.rollout.runtime` (``open_rollout``: in-process on one machine or in the
trainer pod), :mod:`agentrl.rollout.ray_workers` (``open_remote_rollout``: the driver's one
scheduler over the worker actors), :mod:`agentrl.rollout.evaluation` and
:mod:`agentrl.trainer.evaluation` (the held-out evaluation's own scheduler),
:mod:`agentrl.trainer.assembly` (``agentrl run``'s in-process tier behind a ``GatedEpisodes``).
Typical use::

    async with RolloutScheduler(runner=runner, tasks=tasks, concurrency=64,
                                group_size=8, admission=admission) as scheduler:
        async for trajectory in scheduler.trajectories():
            ...
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol, Self, runtime_checkable

from agentrl.api.rollout import ClassAction, TerminalClass
from agentrl.rollout import metrics
from agentrl.rollout.admission import Admission, OpenAdmission
from agentrl.rollout.tasks.model import Task
from agentrl.rollout.trajectory import Trajectory

logger = logging.getLogger(__name__)


@dataclass
class _Batch:
    size: int
    started_at: float
    finishes: list[float] = field(default_factory=list)


def _episodes(tasks: Iterable[Task], group_size: int) -> Iterator[tuple[Task, str]]:
    for number, task in enumerate(tasks):
        group_id = f"{task.id}#{number}"
        for _ in range(group_size):
            yield task, group_id


class Episodes(Protocol):
    """What runs one admitted episode to its end: an :class:`EpisodeRunner` in this process,
    or :class:`~agentrl.rollout.ray_workers.RemoteEpisodes` over worker actors."""

    async def run(self, task: Task, *, group_id: str, policy_version: int) -> Trajectory: ...


@runtime_checkable
class SlottedEpisodes(Episodes, Protocol):
    """An :class:`Episodes` that keeps the cap of live episodes itself and starts admitted
    orders as slots free, without waiting for the scheduler (an optional ability: a plain
    runner in this process has none, and the scheduler's own count is the cap; behind a
    :class:`GatedEpisodes` it has)."""

    def set_concurrency(self, concurrency: int) -> None:
        """The effective concurrency: never more episodes running at once than this."""
        ...

    @property
    def prefetch(self) -> int:
        """Admitted orders it wants beyond the concurrency, to start the moment a slot frees."""
        ...

    def withdraw(self) -> None:
        """Drop the admitted orders that have not started (their ``run`` calls are cancelled):
        the scheduler stops admitting."""
        ...


class GatedEpisodes:
    """A runner in this process (a plain :class:`Episodes`) behind one gate of live episodes:
    a :class:`SlottedEpisodes` whose cap is the in-effect concurrency, so every scheduler
    handed it shares that cap — training's, and a held-out evaluation's (which sees it through
    :class:`~agentrl.rollout.evaluation._SharedSlots`, so it neither resizes nor withdraws it).
    Without it, training's C episodes and an evaluation's share would run side by side, above
    ``spec.sandbox.concurrency``.

    It holds the capacity (:meth:`set_concurrency`, the effective concurrency the training
    scheduler tells it), the number of episodes running, and the ``run`` calls waiting for a
    slot, served first come first served (a slot that frees goes to the oldest waiter). Its
    prefetch is 0: a scheduler alone never admits beyond the capacity, so with nobody else
    sharing the gate no call ever waits and training behaves as over the plain runner. Lowering
    the capacity stops nothing that runs; :meth:`withdraw` cancels the calls still waiting."""

    def __init__(self, inner: Episodes, capacity: int = 0) -> None:
        if capacity < 0:
            raise ValueError("capacity must be ≥ 0")
        self.inner = inner
        self.capacity = capacity
        """Most episodes running at once (the effective concurrency)."""
        self.live = 0
        """Episodes running now (holding a slot)."""
        self._waiting: deque[asyncio.Future[None]] = deque()

    @property
    def prefetch(self) -> int:
        return 0

    @property
    def waiting(self) -> int:
        """``run`` calls waiting for a slot."""
        return sum(1 for f in self._waiting if not f.done())

    def set_concurrency(self, concurrency: int) -> None:
        if concurrency < 0:
            raise ValueError("concurrency must be ≥ 0")
        self.capacity = concurrency
        self._hand_over()

    def withdraw(self) -> None:
        while self._waiting:
            self._waiting.popleft().cancel()

    async def run(self, task: Task, *, group_id: str, policy_version: int) -> Trajectory:
        if self.live < self.capacity and not self.waiting:
            self.live += 1
        else:
            slot = asyncio.get_running_loop().create_future()
            self._waiting.append(slot)
            try:
                await slot  # the slot is counted in ``live`` when handed over
            except asyncio.CancelledError:
                if slot.done() and not slot.cancelled():  # handed over, then cancelled
                    self._release()
                elif slot in self._waiting:
                    self._waiting.remove(slot)
                raise
        try:
            return await self.inner.run(task, group_id=group_id, policy_version=policy_version)
        finally:
            self._release()

    def _release(self) -> None:
        self.live -= 1
        self._hand_over()

    def _hand_over(self) -> None:
        """Give free slots to the oldest waiters."""
        while self._waiting and self.live < self.capacity:
            slot = self._waiting.popleft()
            if not slot.done():
                slot.set_result(None)
                self.live += 1


class RolloutScheduler:
    """Admits episodes up to the concurrency in effect and collects their trajectories."""

    def __init__(
        self,
        *,
        runner: Episodes,
        tasks: Iterable[Task],
        concurrency: int,
        group_size: int = 1,
        admission: Admission | None = None,
        provider_limit: int | None = None,
        batch_size: int | None = None,
        export_metrics: bool = True,
    ) -> None:
        """``export_metrics``: set the process's concurrency gauges (False for a held-out
        evaluation's scheduler, which must not overwrite training's figures)."""
        if concurrency < 0:
            raise ValueError("concurrency must be ≥ 0")
        self.runner = runner
        self.admission: Admission = admission or OpenAdmission()
        self.provider_limit = provider_limit
        """The provider's own limit on live sandboxes (E2B plan), or None (on a cluster the
        operator's in-effect figure already applies it)."""
        self.batch_size = batch_size
        """Episodes per long-tail batch (``trainer.trajectoriesPerStep``); None disables it."""
        self.export_metrics = export_metrics
        self._episodes = _episodes(tasks, group_size)
        self._next: tuple[Task, str] | None = None
        self._exhausted = False
        self._concurrency = concurrency
        self._running: set[asyncio.Task[None]] = set()
        self._versions: dict[asyncio.Task[None], int] = {}
        """Policy version each running episode was admitted under (the staleness gate)."""
        self._wake = asyncio.Event()
        self._results: asyncio.Queue[Trajectory | None] = asyncio.Queue()
        self._slotted = runner if isinstance(runner, SlottedEpisodes) else None
        self._loop_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._admitted = itertools.count()
        self._batches: dict[int, _Batch] = {}
        self.long_tail_shares: list[float] = []
        """Long-tail share of each completed batch, in batch order."""
        self.peak_in_flight = 0
        """Most episodes ever in flight at once (the invariant tests assert on it); with a
        :class:`SlottedEpisodes` runner, admitted ones waiting for a slot included."""
        self.admission.subscribe(self._wake.set)
        self._export()

    # -- the knobs ---------------------------------------------------------------------------

    @property
    def concurrency(self) -> int:
        """Configured episodes in flight."""
        return self._concurrency

    @property
    def effective_concurrency(self) -> int:
        """``min(configured, provider limit)``."""
        if self.provider_limit is None:
            return self._concurrency
        return min(self._concurrency, self.provider_limit)

    @property
    def in_flight(self) -> int:
        """Admitted episodes not finished (with a :class:`SlottedEpisodes` runner, those
        waiting for a slot too)."""
        return len(self._running)

    @property
    def window(self) -> int:
        """Episodes admitted and not finished that the scheduler allows: the effective
        concurrency, plus a :class:`SlottedEpisodes` runner's prefetch."""
        effective = self.effective_concurrency
        return effective + (self._slotted.prefetch if self._slotted is not None else 0)

    @property
    def oldest_in_flight_version(self) -> int | None:
        """The lowest policy version among running episodes (None when none runs): the
        trainer does not advance past the version that would make it too stale."""
        return min(self._versions.values(), default=None)

    def set_concurrency(self, concurrency: int) -> None:
        """Follow a change of ``spec.sandbox.concurrency`` (``kubectl scale``, autoscaler).
        Raising starts more episodes now; lowering lets running ones finish."""
        if concurrency < 0:
            raise ValueError("concurrency must be ≥ 0")
        if concurrency != self._concurrency:
            logger.info("rollout concurrency %d -> %d", self._concurrency, concurrency)
        self._concurrency = concurrency
        self._export()
        self._wake.set()

    def _export(self) -> None:
        if self.export_metrics:
            metrics.CONCURRENCY_CONFIGURED.set(self._concurrency)
            metrics.CONCURRENCY_EFFECTIVE.set(self.effective_concurrency)
        if self._slotted is not None:
            self._slotted.set_concurrency(self.effective_concurrency)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start admitting episodes (idempotent)."""
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._admit_loop(), name="rollout-admission")

    def stop(self) -> None:
        """Admit no more episodes; running ones finish and are still yielded (a
        :class:`SlottedEpisodes` runner drops the admitted ones that have not started)."""
        if not self._stopping and self._slotted is not None:
            self._slotted.withdraw()
        self._stopping = True
        self._wake.set()

    async def cancel(self) -> None:
        """Emergency stop: cancel running episodes (their sandboxes are closed) and wait."""
        self.stop()
        for task in list(self._running):
            task.cancel()
        if self._loop_task is not None:
            await asyncio.gather(self._loop_task, return_exceptions=True)

    async def __aenter__(self) -> Self:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            await self.cancel()
            return
        self.stop()
        if self._loop_task is not None:
            await self._loop_task

    async def trajectories(self) -> AsyncIterator[Trajectory]:
        """Finished trajectories in finishing order, until the task source is exhausted (or
        :meth:`stop` was called) and nothing is left running."""
        self.start()
        while True:
            item = await self._results.get()
            if item is None:
                return
            yield item

    # -- the admission loop ------------------------------------------------------------------

    def _peek(self) -> tuple[Task, str] | None:
        if self._next is None and not self._exhausted:
            self._next = next(self._episodes, None)
            if self._next is None:
                self._exhausted = True
        return self._next

    async def _admit_loop(self) -> None:
        try:
            while True:
                self._wake.clear()
                # Up to the concurrency first; the prefetch only after a turn of the loop, so
                # the orders that start at once go out before those that wait for a slot.
                if self._admit(self.effective_concurrency) and self.window > len(self._running):
                    await asyncio.sleep(0)
                self._admit(self.window)
                if (self._stopping or self._exhausted) and not self._running:
                    break
                await self._wake.wait()
        finally:
            self._results.put_nowait(None)

    def _admit(self, limit: int) -> int:
        """Admit episodes while fewer than ``limit`` are in flight; how many it admitted."""
        admitted = 0
        while not self._stopping and len(self._running) < limit:
            item = self._peek()
            if item is None:
                break
            version = self.admission.try_admit()
            if version is None:
                break
            self._next = None
            self._launch(item[0], item[1], version)
            admitted += 1
        return admitted

    def _launch(self, task: Task, group_id: str, version: int) -> None:
        sequence = next(self._admitted)
        if self.batch_size:
            index = sequence // self.batch_size
            if index not in self._batches:
                self._batches[index] = _Batch(size=self.batch_size, started_at=time.monotonic())
        else:
            index = -1
        job = asyncio.create_task(self._episode(task, group_id, version, index))
        self._running.add(job)
        self._versions[job] = version
        # A done-callback, not code inside the episode: a task cancelled before it ever ran
        # must leave the running set too, or the admission loop would wait for it forever.
        job.add_done_callback(self._episode_done)
        self.peak_in_flight = max(self.peak_in_flight, len(self._running))

    def _episode_done(self, job: asyncio.Task[None]) -> None:
        self._running.discard(job)
        self._versions.pop(job, None)
        self._wake.set()

    async def _episode(self, task: Task, group_id: str, version: int, batch: int) -> None:
        trajectory = await self.runner.run(task, group_id=group_id, policy_version=version)
        if (
            trajectory.terminal_class == TerminalClass.INFRA_ERROR
            or trajectory.training_action == ClassAction.DROP
        ):
            self.admission.release()
        self._finish_batch(batch)
        # Out of the in-flight versions *before* the consumer can see the trajectory: the
        # trainer's staleness gate must not wait for an episode it already has.
        current = asyncio.current_task()
        if current is not None:
            self._versions.pop(current, None)  # type: ignore[arg-type]
        self._results.put_nowait(trajectory)

    def _finish_batch(self, index: int) -> None:
        batch = self._batches.get(index)
        if batch is None:
            return
        batch.finishes.append(time.monotonic())
        if len(batch.finishes) == batch.size:
            share = metrics.long_tail_share(batch.started_at, batch.finishes)
            self.long_tail_shares.append(share)
            metrics.LONG_TAIL_SHARE.set(share)
            metrics.LONG_TAIL_SHARE_HISTOGRAM.observe(share)
            del self._batches[index]
