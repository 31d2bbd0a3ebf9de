"""The watchdog's state machine, driven step by step with fakes and a fake clock.

Every expectation is counted by hand from the configuration in ``config()`` below.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agentrl.api.wire import WatchdogState
from agentrl.engine.watchdog import (
    ENGINE_EXITED,
    GENERATION_STALL,
    HEALTH_PROBE_FAILED,
    EngineLoad,
    Watchdog,
    WatchdogConfig,
    parse_engine_load,
)
from agentrl.engine.watchdog_report import FakeReporter
from agentrl.engine.weight_pointer import CurrentWeights, write_current_weights
from tests.factories import make_job

FAULT = "Memory access fault by GPU node-0 (Agent handle: 0x1) on address 0x2. Reason: Unknown."


@dataclass
class FakeEngine:
    """The engine as the watchdog sees it: a PID, a health answer, a load, pushed weights.
    ``stop`` kills the PID; the test plays the kubelet with ``restart``."""

    pid: int | None = 100
    healthy: bool = True
    load_value: EngineLoad = field(default_factory=lambda: EngineLoad(0, 0, 0))
    stopped: list[int] = field(default_factory=list)
    pushed: list[str] = field(default_factory=list)
    push_error: str | None = None
    served: str | None = "0"
    """What ``/model_info`` reports (None: unreadable); a successful push sets it."""

    def find(self) -> int | None:
        return self.pid

    async def stop(self, pid: int, grace_seconds: float) -> None:
        self.stopped.append(pid)
        if self.pid == pid:
            self.pid = None

    def restart(self) -> None:
        self.pid = 100 + len(self.stopped) + 1000 * (self.pid or 0)

    async def health_generate(self, timeout: float) -> bool:
        return self.healthy

    async def load(self, timeout: float) -> EngineLoad | None:
        return self.load_value

    async def push_weights(self, weights: CurrentWeights, timeout: float) -> str | None:
        if self.push_error is None:
            self.pushed.append(weights.weight_version)
            self.served = weights.weight_version
        return self.push_error

    async def served_version(self, timeout: float) -> str | None:
        return self.served


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def config(tmp_path: Path, **overrides: object) -> WatchdogConfig:
    job = (
        make_job("swe")
        .with_served_model("/models/qwen3-30b-a3b", "policy")
        .with_inference(
            watchdog={
                "healthIntervalSeconds": 10,
                "failedProbesBeforeRestart": 3,
                "stallSeconds": 60,
                "maxRestarts": 2,
                "restartWindowSeconds": 600,
            },
            startupTimeoutSeconds=300,
        )
        .obj()
    )
    values: dict[str, object] = {
        "log_file": tmp_path / "engine.log",
        "weights_file": tmp_path / "current-weights.json",
        "startup_probe_interval_seconds": 1,
        **overrides,
    }
    return WatchdogConfig.from_job(job, **values)


def make(tmp_path: Path, **overrides: object) -> tuple[Watchdog, FakeEngine, FakeReporter, Clock]:
    (tmp_path / "engine.log").write_text("")
    engine, reporter, clock = FakeEngine(), FakeReporter(), Clock()
    dog = Watchdog(
        config(tmp_path, **overrides),
        endpoints=engine,
        processes=engine,
        reporter=reporter,
        clock=clock,
    )
    return dog, engine, reporter, clock


async def step(dog: Watchdog, times: int = 1) -> None:
    for _ in range(times):
        await dog.step()
        await asyncio.sleep(0)  # let the probe tasks the step started finish


async def become_ready(dog: Watchdog) -> None:
    await step(dog, 3)
    assert dog.state == WatchdogState.READY


def append(tmp_path: Path, line: str) -> None:
    with (tmp_path / "engine.log").open("a") as log:
        log.write(line + "\n")


async def test_engine_is_unready_until_healthy_then_ready(tmp_path: Path) -> None:
    dog, engine, reporter, clock = make(tmp_path)
    engine.healthy = False
    await step(dog, 3)
    assert dog.state == WatchdogState.STARTING
    assert not dog.ready
    engine.healthy = True
    clock.now += 1  # startup probes run every second
    await step(dog, 3)
    assert dog.ready
    assert reporter.reports[-1].state == WatchdogState.READY


async def test_log_fault_takes_readiness_down_stops_the_engine_and_recovers(
    tmp_path: Path,
) -> None:
    dog, engine, reporter, clock = make(tmp_path)
    write_current_weights(
        tmp_path / "current-weights.json",
        CurrentWeights(model_path="/checkpoints/step-7/hf", weight_version="7"),
    )
    await become_ready(dog)
    engine.pushed.clear()  # the first start pushed version 7 too
    append(tmp_path, "[TP0] Decode batch. #running-req: 3")
    append(tmp_path, FAULT)
    await step(dog)
    assert not dog.ready
    assert dog.state == WatchdogState.RECOVERING
    assert engine.stopped == [100]
    assert reporter.events[0][:2] == ("Warning", "EngineFault")
    assert "GPU_MEMORY_ACCESS_FAULT" in reporter.events[0][2]
    assert dog.metrics.faults.labels("GPU_MEMORY_ACCESS_FAULT")._value.get() == 1
    # The kubelet restarts the container 12 s later; one step sees the new PID, one probes.
    clock.now += 12
    engine.restart()
    await step(dog, 3)
    assert dog.ready
    assert engine.pushed == ["7"]
    assert dog.weight_version == "7"
    assert dog.restarts == 1
    assert dog.last_recovery_seconds == 12.0
    assert reporter.events[-1][:2] == ("Normal", "EngineRecovered")


async def test_the_report_follows_the_version_the_engine_serves_whoever_pushed_it(
    tmp_path: Path,
) -> None:
    dog, engine, reporter, clock = make(tmp_path)
    await become_ready(dog)
    await step(dog, 2)  # the first reads of /metrics and /model_info once ready
    assert dog.weight_version == "0"  # what the fresh engine reports; nobody pushed
    # the trainer pushes version 4 straight to the engine (the steady state: not the watchdog)
    engine.served = "4"
    clock.now += 10  # healthIntervalSeconds
    await step(dog, 2)
    assert dog.weight_version == "4"
    assert reporter.reports[-1].weight_version == "4"
    assert engine.pushed == []
    # an unreadable /model_info keeps the last version the engine reported
    engine.served = None
    clock.now += 10
    await step(dog, 2)
    assert reporter.reports[-1].weight_version == "4"
    engine.served = "5"
    clock.now += 10
    await step(dog, 2)
    assert reporter.reports[-1].weight_version == "5"


async def test_a_fault_quoted_in_a_request_log_changes_nothing(tmp_path: Path) -> None:
    dog, engine, _, _ = make(tmp_path)
    await become_ready(dog)
    append(tmp_path, f"Receive: obj=GenerateReqInput(text='{FAULT}')")
    await step(dog, 2)
    assert dog.ready
    assert engine.stopped == []


async def test_health_probes_must_fail_the_configured_number_of_times_in_a_row(
    tmp_path: Path,
) -> None:
    dog, engine, _, clock = make(tmp_path)
    await become_ready(dog)
    engine.healthy = False
    # Probes every 10 s; failedProbesBeforeRestart 3: two failures leave the engine alone.
    for _ in range(2):
        clock.now += 10
        await step(dog, 2)
    assert dog.ready
    assert engine.stopped == []
    clock.now += 10
    await step(dog, 2)
    assert not dog.ready
    assert engine.stopped == [100]
    assert dog.last_fault is not None
    assert dog.last_fault.signature == HEALTH_PROBE_FAILED


async def test_a_passing_probe_resets_the_failure_count(tmp_path: Path) -> None:
    dog, engine, _, clock = make(tmp_path)
    await become_ready(dog)
    for healthy in (False, False, True, False, False):
        engine.healthy = healthy
        clock.now += 10
        await step(dog, 2)
    assert dog.ready
    assert engine.stopped == []


async def test_running_requests_without_new_tokens_for_stall_seconds_is_a_stall(
    tmp_path: Path,
) -> None:
    dog, engine, _, clock = make(tmp_path)
    await become_ready(dog)
    engine.load_value = EngineLoad(
        running_requests=4, generation_tokens_total=500, gen_throughput=0
    )
    # Loads are read every 10 s; the counter stays at 500. Progress was last seen at the
    # first read, so the stall is declared at the read 60 s after it.
    for _ in range(6):
        clock.now += 10
        await step(dog, 2)
    assert dog.ready
    clock.now += 10
    await step(dog, 2)
    assert not dog.ready
    assert dog.last_fault is not None
    assert dog.last_fault.signature == GENERATION_STALL


async def test_an_idle_engine_is_never_stalled(tmp_path: Path) -> None:
    dog, engine, _, clock = make(tmp_path)
    await become_ready(dog)
    engine.load_value = EngineLoad(
        running_requests=0, generation_tokens_total=500, gen_throughput=0
    )
    for _ in range(20):
        clock.now += 10
        await step(dog, 2)
    assert dog.ready


async def test_an_engine_that_exited_by_itself_is_not_stopped_again(tmp_path: Path) -> None:
    dog, engine, _, _ = make(tmp_path)
    await become_ready(dog)
    engine.pid = 555  # crashed and restarted by the kubelet between two polls
    await step(dog)
    assert engine.stopped == []  # the new engine is innocent
    assert not dog.ready
    assert dog.last_fault is not None
    assert dog.last_fault.signature == ENGINE_EXITED
    await step(dog, 3)
    assert dog.ready
    assert dog.restarts == 1


async def test_more_restarts_than_the_limit_within_the_window_is_degraded(
    tmp_path: Path,
) -> None:
    dog, engine, reporter, clock = make(tmp_path)
    await become_ready(dog)
    # maxRestarts 2 within 600 s: the third restart trips the guard.
    for restart in range(1, 4):
        append(tmp_path, FAULT)
        await step(dog)
        clock.now += 30
        engine.restart()
        await step(dog, 3)
        assert dog.restarts == restart
        assert dog.ready
        expected = WatchdogState.DEGRADED if restart == 3 else WatchdogState.READY
        assert dog.state == expected
    crash_loop = [e for e in reporter.events if e[1] == "WatchdogCrashLoop"]
    assert len(crash_loop) == 1
    assert crash_loop[0][0] == "Warning"
    assert "3 times within 600 s (limit 2)" in crash_loop[0][2]
    assert reporter.reports[-1].state == WatchdogState.DEGRADED
    assert reporter.reports[-1].restarts_in_window == 3
    # Restarts were seen at t = 1030, 1060, 1090 (now). Past 1030 + 600 the first leaves the
    # window: two remain, within the limit, so the state is Ready again.
    assert clock.now == 1090
    clock.now = 1030 + 600 + 1
    await step(dog)
    assert dog.state == WatchdogState.READY
    assert reporter.events[-1][1] == "WatchdogCrashLoopCleared"


async def test_an_engine_not_healthy_within_the_startup_timeout_is_stopped_again(
    tmp_path: Path,
) -> None:
    dog, engine, _, clock = make(tmp_path)
    engine.healthy = False
    await step(dog, 2)
    clock.now += 299
    await step(dog, 2)
    assert engine.stopped == []
    clock.now += 1  # startupTimeoutSeconds 300
    await step(dog, 2)
    assert engine.stopped == [100]


async def test_failed_weight_pushes_keep_readiness_down_then_restart_the_engine(
    tmp_path: Path,
) -> None:
    dog, engine, _, clock = make(tmp_path)
    write_current_weights(
        tmp_path / "current-weights.json",
        CurrentWeights(model_path="/checkpoints/step-3/hf", weight_version="3"),
    )
    engine.push_error = "HTTP 400: no such file"
    # weightPushAttempts 3: three failed pushes, then the engine is stopped.
    for _ in range(3):
        clock.now += 1
        await step(dog, 2)
        assert not dog.ready
    assert engine.stopped == [100]
    assert dog.metrics.weight_pushes.labels("failure")._value.get() == 3


def test_engine_load_is_read_from_sglang_prometheus_text() -> None:
    text = (
        "# HELP sglang:num_running_reqs The number of running requests.\n"
        "# TYPE sglang:num_running_reqs gauge\n"
        'sglang:num_running_reqs{model_name="policy",tp_rank="0"} 3.0\n'
        'sglang:num_running_reqs{model_name="policy",tp_rank="1"} 2.0\n'
        "# HELP sglang:generation_tokens_total Number of generation tokens processed.\n"
        "# TYPE sglang:generation_tokens_total counter\n"
        'sglang:generation_tokens_total{model_name="policy"} 12345.0\n'
    )
    load = parse_engine_load(text)
    assert load.running_requests == 5.0  # 3 + 2 over the TP ranks
    assert load.generation_tokens_total == 12345.0
    assert load.gen_throughput is None


@pytest.mark.parametrize("state", list(WatchdogState))
def test_report_serialises_to_camel_case_json(tmp_path: Path, state: WatchdogState) -> None:
    dog, _, _, _ = make(tmp_path)
    report = dog.report().model_copy(update={"state": state})
    text = report.to_annotation()
    assert f'"state":"{state.value}"' in text
    assert '"restartsInWindow":0' in text
    assert '"maxRestarts":2' in text
