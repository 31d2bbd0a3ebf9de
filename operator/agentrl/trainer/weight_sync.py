"""Getting new weights into every engine, and keeping track of what each one serves.

``disk`` (:class:`DiskWeightSync`): the trainer writes the weights in the format engines load,
records them in ``current-weights.json`` (:mod:`agentrl.engine.weight_pointer`, which the
watchdog reads to re-push after a restart), then, on every engine at once: pause generation
(``in_place``: running requests keep their state and continue under the new weights), ``POST
/update_weights_from_disk``, ``/flush_cache`` (the prefix cache holds KV of the old weights),
continue generation.

``distributed`` (engines join a broadcast group with ``/init_weights_update_group``; each push
announces names/dtypes/shapes with ``/update_weights_from_distributed`` while the trainer
broadcasts over RCCL/NCCL) is NOT implemented yet: :class:`~agentrl.engine.client.EngineClient`
has both calls, but there is no trainer-side broadcaster and the tiny engine does not serve
them. Only ``disk`` works today.

The disk mode tracks the version each engine reports in ``/get_model_info`` and re-pushes to
any engine that serves an older one — an engine restarted by its watchdog comes back with its
initial weights.
Callers: :mod:`agentrl.trainer.loop`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import Counter, Gauge
from pydantic import BaseModel, Field

from agentrl.engine.client import EngineClient, EngineError
from agentrl.engine.weight_pointer import CurrentWeights, write_current_weights

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
                    str(path), weight_version=str(version)
                )
                if result.success:
                    await client.flush_cache()
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
        keep = {self.path_for(self.current_version - i).name for i in range(self.keep)}
        for child in self.weights_dir.glob("v*"):
            if child.is_dir() and child.name not in keep and child.name[1:].isdigit():
                for f in child.iterdir():
                    f.unlink()
                child.rmdir()
