"""Episodes spread over processes: Ray actors run them, the driver admits and collects.

One asyncio loop keeps thousands of episodes in flight, but it is one core: JSON, tokenisation
and TLS of every LLM call and exec would queue behind each other. So on a cluster the episodes
run in ``spec.rollout.workers`` :class:`RolloutWorker` actors (placed on the rollout worker pods
that joined the trainer's Ray head), while the driver keeps what must be one: the
:class:`~agentrl.rollout.scheduler.RolloutScheduler` with the job's whole concurrency, the
trainer's admission control (staleness), the task order and the long-tail batches.

The invariant "at most the in-effect concurrency of live sandboxes" is kept *at the workers*:

* the driver grants each worker a number of **slots** (:mod:`agentrl.rollout.slots`: an even
  share of the in-effect concurrency, lowered while episodes over a lowered concurrency are
  still running), and a worker runs at most that many episodes at once;
* the scheduler admits up to the in-effect concurrency *plus as many again*
  (:attr:`RemoteEpisodes.prefetch`), and :meth:`RemoteEpisodes.run` gives each admitted episode
  to the live worker furthest below twice its share (its slots and one refill of each; ties: the
  lowest index; a worker without a share gets none and hands over what it had queued) — orders
  made in one turn of the driver's loop travel in one ``submit`` call per worker, with the
  worker's grant;
* a worker starts an order at once when it has a free slot, else queues it, and starts the next
  queued order **the moment one of its episodes ends**, in the same turn of its loop — so a
  burst of finishes refills without waiting for the driver. The driver tops the queues up as
  the trajectories reach it;
* each worker's collector in the driver long-polls ``collect``, which answers as soon as one
  episode finished (or after :data:`COLLECT_WAIT_SECONDS`) with every finished trajectory, the
  worker's running/queued/slot counts (:class:`WorkerReport`) and now and then a snapshot of its
  metrics — trajectories *stream* to the trainer as they finish, a batch per call.

Admission (staleness) stays with the driver: a prefetched order was admitted, counts against the
bound and carries the policy version it was admitted under (never newer than the one its
tokens are sampled from). Lowering the concurrency (``kubectl scale``) never stops a running
episode: grants shrink and workers stop refilling until the live episodes fit; raising it
raises the grants, and the queued orders start at once. When the scheduler stops admitting,
the orders still queued are withdrawn (:meth:`RemoteEpisodes.withdraw`), so a stop waits for
running episodes only.

Nothing caps episodes per worker but the grants (an actor's ``max_concurrency`` only bounds its
concurrent method calls, and a worker gets a handful: submit, collect, cancel, withdraw). A
worker's engine pools are sized by :func:`~agentrl.rollout.runtime.remote_worker_pool_size`.
The grants and queues are exported by each worker (``agentrl_rollout_worker_slots``,
``agentrl_rollout_prefetched_orders``).

A worker that dies (its pod evicted, OOM-killed, or replaced by a rolling update of the rollout
Deployment) fails its outstanding episodes (running or queued) over to the live workers, within
``rollout.failurePolicy.infraRetries``; past it they end as ``infra_error`` trajectories with
reason ``rollout_worker`` (never scored). Its slots go to the live workers. Ray restarts the
actor (``max_restarts=-1``) in its bundle of the rollout placement group, which Ray places
again on a rollout pod that joins the head (the replacement pod); until then a call to it
answers "restarting". The driver keeps calling ``open`` (:data:`REOPEN_BACKOFF_SECONDS`) and,
once the restarted actor answers, gives it orders and slots again under the same index, so its
sandbox pods (the kubernetes provider's worker id) are reaped by its next create
(``agentrl_rollout_worker_restarts_total`` counts these). While no worker is alive and one is
being restarted, episodes wait for it instead of failing at once; an actor gone for good
(``ActorDiedError`` and Ray's control store says ``DEAD``: killed without restart) is not waited
for, and with none alive and none coming back, every episode ends as an ``infra_error`` at once.
(``ActorDiedError`` alone does not say it: a call reaching the dead incarnation before Ray
marked it restarting fails so too.)

Everything crossing the process boundary is a pydantic model dumped to JSON (the job manifest,
tasks, trajectories): no live objects are pickled.

``ray`` is the ``ray`` extra and is imported only here, inside the functions that need it.
Callers: the trainer's driver (:mod:`agentrl.trainer.pod`), ``bench/rollout_concurrency.py``,
tests.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import importlib
import itertools
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from agentrl.api.job import AgentRLJobSpec
from agentrl.api.rollout import FailurePolicy, TerminalClass
from agentrl.api.wire import SandboxPods
from agentrl.ray_cluster import placement as ray_placement
from agentrl.ray_cluster.placement import Placement, current_placement
from agentrl.rollout import metrics
from agentrl.rollout.admission import Admission
from agentrl.rollout.concurrency_source import ConcurrencySource
from agentrl.rollout.scheduler import RolloutScheduler
from agentrl.rollout.slots import grant_slots, shares
from agentrl.rollout.tasks.model import Task
from agentrl.rollout.trajectory import Timings, Trajectory, training_action

logger = logging.getLogger(__name__)


#: Longest a worker's ``collect`` waits for a first finished episode before answering empty;
#: bounds how late the driver notices a worker it no longer needs (and how often an idle
#: worker's metrics refresh). A finished episode answers at once.
COLLECT_WAIT_SECONDS: Final = 5.0
#: Seconds between two metric snapshots a worker attaches to ``collect`` answers.
METRICS_SNAPSHOT_SECONDS: Final = 5.0
#: The infra-error category of an episode lost with its worker.
WORKER_LOST: Final = "rollout_worker"
#: First and longest wait between two ``open`` calls to a worker actor Ray is restarting (the
#: wait doubles): how late after a replacement rollout pod joins the driver uses it again.
REOPEN_BACKOFF_SECONDS: Final = (1.0, 15.0)
#: Longest :meth:`RemoteEpisodes.aclose` waits for one worker's ``close`` (its episodes
#: cancelled, their sandboxes deleted): a worker whose pod left unnoticed must not hold a
#: stopping trainer for the rest of its grace period. Past it the worker's stats are what the
#: driver knew.
CLOSE_WAIT_SECONDS: Final = 60.0


class RolloutWorkerConfig(BaseModel):
    """What every worker actor needs to run episodes."""

    model_config = ConfigDict(frozen=True)

    job: dict[str, Any]
    """The AgentRLJob manifest (the ConfigMap's ``job.yaml``: defaults resolved, uid set)."""
    sandbox_pods: SandboxPods | None = None
    """The sandbox pod template of ``runtime.yaml`` (provider ``kubernetes``)."""
    engine_urls: list[str] = Field(min_length=1)
    """Base URLs of the inference engines."""
    workers: int = Field(ge=1)
    """Worker actors to start (``spec.rollout.workers``)."""
    namespace: str | None = None
    """Namespace of sandbox pods (provider ``kubernetes``); the job's by default."""
    kubeconfig: str | None = None
    """Kubeconfig for the provider; None: in-cluster ServiceAccount or ``$KUBECONFIG``."""
    sandbox_dir: str | None = None
    """Parent directory of ``local`` sandboxes; None: the system's temporary directory."""
    parts: str | None = None
    """``module:function`` building a worker's :class:`WorkerParts` from (this config, the
    worker's index), imported in the worker; None: the spec's sandbox provider, the engine
    clients and tokenizer the engines report. For benchmarks and tests that put fakes in."""


class WorkerParts(BaseModel):
    """What a worker runs episodes with, when :attr:`RolloutWorkerConfig.parts` builds it."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    provider: Any
    """A :class:`~agentrl.sandbox.provider.SandboxProvider` (closed by the worker)."""
    tokenizer: Any = None
    """A :class:`~agentrl.rollout.agent.TurnTokenizer`; None asks the engines."""
    engine_client: Any = None
    """Called like :class:`~agentrl.engine_client.client.EngineClient`; None: that class."""


class EpisodeOrder(BaseModel):
    """Driver → worker: run one episode."""

    key: int
    """The driver's number for it (answers and cancels name it)."""
    task: Task
    group_id: str
    policy_version: int
    attempt: int = 0
    """Attempts already spent on it (on workers that died)."""


class EpisodeDone(BaseModel):
    """Worker → driver: one finished episode."""

    key: int
    trajectory: str | None = None
    """The :class:`Trajectory` as JSON; None when the worker failed to run it (``error``)."""
    error: str | None = None


class WorkerReport(BaseModel):
    """A worker's counts as of one of its answers (``submit``, ``collect``)."""

    seq: int
    """Grows with every answer: answers may reach the driver out of order, the newest wins."""
    running: int
    """Episodes running (each holding a sandbox or about to)."""
    queued: int
    """Admitted orders waiting for a slot."""
    slots: int
    """The grant it runs under: it starts an order only while ``running < slots``."""


class Collected(BaseModel):
    """A worker's answer to ``collect``."""

    done: list[EpisodeDone] = Field(default_factory=list)
    report: WorkerReport
    """Its counts after these."""
    metrics: list[dict[str, Any]] | None = None
    """A snapshot of the worker's metrics (:func:`agentrl.rollout.metrics_export.snapshot`),
    every :data:`METRICS_SNAPSHOT_SECONDS`; None in between."""


class WorkerStats(BaseModel):
    """What a worker actor reports about itself."""

    worker_index: int
    pid: int
    """The actor's process (the episodes really ran outside the driver)."""
    episodes: int = 0
    """Episodes it finished."""
    in_flight: int = 0
    """Episodes running now."""
    peak_in_flight: int = 0
    """Most episodes it had running at once (never above its grant)."""
    slots: int = 0
    """Its grant now."""
    queued: int = 0
    """Orders waiting for a slot now."""
    cancelled: int = 0
    """Running episodes it stopped on the driver's cancel (or at close): an episode killed."""
    engine_pool_size: int = 0
    """Connections of its pool towards each engine."""


class RolloutWorker:
    """The body of one worker actor (wrapped by ``ray.remote`` in :func:`start_workers`)."""

    def __init__(self, config: dict[str, Any], index: int, *, runner: Any = None) -> None:
        self.config = RolloutWorkerConfig.model_validate(config)
        self.index = index
        self._stack: contextlib.AsyncExitStack | None = None
        self._runner: Any = runner
        """The episode runner; given here by tests (then :meth:`open` builds nothing)."""
        self._running: dict[int, asyncio.Task[None]] = {}
        self._queue: collections.deque[int] = collections.deque()
        """Keys of the queued orders, oldest first (cancelled ones are skipped when met)."""
        self._orders: dict[int, EpisodeOrder] = {}
        """The queued orders by key."""
        self._slots = 0
        self._seq = 0
        self._ready: list[EpisodeDone] = []
        self._wake: asyncio.Event | None = None
        self._snapshot_at = 0.0
        self._stats = WorkerStats(worker_index=index, pid=os.getpid())

    def where(self) -> dict[str, Any]:
        """Where this actor runs (placement group, bundle, node, process)."""
        return current_placement().model_dump()

    async def open(self, drop: bool = False) -> dict[str, Any]:
        """Build the sandbox provider, engine clients and episode runner; :class:`WorkerStats`.

        ``drop``: the driver failed this worker's episodes over (a call to it failed); if this
        incarnation was open already (the failure was the connection, not the process), it
        cancels what it still runs and queues, so nothing runs beyond the driver's grants."""
        from agentrl.api import AgentRLJob
        from agentrl.rollout.runtime import (
            configure_worker_process,
            open_episode_runner,
            remote_worker_pool_size,
        )
        from agentrl.sandbox import open_provider

        if self._wake is not None:
            if drop:
                await self._drop_all()
            return self._stats.model_dump()
        if self._runner is not None:  # given by a test
            self._wake = asyncio.Event()
            return self._stats.model_dump()
        config = self.config
        job = AgentRLJob.model_validate(config.job)
        stack = contextlib.AsyncExitStack()
        if config.parts is not None:
            module, _, name = config.parts.partition(":")
            parts = getattr(importlib.import_module(module), name)(config, self.index)
        else:
            parts = WorkerParts(
                provider=open_provider(
                    job.spec.sandbox,
                    pods=config.sandbox_pods,
                    namespace=config.namespace,
                    worker_id=f"{job.metadata.name}-rollout-{self.index}",
                    kubeconfig=config.kubeconfig,
                    local_base_dir=config.sandbox_dir,
                )
            )
        stack.push_async_callback(parts.provider.aclose)
        pool_size = remote_worker_pool_size(job.spec)
        clients = {} if parts.engine_client is None else {"engine_client": parts.engine_client}
        try:
            self._runner = await stack.enter_async_context(
                open_episode_runner(
                    job.spec,
                    provider=parts.provider,
                    engine_urls=config.engine_urls,
                    pool_size=pool_size,
                    tokenizer=parts.tokenizer,
                    **clients,
                )
            )
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        self._wake = asyncio.Event()
        self._stats.engine_pool_size = pool_size
        configure_worker_process()  # this actor's process only runs episodes
        return self._stats.model_dump()

    async def submit(self, orders: list[dict[str, Any]], slots: int) -> dict[str, Any]:
        """Queue these orders, run under a grant of ``slots`` from now on, and start what the
        grant allows; the :class:`WorkerReport` after it."""
        if self._runner is None or self._wake is None:
            raise RuntimeError("submit before open")
        if slots < 0:
            raise ValueError(f"a grant of {slots} slots")
        for raw in orders:
            order = EpisodeOrder.model_validate(raw)
            self._orders[order.key] = order
            self._queue.append(order.key)
        self._slots = slots
        metrics.WORKER_SLOTS.set(slots)
        self._fill()
        return self._report().model_dump()

    def _fill(self) -> None:
        """Start queued orders while the grant has a free slot."""
        running, queue, orders = self._running, self._queue, self._orders
        while len(running) < self._slots and queue:
            order = orders.pop(queue.popleft(), None)
            if order is not None:  # else cancelled while queued
                task = asyncio.create_task(self._episode(order))
                running[order.key] = task
                # A task cancelled before its first step never runs its ``finally``.
                task.add_done_callback(functools.partial(self._forget, order.key))
        if len(running) > self._stats.peak_in_flight:
            self._stats.peak_in_flight = len(running)
        metrics.PREFETCHED_ORDERS.set(len(orders))

    def _forget(self, key: int, task: asyncio.Task[None]) -> None:
        if self._running.get(key) is task:
            del self._running[key]
            self._fill()

    def _report(self) -> WorkerReport:
        self._seq += 1
        return WorkerReport(
            seq=self._seq, running=len(self._running), queued=len(self._orders), slots=self._slots
        )

    async def _episode(self, order: EpisodeOrder) -> None:
        trajectory: Trajectory | None = None
        error: str | None = None
        try:
            trajectory = await self._runner.run(
                order.task,
                group_id=order.group_id,
                policy_version=order.policy_version,
                attempt=order.attempt,
            )
        except asyncio.CancelledError:
            self._stats.cancelled += 1
            raise
        except Exception as exc:  # the runner classifies failures itself; this is a bug
            error = f"{type(exc).__name__}: {exc}"
        finally:
            self._running.pop(order.key, None)
            self._fill()  # the freed slot takes the next queued order now, not after a round trip
        if trajectory is not None:
            done = EpisodeDone(key=order.key, trajectory=trajectory.model_dump_json())
        else:
            done = EpisodeDone(key=order.key, error=error)
        self._stats.episodes += 1
        self._ready.append(done)
        assert self._wake is not None
        self._wake.set()

    async def collect(self, wait_seconds: float = COLLECT_WAIT_SECONDS) -> dict[str, Any]:
        """Every finished episode not collected yet, waiting up to ``wait_seconds`` for the
        first (:class:`Collected`)."""
        if not self._ready and self._wake is not None:
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_seconds):
                    await self._wake.wait()
        done, self._ready = self._ready, []
        snapshot = None
        now = time.monotonic()
        if now - self._snapshot_at >= METRICS_SNAPSHOT_SECONDS:
            from agentrl.rollout.metrics_export import snapshot as take_snapshot

            snapshot = take_snapshot()
            self._snapshot_at = now
        return Collected(done=done, report=self._report(), metrics=snapshot).model_dump()

    async def cancel(self, keys: list[int]) -> None:
        """Cancel these episodes, running (their sandboxes are closed) or queued; no answer
        comes for them."""
        for key in keys:
            self._orders.pop(key, None)
            task = self._running.get(key)
            if task is not None:
                _cancel_once(task)
        metrics.PREFETCHED_ORDERS.set(len(self._orders))

    async def withdraw(self) -> list[int]:
        """Drop every queued order (the driver stopped admitting); their keys."""
        keys = list(self._orders)
        self._orders.clear()
        self._queue.clear()
        metrics.PREFETCHED_ORDERS.set(0)
        return keys

    def stats(self) -> dict[str, Any]:
        """:class:`WorkerStats` now."""
        now = {"in_flight": len(self._running), "slots": self._slots, "queued": len(self._orders)}
        return self._stats.model_copy(update=now).model_dump()

    async def _drop_all(self) -> None:
        """Drop the queue and the grant, cancel what runs and forget what finished."""
        self._orders.clear()
        self._queue.clear()
        self._slots = 0
        running = list(self._running.values())
        for task in running:
            _cancel_once(task)
        await asyncio.gather(*running, return_exceptions=True)
        self._ready.clear()

    async def close(self) -> dict[str, Any]:
        """Drop the queue, cancel what still runs, close engines and provider; the final
        :class:`WorkerStats`."""
        await self._drop_all()
        if self._stack is not None:
            await self._stack.aclose()
            self._stack = None
            self._runner = None
        return self.stats()


