"""Rollout workers' Prometheus metrics, carried to the driver and served there on one port.

On a cluster the episodes run in Ray actor processes (:mod:`agentrl.rollout.ray_workers`), so
what they record (``agentrl_rollout_*``, ``agentrl_sandbox_*``, ``agentrl_engine_client_*``)
lands in those processes' default registries, which nothing scrapes. Each worker sends a
:func:`snapshot` of its metrics with the trajectories it hands back; the driver keeps the latest
one per worker in a :class:`WorkerMetrics` and serves its own registry and the workers' series
together with :func:`serve`::

    # in the worker (RolloutWorker.collect):
    return {..., "metrics": metrics_export.snapshot()}

    # in the driver:
    workers = metrics_export.WorkerMetrics()          # over the default registry
    server = metrics_export.serve(port, workers=workers)
    workers.update(str(index), collected["metrics"])  # after every collect()
    workers.forget(str(index))                        # when that worker is lost
    server.close()

What one scrape of the driver shows (``WorkerMetrics.collect``):

* every metric family once, with one HELP and one TYPE line;
* the driver's own series unchanged and without a ``worker`` label; each worker's series with
  ``worker="<id>"`` added (a worker series that already had a ``worker`` label keeps it as
  ``exported_worker``, as Prometheus itself does), so ``sum(...)`` over a family is the job's
  total and ``sum by (worker)`` splits it;
* a family the driver and workers both have (they import the same metric modules) is one
  family: the driver's samples first, then each worker's, workers in sorted order, with the
  driver's HELP and TYPE. A worker family whose type differs from the driver's (mismatched
  versions) is left out and logged once; among workers, the first in sorted order sets the type;
* a worker's counters are cumulative for its process: each snapshot replaces the previous one.
  A restarted worker that reuses its id starts again from 0, which Prometheus reads as a
  counter reset, as it would for a restarted pod.

Why WorkerMetrics wraps the driver's registry rather than being registered in it: the driver's
registry already emits a family for each of these names from its own collectors, and a second
collector yielding the same name would print a second HELP/TYPE block, which Prometheus
rejects. So ``WorkerMetrics(source)`` *is* the merged view, and :func:`serve` exposes it from a
registry of its own. Registering it in its own source fails loudly at the first scrape.

Left out on purpose: ``_created`` samples (another process's start time; they would double the
size of every counter), families with no samples (the driver declares the same ones), and
prometheus_client's multiprocess mode (its files on a local directory do not cross pods).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Self
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, CollectorRegistry, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

log = logging.getLogger(__name__)

#: Families whose name starts with this are part of a snapshot.
PREFIX: Final = "agentrl_"
#: The label that tells workers' series apart in the driver's exposition.
WORKER_LABEL: Final = "worker"
#: Where a worker series' own ``worker`` label goes (Prometheus' ``honor_labels: false`` name).
EXPORTED_WORKER_LABEL: Final = "exported_worker"

#: Sample name suffixes a family of each type may carry in a snapshot (``_created`` excluded).
SAMPLE_SUFFIXES: Final[dict[str, tuple[str, ...]]] = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum"),
    "summary": ("", "_count", "_sum"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "info": ("_info",),
    "stateset": ("",),
    "unknown": ("",),
}
#: JSON has no NaN or infinities: they travel as Prometheus spells them.
_NON_FINITE: Final = {"NaN": math.nan, "+Inf": math.inf, "-Inf": -math.inf}


def _encode(value: float) -> float | str:
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "+Inf" if value > 0 else "-Inf"


def _decode(value: object) -> float:
    if isinstance(value, str) and value in _NON_FINITE:
        return _NON_FINITE[value]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise ValueError(f"sample value {value!r} is not a number")


def snapshot(
    registry: CollectorRegistry = REGISTRY, *, prefix: str = PREFIX
) -> list[dict[str, Any]]:
    """This process's metric families named ``prefix*``, as JSON-able data.

    One dict per family: ``name``, ``type``, ``documentation``, ``unit`` (only when set) and
    ``samples``, each ``{"name", "labels", "value"}``; a non-finite value is the string
    ``"NaN"``, ``"+Inf"`` or ``"-Inf"``. ``_created`` samples and families without samples are
    left out.
    """
    families: list[dict[str, Any]] = []
    for family in registry.collect():
        if not family.name.startswith(prefix):
            continue
        created = family.name + "_created"
        samples = [
            {"name": s.name, "labels": dict(s.labels), "value": _encode(s.value)}
            for s in family.samples
            if s.name != created
        ]
        if not samples:
            continue
        entry: dict[str, Any] = {
            "name": family.name,
            "type": family.type,
            "documentation": family.documentation,
            "samples": samples,
        }
        if family.unit:
            entry["unit"] = family.unit
        families.append(entry)
    return families


@dataclass(frozen=True)
class _Family:
    """One family of a worker's snapshot, its samples already labelled with the worker."""

    name: str
    type: str
    documentation: str
    unit: str
    samples: tuple[Sample, ...]


def _worker_labels(labels: Mapping[str, Any], worker: str) -> dict[str, str]:
    out = {str(key): str(value) for key, value in labels.items()}
    if WORKER_LABEL in out:
        out[EXPORTED_WORKER_LABEL] = out.pop(WORKER_LABEL)
    out[WORKER_LABEL] = worker
    return out


