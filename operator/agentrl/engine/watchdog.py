"""The GPU watchdog sidecar: detect an engine fault, restart the engine with graphs still on,
push the current weights again, and only then report ready.

Run by ``agentrl engine watchdog`` in a sidecar of every engine pod (``shareProcessNamespace``),
and in-process by tests. It serves the engine pod's readiness probe (``/readyz`` on
:data:`~agentrl.api.wire.WATCHDOG_PORT`), so an engine that is faulting or
recovering leaves the Service at once.

Detection, every ``pollIntervalSeconds``:

* **log faults** — new lines of the engine log classified by :mod:`agentrl.engine.faults`;
* **engine gone** — the engine's main process exited or was replaced (a crash the kubelet
  already answered with a restart);
* **failed probes** — ``/health_generate`` failing or slower than ``healthTimeoutSeconds``,
  ``failedProbesBeforeRestart`` times in a row (a hang: the process lives, no token comes);
* **stall** — requests running or queued (``sglang:num_running_reqs``,
  ``sglang:num_queue_reqs``) while ``sglang:generation_tokens_total`` has not moved for
  ``stallSeconds`` (``/metrics`` still answering is not liveness).

Action, once per incident: readiness goes down; the engine's process group is stopped, so its
container exits and the kubelet restarts it on the same GPU with the same command (the
watchdog never starts an engine and never touches its flags); the watchdog waits for a new
engine process to answer ``/health_generate``, pushes the trainer's current weights
(:mod:`agentrl.engine.weight_pointer`) with ``/update_weights_from_disk`` and checks the
version ``/model_info`` reports; then readiness returns. An engine that is not healthy
within ``recoverTimeoutSeconds`` is stopped again.

Crash-loop guard: more than ``maxRestarts`` restarts within ``restartWindowSeconds`` puts the
watchdog in ``Degraded`` (annotation + a Warning Event on the job; the operator sets the
Degraded condition). Recovery continues; HIP graphs stay on regardless.

The state machine lives in :class:`Watchdog` and takes every collaborator as an argument (the
engine's HTTP endpoints, the process table, the reporter, the clock), so tests drive it step by
step with fakes, and the integration test drives it against a real faulting engine process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import Enum as EnumMetric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, Field

from agentrl.api import AgentRLJob, wire
from agentrl.api.engine import EngineServer
from agentrl.api.wire import LastFault, WatchdogReport, WatchdogState
from agentrl.engine import faults
from agentrl.engine.processes import EngineProcesses
from agentrl.engine.watchdog_report import (
    REASON_CRASH_LOOP,
    REASON_CRASH_LOOP_CLEARED,
    REASON_FAULT,
    REASON_RECOVERED,
    EventType,
    Reporter,
)
from agentrl.engine.weight_pointer import CurrentWeights, read_current_weights
from agentrl.engine_client.client import MODEL_INFO_PATH

log = logging.getLogger(__name__)

#: Trigger names for what the watchdog observes itself (log faults use their signature name).
HEALTH_PROBE_FAILED = "HEALTH_PROBE_FAILED"
GENERATION_STALL = "GENERATION_STALL"
ENGINE_EXITED = "ENGINE_EXITED"
#: Every value the ``signature`` label of ``agentrl_watchdog_faults_total`` can take.
TRIGGER_NAMES = (*faults.SIGNATURE_NAMES, HEALTH_PROBE_FAILED, GENERATION_STALL, ENGINE_EXITED)


class WatchdogConfig(BaseModel):
    """The watchdog's settings; :meth:`from_job` derives them from ``spec.inference``."""

    engine_url: str = f"http://127.0.0.1:{wire.ENGINE_PORT}"
    """The engine's base URL (same pod: loopback)."""
    log_file: Path = Path(wire.ENGINE_LOG_FILE)
    """The engine log ``agentrl engine launch`` writes on the shared volume."""
    engine_cmdline: str = wire.SGLANG_MODULE
    """Substring of the engine main process's command line."""
    weights_file: Path | None = Path(wire.CURRENT_WEIGHTS_FILE)
    """The trainer's current-weights record; None never re-pushes."""
    health_timeout_seconds: float = Field(default=60, gt=0)
    """``spec.inference.watchdog.healthTimeoutSeconds``."""
    health_interval_seconds: float = Field(default=15, gt=0)
    """``spec.inference.watchdog.healthIntervalSeconds``."""
    failed_probes_before_restart: int = Field(default=3, ge=1)
    """``spec.inference.watchdog.failedProbesBeforeRestart``."""
    stall_seconds: float = Field(default=120, gt=0)
    """``spec.inference.watchdog.stallSeconds``."""
    max_restarts: int = Field(default=5, ge=1)
    """``spec.inference.watchdog.maxRestarts``."""
    restart_window_seconds: float = Field(default=3600, gt=0)
    """``spec.inference.watchdog.restartWindowSeconds``."""
    recover_timeout_seconds: float = Field(default=1800, gt=0)
    """A (re)started engine not healthy after this long is stopped again; from
    ``spec.inference.startupTimeoutSeconds`` (model load plus graph capture)."""
    stop_grace_seconds: float = Field(default=10, ge=0)
    """SIGTERM to SIGKILL when stopping the engine (seconds)."""
    poll_interval_seconds: float = Field(default=0.5, gt=0)
    """How often the log and the process table are read (seconds)."""
    startup_probe_interval_seconds: float = Field(default=2, gt=0)
    """Probe cadence while waiting for a (re)started engine to become healthy (seconds)."""
    weight_push_timeout_seconds: float = Field(default=900, gt=0)
    """Timeout of one ``/update_weights_from_disk`` (loading a large model from disk)."""
    weight_push_attempts: int = Field(default=3, ge=1)
    """Failed pushes before the engine is restarted again."""

    @classmethod
    def from_job(cls, job: AgentRLJob, **overrides: object) -> WatchdogConfig:
        """Settings from ``job.spec.inference``; ``overrides`` win (paths, URLs in tests)."""
        spec = job.spec.inference
        values: dict[str, object] = {
            "health_timeout_seconds": spec.watchdog.health_timeout_seconds,
            "health_interval_seconds": spec.watchdog.health_interval_seconds,
            "failed_probes_before_restart": spec.watchdog.failed_probes_before_restart,
            "stall_seconds": spec.watchdog.stall_seconds,
            "max_restarts": spec.watchdog.max_restarts,
            "restart_window_seconds": spec.watchdog.restart_window_seconds,
            "recover_timeout_seconds": spec.startup_timeout_seconds,
            "engine_cmdline": (
                wire.TINY_CMDLINE
                if spec.server == EngineServer.TINY
                else wire.SGLANG_MODULE
            ),
        }
        values.update(overrides)
        return cls.model_validate(values)