def _cancel_once(task: asyncio.Task[None]) -> None:
    """Cancel an episode's task unless it is already being cancelled: a second cancel would
    interrupt the first one's cleanup, such as the deletion of a sandbox pod just created
    (left running when the job was suspended)."""
    if not task.cancelling():
        task.cancel()


def start_workers(
    config: RolloutWorkerConfig,
    *,
    cpus_per_worker: float = 1.0,
    strategies: Sequence[Any] | None = None,
) -> list[Any]:
    """One actor per worker, each reserving ``cpus_per_worker`` so Ray spreads them over cores
    (and over the rollout worker pods of a cluster); Ray restarts one whose process or node died
    (:class:`RemoteEpisodes` opens it again).

    ``strategies``: one Ray scheduling strategy per worker — the bundles of the job's rollout
    placement group (:func:`start_workers_in`); None lets Ray
    choose."""
    import ray

    if strategies is not None and len(strategies) != config.workers:
        raise ValueError(f"{len(strategies)} scheduling strategies for {config.workers} workers")
    actor = ray.remote(num_cpus=cpus_per_worker, max_restarts=-1)(RolloutWorker)
    payload = config.model_dump(mode="json")
    return [
        (
            actor if strategies is None else actor.options(scheduling_strategy=strategies[index])
        ).remote(payload, index)
        for index in range(config.workers)
    ]


