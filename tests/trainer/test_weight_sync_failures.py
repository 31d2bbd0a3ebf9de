"""Weight pushes that fail: each push is tried ``weightSync.pushAttempts`` times with a doubling
backoff (a fake clock records the waits), a push still failing counts one failure for that
engine, failures in a row are counted per engine and exported, a push the engine takes clears
them, and the driver's progress report carries them to the operator. Fake engine clients for
the counting; the real tiny engine for a refusal it really answers."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from prometheus_client import REGISTRY

from agentrl.api.trainer import WeightSync as WeightSyncSpec
from agentrl.api.wire import WeightPushFailure
from agentrl.engine_client.client import (
    EngineClient,
    EngineUnavailable,
    ModelInfo,
    UpdateWeightsResult,
)
from agentrl.tiny import policy as tiny
from agentrl.tiny.server import TinyEngine, build_app
from agentrl.trainer.checkpoint import DriverState
from agentrl.trainer.progress import FakeProgressReporter, ProgressTracker, to_annotation
from agentrl.trainer.weight_sync import (
    DiskWeightSync,
    DistributedWeightSync,
    PushRetry,
    SyncReport,
    observe_failures,
)
from tests.trainer.test_trainer_cli import _record


class FakeClock:
    """Records the waits instead of sleeping them."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)


class FakeEngine:
    """An engine client whose weight updates answer from a script: ``"ok"``, ``"refuse"`` (the
    engine answers success false) or ``"down"`` (it cannot be reached); the last entry repeats.
    Records every update it was asked for."""

    def __init__(self, url: str, script: Iterable[str]) -> None:
        self.base_url = url
        self.script = list(script)
        self.updates: list[str | None] = []
        self.version = "0"

    def _next(self) -> str:
        return self.script.pop(0) if len(self.script) > 1 else self.script[0]

    async def pause_generation(self, **_: Any) -> None:
        return None

    async def continue_generation(self, **_: Any) -> None:
        return None

    async def flush_cache(self, **_: Any) -> bool:
        return True

    async def update_weights_from_disk(
        self, path: str, *, weight_version: str | None = None, **_: Any
    ) -> UpdateWeightsResult:
        self.updates.append(weight_version)
        outcome = self._next()
        if outcome == "down":
            raise EngineUnavailable("connection refused", url=self.base_url)
        if outcome == "refuse":
            return UpdateWeightsResult(success=False, message="Failed to load weights")
        self.version = weight_version or self.version
        return UpdateWeightsResult(success=True)

    async def get_model_info(self, **_: Any) -> ModelInfo:
        return ModelInfo.model_validate({"model_path": "m", "weight_version": self.version})


def _disk(engines: list[FakeEngine], tmp_path: Path, clock: FakeClock, **retry: Any) -> Any:
    return DiskWeightSync(
        engines,  # type: ignore[arg-type]
        export=lambda d: d.mkdir(parents=True, exist_ok=True),
        weights_dir=tmp_path,
        retry=PushRetry(**retry),
        sleep=clock.sleep,
    )


def _sample(name: str, engine: str) -> float:
    return REGISTRY.get_sample_value(name, {"engine": engine}) or 0.0


def test_the_retry_policy_comes_from_the_spec_and_doubles_its_wait() -> None:
    spec = WeightSyncSpec.model_validate({"pushAttempts": 4, "retryBackoffSeconds": 0.5})
    retry = PushRetry.from_spec(spec)
    assert retry == PushRetry(attempts=4, backoff_seconds=0.5)
    assert retry.waits() == [0.5, 1.0, 2.0]
    assert PushRetry(attempts=1).waits() == []
    # the spec's defaults: three tries, 2 s then 4 s apart
    assert PushRetry.from_spec(WeightSyncSpec()).waits() == [2.0, 4.0]