# ---- the engine's endpoints ------------------------------------------------------------------


@dataclass(frozen=True)
class EngineLoad:
    """What the stall detector reads from ``/metrics``."""

    running_requests: float
    generation_tokens_total: float | None
    gen_throughput: float | None
    queued_requests: float = 0.0

    @property
    def pending(self) -> float:
        """Requests the engine owes tokens to: running plus queued (an engine that admits
        nothing from its queue is as stuck as one whose batch makes no progress)."""
        return self.running_requests + self.queued_requests


class EngineEndpoints(Protocol):
    """The engine HTTP calls the watchdog makes (a fake stands in for it in unit tests)."""

    async def health_generate(self, timeout: float) -> bool:
        """True when ``/health_generate`` answered 200 within ``timeout``."""
        ...

    async def load(self, timeout: float) -> EngineLoad | None:
        """Running requests and token counters, or None when ``/metrics`` is unreadable."""
        ...

    async def push_weights(self, weights: CurrentWeights, timeout: float) -> str | None:
        """Push ``weights``; None on success, else why it failed."""
        ...

    async def served_version(self, timeout: float) -> str | None:
        """The weight version the engine serves (``/model_info``), None when unreadable."""
        ...


def parse_engine_load(text: str) -> EngineLoad:
    """The stall detector's inputs from SGLang's Prometheus text (summed over label sets)."""
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return EngineLoad(
        running_requests=sums.get("sglang:num_running_reqs", 0.0),
        generation_tokens_total=sums.get("sglang:generation_tokens_total"),
        gen_throughput=sums.get("sglang:gen_throughput"),
        queued_requests=sums.get("sglang:num_queue_reqs", 0.0),
    )


