"""Finding and stopping the engine process from the watchdog sidecar.

Called by ``agentrl.engine.watchdog``. The engine pod runs with ``shareProcessNamespace: true``,
so the sidecar sees the engine container's processes in ``/proc`` and can signal them (it runs
as the engine's user, or with ``CAP_KILL``). It finds the engine by a substring of its command
line (``sglang.launch_server``) and stops its whole process group: SGLang's scheduler and
detokenizer are children of that process, and a hung one would otherwise keep the GPU.
``agentrl engine launch`` makes the engine lead its own process group for exactly this reason.

When the engine's main process exits, its container exits and the kubelet restarts it on the
same GPU with the same command: the watchdog never starts an engine itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)


class EngineProcesses(Protocol):
    """What the watchdog needs from the process table (a fake stands in for it in tests)."""

    def find(self) -> int | None:
        """PID of the engine's main process, or None when no engine runs."""
        ...

    async def stop(self, pid: int, grace_seconds: float) -> None:
        """SIGTERM the engine's process group, SIGKILL it after ``grace_seconds``."""
        ...


@dataclass(frozen=True)
class _Proc:
    pid: int
    ppid: int
    start_ticks: int
    cmdline: str


def _read_proc(pid: int, proc_root: Path) -> _Proc | None:
    """One live (non-zombie) process, or None when it is gone or unreadable."""
    base = proc_root / str(pid)
    try:
        raw_cmdline = (base / "cmdline").read_bytes()
        stat = (base / "stat").read_text()
    except OSError:
        return None
    # stat is "pid (comm) state ppid ... starttime(22nd field) ..."; comm may hold spaces and
    # parentheses, so split after its last ")".
    fields = stat[stat.rfind(")") + 2 :].split()
    if not fields or fields[0] in ("Z", "X"):
        return None
    cmdline = raw_cmdline.replace(b"\0", b" ").decode("utf-8", "replace").strip()
    return _Proc(pid=pid, ppid=int(fields[1]), start_ticks=int(fields[19]), cmdline=cmdline)


def is_alive(pid: int, proc_root: Path = Path("/proc")) -> bool:
    """Whether ``pid`` is a live process (a zombie awaiting its parent counts as gone)."""
    return _read_proc(pid, proc_root) is not None


@dataclass
class ProcEngineProcesses:
    """:class:`EngineProcesses` over ``/proc`` and POSIX signals."""

    cmdline_pattern: str
    """Substring of the engine's command line (``sglang.launch_server``)."""
    proc_root: Path = Path("/proc")
    """Where the process table is (a shared PID namespace makes the engine's visible)."""

    def find(self) -> int | None:
        """The oldest matching process whose parent does not match too (the main process,
        not one of its children)."""
        own = os.getpid()
        matches: dict[int, _Proc] = {}
        for entry in self.proc_root.iterdir():
            if not entry.name.isdigit() or int(entry.name) == own:
                continue
            proc = _read_proc(int(entry.name), self.proc_root)
            if proc is not None and self.cmdline_pattern in proc.cmdline:
                matches[proc.pid] = proc
        roots = [p for p in matches.values() if p.ppid not in matches]
        if not roots:
            return None
        return min(roots, key=lambda p: (p.start_ticks, p.pid)).pid

    async def stop(self, pid: int, grace_seconds: float) -> None:
        """Stop the engine's process group (only the process itself when it does not lead a
        group: never signal a group that also holds someone else, such as a supervisor)."""
        try:
            group = os.getpgid(pid)
        except ProcessLookupError:
            return
        targets_group = group == pid

        def send(sig: signal.Signals) -> None:
            with contextlib.suppress(ProcessLookupError):
                if targets_group:
                    os.killpg(group, sig)
                else:
                    os.kill(pid, sig)

        log.warning(
            "stopping engine pid %d (%s) with SIGTERM", pid, "group" if targets_group else "process"
        )
        send(signal.SIGTERM)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_seconds
        while loop.time() < deadline:
            if not is_alive(pid, self.proc_root):
                return
            await asyncio.sleep(0.05)
        log.warning("engine pid %d still alive after %.1f s: SIGKILL", pid, grace_seconds)
        send(signal.SIGKILL)
