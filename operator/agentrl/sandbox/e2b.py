"""The ``e2b`` provider: E2B cloud microVMs through the ``e2b`` package's ``AsyncSandbox``.

The package is imported when the first sandbox is created (extra ``agentrl[e2b]``), so the
operator and ``import agentrl`` never need it. Limits come from ``spec.sandbox.e2b``: creations are
paced by ``maxCreatesPerSecond`` (token bucket) and live sandboxes capped by ``maxConcurrent``
(your plan's limits; both exported as metrics, and the scheduler's effective concurrency is
already capped by the latter). A refused creation (429 ``RateLimitException``, or 503
``ServiceBusyException``: no capacity right now) is retried with exponential backoff until the
episode's startup timeout runs out. The SDK's own retries of those answers are turned off for
creations (``retries=0``, SDK 2.x), so every attempt goes through the token bucket and every
refusal is counted; ``kill`` gets them back. The API key comes from the environment variable the
rollout worker is given (``E2B_API_KEY``, for ``spec.sandbox.e2b.apiKeySecretRef``).

Commands run through envd, which does not kill a process when its stream ends (the SDK can
reattach to it), so each command runs under coreutils ``timeout`` inside the sandbox, like the
kubernetes provider: at its timeout it and everything it started are killed (exit 124). We also
stop waiting a grace period later: the SDK sends its ``timeout`` to envd but does not itself end a
stream that has started (SDK 2.63 waited 5 s for a fake envd with ``timeout=0.5``).

A command that exits non-zero is a result (E2B raises ``CommandExitException`` for it; we turn it
back into an :class:`~agentrl.sandbox.provider.ExecResult`); E2B's own failures are
:class:`~agentrl.sandbox.errors.SandboxError`. SDK 2.x makes a sandbox that stopped
(``SandboxNotRunningException``) or cannot be reached (``SandboxUnreachableException``) subclasses
of ``TimeoutException``; they are :class:`~agentrl.sandbox.errors.SandboxGone`, never a command
timeout, and a ``TimeoutException`` before the command's own timeout is an infra error too.

Tested against the real SDK in ``tests/sandbox/test_e2b_sdk_contract.py`` (names and signatures)
and ``tests/sandbox/test_e2b_sdk_http.py`` (over HTTP, against a local fake of E2B's API and envd).

Callers: :func:`agentrl.sandbox.open_provider` for ``provider: e2b``.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import os
import re
import shlex
import time
from collections.abc import Awaitable, Callable, Mapping
from types import ModuleType
from typing import Any

from agentrl.sandbox.errors import (
    SandboxCreateError,
    SandboxExecError,
    SandboxFileError,
    SandboxGone,
    SandboxRateLimited,
)
from agentrl.sandbox.metrics import (
    SANDBOX_CREATE_RATE_LIMIT,
    SANDBOX_FAILURES,
    SANDBOX_PROVIDER_CONCURRENCY_LIMIT,
)
from agentrl.sandbox.provider import ExecResult, SandboxBase, SandboxRequest, resolve_path
from agentrl.sandbox.ratelimit import TokenBucket

logger = logging.getLogger(__name__)

API_KEY_ENV = "E2B_API_KEY"
#: Backoff after a refused creation (429/503): first wait, and the longest single wait.
BACKOFF_INITIAL_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 30.0
#: SDK exception names that mean "refused for rate, quota or capacity: back off and retry".
REFUSED = ("RateLimitException", "ServiceBusyException")
#: We stop waiting for a command this long after its timeout: the ``timeout`` inside the sandbox
#: answers first (exit 124); this deadline (ours, and the one the SDK sends envd) only catches a
#: command whose output stays open past its kill (a daemon it started) or a silent sandbox.
EXEC_DEADLINE_GRACE_SECONDS = 5.0
#: Seconds between ``timeout``'s SIGTERM and its SIGKILL (``timeout -k``).
KILL_AFTER_SECONDS = 1
#: Retries of ``kill`` for 429/502/503/504 answers: the SDK's default (``DEFAULT_RETRIES`` in
#: ``e2b.connection_config``), given back because the sandbox inherits ``retries=0`` from its
#: creation. An unkilled sandbox counts against the plan until its E2B timeout.
KILL_RETRIES = 3
#: Seconds for each command that prepares the working directory.
WORKDIR_TIMEOUT_SECONDS = 30.0
#: The E2B user that may create any directory (the default user usually may not create
#: ``/workspace``).
ROOT_USER = "root"
_OWNER_MARK = "agentrl-workdir-owner="


def _exc(sdk: ModuleType, name: str) -> type[BaseException]:
    """The SDK's exception class ``name``, or a class nothing raises when this SDK version has
    none (``tests/sandbox/test_e2b_sdk_contract.py`` checks every name used here exists)."""
    found = getattr(sdk, name, None)
    return found if isinstance(found, type) else type(f"_Missing{name}", (Exception,), {})


def _excs(sdk: ModuleType, *names: str) -> tuple[type[BaseException], ...]:
    return tuple(_exc(sdk, name) for name in names)


def _has_retries_option(sdk: ModuleType) -> bool:
    """Whether this SDK takes the ``retries`` connection option (2.x; 1.x would reject it)."""
    config = getattr(sdk, "ConnectionConfig", None)
    if config is None:
        return False
    try:
        return "retries" in inspect.signature(config).parameters
    except (TypeError, ValueError):
        return False


def timed_command(command: str, timeout: float) -> str:
    """``command`` under coreutils ``timeout`` in ``/bin/sh``: exit 124 at ``timeout``, SIGKILL
    ``KILL_AFTER_SECONDS`` after SIGTERM, the whole process group."""
    return (
        f"timeout -k {KILL_AFTER_SECONDS} {max(timeout, 0.001):g} /bin/sh -c {shlex.quote(command)}"
    )


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
        return await self._run(command, timeout=timeout, cwd=cwd or self.workdir, env=env)

    async def _run(
        self,
        command: str,
        *,
        timeout: float,
        cwd: str,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
    ) -> ExecResult:
        sdk = self._provider.sdk()
        exit_exc = _exc(sdk, "CommandExitException")
        # Before TimeoutException: SDK 2.x derives both from it.
        gone = _excs(sdk, "SandboxNotRunningException", "SandboxUnreachableException")
        timeout_exc = _exc(sdk, "TimeoutException")
        options: dict[str, Any] = {
            "cwd": cwd,
            "envs": {**self._env, **(env or {})},
            "timeout": timeout + EXEC_DEADLINE_GRACE_SECONDS,
        }
        if user is not None:
            options["user"] = user  # otherwise envd's default user
        start = time.monotonic()
        try:
            result = await asyncio.wait_for(
                self._inner.commands.run(timed_command(command, timeout), **options),
                options["timeout"],
            )
        except exit_exc as exc:
            result = exc  # carries exit_code, stdout, stderr
        except gone as exc:
            raise SandboxGone(f"e2b sandbox {self.id} is gone: {exc}", provider="e2b") from exc
        except (timeout_exc, TimeoutError) as exc:
            elapsed = time.monotonic() - start
            if elapsed < timeout:
                # The stream did not open, or a proxy cancelled it: not the command's timeout.
                raise SandboxExecError(
                    f"e2b exec failed after {elapsed:.1f}s of its {timeout:g}s: {exc}",
                    provider="e2b",
                ) from exc
            logger.warning("e2b sandbox %s: a command outlived its %gs timeout", self.id, timeout)
            return ExecResult(exit_code=124, timed_out=True, duration_seconds=elapsed)
        except Exception as exc:
            raise SandboxExecError(f"e2b exec failed: {exc}", provider="e2b") from exc
        exit_code = int(getattr(result, "exit_code", 0) or 0)
        return ExecResult(
            exit_code=exit_code,
            stdout=str(getattr(result, "stdout", "") or ""),
            stderr=str(getattr(result, "stderr", "") or ""),
            timed_out=exit_code == 124,
            duration_seconds=time.monotonic() - start,
        )

    async def prepare_workdir(self) -> None:
        """Create the working directory, owned by envd's default user (who runs the commands).

        The default user makes it when it may; otherwise root makes it and hands it over (the
        default user's uid:gid come back from the first command). Both run in ``/``: envd cannot
        start a command in a directory that does not exist yet.
        """
        quoted = shlex.quote(self.workdir)
        probe = await self._run(
            f'mkdir -p {quoted} 2>/dev/null || echo "{_OWNER_MARK}$(id -u):$(id -g)"',
            timeout=WORKDIR_TIMEOUT_SECONDS,
            cwd="/",
        )
        marks = [line for line in probe.stdout.splitlines() if line.startswith(_OWNER_MARK)]
        if probe.ok and not marks:
            return
        owner = marks[0].removeprefix(_OWNER_MARK).strip() if marks else ""
        if not probe.ok or not re.fullmatch(r"\d+:\d+", owner):
            raise SandboxCreateError(
                f"e2b sandbox {self.id}: cannot create {self.workdir}: {probe.output.strip()}",
                provider="e2b",
            )
        made = await self._run(
            f"mkdir -p {quoted} && chown {owner} {quoted}",
            timeout=WORKDIR_TIMEOUT_SECONDS,
            cwd="/",
            user=ROOT_USER,
        )
        if not made.ok:
            raise SandboxCreateError(
                f"e2b sandbox {self.id}: cannot create {self.workdir} as {ROOT_USER}: "
                f"{made.output.strip()}",
                provider="e2b",
            )

    async def write_file(self, path: str, data: bytes | str) -> None:
        try:
            await self._inner.files.write(resolve_path(self.workdir, path), data)
        except Exception as exc:
            raise SandboxFileError(f"e2b write {path} failed: {exc}", provider="e2b") from exc

    async def read_file(self, path: str) -> bytes:
        # FileNotFoundException is 2.x's name; NotFoundException (its base) is 1.x's.
        not_found = _excs(self._provider.sdk(), "FileNotFoundException", "NotFoundException")
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
            await self._inner.kill(**self._provider.kill_options())
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

    def create_options(self, request: SandboxRequest) -> dict[str, Any]:
        """Keyword arguments of ``AsyncSandbox.create`` for ``request``."""
        options: dict[str, Any] = {
            "template": request.template or self.template,
            "timeout": self.sandbox_timeout_seconds,
            "envs": dict(request.env),
            "metadata": {"agentrl-episode": request.episode_id},
            "api_key": self.api_key,
        }
        if self.domain:
            options["domain"] = self.domain
        if _has_retries_option(self.sdk()):
            options["retries"] = 0  # ours: paced by the bucket, counted, bounded by the episode
        return options

    def kill_options(self) -> dict[str, Any]:
        """Keyword arguments of ``AsyncSandbox.kill``."""
        return {"retries": KILL_RETRIES} if _has_retries_option(self.sdk()) else {}

    async def create(self, request: SandboxRequest) -> E2BSandbox:
        sdk = self.sdk()
        if not self.api_key:
            raise SandboxCreateError(
                f"no E2B API key: set {API_KEY_ENV} to the key in spec.sandbox.e2b.apiKeySecretRef",
                provider=self.name,
            )
        refused = _excs(sdk, *REFUSED)
        options = self.create_options(request)
        await self.slots.acquire()
        try:
            delay = BACKOFF_INITIAL_SECONDS
            while True:
                await self.bucket.acquire()
                try:
                    inner = await sdk.AsyncSandbox.create(**options)
                    break
                except refused as exc:
                    # Rate, quota or capacity: wait and try again; the episode's startup timeout
                    # bounds the whole wait, after which it is an infra error.
                    logger.info("e2b: creation refused (%s); retrying in %.1fs", exc, delay)
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
            await sandbox.prepare_workdir()
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    async def aclose(self) -> None:
        return None


__all__ = ["E2BProvider", "E2BSandbox", "SandboxRateLimited"]
