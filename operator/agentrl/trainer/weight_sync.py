"""Getting new weights into every engine, and keeping track of what each one serves.

``disk`` (:class:`DiskWeightSync`): the trainer writes the weights in the format engines load,
records them in ``current-weights.json`` (:mod:`agentrl.engine.weight_pointer`, which the
watchdog reads to re-push after a restart), then, on every engine at once: pause generation
(``in_place``: running requests keep their state and continue under the new weights), ``POST
/update_weights_from_disk`` with ``flush_cache: false``, ``/flush_cache`` (the prefix cache
holds KV of the old weights), continue generation. SGLang flushes only an idle cache: with
requests held in place the flush is refused (400, not an error: those requests continue on
their KV), and an update asking for its default flush would fail SGLang's assertion and kill the
engine's scheduler, hence ``flush_cache: false`` on the update itself.

``distributed`` (:class:`DistributedWeightSync`): the trainer (rank 0) and every engine rank join
one broadcast group (:mod:`agentrl.engine_client.weight_group`; ``/init_weights_update_group`` on
each engine, rank offsets ``1 + i × gpusPerEngine``) on the interface pinned by
``spec.trainer.network``. Each push pauses generation, announces names/dtypes/shapes with
``/update_weights_from_distributed`` on every engine and, while those calls wait, broadcasts each
tensor from rank 0; then flushes caches and continues. Weights never touch the disk, except that an
exported copy is recorded in ``current-weights.json`` when an ``export`` is given (the watchdog
loads it into a restarted engine before the next broadcast); those copies are pruned as disk
mode prunes its exports (:func:`prune_exports`: the last ``keep``), or a 30B model's ~61 GB per
push would fill the checkpoint volume within a few dozen steps.

Both modes track the version each engine reports in ``/get_model_info`` and re-push to any
engine that serves an older one — an engine restarted by its watchdog comes back with its
initial weights. A restarted engine has also left the broadcast group, so the distributed mode
forms a new group (a new name) with every engine before re-pushing.

**Failures are retried, counted and reported, never silent.** A push that an engine does not
take (unreachable, a refusal, a group that cannot be formed) is tried again after a backoff —
a refusal too: on a shared volume an engine may see the exported files a moment late
(:class:`PushRetry`, from ``spec.trainer.weightSync.pushAttempts`` and
``retryBackoffSeconds``: the first retry after ``retryBackoffSeconds``, each further one after
twice the previous wait); disk mode retries the failing engine alone, distributed mode the
whole broadcast with a new group. A push still failing after its last try counts one failure
for that engine (:class:`PushFailures`): ``agentrl_weight_sync_failures_total{engine}``, and
``agentrl_weight_sync_consecutive_failures{engine}`` holds the failures in a row (0 once a
push is taken). Every :class:`SyncReport` carries the engines failing now (``failures``, a
:class:`~agentrl.api.wire.WeightPushFailure` each: engine, count, last error), which the driver
puts in its ``agentrl.dev/progress`` annotation; the operator turns three in a row into
``Degraded``/``WeightPushFailing`` and ``WeightsSynced=False``, and the chart alerts on the gauge.

Meanwhile the trainer keeps training: its steps go on, each interval pushes again (one failed
push per interval: :meth:`reconcile` leaves an engine whose last push failed to the push that
follows it), and an engine that takes a push is current again. Episodes that engine serves
meanwhile come from older weights than their policy version says; the engines' own logprobs go
with them, so the off-policy correction
(``spec.trainer.algorithm.offPolicyCorrection``) weighs them as what they are, and
``agentrl_trainer_mismatch_abs_mean`` shows the gap.

Callers: :mod:`agentrl.trainer.loop`, built by :func:`agentrl.trainer.factories.build_weight_sync`
(and ``agentrl run``'s runner).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import Counter, Gauge
from pydantic import BaseModel, ConfigDict, Field

from agentrl.api.trainer import WeightSync as WeightSyncSpec
from agentrl.api.wire import WEIGHT_PUSH_ERROR_CHARS, WeightPushFailure
from agentrl.engine.weight_pointer import CurrentWeights, write_current_weights
from agentrl.engine_client.client import EngineClient, EngineError
from agentrl.engine_client.weight_group import BroadcastGroup

log = logging.getLogger(__name__)

SERVED_VERSION = Gauge(
    "agentrl_engine_weight_version",
    "Weight version each engine reported after the last push or check (-1: unknown).",
    ["engine"],
)
SYNC_FAILURES = Counter(
    "agentrl_weight_sync_failures_total",
    "Weight pushes an engine did not take, after every try (weightSync.pushAttempts).",
    ["engine"],
)
RETRIES = Counter(
    "agentrl_weight_sync_retries_total",
    "Tries of a weight push after its first, per engine (with backoff between them).",
    ["engine"],
)
CONSECUTIVE_FAILURES = Gauge(
    "agentrl_weight_sync_consecutive_failures",
    "Weight pushes in a row an engine did not take (0 once it takes one).",
    ["engine"],
)
REPUSHES = Counter(
    "agentrl_weight_sync_repushes_total",
    "Pushes of the current weights to an engine found serving older ones (e.g. restarted).",
    ["engine"],
)

#: Name of the record of the current weights, next to the exported weight directories.
POINTER_FILE = "current-weights.json"


#: Sleeps ``seconds`` (``asyncio.sleep``; tests pass a fake clock's).
Sleep = Callable[[float], Awaitable[None]]


class PushRetry(BaseModel):
    """How often one push is tried before it counts as failed, and the waits between tries."""

    model_config = ConfigDict(frozen=True)

    attempts: int = Field(default=3, ge=1)
    """Tries in all (``weightSync.pushAttempts``)."""
    backoff_seconds: float = Field(default=2.0, ge=0.0)
    """Wait before the second try; doubled before each further one
    (``weightSync.retryBackoffSeconds``)."""

    @classmethod
    def from_spec(cls, spec: WeightSyncSpec) -> PushRetry:
        """The policy of ``spec.trainer.weightSync``."""
        return cls(attempts=spec.push_attempts, backoff_seconds=spec.retry_backoff_seconds)

    def waits(self) -> list[float]:
        """The wait before each try after the first: ``b, 2b, 4b, ...``."""
        return [self.backoff_seconds * 2**i for i in range(self.attempts - 1)]


class PushFailures:
    """Failed pushes in a row, per engine: a push that fails after its last try adds one, a
    push the engine takes clears it. Sets ``agentrl_weight_sync_failures_total`` and
    ``agentrl_weight_sync_consecutive_failures``."""

    def __init__(self) -> None:
        self._failing: dict[str, WeightPushFailure] = {}

    def failed(self, engine: str, *, version: int, error: str) -> WeightPushFailure:
        """One more failed push to ``engine``; returns its record."""
        before = self._failing.get(engine)
        failure = WeightPushFailure(
            engine=engine,
            failures=(before.failures if before is not None else 0) + 1,
            error=error[:WEIGHT_PUSH_ERROR_CHARS],
            version=str(version),
        )
        self._failing[engine] = failure
        SYNC_FAILURES.labels(engine=engine).inc()
        CONSECUTIVE_FAILURES.labels(engine=engine).set(failure.failures)
        log.warning(
            "weight push v%d to %s failed (%d in a row): %s",
            version,
            engine,
            failure.failures,
            failure.error,
        )
        return failure

    def succeeded(self, engine: str) -> None:
        """``engine`` took a push."""
        if self._failing.pop(engine, None) is not None:
            log.info("%s takes weight pushes again", engine)
        CONSECUTIVE_FAILURES.labels(engine=engine).set(0)

    def current(self) -> list[WeightPushFailure]:
        """The engines failing now, by URL."""
        return [self._failing[url] for url in sorted(self._failing)]

    def __contains__(self, engine: object) -> bool:
        """Whether ``engine``'s last push failed."""
        return engine in self._failing


