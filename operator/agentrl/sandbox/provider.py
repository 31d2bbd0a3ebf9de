"""The sandbox interface every provider implements, kept deliberately small.

An episode needs five things from a sandbox: to get one (``create``), to run a command in it
(``exec``), to put a file in and take one out (``write_file``, ``read_file``) and to give it back
(``close``). Everything else (images, pods, microVMs, namespaces) is the provider's business.
A small surface is what lets the local, Kubernetes and E2B providers, and the fake used by the
tests, be swapped by one manifest field (``spec.sandbox.provider``).

Callers: :mod:`agentrl.rollout.episode` (one sandbox per episode attempt), the verifier, and
``agentrl tasks validate``. Providers live beside this module; :func:`agentrl.sandbox.open_provider`
picks one from the spec.

Paths given to ``write_file``/``read_file``/``exec(cwd=)`` are relative to ``Sandbox.workdir``
unless absolute. A command that exits non-zero or runs past its timeout is a result, never an
exception; exceptions (:mod:`agentrl.sandbox.errors`) mean the infrastructure failed.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Protocol, Self, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field


class SandboxRequest(BaseModel):
    """What one episode asks of a provider."""

    model_config = ConfigDict(frozen=True)

    episode_id: str = Field(min_length=1)
    """Unique id of the episode attempt; providers put it in names and labels."""
    image: str | None = None
    """Container image of the task (Kubernetes); ``None`` uses ``spec.sandbox.image``."""
    template: str | None = None
    """E2B template of the task; ``None`` uses ``spec.sandbox.e2b.template``."""
    workdir: str = "/workspace"
    """Directory commands start in and relative paths resolve against. The local provider
    maps it into its temporary directory."""
    env: Mapping[str, str] = Field(default_factory=dict)
    """Environment of every command."""


class ExecResult(BaseModel):
    """The outcome of one command: what the agent (or the verifier) sees."""

    exit_code: int
    """Process exit status; ``-9``-style negative numbers for signals, 124 on timeout."""
    stdout: str = ""
    """Standard output, decoded as UTF-8 with replacement."""
    stderr: str = ""
    """Standard error, decoded as UTF-8 with replacement."""
    timed_out: bool = False
    """The command ran past its timeout and was killed (with everything it started)."""
    duration_seconds: float = 0.0
    """Wall time of the command as the provider measured it."""

    @property
    def output(self) -> str:
        """Stdout then stderr, the way a terminal shows them."""
        if self.stderr and self.stdout:
            return f"{self.stdout.rstrip(chr(10))}\n{self.stderr}"
        return self.stdout or self.stderr

    @property
    def ok(self) -> bool:
        """Exit status 0 and not timed out."""
        return self.exit_code == 0 and not self.timed_out


@runtime_checkable
class Sandbox(Protocol):
    """One live sandbox, leased by one episode attempt."""

    id: str
    """Provider-specific identity (pod name, E2B sandbox id, directory)."""
    workdir: str
    """Where commands start and relative paths point."""

    async def exec(
        self,
        command: str,
        *,
        timeout: float,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        """Run ``command`` with ``/bin/sh -c``; kill it and everything it started after
        ``timeout`` seconds."""
        ...

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Create or replace a file (parent directories are created)."""
        ...

    async def read_file(self, path: str) -> bytes:
        """Read a whole file; a missing file raises :class:`FileNotFoundError`."""
        ...

    async def close(self) -> None:
        """Destroy the sandbox. Idempotent; never raises for an already-gone sandbox."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


@runtime_checkable
class SandboxProvider(Protocol):
    """Creates sandboxes. One provider serves every episode of a rollout worker."""

    name: str
    """``local``, ``kubernetes``, ``e2b`` or ``fake``: the label of its metrics."""

    async def create(self, request: SandboxRequest) -> Sandbox:
        """Create a sandbox and wait until commands can run in it."""
        ...

    async def aclose(self) -> None:
        """Release provider resources (HTTP sessions) and reap what this worker left behind."""
        ...


class SandboxBase:
    """Context-manager plumbing shared by the providers' sandbox classes."""

    async def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def resolve_path(workdir: str, path: str) -> str:
    """``path`` made absolute against ``workdir`` (POSIX, no normalisation of ``..``: the
    sandbox is the security boundary, not this function)."""
    if path.startswith("/"):
        return path
    return f"{workdir.rstrip('/')}/{path}"