# -- the driver's side -----------------------------------------------------------------------


def start_workers_in(placement: Placement, config: RolloutWorkerConfig) -> list[Any]:
    """The rollout worker actors of :func:`start_workers`, worker ``i`` in bundle ``i`` of
    ``placement``'s rollout group (``config.workers`` is ``spec.rollout.workers``); the
    placement keeps their handles."""
    handles = start_workers(
        config,
        cpus_per_worker=ray_placement.ROLLOUT_WORKER_CPUS,
        strategies=ray_placement.rollout_strategies(placement),
    )
    placement.actors.extend(handles)
    return handles


class _Lost(Exception):
    """The worker running an episode died before answering."""


@dataclass
class _Worker:
    index: int
    actor: Any
    alive: bool = True
    outstanding: int = 0
    """Orders given to it and not answered: unsent, queued there or running there."""
    orders: list[dict[str, Any]] = field(default_factory=list)
    """Orders not sent yet."""
    cancels: list[int] = field(default_factory=list)
    withdrawing: str | None = None
    """``cancel``: drop its queued orders (the scheduler stops); ``move``: hand them to the
    workers with a share (this one has none)."""
    share: int = 0
    """Its even share of the concurrency (0: it gets no orders)."""
    grant: int = 0
    """The slots it should run under (sent with its next call when it changed)."""
    sent_grant: int | None = None
    unacked: list[int] = field(default_factory=list)
    """Grants of ``submit`` calls not answered yet: it may be applying any of them."""
    report: WorkerReport | None = None
    """Its newest answer's counts."""
    flushing: bool = False
    pid: int = 0
    restarts: int = 0
    """Times the driver opened it again after Ray restarted it: its incarnation. A call made
    to an earlier incarnation that fails late says nothing about this one."""
    collector: asyncio.Task[None] | None = None
    sender: asyncio.Task[None] | None = None
    reopener: asyncio.Task[None] | None = None
    """Calling ``open`` until Ray's restart of it answers (:meth:`RemoteEpisodes._reopen`)."""

    @property
    def reopening(self) -> bool:
        return self.reopener is not None and not self.reopener.done()

    @property
    def holding(self) -> int:
        """The most episodes it may be running now or start without a new grant: the larger
        of what it last reported running, the grant it reported and every grant in flight."""
        if not self.alive:
            return 0
        known = 0 if self.report is None else max(self.report.running, self.report.slots)
        return max(known, *self.unacked) if self.unacked else known


