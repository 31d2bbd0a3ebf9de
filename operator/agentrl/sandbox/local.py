"""The ``local`` provider: a temporary directory on this machine, commands in fresh Linux
namespaces.

Used by ``agentrl run`` and the tests. Each command runs under ``unshare`` in a new network
namespace (only a downed loopback: no network at all), a new PID namespace (the command is PID 1's
child; killing it kills everything it started, daemons included) and a new mount namespace with
its own ``/proc``, plus IPC and UTS namespaces; resource limits (address space, file size, open
files) come from ``spec.sandbox``. The filesystem is the host's: the sandbox directory holds the
task's repository and persists between commands of one episode, and is deleted on ``close``.

What this is not: a security boundary against a hostile process running as root (that is what
the ``kubernetes`` provider with a RuntimeClass, or ``e2b``, is for). It isolates honest episodes
from each other and from the network, and bounds runaway ones.

Which namespace kinds work is probed once per process. A kind that is unavailable (no
``unshare``, a seccomp profile, missing privileges) is logged as an ERROR naming the kind and what
is lost, exported as ``agentrl_sandbox_local_namespace_available{kind}`` = 0, and skipped; with
``strict=True`` the provider refuses to create sandboxes instead.

Callers: :func:`agentrl.sandbox.open_provider` for ``provider: local``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from prometheus_client import Gauge

from agentrl.sandbox.errors import SandboxCreateError, SandboxExecError, SandboxFileError
from agentrl.sandbox.provider import ExecResult, SandboxBase, SandboxRequest

logger = logging.getLogger(__name__)

NAMESPACE_AVAILABLE = Gauge(
    "agentrl_sandbox_local_namespace_available",
    "Whether the local provider can isolate commands with this namespace kind (1) or runs "
    "them without it (0).",
    ["kind"],
)

#: unshare flags per namespace kind, in the order they are probed.
NAMESPACE_FLAGS: dict[str, tuple[str, ...]] = {
    "net": ("--net",),
    "pid": ("--pid", "--fork", "--kill-child"),
    "mount": ("--mount", "--mount-proc"),
    "ipc": ("--ipc",),
    "uts": ("--uts",),
}

#: What is lost without each kind, for the loud fallback message.
_LOSS: dict[str, str] = {
    "net": "commands can reach the network",
    "pid": "processes a command leaves behind are not reliably killed on timeout",
    "mount": "commands see the host's /proc",
    "ipc": "commands share System V IPC with the host",
    "uts": "commands can change the host name",
}

#: Exit status reported for a command killed on timeout (the coreutils ``timeout`` convention).
TIMEOUT_EXIT_CODE = 124

#: Default cap on captured output per stream; the agent-side cap (toolOutputMaxBytes) is applied
#: later, this only keeps a runaway ``yes`` from filling memory.
DEFAULT_MAX_CAPTURE_BYTES = 8 * 1024 * 1024


@functools.cache
def available_namespaces() -> frozenset[str]:
    """Namespace kinds ``unshare`` can create here, probed once per process (and exported)."""
    unshare = shutil.which("unshare")
    found: set[str] = set()
    for kind, flags in NAMESPACE_FLAGS.items():
        ok = False
        if unshare is not None:
            try:
                probe = subprocess.run(
                    [unshare, *flags, "true"], capture_output=True, timeout=10, check=False
                )
                ok = probe.returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                ok = False
        NAMESPACE_AVAILABLE.labels(kind).set(1 if ok else 0)
        if ok:
            found.add(kind)
        else:
            logger.error(
                "local sandbox: %s namespace unavailable (%s); running without it: %s",
                kind,
                "no unshare binary" if unshare is None else "unshare refused",
                _LOSS[kind],
            )
    return frozenset(found)


class _BoundedBuffer:
    """Keeps the first and last ``limit / 2`` bytes of a stream and counts what it drops."""

    def __init__(self, limit: int) -> None:
        self._half = max(1, limit // 2)
        self._head = bytearray()
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_len = 0
        self.dropped = 0

    def feed(self, chunk: bytes) -> None:
        room = self._half - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        self._tail.append(chunk)
        self._tail_len += len(chunk)
        while self._tail_len > self._half:
            first = self._tail[0]
            excess = self._tail_len - self._half
            if len(first) <= excess:
                self._tail.popleft()
                self._tail_len -= len(first)
                self.dropped += len(first)
            else:
                self._tail[0] = first[excess:]
                self._tail_len -= excess
                self.dropped += excess

    def text(self) -> str:
        middle = f"\n[... {self.dropped} bytes dropped ...]\n".encode() if self.dropped else b""
        return (bytes(self._head) + middle + b"".join(self._tail)).decode(errors="replace")


async def _pump(stream: asyncio.StreamReader | None, sink: _BoundedBuffer) -> None:
    if stream is None:
        return
    while chunk := await stream.read(65536):
        sink.feed(chunk)


class LocalSandbox(SandboxBase):
    """One sandbox directory; every command in fresh namespaces."""

    def __init__(self, provider: LocalProvider, root: Path, request: SandboxRequest) -> None:
        self._provider = provider
        self.root = root
        self.id = root.name
        # The request's workdir names a path inside an image; locally the directory is the
        # workspace, so that relative paths mean the same thing under every provider.
        self.workdir = str(root)
        self._env = dict(request.env)
        self._closed = False

    def _path(self, path: str) -> Path:
        full = Path(path) if path.startswith("/") else self.root / path
        resolved = full.resolve()
        if not resolved.is_relative_to(self.root.resolve()):
            raise SandboxFileError(
                f"{path} is outside the local sandbox {self.root}: the local provider shares "
                "the host filesystem and only gives episodes their own directory",
                provider="local",
            )
        return resolved

    async def exec(
        self,
        command: str,
        *,
        timeout: float,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        if self._closed:
            raise SandboxExecError(f"sandbox {self.id} is closed", provider="local")
        workdir = self._path(cwd) if cwd else self.root
        full_env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": str(self.root),
            "LANG": "C.UTF-8",
            "TMPDIR": str(self.root),
            "PYTHONDONTWRITEBYTECODE": "1",
            **self._env,
            **(env or {}),
        }
        argv = [*self._provider.unshare_prefix(), "/bin/sh", "-c", command]
        start = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=workdir,
                env=full_env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its own process group, killed as one on timeout
                preexec_fn=self._provider.apply_limits,
            )
        except OSError as exc:
            raise SandboxExecError(f"cannot start command: {exc}", provider="local") from exc
        out = _BoundedBuffer(self._provider.max_capture_bytes)
        err = _BoundedBuffer(self._provider.max_capture_bytes)
        pumps = asyncio.gather(_pump(proc.stdout, out), _pump(proc.stderr, err), proc.wait())
        timed_out = False
        try:
            await asyncio.wait_for(asyncio.shield(pumps), timeout)
        except TimeoutError:
            timed_out = True
            _kill_group(proc.pid)
            await pumps
        finally:
            if proc.returncode is None:  # cancelled from outside: leave nothing running
                _kill_group(proc.pid)
                await proc.wait()
        code = TIMEOUT_EXIT_CODE if timed_out else proc.returncode
        return ExecResult(
            exit_code=code if code is not None else -1,
            stdout=out.text(),
            stderr=err.text(),
            timed_out=timed_out,
            duration_seconds=time.monotonic() - start,
        )

    async def write_file(self, path: str, data: bytes | str) -> None:
        target = self._path(path)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data.encode() if isinstance(data, str) else data)
        except OSError as exc:
            raise SandboxFileError(f"cannot write {path}: {exc}", provider="local") from exc

    async def read_file(self, path: str) -> bytes:
        target = self._path(path)
        try:
            return target.read_bytes()
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise SandboxFileError(f"cannot read {path}: {exc}", provider="local") from exc

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(shutil.rmtree, self.root, True)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


class LocalProvider:
    """Creates :class:`LocalSandbox` directories under ``base_dir``."""

    name = "local"

    def __init__(
        self,
        *,
        base_dir: str | None = None,
        memory_bytes: int | None = None,
        max_file_bytes: int | None = None,
        max_open_files: int = 4096,
        max_capture_bytes: int = DEFAULT_MAX_CAPTURE_BYTES,
        strict: bool = False,
    ) -> None:
        self.base_dir = Path(base_dir or tempfile.gettempdir())
        self.memory_bytes = memory_bytes
        """RLIMIT_AS of every command (``spec.sandbox.memory``); None leaves it unlimited."""
        self.max_file_bytes = max_file_bytes
        """RLIMIT_FSIZE (``spec.sandbox.ephemeralStorage``): largest file a command writes."""
        self.max_open_files = max_open_files
        self.max_capture_bytes = max_capture_bytes
        self.strict = strict
        """Refuse to run without every namespace kind instead of falling back."""
        self.namespaces = available_namespaces()

    def unshare_prefix(self) -> list[str]:
        """The ``unshare`` argv prefix for the namespace kinds that work here."""
        if not self.namespaces:
            return []
        flags: list[str] = []
        for kind, kind_flags in NAMESPACE_FLAGS.items():
            if kind in self.namespaces:
                flags.extend(kind_flags)
        return ["unshare", *flags, "--"]

    def apply_limits(self) -> None:
        """Runs in the child between fork and exec: set resource limits."""
        if self.memory_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (self.memory_bytes, self.memory_bytes))
        if self.max_file_bytes:
            resource.setrlimit(resource.RLIMIT_FSIZE, (self.max_file_bytes, self.max_file_bytes))
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.max_open_files, self.max_open_files))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    async def create(self, request: SandboxRequest) -> LocalSandbox:
        missing = set(NAMESPACE_FLAGS) - self.namespaces
        if self.strict and missing:
            raise SandboxCreateError(
                f"local sandbox: namespaces {sorted(missing)} unavailable and strict isolation "
                "was requested",
                provider="local",
            )
        try:
            self.base_dir.mkdir(parents=True, exist_ok=True)
            root = Path(tempfile.mkdtemp(prefix="agentrl-sbx-", dir=self.base_dir))
        except OSError as exc:
            raise SandboxCreateError(f"cannot create sandbox dir: {exc}", provider="local") from exc
        return LocalSandbox(self, root, request)

    async def aclose(self) -> None:
        return None
