"""Start, find and stop the control-plane processes of one local cluster.

Each component runs in its own session (so a signal to the group reaches its children), logs
to ``<state>/logs/<name>.log`` and has a pid file; a pid file counts only while the process it
names still runs the recorded binary, so a stale file after a reboot is ignored.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


class PortInUseError(RuntimeError):
    """A port the cluster needs is taken by another process."""


@dataclass(frozen=True)
class Component:
    """A process of the control plane (or of a real node)."""

    name: str
    argv: list[str]
    #: a network namespace file (``/run/netns/NAME``) the process runs in; None: the machine's
    netns: str | None = None


_CLONE_NEWNET = 0x40000000


def _netns_entry(path: str) -> tuple[Callable[[], None], int]:
    """A preexec function that moves the child into the network namespace ``path`` (between
    fork and exec: only the network namespace changes, so mounts stay shared with the
    machine), and the namespace's fd (the caller closes it after the fork). libc is resolved
    here, in the parent, so the child only makes the system call."""
    import ctypes

    setns = ctypes.CDLL(None, use_errno=True).setns
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def enter() -> None:
        if setns(fd, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({path})")

    return enter, fd


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``host:port`` can be bound right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def port_owner(port: int) -> str:
    """A best-effort description of who listens on ``port`` (from /proc/net/tcp)."""
    target = f"{port:04X}"
    inodes: set[str] = set()
    with contextlib.suppress(OSError):
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[1].endswith(":" + target) and fields[3] == "0A":  # LISTEN
                    inodes.add(fields[9])
    if not inodes:
        return "unknown process"
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (pid_dir / "fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    cmd = (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                    return f"pid {pid_dir.name} ({cmd.strip()[:80]})"
    return "another process"


class ProcessTable:
    """The pid files of one cluster's processes."""

    def __init__(self, state_dir: Path) -> None:
        self.pid_dir = state_dir / "pids"
        self.log_dir = state_dir / "logs"
        # processes this object started: between fork and exec /proc shows the parent's
        # command line, so our own children are checked with poll() instead
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    def _pid_file(self, name: str) -> Path:
        return self.pid_dir / f"{name}.pid"

    def log_path(self, name: str) -> Path:
        """Where component ``name`` logs."""
        return self.log_dir / f"{name}.log"

    def start(self, component: Component, *, env: dict[str, str] | None = None) -> int:
        """Start ``component`` in its own session; returns its pid."""
        self.pid_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path(component.name).open("ab")
        enter, netns_fd = _netns_entry(component.netns) if component.netns else (None, -1)
        try:
            proc = subprocess.Popen(
                component.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
                preexec_fn=enter,  # only a setns(2): libc is resolved before the fork
            )
        finally:
            log.close()
            if netns_fd >= 0:
                os.close(netns_fd)
        self._children[component.name] = proc
        self._pid_file(component.name).write_text(f"{proc.pid}\n{component.argv[0]}\n")
        return proc.pid

    def pid(self, name: str) -> int | None:
        """The live pid of ``name``, or None (no file, dead process, or pid reused)."""
        child = self._children.get(name)
        if child is not None:
            if child.poll() is None and self._pid_file(name).exists():
                return child.pid
            return None
        path = self._pid_file(name)
        try:
            pid_text, binary = path.read_text().splitlines()[:2]
            pid = int(pid_text)
        except (OSError, ValueError):
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return None
        if state == "Z" or cmdline != binary:
            return None
        return pid

    def names(self) -> list[str]:
        """Every component that has a pid file."""
        if not self.pid_dir.exists():
            return []
        return sorted(p.stem for p in self.pid_dir.glob("*.pid"))

    def stop(self, name: str, *, timeout: float = 15.0) -> bool:
        """Stop ``name`` (SIGTERM to its group, then SIGKILL); True if it was running."""
        pid = self.pid(name)
        self._pid_file(name).unlink(missing_ok=True)
        child = self._children.pop(name, None)
        if pid is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (child.poll() is not None) if child else not _alive(pid):
                return True
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        while _alive(pid) and time.monotonic() < deadline + 5:
            time.sleep(0.1)
        return True


def _alive(pid: int) -> bool:
    try:
        # reap if it is our child; ignore if not
        with contextlib.suppress(ChildProcessError):
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                return False
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
