"""The watchdog against a real faulting engine process (the tiny CPU engine with fault
injection), a supervisor playing the kubelet, real ``/proc`` process control and real HTTP.

The supervisor restarts the engine with the very same argv whenever it exits, as the kubelet
restarts a container; every start is recorded, so the tests can check that the watchdog never
changed the engine's flags.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentrl.api.wire import WatchdogState
from agentrl.engine.processes import ProcEngineProcesses
from agentrl.engine.watchdog import HttpEngineEndpoints, Watchdog, WatchdogConfig
from agentrl.engine.watchdog_report import FakeReporter
from agentrl.engine.weight_pointer import CurrentWeights, write_current_weights

pytestmark = pytest.mark.slow

FAULT = (
    ":0:rocdevice.cpp            :3020: 2383741117 us: Callback: Queue 0x7f1b3c200000 aborting "
    "with error : HSA_STATUS_ERROR_EXCEPTION: An HSAIL operation resulted in a hardware "
    "exception. code: 0x1016"
)
#: How long the watchdog may take from the fault to ready again here: an engine start on two
#: shared cores is about 3 s (torch import and model load), plus polling.
RECOVERY_BOUND_SECONDS = 45.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tiny = pytest.importorskip("agentrl.tiny.policy", reason="the tiny engine needs torch")
    directory = tmp_path_factory.mktemp("policy")
    tiny.save_policy(tiny.new_policy(0), directory)
    return directory


class Kubelet:
    """Restarts the engine with the same argv whenever it exits."""

    def __init__(self, argv: list[str], output: Path) -> None:
        self.argv = argv
        self.output = output
        self.starts: list[list[str]] = []
        self.exit_codes: list[int] = []
        self.process: asyncio.subprocess.Process | None = None
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while not self._stopping:
            with self.output.open("ab") as out:
                self.process = await asyncio.create_subprocess_exec(
                    *self.argv, stdout=out, stderr=out, start_new_session=True
                )
            self.starts.append(list(self.argv))
            self.exit_codes.append(await self.process.wait())
            await asyncio.sleep(0.2)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        self._stopping = True
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(self._task, 10)


@contextlib.asynccontextmanager
async def running(
    tmp_path: Path, policy_dir: Path, fault: list[str], **overrides: object
) -> AsyncIterator[tuple[Watchdog, Kubelet, FakeReporter, str]]:
    port = free_port()
    log_file = tmp_path / "engine.log"
    log_file.touch()
    agentrl = shutil.which("agentrl") or sys.exit("agentrl is not installed")
    argv = [
        agentrl, "engine", "serve-tiny",
        "--model-path", str(policy_dir),
        "--port", str(port),
        "--log-file", str(log_file),
        *fault,
    ]  # fmt: skip
    kubelet = Kubelet(argv, tmp_path / "engine.out")
    reporter = FakeReporter()
    config = WatchdogConfig.model_validate(
        {
            "engine_url": f"http://127.0.0.1:{port}",
            "log_file": log_file,
            "engine_cmdline": str(log_file),  # unique to this test's engine
            "weights_file": tmp_path / "current-weights.json",
            "poll_interval_seconds": 0.1,
            "startup_probe_interval_seconds": 0.2,
            "health_interval_seconds": 0.5,
            "health_timeout_seconds": 1.0,
            "failed_probes_before_restart": 2,
            "stop_grace_seconds": 2,
            "recover_timeout_seconds": 60,
            **overrides,
        }
    )
    endpoints = HttpEngineEndpoints(config.engine_url)
    dog = Watchdog(
        config,
        endpoints=endpoints,
        processes=ProcEngineProcesses(config.engine_cmdline),
        reporter=reporter,
    )
    stop = asyncio.Event()
    kubelet.start()
    loop_task = asyncio.ensure_future(dog.run(stop))
    try:
        yield dog, kubelet, reporter, config.engine_url
    finally:
        stop.set()
        await asyncio.wait_for(loop_task, 10)
        await endpoints.close()
        await kubelet.stop()


async def wait_for(predicate, timeout: float) -> float:  # type: ignore[no-untyped-def]
    """Seconds until ``predicate()`` held; fails the test after ``timeout``."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def generate(url: str, max_new_tokens: int = 4) -> dict[str, object]:
    import aiohttp

    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": max_new_tokens}}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{url}/generate", json=body, timeout=aiohttp.ClientTimeout(total=30)) as r,
    ):
        assert r.status == 200
        result: dict[str, object] = await r.json()
        return result


