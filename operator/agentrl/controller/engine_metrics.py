"""The engines' load as the autoscaler sees it: scrape SGLang's ``/metrics`` on every ready
engine pod into :class:`~agentrl.reconcile.policies.autoscale.EngineMetrics`.

The reconciler calls :func:`collect_engine_metrics` once per reconcile of a job whose
autoscaler is enabled, with the job as read and the raw pods it already listed, and hands the
result to ``autoscale.decide``. Engines are scraped concurrently, each within
``timeout_seconds``; one that does not answer is left out (and counted in
``agentrl_operator_engine_scrape_errors_total``), so a restarting engine never blocks a
decision — with no engine answering, the autoscaler holds.

Read from each engine (SGLang's scheduler gauges, label ``model_name`` and, in newer builds,
rank labels): ``sglang:num_running_reqs`` and ``sglang:num_queue_reqs``, summed over an engine's
series (its data-parallel ranks each hold their own requests), and ``sglang:token_usage``, the
highest of its series (the fullest KV cache is the one that retracts requests first).

**Test hook, off unless the operator is started with ``--test-synthetic-engine-metrics``.**
Simulated (kwok) engine pods serve no HTTP. With that flag (``OperatorSettings.
synthetic_engine_metrics``), a job carrying the annotation
:data:`ANNOTATION_SYNTHETIC_ENGINE_METRICS` (``agentrl.dev/synthetic-engine-metrics``) has its
value — ``EngineMetrics`` as camelCase JSON, e.g.
``{"engines": [{"pod": "e-0", "runningRequests": 4, "queuedRequests": 0, "tokenUsage": 0.2}]}``
— used instead of scraping; sandbox counts it leaves out are taken from the cluster as usual.
Without the flag (always, in the Helm chart) the annotation is ignored (logged and counted in
``agentrl_operator_synthetic_metrics_ignored_total``): the autoscaler acts only on what the
engines report.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final

import aiohttp
from prometheus_client import Counter
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, ConfigDict, ValidationError

from agentrl.api.wire import ENGINE_PORT
from agentrl.reconcile.constants import LABEL_COMPONENT, Component
from agentrl.reconcile.observed import Observed
from agentrl.reconcile.policies.autoscale import (
    EngineMetrics,
    EngineSample,
    count_waiting_sandboxes,
)

log = logging.getLogger(__name__)

#: Annotation on an AgentRLJob that replaces scraping with its JSON (tests, dry runs).
ANNOTATION_SYNTHETIC_ENGINE_METRICS: Final = "agentrl.dev/synthetic-engine-metrics"
#: SGLang's gauges the autoscaler reads.
RUNNING: Final = "sglang:num_running_reqs"
QUEUED: Final = "sglang:num_queue_reqs"
TOKEN_USAGE: Final = "sglang:token_usage"
#: Default time one engine has to answer /metrics (seconds).
DEFAULT_TIMEOUT_SECONDS: Final = 2.0

SYNTHETIC_IGNORED = Counter(
    "agentrl_operator_synthetic_metrics_ignored_total",
    "Reconciles of jobs whose synthetic-engine-metrics annotation was ignored (the operator "
    "runs without --test-synthetic-engine-metrics).",
)

SCRAPE_ERRORS = Counter(
    "agentrl_operator_engine_scrape_errors_total",
    "Engine /metrics scrapes that failed (timeout, connection, HTTP or parse error).",
    ["kind"],
)

#: ``fetch(url)`` → the response body; raises on any failure. The real one is
#: :class:`HttpFetch`; tests pass a dict-backed fake (:class:`StaticFetch`).
Fetch = Callable[[str], Awaitable[str]]


class EnginePod(BaseModel):
    """A ready engine pod to scrape."""

    model_config = ConfigDict(frozen=True)

    name: str
    ip: str

    def metrics_url(self, port: int = ENGINE_PORT) -> str:
        """SGLang's /metrics on this pod."""
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"http://{host}:{port}/metrics"


class MetricsParseError(ValueError):
    """An engine's /metrics lacks a gauge the autoscaler needs."""