@dataclass
class _Order:
    """An order the driver handed out and has no answer for yet."""

    worker: _Worker
    future: asyncio.Future[Trajectory]
    payload: dict[str, Any]
    """:class:`EpisodeOrder`'s fields, as sent."""


def actor_state(actor: Any) -> str | None:
    """What Ray's control store (GCS) says of ``actor``: ``ALIVE``, ``RESTARTING``, ``DEAD``,
    ...; None when it cannot be asked. Blocking (a call to the GCS)."""
    try:
        # the one API that answers this without Ray's dashboard (ray.util.state needs it)
        from ray._private import state

        info = state.actors(actor_id=actor._actor_id.hex())
    except Exception:  # no answer: cannot tell
        return None
    value = info.get("State") if isinstance(info, dict) else None
    return str(value) if value else None


class RemoteEpisodes:
    """The scheduler's episode runner when episodes run in worker actors (see the module's
    docstring): a :class:`~agentrl.rollout.scheduler.SlottedEpisodes`. Use through
    :func:`open_remote_rollout`, or ``await start()`` … ``await aclose()``."""

    def __init__(
        self,
        actors: Sequence[Any],
        spec: AgentRLJobSpec,
        *,
        collect_wait_seconds: float = COLLECT_WAIT_SECONDS,
        on_metrics: Callable[[str, list[dict[str, Any]]], None] | None = None,
    ) -> None:
        if not actors:
            raise ValueError("no rollout worker actors")
        self.spec = spec
        self.collect_wait_seconds = collect_wait_seconds
        self.on_metrics = on_metrics
        """Called with (worker index as a string, snapshot) as snapshots arrive: the driver's
        :meth:`agentrl.rollout.metrics_export.WorkerMetrics.update`."""
        self.workers = [_Worker(index, actor) for index, actor in enumerate(actors)]
        self.capacity = spec.sandbox.concurrency
        """The effective concurrency: live episodes over all workers never exceed it (the
        scheduler sets it, :meth:`set_concurrency`)."""
        self._pending: dict[int, _Order] = {}
        self._keys = itertools.count()
        self._task_json: tuple[Task | None, dict[str, Any]] = (None, {})
        """The last task handed out and its JSON form (dumped once per group)."""
        self._started = False
        self.lost_episodes = 0
        """Episodes whose worker died while running or holding them (each retried or dropped)."""
        self.final_stats: list[WorkerStats] = []
        """Each worker's last :class:`WorkerStats`, once :meth:`aclose` ran."""
        self._revived = asyncio.Event()
        """Set when a worker being reopened came back or was given up on."""

    @property
    def alive(self) -> int:
        """Workers still alive."""
        return sum(w.alive for w in self.workers)

    def outstanding(self) -> list[int]:
        """Episodes each worker holds for the driver (running or queued), by worker index."""
        return [w.outstanding for w in self.workers]

    def grants(self) -> list[int]:
        """The slots each worker is granted (or about to be), by worker index."""
        return [w.grant for w in self.workers]

    # -- SlottedEpisodes ---------------------------------------------------------------------

    @property
    def prefetch(self) -> int:
        """Admitted orders held at the workers beyond the concurrency: as many as the
        concurrency, so every worker can refill each of its slots once from its own queue."""
        return self.capacity

    def set_concurrency(self, concurrency: int) -> None:
        """The effective concurrency: the grants follow (lowered at once; raised only as far
        as the episodes still running under the old figure allow)."""
        if concurrency < 0:
            raise ValueError("concurrency must be ≥ 0")
        self.capacity = concurrency
        self._regrant()

    def withdraw(self) -> None:
        """Cancel every order that has not started: those not sent here, those queued in the
        workers by their next call."""
        for worker in self.workers:
            if not worker.alive:
                continue
            for order in worker.orders:
                entry = self._pending.pop(order["key"], None)
                if entry is not None:
                    worker.outstanding -= 1
                    entry.future.cancel()
            worker.orders = []
            if worker.outstanding:
                worker.withdrawing = "cancel"
                self._kick(worker)

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> list[WorkerStats]:
        """Open every worker (engines, provider) and start collecting."""
        stats = [
            WorkerStats.model_validate(s)
            for s in await asyncio.gather(*(w.actor.open.remote() for w in self.workers))
        ]
        for worker, stat in zip(self.workers, stats, strict=True):
            worker.pid = stat.pid
            worker.collector = asyncio.create_task(
                self._collect(worker), name=f"rollout-collector-{worker.index}"
            )
        self._started = True
        metrics.ROLLOUT_WORKERS_ALIVE.set(self.alive)
        self._regrant(send=False)  # the first grants travel with the first orders
        return stats

    async def run(self, task: Task, *, group_id: str, policy_version: int) -> Trajectory:
        """One episode on a worker; a lost worker's episode is retried on another within
        ``rollout.failurePolicy.infraRetries``, then ends as an ``infra_error``."""
        policy = self.spec.rollout.failure_policy
        started = time.time()
        attempt = 0
        while True:
            worker = await self._live_worker()
            if worker is None:
                reason = "no rollout worker is alive"
            else:
                try:
                    return await self._dispatch(worker, task, group_id, policy_version, attempt)
                except _Lost as lost:
                    reason = str(lost)
            self.lost_episodes += 1
            if worker is None or attempt >= policy.infra_retries:
                metrics.INFRA_DROPPED.labels(WORKER_LOST).inc()
                return lost_trajectory(
                    task, group_id, policy_version, attempt, reason, policy, started
                )
            metrics.INFRA_RETRIES.labels(WORKER_LOST).inc()
            attempt += 1

    async def _live_worker(self) -> _Worker | None:
        """:meth:`_pick`'s worker; with none alive, wait while Ray restarts one (None: no
        worker is alive or coming back)."""
        worker = self._pick()
        while worker is None and any(w.reopening for w in self.workers):
            self._revived.clear()
            await self._revived.wait()
            worker = self._pick()
        return worker

    def _pick(self) -> _Worker | None:
        """The live worker furthest below its target of outstanding orders (twice its share:
        its slots and one refill of each), ties to the lowest index; a worker without a share
        gets orders only when no worker has one (the concurrency is 0: they wait there)."""
        live = [w for w in self.workers if w.alive]
        sharing = [w for w in live if w.share > 0]
        if sharing:
            return min(sharing, key=lambda w: (w.outstanding - 2 * w.share, w.index))
        return min(live, key=lambda w: (w.outstanding, w.index)) if live else None

    async def _dispatch(
        self, worker: _Worker, task: Task, group_id: str, policy_version: int, attempt: int
    ) -> Trajectory:
        key = next(self._keys)
        future: asyncio.Future[Trajectory] = asyncio.get_running_loop().create_future()
        if self._task_json[0] is not task:  # a group's episodes come one after another
            self._task_json = (task, task.model_dump(mode="json"))
        # EpisodeOrder's fields, as its model_dump(mode="json") would give them
        order = {
            "key": key,
            "task": self._task_json[1],
            "group_id": group_id,
            "policy_version": policy_version,
            "attempt": attempt,
        }
        entry = self._pending[key] = _Order(worker, future, order)
        worker.outstanding += 1
        worker.orders.append(order)
        self._kick(worker)
        try:
            return await future
        except asyncio.CancelledError:
            if self._pending.pop(key, None) is not None:
                owner = entry.worker  # where it is now (it may have moved)
                owner.outstanding -= 1
                unsent = [o for o in owner.orders if o is not order]
                if len(unsent) == len(owner.orders):
                    owner.cancels.append(key)  # already sent: the worker cancels it
                    self._kick(owner)
                owner.orders = unsent
            raise

    def _move(self, key: int) -> None:
        """Give an order that never started (withdrawn from a worker without a share) to the
        worker :meth:`_pick` chooses now."""
        entry = self._pending.get(key)
        if entry is None:
            return
        target = self._pick()
        if target is None:
            return
        entry.worker.outstanding -= 1
        entry.worker = target
        target.outstanding += 1
        target.orders.append(entry.payload)
        self._kick(target)

    # -- grants ------------------------------------------------------------------------------

    def _regrant(self, *, send: bool = True) -> None:
        """Recompute every worker's grant (:func:`~agentrl.rollout.slots.grant_slots`) and send
        the changed ones (``send=False``: with the worker's next call)."""
        if not self._started:
            return
        alive = [w.alive for w in self.workers]
        if not any(alive):
            return
        even = shares(self.capacity, alive)
        grants = grant_slots(self.capacity, even, [w.holding for w in self.workers])
        for worker, share in zip(self.workers, even, strict=True):
            worker.share = share
        for worker, grant in zip(self.workers, grants, strict=True):
            if not worker.alive:
                continue
            if grant != worker.grant:
                worker.grant = grant
                if send:
                    self._kick(worker)
            if worker.share == 0 and any(w.share for w in self.workers):
                self._hand_over(worker)

    def _hand_over(self, worker: _Worker) -> None:
        """``worker`` lost its share (the concurrency fell below the workers): its orders that
        never started go to the workers that have one, so none waits for a slot that will not
        come."""
        unsent, worker.orders = worker.orders, []
        for order in unsent:
            self._move(order["key"])
        queued = worker.report is not None and worker.report.queued > 0
        if (queued or worker.unacked) and worker.withdrawing is None:
            worker.withdrawing = "move"
            self._kick(worker)

    def _apply(self, worker: _Worker, report: WorkerReport) -> None:
        if worker.report is None or report.seq > worker.report.seq:
            worker.report = report
            self._regrant()

    # -- calls to the workers ----------------------------------------------------------------

    def _kick(self, worker: _Worker) -> None:
        if not worker.flushing and worker.alive and self._started:
            worker.flushing = True
            worker.sender = asyncio.get_running_loop().create_task(self._flush(worker))

    async def _flush(self, worker: _Worker) -> None:
        """Send a worker its orders and grant, cancels and a withdrawal, batched: everything
        queued in the turn of the loop that started this task (its first step is in the next
        one) and while a previous call was in flight goes in one call each, in that order."""
        import ray

        incarnation = worker.restarts
        try:
            while worker.alive and worker.restarts == incarnation:
                if worker.orders or worker.grant != worker.sent_grant:
                    orders, worker.orders = worker.orders, []
                    grant = worker.sent_grant = worker.grant
                    worker.unacked.append(grant)
                    try:
                        raw = await worker.actor.submit.remote(orders, grant)
                    finally:
                        if grant in worker.unacked:
                            worker.unacked.remove(grant)
                    self._apply(worker, WorkerReport.model_validate(raw))
                elif worker.cancels:
                    cancels, worker.cancels = worker.cancels, []
                    await worker.actor.cancel.remote(cancels)
                elif worker.withdrawing is not None:
                    mode, worker.withdrawing = worker.withdrawing, None
                    for key in await worker.actor.withdraw.remote():
                        entry = self._pending.get(key)
                        if entry is None or entry.worker is not worker:
                            continue
                        if mode == "move":
                            self._move(key)
                        else:
                            del self._pending[key]
                            worker.outstanding -= 1
                            entry.future.cancel()
                else:
                    break
        except ray.exceptions.RayActorError as exc:
            self._lose(worker, exc, incarnation)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a call that cannot reach the worker: no use
            logger.exception("rollout worker %d refused a call", worker.index)
            self._lose(worker, exc, incarnation)
        finally:
            worker.flushing = False

    async def _collect(self, worker: _Worker) -> None:
        import ray

        incarnation = worker.restarts
        while worker.alive and worker.restarts == incarnation:
            try:
                raw = await worker.actor.collect.remote(self.collect_wait_seconds)
                collected = Collected.model_validate(raw)
            except ray.exceptions.RayActorError as exc:
                self._lose(worker, exc, incarnation)
                return
            except Exception as exc:  # an answer we cannot read: the worker is no use
                logger.exception("rollout worker %d answered collect wrongly", worker.index)
                self._lose(worker, exc, incarnation)
                return
            for done in collected.done:
                entry = self._pending.get(done.key)
                if entry is None or entry.worker is not worker:  # cancelled meanwhile
                    continue
                del self._pending[done.key]
                worker.outstanding -= 1
                future = entry.future
                if future.done():
                    continue
                if done.trajectory is not None:
                    future.set_result(Trajectory.model_validate_json(done.trajectory))
                else:
                    future.set_exception(_Lost(f"worker {worker.index} failed: {done.error}"))
            self._apply(worker, collected.report)
            if collected.metrics is not None and self.on_metrics is not None:
                self.on_metrics(str(worker.index), collected.metrics)

    def _lose(self, worker: _Worker, exc: BaseException, incarnation: int | None = None) -> None:
        """``worker`` died: fail its outstanding episodes over (their ``run`` retries them),
        give its slots to the live workers, and reopen it once Ray has restarted it.
        ``incarnation``: the one the failed call went to (a late failure of an earlier one is
        ignored)."""
        import ray

        if not worker.alive or incarnation not in (None, worker.restarts):
            return
        worker.alive = False
        metrics.ROLLOUT_WORKERS_ALIVE.set(self.alive)
        logger.error("rollout worker %d (pid %d) died: %s", worker.index, worker.pid, exc)
        reason = f"worker {worker.index} died: {type(exc).__name__}"
        for key, entry in list(self._pending.items()):
            if entry.worker is worker:
                del self._pending[key]
                if not entry.future.done():
                    entry.future.set_exception(_Lost(reason))
        worker.outstanding = 0
        worker.orders, worker.cancels, worker.unacked = [], [], []
        worker.grant = 0
        self._regrant()
        # its process or node went (not a wrong answer): Ray restarts it unless it was killed
        # for good, which the first ``open`` of the reopening tells
        if self._started and isinstance(exc, ray.exceptions.RayActorError):
            worker.reopener = asyncio.get_running_loop().create_task(
                self._reopen(worker), name=f"rollout-reopen-{worker.index}"
            )

    async def _reopen(self, worker: _Worker) -> None:
        """Call ``open`` on ``worker``'s actor until Ray's restart of it answers (it answers
        "restarting" until its bundle is placed on a rollout pod again), then give it orders
        and slots again; stop when it is gone for good."""
        import ray

        wait, longest = REOPEN_BACKOFF_SECONDS
        try:
            while True:
                try:
                    raw = await worker.actor.open.remote(drop=True)
                    break
                except ray.exceptions.ActorDiedError as exc:
                    # A call that reaches the dead incarnation before Ray's control store
                    # marked the actor restarting also fails so (both rollout pods replaced by
                    # an image roll: the driver gave up on both workers, and the run stalled):
                    # only the store's DEAD says the actor will not come back.
                    state = await asyncio.to_thread(actor_state, worker.actor)
                    if state is None or state == "DEAD":
                        logger.error("rollout worker %d is gone for good: %s", worker.index, exc)
                        return
                    logger.warning(
                        "rollout worker %d answered as dead but Ray says %s: waiting for it",
                        worker.index, state,
                    )  # fmt: skip
                except ray.exceptions.RayActorError:
                    pass  # restarting: it answers once Ray has placed it again
                await asyncio.sleep(wait)
                wait = min(2 * wait, longest)
            stat = WorkerStats.model_validate(raw)
            worker.pid, worker.restarts = stat.pid, worker.restarts + 1
            worker.report, worker.sent_grant, worker.withdrawing = None, None, None
            worker.alive = True
            metrics.ROLLOUT_WORKER_RESTARTS.inc()
            metrics.ROLLOUT_WORKERS_ALIVE.set(self.alive)
            logger.warning(
                "rollout worker %d is back (pid %d, restart %d)",
                worker.index, worker.pid, worker.restarts,
            )  # fmt: skip
            worker.collector = asyncio.get_running_loop().create_task(
                self._collect(worker), name=f"rollout-collector-{worker.index}"
            )
            self._regrant()
        finally:
            self._revived.set()

    async def aclose(self) -> list[WorkerStats]:
        """Stop collecting and close the live workers (cancelling what still runs there);
        their final stats (dead workers: what the driver knew)."""
        import ray

        tasks = [
            t for w in self.workers for t in (w.collector, w.sender, w.reopener) if t is not None
        ]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._started = False
        stats: list[WorkerStats] = []
        for worker in self.workers:
            stat = WorkerStats(worker_index=worker.index, pid=worker.pid)
            if worker.alive:
                try:
                    stat = WorkerStats.model_validate(
                        await asyncio.wait_for(worker.actor.close.remote(), CLOSE_WAIT_SECONDS)
                    )
                except ray.exceptions.RayActorError as exc:
                    self._lose(worker, exc)
                except TimeoutError:
                    logger.error(
                        "rollout worker %d did not close within %.0f s; leaving it",
                        worker.index, CLOSE_WAIT_SECONDS,
                    )  # fmt: skip
            stats.append(stat)
        self.final_stats = stats
        return stats


