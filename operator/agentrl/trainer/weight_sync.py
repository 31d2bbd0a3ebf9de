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
Callers: :mod:`agentrl.trainer.loop`.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import Counter, Gauge
from pydantic import BaseModel, Field

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
    "agentrl_weight_sync_failures_total", "Weight pushes an engine did not accept.", ["engine"]
)
REPUSHES = Counter(
    "agentrl_weight_sync_repushes_total",
    "Pushes of the current weights to an engine found serving older ones (e.g. restarted).",
    ["engine"],
)

#: Name of the record of the current weights, next to the exported weight directories.
POINTER_FILE = "current-weights.json"


class SyncReport(BaseModel):
    """The outcome of one push."""

    version: int
    seconds: float
    served: dict[str, str | None] = Field(default_factory=dict)
    """Engine URL → version it reports now (None when it could not be asked)."""
    failed: list[str] = Field(default_factory=list)
    """Engines that did not take the push (they are retried by :meth:`reconcile`)."""


class WeightSync(Protocol):
    """What the driver needs of a weight-sync mode."""

    current_version: int

    async def push(self, version: int) -> SyncReport:
        """Make every engine serve the trainer's weights as ``version``."""
        ...

    async def reconcile(self) -> list[str]:
        """Re-push to engines serving an older version; returns their URLs."""
        ...


class DiskWeightSync:
    """``weightSync.mode: disk``.

    Args:
        clients: one client per engine.
        export: writes the trainer's current weights into the directory it is given.
        weights_dir: where versions are exported (``v{N}/``), on a volume engines can read.
        keep: exported versions kept on disk (older ones are deleted; the checkpoint keeps
            its own copy).
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
    ) -> None:
        self.clients = list(clients)
        self.export = export
        self.weights_dir = weights_dir
        self.keep = keep
        self.current_version = initial_version
        self.current_path: Path | None = initial_path
        self.served: dict[str, str | None] = {c.base_url: None for c in self.clients}

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
        )

    async def _push_one(self, client: EngineClient, path: Path, version: int) -> bool:
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
            log.warning("weight push v%d to %s failed: %s", version, client.base_url, exc)
            self._record(client.base_url, None)
            SYNC_FAILURES.labels(engine=client.base_url).inc()
            return False
        if not result.success:
            log.warning("engine %s refused v%d: %s", client.base_url, version, result.message)
            SYNC_FAILURES.labels(engine=client.base_url).inc()
            return False
        self._record(client.base_url, str(version))
        return True

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
            if info.weight_version != want:
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
    kept = set(older[max(0, len(older) - keep + 1):])
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
        if self.group is None:
            await self._form_group()
        assert self.group is not None
        names, dtypes, shapes, items = _announced(self.tensors())
        try:
            for c in self.clients:
                await c.pause_generation(mode="in_place")
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
        failed = []
        for client, result in zip(self.clients, results, strict=True):
            if isinstance(result, BaseException) or not result.success:
                log.warning("engine %s did not take v%d: %s", client.base_url, version, result)
                SYNC_FAILURES.labels(engine=client.base_url).inc()
                self._record(client.base_url, None)
                failed.append(client.base_url)
            else:
                self._record(client.base_url, str(version))
        if failed:
            # A member that failed mid-broadcast leaves the group unusable: form a new one next.
            self.group.close()
            self.group = None
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
            failed=failed,
        )

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
            if info.weight_version != want:
                stale.append(client.base_url)
                REPUSHES.labels(engine=client.base_url).inc()
        if stale:
            # The stale engine restarted and left the group: a new group, then the same weights.
            await self._form_group()
            await self.push(self.current_version)
        return stale

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None
