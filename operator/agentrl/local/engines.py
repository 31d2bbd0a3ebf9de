"""The CPU engines of ``agentrl run``: ``spec.inference.engines`` tiny engine processes on
127.0.0.1, supervised.

Each engine is ``agentrl engine serve-tiny`` in its own process (as a real engine is its own
pod). When one exits — ``--chaos`` makes engines crash with a HIP fault line, as the watchdog
would see on a GPU — the supervisor starts it again on the same port with its initial weights;
the trainer's weight sync then finds it serving an old version and pushes the current one
(:meth:`agentrl.trainer.weight_sync.DiskWeightSync.reconcile`), the same recovery path as on a
cluster. Restarts are counted.

Callers: :mod:`agentrl.local.runner`.
"""

from __future__ import annotations

import asyncio
import ctypes
import random
import signal
import socket
import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel

#: The fault line chaos engines print (a real ROCm signature, so watchdog parsers match it).
CHAOS_FAULT_LINE = "HIP error: an illegal memory access was encountered"


class EngineChaos(BaseModel):
    """Engine faults for ``--chaos``: each engine start crashes after a random number of
    requests with mean ``1 / rate``."""

    rate: float
    """Probability that any one request is the one after which the engine crashes."""
    seed: int = 0


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the run's process dies, however it dies, so
    no engine outlives its run (Linux; elsewhere a no-op)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalEngine:
    """One supervised engine process."""

    def __init__(
        self,
        index: int,
        *,
        model_path: Path,
        weight_version: str,
        context_length: int,
        max_running_requests: int,
        log_dir: Path,
        seed: int,
        chaos: EngineChaos | None,
    ) -> None:
        self.index = index
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model_path = model_path
        self.weight_version = weight_version
        self.context_length = context_length
        self.max_running_requests = max_running_requests
        self.log_file = log_dir / f"engine-{index}.log"
        self.seed = seed
        self.chaos = chaos
        self._rng = random.Random(f"{chaos.seed if chaos else 0}:{index}")
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def argv(self) -> list[str]:
        argv = [
            sys.executable, "-c", "from agentrl.tiny.server import serve_tiny; serve_tiny()",
            "--model-path", str(self.model_path),
            "--port", str(self.port),
            "--weight-version", self.weight_version,
            "--context-length", str(self.context_length),
            "--max-running-requests", str(self.max_running_requests),
            "--seed", str(self.seed + 1000 * self.restarts),
            "--log-file", str(self.log_file),
        ]  # fmt: skip
        if self.chaos is not None and self.chaos.rate > 0:
            after = max(1, int(self._rng.expovariate(self.chaos.rate)))
            argv += ["--fault-mode", "crash", "--fault-after-requests", str(after),
                     "--fault-line", CHAOS_FAULT_LINE]  # fmt: skip
        return argv

    def start(self) -> None:
        with self.log_file.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
            )

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class LocalEngines:
    """All engines of a local run, with a supervisor task that restarts the ones that exit."""

    def __init__(self, engines: list[LocalEngine]) -> None:
        self.engines = engines
        self._task: asyncio.Task[None] | None = None

    @property
    def urls(self) -> list[str]:
        return [e.url for e in self.engines]

    @property
    def restarts(self) -> int:
        return sum(e.restarts for e in self.engines)

    def start(self) -> None:
        for engine in self.engines:
            engine.start()
        self._task = asyncio.get_running_loop().create_task(self._supervise())

    async def _supervise(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            for engine in self.engines:
                if engine.process is not None and engine.process.poll() is not None:
                    engine.restarts += 1
                    engine.start()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for engine in self.engines:
            engine.stop()