def observe_failures(report: SyncReport) -> None:
    """Set ``agentrl_weight_sync_consecutive_failures`` in this process from ``report``: the
    driver calls it with every push's report, since with megatron ranks the sync runs in rank
    0's actor, whose own metrics nobody scrapes."""
    failing = {f.engine: f.failures for f in report.failures}
    for engine in sorted({*report.served, *failing}):
        CONSECUTIVE_FAILURES.labels(engine=engine).set(failing.get(engine, 0))


async def with_retries(
    try_once: Callable[[], Awaitable[dict[str, str]]], retry: PushRetry, *, sleep: Sleep
) -> dict[str, str]:
    """Run ``try_once`` up to ``retry.attempts`` times, with :meth:`PushRetry.waits` between
    tries, until it reports no failure. ``try_once`` returns engine URL → error text for the
    engines that did not take the try; so does this, for the last try."""
    errors = await try_once()
    for wait in retry.waits():
        if not errors:
            break
        for engine in errors:
            RETRIES.labels(engine=engine).inc()
        log.info(
            "weight push to %s failed; trying again in %.1f s", ", ".join(sorted(errors)), wait
        )
        await sleep(wait)
        errors = await try_once()
    return errors


class SyncReport(BaseModel):
    """The outcome of one push."""

    version: int
    seconds: float
    served: dict[str, str | None] = Field(default_factory=dict)
    """Engine URL → version it reports now (None when it could not be asked)."""
    failed: list[str] = Field(default_factory=list)
    """Engines that did not take the push (they are retried by :meth:`reconcile`)."""
    failures: list[WeightPushFailure] = Field(default_factory=list)
    """Every engine whose pushes are failing after this one (:meth:`PushFailures.current`):
    the count in a row and the last error. The driver reports them (``agentrl.dev/progress``)."""


