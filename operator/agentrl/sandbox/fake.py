"""An in-memory sandbox provider for tests.

Files live in a dict, commands are answered by a handler function the test supplies, and the
provider counts what a test wants to assert: sandboxes created, closed, live now and the peak
of live sandboxes (the "never more live sandboxes than the concurrency in effect" invariant).
Latency and failures are injected explicitly (``startup_seconds``, ``exec_seconds``,
``fail_creates``), never at random, so tests stay deterministic.

Callers: tests under ``tests/rollout`` and ``tests/sandbox`` (``bench/rollout_concurrency.py``
serves its sandboxes from a fake service of its own, not from this provider).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from agentrl.sandbox.errors import SandboxCreateError, SandboxExecError
from agentrl.sandbox.provider import ExecResult, SandboxBase, SandboxRequest, resolve_path

#: A handler gets the sandbox (to read/write its files) and the command, and returns a result.
ExecHandler = Callable[["FakeSandbox", str], ExecResult]


def _default_handler(sandbox: FakeSandbox, command: str) -> ExecResult:
    """Understands ``cat PATH`` and ``true``; everything else exits 127 like a missing command."""
    if command == "true":
        return ExecResult(exit_code=0)
    if command.startswith("cat "):
        path = resolve_path(sandbox.workdir, command[4:].strip())
        if path in sandbox.files:
            return ExecResult(exit_code=0, stdout=sandbox.files[path].decode(errors="replace"))
        return ExecResult(exit_code=1, stderr=f"cat: {path}: No such file or directory\n")
    return ExecResult(exit_code=127, stderr=f"sh: {command.split()[0]}: not found\n")


@dataclass
class FakeStats:
    """What the fake provider saw; tests assert on it."""

    created: int = 0
    closed: int = 0
    live: int = 0
    peak_live: int = 0
    commands: list[str] = field(default_factory=list)


class FakeSandbox(SandboxBase):
    """One in-memory sandbox."""

    def __init__(self, provider: FakeProvider, sandbox_id: str, request: SandboxRequest) -> None:
        self._provider = provider
        self.id = sandbox_id
        self.workdir = request.workdir
        self.request = request
        self.files: dict[str, bytes] = {}
        self.closed = False

    async def exec(
        self,
        command: str,
        *,
        timeout: float,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        provider = self._provider
        if self.closed:
            raise SandboxExecError(f"sandbox {self.id} is closed", provider="fake")
        provider.stats.commands.append(command)
        if provider.fail_execs > 0:
            provider.fail_execs -= 1
            raise SandboxExecError("injected exec failure", provider="fake")
        if provider.exec_seconds:
            if provider.exec_seconds > timeout:
                await asyncio.sleep(timeout)
                return ExecResult(exit_code=124, timed_out=True, duration_seconds=timeout)
            await asyncio.sleep(provider.exec_seconds)
        result = provider.handler(self, command)
        return result.model_copy(update={"duration_seconds": provider.exec_seconds})

    async def write_file(self, path: str, data: bytes | str) -> None:
        self.files[resolve_path(self.workdir, path)] = (
            data.encode() if isinstance(data, str) else bytes(data)
        )

    async def read_file(self, path: str) -> bytes:
        full = resolve_path(self.workdir, path)
        if full not in self.files:
            raise FileNotFoundError(full)
        return self.files[full]

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        stats = self._provider.stats
        stats.closed += 1
        stats.live -= 1


class FakeProvider:
    """Creates :class:`FakeSandbox` objects with injected latency and failures."""

    name = "fake"

    def __init__(
        self,
        handler: ExecHandler = _default_handler,
        *,
        startup_seconds: float = 0.0,
        exec_seconds: float = 0.0,
        fail_creates: int = 0,
        fail_execs: int = 0,
    ) -> None:
        self.handler = handler
        self.startup_seconds = startup_seconds
        """Delay of every create()."""
        self.exec_seconds = exec_seconds
        """Delay of every exec()."""
        self.fail_creates = fail_creates
        """The next this-many create() calls raise :class:`SandboxCreateError`."""
        self.fail_execs = fail_execs
        """The next this-many exec() calls raise :class:`SandboxExecError`."""
        self.stats = FakeStats()
        self.sandboxes: list[FakeSandbox] = []
        self._ids = itertools.count()

    async def create(self, request: SandboxRequest) -> FakeSandbox:
        if self.startup_seconds:
            await asyncio.sleep(self.startup_seconds)
        if self.fail_creates > 0:
            self.fail_creates -= 1
            raise SandboxCreateError("injected create failure", provider="fake")
        sandbox = FakeSandbox(self, f"fake-{next(self._ids)}", request)
        self.sandboxes.append(sandbox)
        self.stats.created += 1
        self.stats.live += 1
        self.stats.peak_live = max(self.stats.peak_live, self.stats.live)
        return sandbox

    async def aclose(self) -> None:
        for sandbox in self.sandboxes:
            await sandbox.close()