class HttpEngineEndpoints:
    """:class:`EngineEndpoints` over aiohttp."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def health_generate(self, timeout: float) -> bool:
        try:
            async with self._http().get(
                f"{self.base_url}/health_generate", timeout=aiohttp.ClientTimeout(total=timeout)
            ) as response:
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def load(self, timeout: float) -> EngineLoad | None:
        try:
            async with self._http().get(
                f"{self.base_url}/metrics", timeout=aiohttp.ClientTimeout(total=timeout)
            ) as response:
                if response.status != 200:
                    return None
                return parse_engine_load(await response.text())
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def served_version(self, timeout: float) -> str | None:
        try:
            async with self._http().get(
                f"{self.base_url}{MODEL_INFO_PATH}", timeout=aiohttp.ClientTimeout(total=timeout)
            ) as response:
                if response.status != 200:
                    return None
                served = (await response.json(content_type=None)).get("weight_version")
        except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError):
            return None
        return None if served is None else str(served)

    async def push_weights(self, weights: CurrentWeights, timeout: float) -> str | None:
        body: dict[str, object] = {
            "model_path": weights.model_path,
            "weight_version": weights.weight_version,
        }
        if weights.load_format is not None:
            body["load_format"] = weights.load_format
        client_timeout = aiohttp.ClientTimeout(total=timeout)
        try:
            async with self._http().post(
                f"{self.base_url}/update_weights_from_disk", json=body, timeout=client_timeout
            ) as response:
                reply = await response.json(content_type=None)
                if response.status != 200 or not reply.get("success", False):
                    return f"HTTP {response.status}: {reply.get('message', reply)}"
            async with self._http().get(
                f"{self.base_url}{MODEL_INFO_PATH}", timeout=client_timeout
            ) as response:
                served = (await response.json(content_type=None)).get("weight_version")
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"
        if str(served) != weights.weight_version:
            return (
                f"engine reports weight_version {served!r} after pushing {weights.weight_version!r}"
            )
        return None


# ---- the log ---------------------------------------------------------------------------------


class LogTail:
    """New complete lines of a growing file; follows truncation and replacement (rotation)."""

    def __init__(self, path: Path, *, from_start: bool = False) -> None:
        self.path = path
        self._inode: int | None = None
        self._offset = 0
        self._partial = b""
        self.line_number = 0
        """Lines read so far from the current file (for messages)."""
        if not from_start:
            with contextlib.suppress(FileNotFoundError):
                stat = path.stat()
                self._inode, self._offset = stat.st_ino, stat.st_size

    def read(self) -> list[str]:
        """Lines appended since the last call (a trailing partial line waits)."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return []
        if stat.st_ino != self._inode or stat.st_size < self._offset:
            self._inode, self._offset, self._partial, self.line_number = stat.st_ino, 0, b"", 0
        if stat.st_size == self._offset:
            return []
        with self.path.open("rb") as handle:
            handle.seek(self._offset)
            data = handle.read()
        self._offset += len(data)
        chunks = (self._partial + data).split(b"\n")
        self._partial = chunks.pop()
        self.line_number += len(chunks)
        return [c.decode("utf-8", "replace").rstrip("\r") for c in chunks]


# ---- metrics ---------------------------------------------------------------------------------