def _parse_family(worker: str, entry: Mapping[str, Any]) -> _Family:
    name, typ = entry["name"], entry["type"]
    if typ not in SAMPLE_SUFFIXES:
        raise ValueError(f"family {name}: unknown type {typ!r}")
    allowed = {name + suffix for suffix in SAMPLE_SUFFIXES[typ]}
    samples = []
    for sample in entry["samples"]:
        if sample["name"] not in allowed:
            raise ValueError(f"sample {sample['name']} does not belong to {typ} family {name}")
        labels = _worker_labels(sample.get("labels", {}), worker)
        samples.append(Sample(sample["name"], labels, _decode(sample["value"])))
    return _Family(
        name=name,
        type=typ,
        documentation=str(entry.get("documentation", "")),
        unit=str(entry.get("unit", "")),
        samples=tuple(samples),
    )


def _parse(worker: str, data: Iterable[Mapping[str, Any]]) -> tuple[_Family, ...]:
    families: dict[str, _Family] = {}
    for entry in data:
        try:
            family = _parse_family(worker, entry)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"worker {worker}: malformed metrics snapshot ({exc!r})") from exc
        except ValueError as exc:
            raise ValueError(f"worker {worker}: {exc}") from exc
        if family.name in families:
            raise ValueError(f"worker {worker}: family {family.name} appears twice")
        families[family.name] = family
    return tuple(families.values())


class WorkerMetrics(Collector):
    """The driver's registry merged with the latest snapshot of every rollout worker.

    Thread-safe: :meth:`update` and :meth:`forget` run on the driver's event loop while the
    HTTP server's threads collect.
    """

    def __init__(self, source: CollectorRegistry = REGISTRY) -> None:
        self._source = source
        self._lock = threading.Lock()
        self._workers: dict[str, tuple[_Family, ...]] = {}
        self._local = threading.local()
        self._conflicts: set[tuple[str, str]] = set()

    @property
    def source(self) -> CollectorRegistry:
        """The driver's registry this view merges the workers into."""
        return self._source

    @property
    def workers(self) -> list[str]:
        """Ids of the workers with a snapshot, sorted."""
        with self._lock:
            return sorted(self._workers)

    def update(self, worker: str, snapshot: Sequence[Mapping[str, Any]]) -> None:
        """Keep ``snapshot`` (from :func:`snapshot` in that worker) as ``worker``'s metrics,
        replacing the previous one. A malformed snapshot raises ValueError and changes
        nothing."""
        if not isinstance(worker, str) or not worker:
            raise ValueError(f"worker id must be a non-empty string, got {worker!r}")
        families = _parse(worker, snapshot)
        with self._lock:
            self._workers[worker] = families

    def forget(self, worker: str) -> None:
        """Drop ``worker``'s series (it was lost or closed); unknown ids are ignored."""
        with self._lock:
            self._workers.pop(worker, None)

    def describe(self) -> list[Metric]:
        """Nothing: the names change with the workers, so no registry should reserve them."""
        return []

    def collect(self) -> Iterator[Metric]:
        """The source's families with the workers' samples merged in, then families only the
        workers have (in order of first appearance, workers sorted)."""
        if getattr(self._local, "collecting", False):
            raise RuntimeError(
                "WorkerMetrics is registered in the registry it merges; expose it with "
                "metrics_export.serve(port, workers=...) instead"
            )
        self._local.collecting = True
        try:
            driver = list(self._source.collect())
        finally:
            self._local.collecting = False
        with self._lock:
            workers = sorted(self._workers.items())
        yield from self._merge(driver, workers)

    def _merge(
        self, driver: list[Metric], workers: list[tuple[str, tuple[_Family, ...]]]
    ) -> Iterator[Metric]:
        by_name: dict[str, list[_Family]] = {}
        for _, snapshot_families in workers:
            for worker_family in snapshot_families:
                by_name.setdefault(worker_family.name, []).append(worker_family)
        for own in driver:
            extra = by_name.pop(own.name, None)
            if not extra:
                yield own
                continue
            merged = Metric(own.name, own.documentation, own.type, own.unit)
            merged.samples = list(own.samples)
            self._add(merged, extra)
            yield merged
        for name, families in by_name.items():
            first = families[0]
            merged = Metric(name, first.documentation, first.type, first.unit)
            self._add(merged, families)
            yield merged

    def _add(self, merged: Metric, families: list[_Family]) -> None:
        for family in families:
            if family.type == merged.type:
                merged.samples.extend(family.samples)
                continue
            worker = family.samples[0].labels[WORKER_LABEL] if family.samples else "?"
            key = (merged.name, worker)
            if key not in self._conflicts:
                self._conflicts.add(key)
                log.warning(
                    "metric %s of worker %s is a %s, here a %s: its samples are not exported",
                    merged.name,
                    worker,
                    family.type,
                    merged.type,
                )


@dataclass
class MetricsServer:
    """A running ``/metrics`` endpoint; :meth:`close` stops it and frees the port."""

    host: str
    port: int
    """The bound port (the one the OS chose when :func:`serve` was given 0)."""
    _server: WSGIServer
    _thread: threading.Thread

    def close(self) -> None:
        """Stop serving and release the port (idempotent)."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def serve(
    port: int, *, host: str = "0.0.0.0", workers: WorkerMetrics | None = None
) -> MetricsServer:
    """Serve ``/metrics`` on ``host:port`` from a daemon thread: the default registry, or
    ``workers`` (its source merged with the workers' snapshots) when given. ``port`` 0 lets the
    OS choose; the result's ``port`` says which. Raises OSError when the port is taken."""
    exposed: Collector = REGISTRY
    if workers is not None:
        # Collectors without names are kept by restricted registries, so ?name[]=... works.
        registry = CollectorRegistry(support_collectors_without_names=True)
        registry.register(workers)
        exposed = registry
    server, thread = start_http_server(port, addr=host, registry=exposed)
    return MetricsServer(
        host=host, port=int(server.server_address[1]), _server=server, _thread=thread
    )