async def test_a_push_taken_on_the_third_try_is_no_failure(tmp_path: Path) -> None:
    clock = FakeClock()
    engine = FakeEngine("http://e-0:30000", ["down", "refuse", "ok"])
    retries = _sample("agentrl_weight_sync_retries_total", engine.base_url)
    sync = _disk([engine], tmp_path, clock)
    report = await sync.push(1)
    assert clock.waits == [2.0, 4.0]
    assert engine.updates == ["1", "1", "1"]
    assert (report.failed, report.failures) == ([], [])
    assert report.served == {engine.base_url: "1"}
    assert _sample("agentrl_weight_sync_retries_total", engine.base_url) == retries + 2
    assert _sample("agentrl_weight_sync_consecutive_failures", engine.base_url) == 0


async def test_a_push_failing_every_try_counts_one_failure_with_the_last_error(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    engine = FakeEngine("http://e-1:30000", ["down", "down", "refuse"])
    failures = _sample("agentrl_weight_sync_failures_total", engine.base_url)
    sync = _disk([engine], tmp_path, clock, attempts=3, backoff_seconds=1.5)
    report = await sync.push(7)
    assert clock.waits == [1.5, 3.0]
    assert report.failed == [engine.base_url]
    assert report.failures == [
        WeightPushFailure(
            engine=engine.base_url,
            failures=1,
            error="the engine refused weight version 7: Failed to load weights",
            version="7",
        )
    ]
    assert _sample("agentrl_weight_sync_failures_total", engine.base_url) == failures + 1
    assert _sample("agentrl_weight_sync_consecutive_failures", engine.base_url) == 1


async def test_failures_in_a_row_add_up_per_engine_and_a_taken_push_clears_them(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    good = FakeEngine("http://e-0:30000", ["ok"])
    bad = FakeEngine("http://e-1:30000", ["down"] * 9 + ["ok"])
    sync = _disk([good, bad], tmp_path, clock)
    counts = []
    for version in (1, 2, 3):
        await sync.reconcile()  # as the driver does before each push
        report = await sync.push(version)
        counts.append([(f.engine, f.failures) for f in report.failures])
    # one failed push per interval: the engine known to fail is left to the push itself
    assert counts == [[(bad.base_url, 1)], [(bad.base_url, 2)], [(bad.base_url, 3)]]
    assert report.failures[0].error == "EngineUnavailable: connection refused"
    assert report.failures[0].version == "3"
    # only the failing engine was tried again: 3 tries per push to it, 1 to the good one
    assert good.updates == ["1", "2", "3"]
    assert bad.updates == ["1"] * 3 + ["2"] * 3 + ["3"] * 3
    assert _sample("agentrl_weight_sync_consecutive_failures", bad.base_url) == 3
    # the 10th try works: the next push clears the engine
    await sync.reconcile()
    report = await sync.push(4)
    assert (report.failed, report.failures) == ([], [])
    assert _sample("agentrl_weight_sync_consecutive_failures", bad.base_url) == 0


async def test_an_engine_found_behind_after_a_taken_push_is_re_pushed_by_reconcile(
    tmp_path: Path,
) -> None:
    engine = FakeEngine("http://e-0:30000", ["ok"])
    sync = _disk([engine], tmp_path, FakeClock())
    await sync.push(2)
    engine.version = "0"  # restarted by its watchdog
    assert await sync.reconcile() == [engine.base_url]
    assert engine.updates == ["2", "2"]


async def test_distributed_mode_retries_the_whole_broadcast_and_counts_each_engine() -> None:
    clock = FakeClock()
    urls = ["http://e-0:30000", "http://e-1:30000"]
    sync = DistributedWeightSync(
        [FakeEngine(u, ["ok"]) for u in urls],  # type: ignore[misc]
        tensors=list,
        master_address="trainer-0",
        master_port=29600,
        retry=PushRetry(attempts=2, backoff_seconds=3.0),
        sleep=clock.sleep,
    )
    tries: list[int] = []
    outcomes = [
        {urls[0]: "the weight group could not be formed: EngineError: refused", urls[1]: "x"},
        {urls[1]: "RuntimeError: broadcast timed out"},
        {},
    ]

    async def one_try(version: int) -> dict[str, str]:
        tries.append(version)
        return outcomes.pop(0)

    sync._try_push = one_try  # type: ignore[method-assign]
    report = await sync.push(5)
    assert (tries, clock.waits) == ([5, 5], [3.0])
    assert report.failed == [urls[1]]
    assert [(f.engine, f.failures, f.error) for f in report.failures] == [
        (urls[1], 1, "RuntimeError: broadcast timed out")
    ]
    report = await sync.push(6)  # taken at once: nothing failing any more
    assert (report.failed, report.failures, tries) == ([], [], [5, 5, 6])


def test_the_driver_process_gauge_follows_every_report() -> None:
    url = "http://remote-engine-0:30000"
    failing = WeightPushFailure(engine=url, failures=4, error="e", version="9")
    observe_failures(SyncReport(version=9, seconds=0.0, served={url: None}, failures=[failing]))
    assert _sample("agentrl_weight_sync_consecutive_failures", url) == 4
    observe_failures(SyncReport(version=10, seconds=0.0, served={url: "10"}))
    assert _sample("agentrl_weight_sync_consecutive_failures", url) == 0


async def test_the_progress_annotation_carries_the_failing_engines(tmp_path: Path) -> None:
    engine = FakeEngine("http://demo-engine-1.demo-engine.team.svc:30000", ["down"])
    sync = _disk([engine], tmp_path, FakeClock(), attempts=1)
    reporter = FakeProgressReporter()
    tracker = ProgressTracker(reporter, state=DriverState(step=1))

    class Driver:
        _last_checkpoint = 0
        last_sync: SyncReport | None = None

    driver = Driver()
    for step in (1, 2, 3):
        driver.last_sync = await sync.push(step)
        tracker.on_step(_record(step), driver)
    await tracker.flush()
    payload = json.loads(to_annotation(reporter.reports[-1]))
    assert payload["weightPushFailures"] == [
        {
            "engine": engine.base_url,
            "failures": 3,
            "error": "EngineUnavailable: connection refused",
            "version": "3",
        }
    ]
    # a report after a push every engine took leaves the key out
    engine.script = ["ok"]
    driver.last_sync = await sync.push(4)
    tracker.on_step(_record(4), driver)
    await tracker.flush()
    assert "weightPushFailures" not in json.loads(to_annotation(reporter.reports[-1]))


async def test_a_refusal_of_the_real_tiny_engine_is_retried_and_counted(tmp_path: Path) -> None:
    """The tiny engine refuses a path it cannot load (HTTP 400, ``success: false``, as SGLang
    does) and keeps its weights: every try is made (on a shared volume the export may show up
    late), the push counts as failed with the engine's words; once the export is there the
    next push is taken."""
    engine = TinyEngine(tiny.new_policy(0, dim=8), model_path="start")
    server = TestServer(build_app(engine), host="127.0.0.1")
    await server.start_server()
    trained = tiny.new_policy(3, dim=8)
    broken = {"export": True}

    def export(directory: Path) -> None:
        if not broken["export"]:
            tiny.save_policy(trained, directory)

    clock = FakeClock()
    try:
        async with EngineClient(str(server.make_url("")).rstrip("/"), max_connections=4) as c:
            sync = DiskWeightSync(
                [c], export=export, weights_dir=tmp_path, retry=PushRetry(), sleep=clock.sleep
            )
            report = await sync.push(1)
            assert clock.waits == [2.0, 4.0]
            [failure] = report.failures
            assert (failure.engine, failure.failures, failure.version) == (c.base_url, 1, "1")
            assert failure.error.startswith("EngineRequestError: POST ")
            assert "not a tiny policy directory" in failure.error
            assert (await c.get_model_info()).weight_version != "1"  # old weights kept
            broken["export"] = False
            report = await sync.push(2)
            assert (report.failed, report.failures) == ([], [])
            assert (await c.get_model_info()).weight_version == "2"
    finally:
        await server.close()


@pytest.mark.parametrize("attempts", [0, 21])
def test_push_attempts_out_of_range_are_refused_naming_the_field(attempts: int) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"push_attempts|pushAttempts"):
        WeightSyncSpec.model_validate({"pushAttempts": attempts})