class WatchdogMetrics:
    """The watchdog's Prometheus metrics (its own registry: one watchdog per pod)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.faults = Counter(
            "agentrl_watchdog_faults",
            "Engine faults seen, by signature (log signatures and the watchdog's own triggers).",
            ["signature"],
            registry=r,
        )
        for name in TRIGGER_NAMES:
            self.faults.labels(name)
        self.restarts = Counter(
            "agentrl_watchdog_engine_restarts", "Engine restarts observed.", registry=r
        )
        self.recovery_seconds = Histogram(
            "agentrl_watchdog_recovery_seconds",
            "Time from a fault to the engine being ready again with current weights.",
            buckets=(5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600),
            registry=r,
        )
        self.state = EnumMetric(
            "agentrl_watchdog_state",
            "Current watchdog state.",
            states=[s.value for s in WatchdogState],
            registry=r,
        )
        self.restarts_in_window = Gauge(
            "agentrl_watchdog_restarts_in_window",
            "Engine restarts within the crash-loop window.",
            registry=r,
        )
        self.max_restarts = Gauge(
            "agentrl_watchdog_max_restarts",
            "Crash-loop guard limit: more restarts than this within the window is Degraded.",
            registry=r,
        )
        self.probe_failures = Counter(
            "agentrl_watchdog_health_probe_failures",
            "Failed or timed-out /health_generate probes.",
            registry=r,
        )
        self.weight_pushes = Counter(
            "agentrl_watchdog_weight_pushes",
            "Weight re-pushes after a restart, by result.",
            ["result"],
            registry=r,
        )


# ---- the state machine -----------------------------------------------------------------------


@dataclass
class _Incident:
    signature: str
    line: str
    started: float
    old_pid: int | None


class Watchdog:
    """One engine's watchdog. Call :meth:`step` repeatedly (or :meth:`run`)."""

    def __init__(
        self,
        config: WatchdogConfig,
        *,
        endpoints: EngineEndpoints,
        processes: EngineProcesses,
        reporter: Reporter,
        metrics: WatchdogMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        log_from_start: bool = False,
    ) -> None:
        """``clock`` and ``log_from_start`` are for tests (a fake clock; a log written before
        the watchdog started)."""
        self.config = config
        self.endpoints = endpoints
        self.processes = processes
        self.reporter = reporter
        self.metrics = metrics or WatchdogMetrics()
        self.clock = clock
        self.tail = LogTail(config.log_file, from_start=log_from_start)

        self.phase = WatchdogState.STARTING
        self.crash_loop = False
        self.pid: int | None = None
        self.restarts = 0
        self.faults_seen = 0
        self.last_fault: LastFault | None = None
        self.last_recovery_seconds: float | None = None
        self.weight_version: str | None = None
        self._restart_times: deque[float] = deque()
        self._incident: _Incident | None = None
        self._attempt_started = clock()
        self._failed_probes = 0
        self._failed_pushes = 0
        self._probe: asyncio.Task[bool] | None = None
        self._next_probe = clock()
        self._next_load = clock() + config.health_interval_seconds
        self._load_task: asyncio.Task[EngineLoad | None] | None = None
        self._version_task: asyncio.Task[str | None] | None = None
        self._last_tokens: float | None = None
        self._last_progress = clock()
        self._last_report: WatchdogReport | None = None
        self._pending_events: list[tuple[EventType, str, str]] = []
        self._engines_seen = 0
        self.metrics.max_restarts.set(config.max_restarts)
        self.metrics.state.state(self.state.value)

    # -- what the HTTP endpoints serve ---------------------------------------------------------

    @property
    def state(self) -> WatchdogState:
        """Degraded while the crash-loop guard is tripped, else the phase."""
        return WatchdogState.DEGRADED if self.crash_loop else self.phase

    @property
    def ready(self) -> bool:
        """Whether the engine may take traffic (healthy, with current weights)."""
        return self.phase == WatchdogState.READY

    def report(self) -> WatchdogReport:
        """The state as the annotation carries it."""
        return WatchdogReport(
            state=self.state,
            ready=self.ready,
            restarts=self.restarts,
            restarts_in_window=len(self._restart_times),
            max_restarts=self.config.max_restarts,
            window_seconds=int(self.config.restart_window_seconds),
            faults=self.faults_seen,
            last_fault=self.last_fault,
            last_recovery_seconds=self.last_recovery_seconds,
            weight_version=self.weight_version,
            updated_at=_rfc3339_now(),
        )

    # -- the loop ------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Step every ``pollIntervalSeconds`` until ``stop`` is set."""
        await self._publish(force=True)
        try:
            while not stop.is_set():
                await self.step()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.config.poll_interval_seconds)
        finally:
            self._cancel_probes()

    async def step(self) -> None:
        """Observe once and act on what was seen."""
        now = self.clock()
        faulty_pid = self.pid
        watched = self._watching(faulty_pid)
        trigger = self._read_log()
        exited = self._watch_process(now)
        if exited is not None and trigger is None:
            # A crashing engine prints its fault before it exits: read what arrived meanwhile,
            # so the incident carries the signature rather than just "exited".
            trigger = self._read_log()
        trigger = trigger or exited
        self._prune_window(now)
        if self.phase == WatchdogState.READY:
            trigger = trigger or self._watch_health(now) or self._watch_stall(now)
            self._watch_served_version()
        if trigger is not None and watched:
            await self._start_incident(*trigger, now=now, faulty_pid=faulty_pid)
        else:
            if trigger is not None and trigger[0] in faults.SIGNATURE_NAMES:
                self._refine_incident(*trigger)
            if self.phase != WatchdogState.READY:
                await self._drive_recovery(now)
        await self._publish()

    def _refine_incident(self, signature: str, line: str) -> None:
        """A fault line of the engine we already restart, read after its exit was seen: it
        names the fault better than ENGINE_EXITED did."""
        incident = self._incident
        if incident is None or incident.signature != ENGINE_EXITED:
            return
        incident.signature, incident.line = signature, line
        self.last_fault = LastFault(signature=signature, line=line, time=_rfc3339_now())

    def _watching(self, pid: int | None) -> bool:
        """Whether a fault seen now belongs to an engine we have not already given up on: any
        engine outside an incident, or a new engine started since the incident began."""
        if self._incident is None:
            return True
        return pid is not None and pid != self._incident.old_pid

    # -- detection -----------------------------------------------------------------------------

    def _read_log(self) -> tuple[str, str] | None:
        first: tuple[str, str] | None = None
        start = self.tail.line_number + 1
        for match in faults.classify_lines(self.tail.read(), first_line_number=start):
            log.warning(
                "fault %s in %s line %d: %s",
                match.signature.name,
                self.config.log_file,
                match.line_number,
                match.line,
            )
            self.metrics.faults.labels(match.signature.name).inc()
            first = first or (match.signature.name, match.line)
        return first

    def _watch_process(self, now: float) -> tuple[str, str] | None:
        """Follow the engine's main process; a vanished or replaced one is ENGINE_EXITED."""
        pid = self.processes.find()
        previous = self.pid
        if pid == previous:
            return None
        self.pid = pid
        self._cancel_probes()
        if pid is not None:
            log.info("engine process %d started (previous: %s)", pid, previous)
            if self._engines_seen > 0:
                self._record_restart(now)
            self._engines_seen += 1
            self._attempt_started = now
            self._next_probe = now
        if previous is None:
            return None
        return ENGINE_EXITED, f"engine process {previous} exited" + (
            f"; engine process {pid} replaced it" if pid is not None else ""
        )

    def _watch_health(self, now: float) -> tuple[str, str] | None:
        result = self._probe_result(now, self.config.health_interval_seconds)
        if result is None:
            return None
        if result:
            self._failed_probes = 0
            return None
        self._failed_probes += 1
        self.metrics.probe_failures.inc()
        log.warning(
            "/health_generate failed (%d of %d)",
            self._failed_probes,
            self.config.failed_probes_before_restart,
        )
        if self._failed_probes < self.config.failed_probes_before_restart:
            return None
        return HEALTH_PROBE_FAILED, (
            f"/health_generate failed or took over {self.config.health_timeout_seconds:g} s "
            f"{self._failed_probes} times in a row"
        )

    def _probe_result(self, now: float, interval: float) -> bool | None:
        """Start a probe when one is due; the result of a finished one, else None."""
        if self._probe is not None and self._probe.done():
            probe, self._probe = self._probe, None
            return False if probe.cancelled() or probe.exception() else probe.result()
        if self._probe is None and now >= self._next_probe:
            self._next_probe = now + interval
            self._probe = asyncio.ensure_future(
                self.endpoints.health_generate(self.config.health_timeout_seconds)
            )
        return None

    def _watch_stall(self, now: float) -> tuple[str, str] | None:
        if self._load_task is not None and self._load_task.done():
            task, self._load_task = self._load_task, None
            load = None if task.cancelled() or task.exception() else task.result()
            if load is not None and self._is_stalled(load, now):
                return GENERATION_STALL, (
                    f"{load.running_requests:g} running and {load.queued_requests:g} queued "
                    "requests and no generated token for "
                    f"{now - self._last_progress:.0f} s"
                )
        if self._load_task is None and now >= self._next_load:
            self._next_load = now + self.config.health_interval_seconds
            self._load_task = asyncio.ensure_future(
                self.endpoints.load(self.config.health_timeout_seconds)
            )
            # the served weight version on the same cadence (read below once it has come)
            if self._version_task is None:
                self._version_task = asyncio.ensure_future(
                    self.endpoints.served_version(self.config.health_timeout_seconds)
                )
        return None

    def _watch_served_version(self) -> None:
        """Follow the weight version the engine serves, whoever pushed it (the trainer's
        pushes in steady state, ours after a restart): the annotation carries the engine's
        own word, so the operator's WeightsSynced compares what engines really serve."""
        task = self._version_task
        if task is None or not task.done():
            return
        self._version_task = None
        served = None if task.cancelled() or task.exception() else task.result()
        if served is not None and served != self.weight_version:
            log.info("engine serves weights %s (was %s)", served, self.weight_version)
            self.weight_version = served

    def _is_stalled(self, load: EngineLoad, now: float) -> bool:
        tokens = load.generation_tokens_total
        if tokens is not None:
            moved = self._last_tokens is None or tokens > self._last_tokens
        else:  # builds without the counter: fall back to the throughput gauge
            moved = (load.gen_throughput or 0.0) > 0.0
        self._last_tokens = tokens
        if load.pending <= 0 or moved:
            self._last_progress = now
            return False
        return now - self._last_progress >= self.config.stall_seconds

    def _cancel_probes(self) -> None:
        """Drop in-flight probes: their answer may come from an engine that is gone."""
        for task in (self._probe, self._load_task, self._version_task):
            if task is not None:
                task.cancel()
        self._probe = self._load_task = self._version_task = None

    # -- acting --------------------------------------------------------------------------------

    async def _start_incident(
        self, signature: str, line: str, *, now: float, faulty_pid: int | None
    ) -> None:
        """Readiness down, Event, stop the faulty engine; the kubelet restarts it."""
        started = self._incident.started if self._incident is not None else now
        self.phase = WatchdogState.RECOVERING
        self.faults_seen += 1
        if signature in (HEALTH_PROBE_FAILED, GENERATION_STALL, ENGINE_EXITED):
            self.metrics.faults.labels(signature).inc()
        self.last_fault = LastFault(signature=signature, line=line, time=_rfc3339_now())
        self._incident = _Incident(signature, line, started=started, old_pid=faulty_pid)
        self._reset_recovery(now)
        log.error("engine fault %s: %s; restarting the engine (graphs stay on)", signature, line)
        self._pending_events.append(
            ("Warning", REASON_FAULT, f"{signature}: {line} (restarting the engine)")
        )
        await self._publish()
        # Stop the engine that faulted only if it is still the one running: when it already
        # exited and the kubelet started a new one in the same poll, the new one is innocent.
        if faulty_pid is not None and faulty_pid == self.pid:
            await self.processes.stop(faulty_pid, self.config.stop_grace_seconds)

    def _reset_recovery(self, now: float) -> None:
        self._cancel_probes()
        self._failed_probes = 0
        self._failed_pushes = 0
        self._attempt_started = now
        self._next_probe = now
        self._last_progress = now
        self._last_tokens = None

    async def _drive_recovery(self, now: float) -> None:
        """STARTING or RECOVERING: wait for a healthy new engine, push weights, go READY."""
        if not self._watching(self.pid) or self.pid is None:
            return  # waiting for the kubelet to start the engine again
        healthy = self._probe_result(now, self.config.startup_probe_interval_seconds)
        if not healthy:
            if now - self._attempt_started >= self.config.recover_timeout_seconds:
                log.error(
                    "engine %d not healthy %.0f s after it started: stopping it again",
                    self.pid,
                    now - self._attempt_started,
                )
                self._attempt_started = now
                await self.processes.stop(self.pid, self.config.stop_grace_seconds)
            return
        if await self._push_current_weights():
            self._become_ready(self.clock())

    async def _push_current_weights(self) -> bool:
        path = self.config.weights_file
        weights = read_current_weights(path) if path is not None else None
        if weights is None:
            return True  # the trainer has not pushed yet: the initial weights are current
        error = await self.endpoints.push_weights(weights, self.config.weight_push_timeout_seconds)
        if error is None:
            self.metrics.weight_pushes.labels("success").inc()
            self.weight_version = weights.weight_version
            log.info("pushed weights %s (%s)", weights.weight_version, weights.model_path)
            return True
        self.metrics.weight_pushes.labels("failure").inc()
        self._failed_pushes += 1
        log.error("pushing weights %s failed: %s", weights.weight_version, error)
        if self._failed_pushes >= self.config.weight_push_attempts and self.pid is not None:
            self._failed_pushes = 0
            await self.processes.stop(self.pid, self.config.stop_grace_seconds)
        return False

    def _become_ready(self, now: float) -> None:
        incident, self._incident = self._incident, None
        self.phase = WatchdogState.READY
        self._reset_recovery(now)
        self._next_load = now
        self._next_probe = now + self.config.health_interval_seconds
        if incident is None:
            log.info("engine ready")
            return
        self.last_recovery_seconds = now - incident.started
        self.metrics.recovery_seconds.observe(self.last_recovery_seconds)
        log.info("engine recovered from %s in %.1f s", incident.signature, now - incident.started)
        weights = f" serving weights {self.weight_version}" if self.weight_version else ""
        self._pending_events.append(
            (
                "Normal",
                REASON_RECOVERED,
                f"engine ready{weights} {self.last_recovery_seconds:.0f} s after "
                f"{incident.signature}",
            )
        )

    def _record_restart(self, now: float) -> None:
        self.restarts += 1
        self.metrics.restarts.inc()
        self._restart_times.append(now)
        self._prune_window(now)
        in_window = len(self._restart_times)
        if self.crash_loop or in_window <= self.config.max_restarts:
            return
        self.crash_loop = True
        last = self.last_fault.signature if self.last_fault else "unknown"
        log.error("crash-loop guard tripped: %d restarts within the window", in_window)
        self._pending_events.append(
            (
                "Warning",
                REASON_CRASH_LOOP,
                f"engine restarted {in_window} times within "
                f"{self.config.restart_window_seconds:g} s (limit {self.config.max_restarts}); "
                f"last fault {last}. HIP graphs stay on; recovery continues.",
            )
        )

    def _prune_window(self, now: float) -> None:
        window = self.config.restart_window_seconds
        while self._restart_times and now - self._restart_times[0] > window:
            self._restart_times.popleft()
        self.metrics.restarts_in_window.set(len(self._restart_times))
        if self.crash_loop and len(self._restart_times) <= self.config.max_restarts:
            self.crash_loop = False
            self._pending_events.append(
                ("Normal", REASON_CRASH_LOOP_CLEARED, "restarts back within the crash-loop limit")
            )

    async def _publish(self, *, force: bool = False) -> None:
        """Send pending Events, then the annotation when the state changed."""
        self.metrics.state.state(self.state.value)
        events, self._pending_events = self._pending_events, []
        for event in events:
            await self.reporter.event(*event)
        report = self.report()
        last = self._last_report
        unchanged = last is not None and report.model_dump(
            exclude={"updated_at"}
        ) == last.model_dump(exclude={"updated_at"})
        if force or not unchanged:
            self._last_report = report
            await self.reporter.annotate(report)