def ready_engine_pods(pods: Iterable[Mapping[str, Any]]) -> list[EnginePod]:
    """The engine pods (by ``app.kubernetes.io/component``) that are Ready and have an IP."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        if (meta.get("labels") or {}).get(LABEL_COMPONENT) != Component.ENGINE.value:
            continue
        if meta.get("deletionTimestamp") or not status.get("podIP"):
            continue
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or ()
        )
        if ready:
            out.append(EnginePod(name=str(meta.get("name")), ip=str(status["podIP"])))
    return sorted(out, key=lambda p: p.name)


def parse_sglang_metrics(pod: str, text: str) -> EngineSample:
    """One engine's sample from its Prometheus text exposition."""
    values: dict[str, list[float]] = {RUNNING: [], QUEUED: [], TOKEN_USAGE: []}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in values:
                values[sample.name].append(float(sample.value))
    missing = [name for name, found in values.items() if not found]
    if missing:
        raise MetricsParseError(f"{pod}: /metrics has no {', '.join(missing)}")
    return EngineSample(
        pod=pod,
        running_requests=sum(values[RUNNING]),
        queued_requests=sum(values[QUEUED]),
        token_usage=max(values[TOKEN_USAGE]),
    )


class HttpFetch:
    """GETs a URL with one shared aiohttp session; use as an async context manager."""

    def __init__(self, *, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> HttpFetch:
        self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __call__(self, url: str) -> str:
        if self._session is None:
            raise RuntimeError("HttpFetch is used outside 'async with'")
        async with self._session.get(url) as response:
            response.raise_for_status()
            return await response.text()


class StaticFetch:
    """A fake :data:`Fetch` for tests: URL → body; a missing URL fails like a dead engine."""

    def __init__(self, bodies: Mapping[str, str]) -> None:
        self.bodies = dict(bodies)
        self.requested: list[str] = []

    async def __call__(self, url: str) -> str:
        self.requested.append(url)
        if url not in self.bodies:
            raise aiohttp.ClientConnectionError(f"connection refused: {url}")
        return self.bodies[url]


def synthetic_metrics(job_body: Mapping[str, Any]) -> EngineMetrics | None:
    """The job's synthetic metrics (:data:`ANNOTATION_SYNTHETIC_ENGINE_METRICS`), None without
    the annotation or when it does not parse (logged)."""
    annotations = (job_body.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(ANNOTATION_SYNTHETIC_ENGINE_METRICS)
    if not raw:
        return None
    try:
        return EngineMetrics.model_validate(json.loads(raw))
    except (ValueError, ValidationError) as exc:
        log.warning("ignoring %s: %s", ANNOTATION_SYNTHETIC_ENGINE_METRICS, exc)
        return None


async def _scrape(pod: EnginePod, fetch: Fetch, port: int) -> EngineSample | None:
    try:
        return parse_sglang_metrics(pod.name, await fetch(pod.metrics_url(port)))
    except TimeoutError:
        kind = "timeout"
    except aiohttp.ClientResponseError:
        kind = "http"
    except aiohttp.ClientError:
        kind = "connection"
    except ValueError:  # MetricsParseError and malformed exposition text
        kind = "parse"
    SCRAPE_ERRORS.labels(kind=kind).inc()
    log.info("engine %s gave no metrics (%s); deciding without it", pod.name, kind)
    return None


async def collect_engine_metrics(
    job_body: Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]],
    observed: Observed,
    *,
    allow_synthetic: bool = False,
    fetch: Fetch | None = None,
    port: int = ENGINE_PORT,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> EngineMetrics:
    """What the autoscaler decides from for one job.

    ``job_body``: the job as read (for the synthetic hook, honoured only with
    ``allow_synthetic``); ``pods``: the job's pods as listed;
    ``observed``: the same snapshot the plan used (for the waiting sandboxes); ``fetch``: for
    tests (default: HTTP with ``timeout_seconds`` per engine).
    """
    pending, unschedulable = count_waiting_sandboxes(observed)
    synthetic = synthetic_metrics(job_body)
    if synthetic is not None and not allow_synthetic:
        SYNTHETIC_IGNORED.inc()
        log.warning(
            "ignoring %s on %s: the operator runs without --test-synthetic-engine-metrics",
            ANNOTATION_SYNTHETIC_ENGINE_METRICS,
            (job_body.get("metadata") or {}).get("name"),
        )
        synthetic = None
    if synthetic is not None:
        given = synthetic.model_fields_set
        return synthetic.model_copy(
            update={
                "sandboxes_pending": synthetic.sandboxes_pending
                if "sandboxes_pending" in given
                else pending,
                "sandboxes_unschedulable": synthetic.sandboxes_unschedulable
                if "sandboxes_unschedulable" in given
                else unschedulable,
            }
        )
    engines = ready_engine_pods(pods)
    if fetch is None:
        async with HttpFetch(timeout_seconds=timeout_seconds) as http:
            samples = await asyncio.gather(*(_scrape(p, http, port) for p in engines))
    else:
        samples = await asyncio.gather(*(_scrape(p, fetch, port) for p in engines))
    return EngineMetrics(
        engines=tuple(s for s in samples if s is not None),
        sandboxes_pending=pending,
        sandboxes_unschedulable=unschedulable,
    )