async def test_a_crashing_engine_is_restarted_with_its_flags_and_current_weights(
    tmp_path: Path, policy_dir: Path
) -> None:
    write_current_weights(
        tmp_path / "current-weights.json",
        CurrentWeights(model_path=str(policy_dir), weight_version="7"),
    )
    fault = ["--fault-line", FAULT, "--fault-after-requests", "2", "--fault-mode", "crash"]
    async with running(tmp_path, policy_dir, fault) as (dog, kubelet, reporter, url):
        await wait_for(lambda: dog.ready, 60)
        assert dog.weight_version == "7"  # pushed on the first start too
        await generate(url)
        await generate(url)  # the second answer arms the crash
        await wait_for(lambda: not dog.ready, 10)
        # The exit and the fault line may be seen in either order; the incident ends up named
        # by the line either way.
        await wait_for(lambda: dog.last_fault is not None and dog.last_fault.line == FAULT, 5)
        assert dog.last_fault is not None
        assert dog.last_fault.signature == "HSA_HARDWARE_EXCEPTION"
        recovered_in = await wait_for(lambda: dog.ready, RECOVERY_BOUND_SECONDS)
        assert recovered_in < RECOVERY_BOUND_SECONDS
        assert len(kubelet.starts) == 2
        assert kubelet.starts[0] == kubelet.starts[1]  # same flags after the restart
        assert kubelet.exit_codes[0] != 0
        assert dog.restarts == 1
        assert dog.state == WatchdogState.READY
        assert dog.metrics.faults.labels("HSA_HARDWARE_EXCEPTION")._value.get() == 1
        reasons = [reason for _, reason, _ in reporter.events]
        assert reasons == ["EngineFault", "EngineRecovered"]
        # The new engine serves the re-pushed version, as /get_model_info reports it.
        import aiohttp

        async with aiohttp.ClientSession() as http, http.get(f"{url}/get_model_info") as r:
            assert (await r.json())["weight_version"] == "7"


async def test_the_watchdog_reports_the_version_the_trainer_pushed_to_the_engine(
    tmp_path: Path, policy_dir: Path
) -> None:
    """Steady state: the trainer pushes weights to the engine itself (its EngineClient, as the
    disk weight sync does); the watchdog's report follows what the engine then serves."""
    from agentrl.engine_client.client import EngineClient

    async with running(tmp_path, policy_dir, []) as (dog, _, reporter, url):
        await wait_for(lambda: dog.ready, 60)
        await wait_for(lambda: dog.weight_version == "0", 5)  # the fresh engine's version
        async with EngineClient(url, max_connections=1) as client:
            for version in ("1", "2"):
                result = await client.update_weights_from_disk(
                    str(policy_dir), weight_version=version, flush_cache=False
                )
                assert result.success
                await wait_for(lambda v=version: dog.weight_version == v, 5)  # type: ignore[misc]
                assert reporter.reports[-1].weight_version == version
        assert dog.metrics.weight_pushes.labels("success")._value.get() == 0  # not ours


async def test_a_hung_engine_is_stopped_and_restarted(tmp_path: Path, policy_dir: Path) -> None:
    fault = ["--fault-after-requests", "1", "--fault-mode", "hang"]
    async with running(tmp_path, policy_dir, fault) as (dog, kubelet, _, url):
        await wait_for(lambda: dog.ready, 60)
        await generate(url)  # after this answer the engine stops answering HTTP
        # 2 failed probes 0.5 s apart, each timing out after 1 s.
        await wait_for(lambda: not dog.ready, 15)
        assert dog.last_fault is not None
        assert dog.last_fault.signature == "HEALTH_PROBE_FAILED"
        await wait_for(lambda: dog.ready, RECOVERY_BOUND_SECONDS)
        assert len(kubelet.starts) == 2
        assert kubelet.starts[0] == kubelet.starts[1]
        # The watchdog stopped it: a hung engine never exits by itself, so its one exit is the
        # watchdog's SIGTERM (killed by the signal, or 0 when its handler shut it down cleanly),
        # never the positive code of a crash.
        assert kubelet.exit_codes[0] <= 0


async def test_an_engine_that_crashes_at_every_start_trips_the_crash_loop_guard(
    tmp_path: Path, policy_dir: Path
) -> None:
    fault = ["--fault-line", FAULT, "--fault-after-requests", "0", "--fault-mode", "crash"]
    async with running(tmp_path, policy_dir, fault, max_restarts=1) as (dog, kubelet, rep, _):
        # maxRestarts 1: the second restart (third start) trips the guard.
        await wait_for(lambda: dog.state == WatchdogState.DEGRADED, 60)
        assert dog.restarts == 2
        assert not dog.ready
        assert [r for _, r, _ in rep.events].count("WatchdogCrashLoop") == 1
        assert rep.reports[-1].state == WatchdogState.DEGRADED
        assert all(start == kubelet.starts[0] for start in kubelet.starts)


async def test_requests_in_flight_at_a_stall_come_back_to_the_rollout_as_infra_errors(
    tmp_path: Path, policy_dir: Path
) -> None:
    from agentrl.engine_client.client import EngineClient, EngineUnavailable, SamplingParams
    from agentrl.rollout.episode import infra_reason

    fault = ["--fault-after-requests", "1", "--fault-mode", "stall"]
    async with running(tmp_path, policy_dir, fault, stall_seconds=1.5) as (dog, _, _, url):
        await wait_for(lambda: dog.ready, 60)
        async with EngineClient(url, max_connections=4, timeout_seconds=60) as client:
            await client.generate([1, 2, 3], SamplingParams(max_new_tokens=2))
            await asyncio.sleep(0.5)  # the stall sets in 0.05 s after that answer
            # The engine now generates nothing but still reports the request as running; the
            # watchdog stops it after 1.5 s without a token, and the request is cut off.
            with pytest.raises(EngineUnavailable) as caught:
                await client.generate([1, 2, 3], SamplingParams(max_new_tokens=8))
        assert infra_reason(caught.value) == "engine_unavailable"  # never a reward of 0
        assert dog.last_fault is not None
        assert dog.last_fault.signature == "GENERATION_STALL"