def lost_trajectory(
    task: Task,
    group_id: str,
    policy_version: int,
    attempt: int,
    reason: str,
    policy: FailurePolicy,
    started: float,
) -> Trajectory:
    """The ``infra_error`` trajectory of an episode lost with its worker (never scored)."""
    trajectory = Trajectory(
        episode_id=f"{task.id}-lost-{uuid.uuid4().hex[:12]}",
        task_id=task.id,
        group_id=group_id,
        attempt=attempt,
        policy_version=policy_version,
        terminal_class=TerminalClass.INFRA_ERROR,
        reward=None,
        training_action=training_action(TerminalClass.INFRA_ERROR, policy),
        infra_reason=f"{WORKER_LOST}: {reason}",
        timings=Timings(started_at=started, finished_at=time.time()),
    )
    metrics.EPISODES.labels(TerminalClass.INFRA_ERROR.value).inc()
    return trajectory


@contextlib.asynccontextmanager
async def open_remote_rollout(
    spec: AgentRLJobSpec,
    episodes: RemoteEpisodes,
    *,
    tasks: Iterable[Task],
    admission: Admission | None = None,
    concurrency_source: ConcurrencySource | None = None,
) -> AsyncIterator[RolloutScheduler]:
    """The driver's scheduler over worker actors: like :func:`~agentrl.rollout.runtime.
    open_rollout`, with the job's whole concurrency (following ``concurrency_source``'s total)
    and the episodes run by ``episodes``' actors. The actors are closed on exit, not killed;
    ``episodes.final_stats`` then says what each did."""
    from agentrl.rollout.runtime import following, provider_limit, starting_concurrency

    await episodes.start()
    try:
        scheduler = RolloutScheduler(
            runner=episodes,
            tasks=tasks,
            concurrency=await starting_concurrency(
                spec.sandbox.concurrency, concurrency_source, whole=True
            ),
            group_size=spec.rollout.group_size,
            admission=admission,
            provider_limit=provider_limit(spec, source=concurrency_source),
            batch_size=spec.trainer.trajectories_per_step,
        )
        async with following(concurrency_source, scheduler, whole=True), scheduler:
            yield scheduler
    finally:
        await episodes.aclose()


class RemoteRun(BaseModel):
    """What :func:`run_on_actors` hands back."""

    trajectories: list[Trajectory]
    workers: list[WorkerStats]


async def run_on_actors(
    config: RolloutWorkerConfig,
    tasks: Sequence[Task],
    *,
    cpus_per_worker: float = 1.0,
    strategies: Sequence[Any] | None = None,
) -> RemoteRun:
    """Run every episode of ``tasks`` (``rollout.groupSize`` each) on ``config.workers`` new
    actors (placed by ``strategies``, as in :func:`start_workers`), then kill them."""
    import ray

    from agentrl.api import AgentRLJob

    spec = AgentRLJob.model_validate(config.job).spec
    actors = start_workers(config, cpus_per_worker=cpus_per_worker, strategies=strategies)
    episodes = RemoteEpisodes(actors, spec)
    try:
        async with open_remote_rollout(spec, episodes, tasks=tasks) as scheduler:
            trajectories = [t async for t in scheduler.trajectories()]
    finally:
        for actor in actors:
            ray.kill(actor)
    return RemoteRun(trajectories=trajectories, workers=episodes.final_stats)