class WeightSync(Protocol):
    """What the driver needs of a weight-sync mode."""

    current_version: int

    async def push(self, version: int) -> SyncReport:
        """Make every engine serve the trainer's weights as ``version``."""
        ...

    async def reconcile(self) -> list[str]:
        """Re-push to engines serving an older version; returns their URLs. An engine whose
        last push failed is left to the push that follows (the driver calls this just before
        pushing), so a failing engine costs one failed push per interval."""
        ...


class DiskWeightSync:
    """``weightSync.mode: disk``.

    Args:
        clients: one client per engine.
        export: writes the trainer's current weights into the directory it is given.
        weights_dir: where versions are exported (``v{N}/``), on a volume engines can read.
        keep: exported versions kept on disk (older ones are deleted; the checkpoint keeps
            its own copy).
        retry: tries of one push per engine and the backoff between them
            (:meth:`PushRetry.from_spec` of ``spec.trainer.weightSync``).
        sleep: waits between tries; for tests (a fake clock).
    """

    def __init__(
        self,
        clients: Sequence[EngineClient],
        *,
        export: Callable[[Path], Any],
        weights_dir: Path,
        keep: int = 2,
        initial_version: int = 0,
        initial_path: Path | None = None,
        retry: PushRetry | None = None,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.clients = list(clients)
        self.export = export
        self.weights_dir = weights_dir
        self.keep = keep
        self.current_version = initial_version
        self.current_path: Path | None = initial_path
        self.served: dict[str, str | None] = {c.base_url: None for c in self.clients}
        self.retry = retry or PushRetry()
        self.sleep = sleep
        self.failures = PushFailures()

    def path_for(self, version: int) -> Path:
        return self.weights_dir / f"v{version}"

    async def push(self, version: int) -> SyncReport:
        start = time.monotonic()
        path = self.path_for(version)
        await asyncio.to_thread(self.export, path)
        write_current_weights(
            self.weights_dir / POINTER_FILE,
            CurrentWeights(model_path=str(path), weight_version=str(version)),
        )
        self.current_version, self.current_path = version, path
        results = await asyncio.gather(*(self._push_one(c, path, version) for c in self.clients))
        failed = [c.base_url for c, ok in zip(self.clients, results, strict=False) if not ok]
        self._prune()
        return SyncReport(
            version=version,
            seconds=time.monotonic() - start,
            served=dict(self.served),
            failed=failed,
            failures=self.failures.current(),
        )

    async def _push_one(self, client: EngineClient, path: Path, version: int) -> bool:
        """Push to one engine with the retries of :attr:`retry`; count the outcome."""
        url = client.base_url

        async def once() -> dict[str, str]:
            error = await self._try_push(client, path, version)
            return {url: error} if error is not None else {}

        errors = await with_retries(once, self.retry, sleep=self.sleep)
        if errors:
            self.failures.failed(url, version=version, error=errors[url])
            return False
        self.failures.succeeded(url)
        return True

    async def _try_push(self, client: EngineClient, path: Path, version: int) -> str | None:
        """One try: pause, load ``path`` as ``version``, flush, continue. The error, or None
        when the engine took it."""
        try:
            await client.pause_generation(mode="in_place")
            try:
                result = await client.update_weights_from_disk(
                    str(path), weight_version=str(version), flush_cache=False
                )
                if result.success and not await client.flush_cache():
                    log.debug("%s kept its prefix cache: requests are held", client.base_url)
            finally:
                await client.continue_generation()
        except EngineError as exc:
            log.info("weight push v%d to %s failed: %s", version, client.base_url, exc)
            self._record(client.base_url, None)
            return f"{type(exc).__name__}: {exc}"
        if not result.success:
            log.info("engine %s refused v%d: %s", client.base_url, version, result.message)
            return f"the engine refused weight version {version}: {result.message}"
        self._record(client.base_url, str(version))
        return None

    def _record(self, url: str, version: str | None) -> None:
        self.served[url] = version
        SERVED_VERSION.labels(engine=url).set(int(version) if version and version.isdigit() else -1)

    async def reconcile(self) -> list[str]:
        if self.current_path is None:
            return []
        want = str(self.current_version)
        stale: list[EngineClient] = []
        for client in self.clients:
            try:
                info = await client.get_model_info(timeout=10.0)
            except EngineError:
                self._record(client.base_url, None)
                continue  # down: the next reconcile tries again
            self._record(client.base_url, info.weight_version)
            if info.weight_version != want and client.base_url not in self.failures:
                stale.append(client)
        for client in stale:
            REPUSHES.labels(engine=client.base_url).inc()
        await asyncio.gather(
            *(self._push_one(c, self.current_path, self.current_version) for c in stale)
        )
        return [c.base_url for c in stale]

    def _prune(self) -> None:
        prune_exports(self.weights_dir, self.current_version, self.keep)


def prune_exports(weights_dir: Path, current: int, keep: int) -> list[Path]:
    """Delete exported weight directories (``v{N}/``) under ``weights_dir`` but ``keep`` of
    them: ``v{current}`` (what ``current-weights.json`` names and engines serve) and the
    newest ones below it. Versions are training steps, so with ``weightSync.intervalSteps`` > 1
    they are not consecutive: "the newest below" is by number, not ``current - 1``. Versions
    above ``current`` are left by a run that got further than the checkpoint this one resumed
    from; they are deleted (the steps are trained again). Anything else under ``weights_dir``
    (checkpoints, the pointer file) is left alone. Returns the directories deleted.
    """
    versions = sorted(
        (int(child.name[1:]), child)
        for child in weights_dir.glob("v*")
        if child.is_dir() and child.name[1:].isdigit()
    )
    older = [path for number, path in versions if number < current]
    kept = set(older[max(0, len(older) - keep + 1) :])
    kept.add(weights_dir / f"v{current}")
    deleted = [path for _, path in versions if path not in kept]
    for path in deleted:
        shutil.rmtree(path)
    return deleted


def _announced(source: Any) -> tuple[list[str], list[str], list[list[int]], Iterator[Any]]:
    """Names, dtypes, shapes and the (name, tensor) pairs of one push. ``source`` is either
    (name, tensor) pairs (read whole here) or a stream that announces its tensors first (a
    ``specs`` list of name/dtype/shape and a ``tensors`` iterator that produces them one at a
    time: :class:`agentrl.trainer.megatron_export.Stream`), so a model larger than one rank's
    memory is pushed without ever being whole in one place."""
    specs = getattr(source, "specs", None)
    if specs is not None:
        return (
            [s.name for s in specs],
            [s.dtype for s in specs],
            [list(s.shape) for s in specs],
            iter(source.tensors),
        )
    named = list(source)
    return (
        [n for n, _ in named],
        [str(t.dtype).removeprefix("torch.") for _, t in named],
        [list(t.shape) for _, t in named],
        iter(named),
    )


def _broadcast_all(group: BroadcastGroup, names: Sequence[str], items: Iterator[Any]) -> None:
    """Broadcast every announced tensor in order. The source is always read to the end, even
    after a failed broadcast: a stream's tensors come from other trainer ranks that block until
    they are received."""
    error: BaseException | None = None
    count = 0
    for i, (name, tensor) in enumerate(items):
        count = i + 1
        if error is not None:
            continue
        if i >= len(names) or name != names[i]:
            error = RuntimeError(f"tensor {i} is {name}, but {names[i : i + 1]} was announced")
            continue
        try:
            group.broadcast(tensor.contiguous())
        except (RuntimeError, ValueError) as exc:
            error = exc
    if error is None and count != len(names):
        error = RuntimeError(f"{count} tensors came for {len(names)} announced")
    if error is not None:
        raise error


def _drain(items: Iterator[Any]) -> None:
    for _ in items:
        pass


class DistributedWeightSync:
    """``weightSync.mode: distributed``.

    Args:
        clients: one client per engine.
        tensors: the trainer's current weights as (HF name, tensor) — whole tensors, on the
            device the group's backend sends from (the GPU for nccl) — or a stream that
            announces them first (see :func:`_announced`).
        master_address: this trainer pod's address as engines reach it (its stable DNS name).
        master_port: the rendezvous port of the broadcast group (not the trainer's own
            ``MASTER_PORT``: that one belongs to its megatron world).
        backend: ``nccl`` (RCCL on ROCm) or ``gloo`` (CPU, tests).
        ranks_per_engine: engine ranks in the group (``inference.gpusPerEngine``).
        interface: the NIC to pin (``spec.trainer.network.ncclSocketIfname``).
        export: optionally also writes the weights to a directory, recorded in
            ``current-weights.json`` under ``weights_dir`` for the watchdog.
        keep: exported versions kept under ``weights_dir`` (older ones are deleted after each
            export, as in disk mode: :func:`prune_exports`).
        retry: tries of one broadcast and the backoff between them (a failed try leaves the
            group unusable: each retry forms a new one with every engine).
        sleep: waits between tries; for tests (a fake clock).
    """

    def __init__(
        self,
        clients: Sequence[EngineClient],
        *,
        tensors: Callable[[], Iterable[tuple[str, Any]]],
        master_address: str,
        master_port: int,
        backend: str = "nccl",
        ranks_per_engine: int = 1,
        interface: str | None = None,
        export: Callable[[Path], Any] | None = None,
        weights_dir: Path | None = None,
        keep: int = 2,
        initial_version: int = 0,
        timeout_seconds: float = 600.0,
        retry: PushRetry | None = None,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.clients = list(clients)
        self.tensors = tensors
        self.master_address = master_address
        self.master_port = master_port
        self.backend = backend
        self.ranks_per_engine = ranks_per_engine
        self.interface = interface
        self.export = export
        self.weights_dir = weights_dir
        self.keep = keep
        self.timeout_seconds = timeout_seconds
        self.current_version = initial_version
        self.pushed = False
        self.served: dict[str, str | None] = {c.base_url: None for c in self.clients}
        self.group: BroadcastGroup | None = None
        self.generation = 0
        """Groups formed so far; each gets a new name, so an engine never joins a stale one."""
        self.retry = retry or PushRetry()
        self.sleep = sleep
        self.failures = PushFailures()

    @property
    def group_name(self) -> str:
        return f"agentrl-weights-{self.generation}"

    async def _form_group(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None
        self.generation += 1
        world = 1 + len(self.clients) * self.ranks_per_engine
        # Rank 0 hosts the rendezvous and blocks until every engine joined: join in a thread
        # while the engines are asked to join.
        joining = asyncio.to_thread(
            BroadcastGroup,
            master_address=self.master_address,
            master_port=self.master_port,
            rank=0,
            world_size=world,
            backend=self.backend,
            interface=self.interface,
            timeout_seconds=self.timeout_seconds,
        )
        calls = [
            c.init_weights_update_group(
                master_address=self.master_address,
                master_port=self.master_port,
                rank_offset=1 + i * self.ranks_per_engine,
                world_size=world,
                group_name=self.group_name,
                backend=self.backend,
                timeout=self.timeout_seconds,
            )
            for i, c in enumerate(self.clients)
        ]
        group, *results = await asyncio.gather(joining, *calls)
        refused = [c.base_url for c, r in zip(self.clients, results, strict=True) if not r.success]
        if refused:
            group.close()
            raise EngineError(f"engines refused the weight group: {refused}", url=refused[0])
        self.group = group

    async def push(self, version: int) -> SyncReport:
        start = time.monotonic()
        errors = await with_retries(lambda: self._try_push(version), self.retry, sleep=self.sleep)
        for client in self.clients:
            url = client.base_url
            if url in errors:
                self.failures.failed(url, version=version, error=errors[url])
            else:
                self.failures.succeeded(url)
        self.current_version, self.pushed = version, True
        if self.export is not None and self.weights_dir is not None:
            path = self.weights_dir / f"v{version}"
            await asyncio.to_thread(self.export, path)
            write_current_weights(
                self.weights_dir / POINTER_FILE,
                CurrentWeights(model_path=str(path), weight_version=str(version)),
            )
            prune_exports(self.weights_dir, version, self.keep)
        return SyncReport(
            version=version,
            seconds=time.monotonic() - start,
            served=dict(self.served),
            failed=[c.base_url for c in self.clients if c.base_url in errors],
            failures=self.failures.current(),
        )

    async def _try_push(self, version: int) -> dict[str, str]:
        """One broadcast of the weights as ``version`` to every engine (forming the group
        first when there is none); engine URL → error for the engines that did not take it."""
        if self.group is None:
            try:
                await self._form_group()
            except (EngineError, RuntimeError, OSError) as exc:
                # refused by an engine, or the rendezvous failed (torch's store errors are
                # RuntimeErrors): no engine got the weights
                why = f"the weight group could not be formed: {type(exc).__name__}: {exc}"
                log.info("weight push v%d: %s", version, why)
                return {c.base_url: why for c in self.clients}
        assert self.group is not None
        names, dtypes, shapes, items = _announced(self.tensors())
        unpaused: EngineError | None = None
        results: list[Any] = []
        try:
            try:
                for c in self.clients:
                    await c.pause_generation(mode="in_place")
            except EngineError as exc:
                unpaused = exc  # nothing is broadcast (the source is drained below)
            else:
                calls = [
                    c.update_weights_from_distributed(
                        names=names,
                        dtypes=dtypes,
                        shapes=shapes,
                        group_name=self.group_name,
                        weight_version=str(version),
                        flush_cache=False,  # paused in place (see the module docstring)
                        timeout=self.timeout_seconds,
                    )
                    for c in self.clients
                ]
                sending = asyncio.to_thread(_broadcast_all, self.group, names, items)
                _, *results = await asyncio.gather(sending, *calls, return_exceptions=True)
        finally:
            # Whatever failed, the source is read to the end (trainer ranks wait to send).
            await asyncio.to_thread(_drain, items)
            for c in self.clients:
                try:
                    await c.flush_cache()  # refused (False) while requests are held
                except EngineError as exc:
                    log.warning("could not flush %s after a push: %s", c.base_url, exc)
                try:
                    await c.continue_generation()  # always: a paused engine serves nothing
                except EngineError as exc:
                    log.warning("could not resume %s after a push: %s", c.base_url, exc)
        if unpaused is not None:
            # that engine is likely down or restarting: the next try forms a new group
            self.group.close()
            self.group = None
            why = f"{type(unpaused).__name__}: {unpaused}"
            return {
                c.base_url: why if c.base_url == unpaused.url else f"no broadcast: {why}"
                for c in self.clients
            }
        errors: dict[str, str] = {}
        for client, result in zip(self.clients, results, strict=True):
            if isinstance(result, BaseException):
                errors[client.base_url] = f"{type(result).__name__}: {result}"
            elif not result.success:
                errors[client.base_url] = (
                    f"the engine refused weight version {version}: {result.message}"
                )
            else:
                self._record(client.base_url, str(version))
                continue
            log.info("engine %s did not take v%d: %s", client.base_url, version, result)
            self._record(client.base_url, None)
        if errors:
            # A member that failed mid-broadcast leaves the group unusable: form a new one next.
            self.group.close()
            self.group = None
        return errors

    def _record(self, url: str, version: str | None) -> None:
        self.served[url] = version
        SERVED_VERSION.labels(engine=url).set(int(version) if version and version.isdigit() else -1)

    async def reconcile(self) -> list[str]:
        if not self.pushed:
            return []
        want = str(self.current_version)
        stale = []
        for client in self.clients:
            try:
                info = await client.get_model_info(timeout=10.0)
            except EngineError:
                self._record(client.base_url, None)
                continue
            self._record(client.base_url, info.weight_version)
            if info.weight_version != want and client.base_url not in self.failures:
                stale.append(client.base_url)
                REPUSHES.labels(engine=client.base_url).inc()
        if stale:
            # The stale engine restarted and left the group: a new group, then the same weights.
            self.close()
            await self.push(self.current_version)
        return stale

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None
