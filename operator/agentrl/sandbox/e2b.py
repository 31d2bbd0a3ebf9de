"""The ``e2b`` provider: E2B cloud microVMs through the ``e2b`` package's ``AsyncSandbox``.

The package is imported when the first sandbox is created (extra ``agentrl[e2b]``), so the
operator and ``import agentrl`` never need it. Limits come from ``spec.sandbox.e2b``: creations are
paced by ``maxCreatesPerSecond`` (token bucket) and live sandboxes capped by ``maxConcurrent``
(your plan's limits; both exported as metrics, and the scheduler's effective concurrency is
already capped by the latter). A 429 from E2B (``RateLimitException``) is retried with exponential
backoff until the episode's startup timeout runs out. The API key comes from the environment
variable the operator fills from ``spec.sandbox.e2b.apiKeySecretRef`` (``E2B_API_KEY``).

A command that exits non-zero is a result (E2B raises ``CommandExitException`` for it; we turn it
back into an :class:`~agentrl.sandbox.provider.ExecResult`); E2B's own failures are
:class:`~agentrl.sandbox.errors.SandboxError`.

Callers: :func:`agentrl.sandbox.open_provider` for ``provider: e2b``.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from types import ModuleType
from typing import Any

from agentrl.sandbox.errors import (
    SandboxCreateError,
    SandboxExecError,
    SandboxFileError,
    SandboxRateLimited,
)
from agentrl.sandbox.metrics import SANDBOX_CREATE_RATE_LIMIT, SANDBOX_PROVIDER_CONCURRENCY_LIMIT
from agentrl.sandbox.provider import ExecResult, SandboxBase, SandboxRequest, resolve_path
from agentrl.sandbox.ratelimit import TokenBucket

logger = logging.getLogger(__name__)

API_KEY_ENV = "E2B_API_KEY"
#: Backoff after a 429: first wait, and the longest single wait.
BACKOFF_INITIAL_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 30.0


def _exc(sdk: ModuleType, name: str) -> type[BaseException]:
    found = getattr(sdk, name, None)
    return found if isinstance(found, type) else type(f"_Missing{name}", (Exception,), {})


class E2BSandbox(SandboxBase):
    """One E2B sandbox."""

    def __init__(self, provider: E2BProvider, inner: Any, request: SandboxRequest) -> None:
        self._provider = provider
        self._inner = inner
        self.id = str(getattr(inner, "sandbox_id", "e2b"))
        self.workdir = request.workdir
        self._env = dict(request.env)
        self._closed = False

    async def exec(
        self,
        command: str,
        *,
        timeout: float,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        sdk = self._provider.sdk()
        exit_exc = _exc(sdk, "CommandExitException")
        timeout_exc = _exc(sdk, "TimeoutException")
        start = time.monotonic()
        try:
            result = await self._inner.commands.run(
                command,
                cwd=cwd or self.workdir,
                envs={**self._env, **(env or {})},
                timeout=timeout,
            )
        except exit_exc as exc:
            result = exc  # carries exit_code, stdout, stderr
        except timeout_exc:
            return ExecResult(exit_code=124, timed_out=True, duration_seconds=timeout)
        except Exception as exc:
            raise SandboxExecError(f"e2b exec failed: {exc}", provider="e2b") from exc
        return ExecResult(
            exit_code=int(getattr(result, "exit_code", 0) or 0),
            stdout=str(getattr(result, "stdout", "") or ""),
            stderr=str(getattr(result, "stderr", "") or ""),
            duration_seconds=time.monotonic() - start,
        )

    async def write_file(self, path: str, data: bytes | str) -> None:
        try:
            await self._inner.files.write(resolve_path(self.workdir, path), data)
        except Exception as exc:
            raise SandboxFileError(f"e2b write {path} failed: {exc}", provider="e2b") from exc

    async def read_file(self, path: str) -> bytes:
        not_found = _exc(self._provider.sdk(), "NotFoundException")
        try:
            data = await self._inner.files.read(resolve_path(self.workdir, path), format="bytes")
        except not_found as exc:
            raise FileNotFoundError(path) from exc
        except Exception as exc:
            raise SandboxFileError(f"e2b read {path} failed: {exc}", provider="e2b") from exc
        return bytes(data)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._inner.kill()
        except Exception as exc:  # E2B's own timeout reclaims it anyway
            logger.warning("cannot kill e2b sandbox %s: %s", self.id, exc)
        finally:
            self._provider.slots.release()


class E2BProvider:
    """Creates E2B sandboxes within the plan's creation rate and concurrency."""

    name = "e2b"

    def __init__(
        self,
        *,
        template: str,
        max_concurrent: int,
        max_creates_per_second: float,
        sandbox_timeout_seconds: int,
        api_key: str | None = None,
        domain: str | None = None,
        sdk: ModuleType | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.template = template
        self.max_concurrent = max_concurrent
        self.sandbox_timeout_seconds = sandbox_timeout_seconds
        self.api_key = api_key or os.environ.get(API_KEY_ENV)
        self.domain = domain
        self.bucket = TokenBucket(max_creates_per_second, sleep=sleep)
        self.slots = asyncio.Semaphore(max_concurrent)
        self._sdk = sdk  # injected by tests; otherwise imported on first use
        self._sleep = sleep
        SANDBOX_CREATE_RATE_LIMIT.labels(self.name).set(max_creates_per_second)
        SANDBOX_PROVIDER_CONCURRENCY_LIMIT.labels(self.name).set(max_concurrent)

    def sdk(self) -> ModuleType:
        if self._sdk is None:
            try:
                self._sdk = importlib.import_module("e2b")
            except ModuleNotFoundError as exc:
                raise SandboxCreateError(
                    "provider e2b needs the e2b package: pip install 'agentrl[e2b]'",
                    provider=self.name,
                ) from exc
        return self._sdk

    async def create(self, request: SandboxRequest) -> E2BSandbox:
        sdk = self.sdk()
        if not self.api_key:
            raise SandboxCreateError(
                f"no E2B API key: set {API_KEY_ENV} (the operator fills it from "
                "spec.sandbox.e2b.apiKeySecretRef)",
                provider=self.name,
            )
        rate_limited = _exc(sdk, "RateLimitException")
        await self.slots.acquire()
        try:
            delay = BACKOFF_INITIAL_SECONDS
            while True:
                await self.bucket.acquire()
                try:
                    kwargs: dict[str, Any] = {
                        "template": request.template or self.template,
                        "timeout": self.sandbox_timeout_seconds,
                        "envs": dict(request.env),
                        "api_key": self.api_key,
                    }
                    if self.domain:
                        kwargs["domain"] = self.domain
                    inner = await sdk.AsyncSandbox.create(**kwargs)
                    break
                except rate_limited as exc:
                    # Quota or rate: wait and try again; the episode's startup timeout bounds
                    # the whole wait, after which it is an infra error.
                    logger.info("e2b: 429 (%s); retrying in %.1fs", exc, delay)
                    from agentrl.sandbox.metrics import SANDBOX_FAILURES

                    SANDBOX_FAILURES.labels(self.name, "create", "SandboxRateLimited").inc()
                    await self._sleep(delay)
                    delay = min(BACKOFF_MAX_SECONDS, delay * 2)
                except Exception as exc:
                    raise SandboxCreateError(
                        f"e2b create failed: {exc}", provider=self.name
                    ) from exc
        except BaseException:
            self.slots.release()
            raise
        sandbox = E2BSandbox(self, inner, request)
        try:
            await sandbox.exec(f"mkdir -p {request.workdir}", timeout=30)
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    async def aclose(self) -> None:
        return None


__all__ = ["E2BProvider", "E2BSandbox", "SandboxRateLimited"]
