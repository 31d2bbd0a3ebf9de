"""Prometheus metrics of the sandbox tier, and the wrapper that records them for any provider.

Callers: :func:`agentrl.sandbox.open_provider` wraps every provider in
:class:`InstrumentedProvider`, so startup latency, exec latency, failures and live sandboxes are
measured the same way for ``local``, ``kubernetes``, ``e2b`` and the fake. Metrics are declared
once here, at import, in the default registry.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import TracebackType
from typing import Self

from prometheus_client import Counter, Gauge, Histogram

from agentrl.sandbox.errors import SandboxError
from agentrl.sandbox.provider import ExecResult, Sandbox, SandboxProvider, SandboxRequest

#: Startup spans fast local directories (ms) to cold Kubernetes pulls (minutes).
_STARTUP_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)
_EXEC_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 180, 600, 1800)

SANDBOX_STARTUP_SECONDS = Histogram(
    "agentrl_sandbox_startup_seconds",
    "Time from create() to a sandbox that runs commands, per provider.",
    ["provider"],
    buckets=_STARTUP_BUCKETS,
)
SANDBOX_EXEC_SECONDS = Histogram(
    "agentrl_sandbox_exec_seconds",
    "Wall time of one command (including its transport), per provider.",
    ["provider"],
    buckets=_EXEC_BUCKETS,
)
SANDBOX_FAILURES = Counter(
    "agentrl_sandbox_failures_total",
    "Infrastructure failures of sandbox operations (not commands that exit non-zero).",
    ["provider", "operation", "error"],
)
SANDBOX_CREATES = Counter(
    "agentrl_sandbox_creates_total",
    "Sandboxes created (successfully), per provider.",
    ["provider"],
)
SANDBOX_LIVE = Gauge(
    "agentrl_sandbox_live",
    "Sandboxes created and not yet closed by this process, per provider.",
    ["provider"],
)
SANDBOX_CREATE_RATE_LIMIT = Gauge(
    "agentrl_sandbox_create_rate_limit_per_second",
    "Configured sandbox creations per second (spec.sandbox.maxCreatesPerSecond or the E2B "
    "plan limit), per provider.",
    ["provider"],
)
SANDBOX_PROVIDER_CONCURRENCY_LIMIT = Gauge(
    "agentrl_sandbox_provider_concurrency_limit",
    "Live sandboxes the provider itself allows (E2B plan limit); 0 means no provider limit.",
    ["provider"],
)


class InstrumentedSandbox:
    """A sandbox whose operations are timed and whose failures are counted."""

    def __init__(self, inner: Sandbox, provider: str) -> None:
        self._inner = inner
        self._provider = provider
        self._closed = False
        self.id = inner.id
        self.workdir = inner.workdir

    @property
    def inner(self) -> Sandbox:
        """The provider's own sandbox object (tests and provider-specific callers)."""
        return self._inner

    async def exec(
        self,
        command: str,
        *,
        timeout: float,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        start = time.monotonic()
        try:
            result = await self._inner.exec(command, timeout=timeout, cwd=cwd, env=env)
        except SandboxError as exc:
            SANDBOX_FAILURES.labels(self._provider, "exec", type(exc).__name__).inc()
            raise
        SANDBOX_EXEC_SECONDS.labels(self._provider).observe(time.monotonic() - start)
        return result

    async def write_file(self, path: str, data: bytes | str) -> None:
        try:
            await self._inner.write_file(path, data)
        except SandboxError as exc:
            SANDBOX_FAILURES.labels(self._provider, "write_file", type(exc).__name__).inc()
            raise

    async def read_file(self, path: str) -> bytes:
        try:
            return await self._inner.read_file(path)
        except SandboxError as exc:
            SANDBOX_FAILURES.labels(self._provider, "read_file", type(exc).__name__).inc()
            raise

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        SANDBOX_LIVE.labels(self._provider).dec()
        try:
            await self._inner.close()
        except SandboxError as exc:
            SANDBOX_FAILURES.labels(self._provider, "close", type(exc).__name__).inc()
            raise

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class InstrumentedProvider:
    """Wraps a provider: measures startup, counts creates and failures, tracks live sandboxes."""

    def __init__(self, inner: SandboxProvider) -> None:
        self._inner = inner
        self.name = inner.name

    @property
    def inner(self) -> SandboxProvider:
        """The wrapped provider."""
        return self._inner

    async def create(self, request: SandboxRequest) -> InstrumentedSandbox:
        start = time.monotonic()
        try:
            sandbox = await self._inner.create(request)
        except SandboxError as exc:
            SANDBOX_FAILURES.labels(self.name, "create", type(exc).__name__).inc()
            raise
        SANDBOX_STARTUP_SECONDS.labels(self.name).observe(time.monotonic() - start)
        SANDBOX_CREATES.labels(self.name).inc()
        SANDBOX_LIVE.labels(self.name).inc()
        return InstrumentedSandbox(sandbox, self.name)

    async def aclose(self) -> None:
        await self._inner.aclose()