def _rfc3339_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ---- the sidecar's HTTP server ---------------------------------------------------------------


def build_app(watchdog: Watchdog) -> web.Application:
    """``/readyz`` (the engine pod's readiness probe), ``/healthz``, ``/metrics``, ``/state``."""

    async def readyz(_: web.Request) -> web.Response:
        status = 200 if watchdog.ready else 503
        return web.Response(status=status, text=watchdog.state.value + "\n")

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(watchdog.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def state(_: web.Request) -> web.Response:
        return web.Response(
            text=watchdog.report().model_dump_json(by_alias=True, exclude_none=True),
            content_type="application/json",
        )

    app = web.Application()
    app.router.add_get(wire.WATCHDOG_READY_PATH, readyz)
    app.router.add_get(wire.WATCHDOG_LIVE_PATH, healthz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/state", state)
    return app


async def serve(
    config: WatchdogConfig,
    *,
    port: int,
    job_name: str,
    pod_name: str | None,
    namespace: str | None,
    job_uid: str | None,
) -> None:
    """Run the sidecar until SIGTERM/SIGINT: the HTTP endpoints and the watchdog loop.

    Outside a pod (no ``pod_name``) the state and Events only go to the log.
    """
    import signal

    from agentrl.engine.processes import ProcEngineProcesses
    from agentrl.engine.watchdog_report import LightkubeReporter, LoggingReporter

    reporter: Reporter
    if pod_name and namespace:
        reporter = LightkubeReporter(
            pod_name=pod_name, namespace=namespace, job_name=job_name, job_uid=job_uid
        )
    else:
        log.warning("no POD_NAME/POD_NAMESPACE: reporting state and events to the log only")
        reporter = LoggingReporter()
    endpoints = HttpEngineEndpoints(config.engine_url)
    watchdog = Watchdog(
        config,
        endpoints=endpoints,
        processes=ProcEngineProcesses(config.engine_cmdline),
        reporter=reporter,
    )
    runner = web.AppRunner(build_app(watchdog), handle_signals=False, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", port).start()
    log.info("watchdog serving %s on :%d", wire.WATCHDOG_READY_PATH, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await watchdog.run(stop)
    finally:
        await endpoints.close()
        await runner.cleanup()
