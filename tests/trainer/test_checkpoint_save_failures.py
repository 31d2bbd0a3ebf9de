"""Checkpoint saves that fail: each save is tried ``checkpoint.saveAttempts`` times with a
doubling backoff and leaves nothing half-written; a save failing after its last try is counted
(metrics), reported in the trainer's progress annotation (``checkpointSaveFailure``: the count
in a row, the step, the error) and training goes on; a save that succeeds clears it. At
``checkpoint.maxFailedSaves`` failed saves in a row, and at a failed save at the end or at a
stop, the driver raises :class:`CheckpointSaveError` (the trainer exits; the operator restarts
it from the last checkpoint)."""

from __future__ import annotations

import asyncio
import errno
import json
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from pydantic import ValidationError

from agentrl.api.trainer import Checkpoint as CheckpointSpec
from agentrl.api.wire import CheckpointSaveFailure, TrainerProgress
from agentrl.rollout.tasks.model import Task
from agentrl.rollout.trajectory import Trajectory
from agentrl.trainer.checkpoint import CheckpointStore, DriverState
from agentrl.trainer.checkpoint_saves import CheckpointSaveError, CheckpointSaver, SavePolicy
from agentrl.trainer.progress import FakeProgressReporter, ProgressTracker, to_annotation
from agentrl.trainer.stopping import StopRequest
from tests.trainer.factories import FakeBackend, make_trajectory, toy_driver

FULL = "OSError: [Errno 28] No space left on device"


class _FullVolume(FakeBackend):
    """Writes part of a checkpoint, then finds the volume full: for the steps in ``fail``,
    that many tries in a row (``None``: every try)."""

    def __init__(self, fail: dict[int, int | None] | None = None) -> None:
        super().__init__()
        self.fail = dict(fail or {})
        self.tries: list[int] = []

    def save_state(self, directory: Path) -> None:
        step = int(directory.name.rsplit("-", 1)[1])
        self.tries.append(step)
        (directory / "model").mkdir(parents=True, exist_ok=True)
        (directory / "model" / "part.bin").write_bytes(b"x" * 64)
        left = self.fail.get(step, 0)
        if left is None or left > 0:
            if left is not None:
                self.fail[step] = left - 1
            raise OSError(errno.ENOSPC, "No space left on device")


class _Clock:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)


def _metric(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def _leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("."))


# -- the policy and the saver ------------------------------------------------------------------


def test_the_policy_comes_from_the_spec_and_the_backoff_doubles() -> None:
    spec = CheckpointSpec.model_validate(
        {"saveAttempts": 4, "retryBackoffSeconds": 0.5, "maxFailedSaves": 2}
    )
    policy = SavePolicy.from_spec(spec)
    assert policy == SavePolicy(attempts=4, backoff_seconds=0.5, max_failed_saves=2)
    assert policy.waits() == [0.5, 1.0, 2.0]
    assert SavePolicy(attempts=1).waits() == []
    # the defaults: three tries 2 s then 4 s apart, the trainer gives up at the third failure
    assert SavePolicy.from_spec(CheckpointSpec()) == SavePolicy()
    assert SavePolicy().waits() == [2.0, 4.0] and SavePolicy().max_failed_saves == 3


@pytest.mark.parametrize(
    "field,value",
    [("saveAttempts", 0), ("saveAttempts", 21), ("maxFailedSaves", 0),
     ("retryBackoffSeconds", -1)],
)  # fmt: skip
def test_out_of_range_knobs_are_refused_naming_the_field(field: str, value: float) -> None:
    with pytest.raises(ValidationError, match=field):
        CheckpointSpec.model_validate({field: value})


async def test_a_save_that_fails_then_succeeds_is_retried_with_backoff(tmp_path: Path) -> None:
    clock = _Clock()
    store = CheckpointStore(tmp_path)
    saver = CheckpointSaver(store, SavePolicy(attempts=3, backoff_seconds=1.0), sleep=clock.sleep)
    backend = _FullVolume({5: 2})
    retries = _metric("agentrl_trainer_checkpoint_save_retries_total")
    saved = await saver.save(backend, DriverState(step=5), last_checkpoint=0)
    assert saved == tmp_path / "step-00000005"
    assert backend.tries == [5, 5, 5] and clock.waits == [1.0, 2.0]
    assert saver.failure is None and store.steps() == [5]
    assert _leftovers(tmp_path) == []  # the failed tries' partial directories are gone
    assert _metric("agentrl_trainer_checkpoint_save_retries_total") - retries == 2
    assert _metric("agentrl_trainer_checkpoint_step") == 5


async def test_failed_saves_are_counted_in_a_row_and_the_limit_raises(tmp_path: Path) -> None:
    clock = _Clock()
    store = CheckpointStore(tmp_path)
    saver = CheckpointSaver(
        store, SavePolicy(attempts=2, backoff_seconds=3.0, max_failed_saves=3), sleep=clock.sleep
    )
    backend = _FullVolume({4: None, 6: None, 8: None, 10: None})
    failures = _metric("agentrl_trainer_checkpoint_save_failures_total")
    assert await saver.save(backend, DriverState(step=2), last_checkpoint=0) is not None
    # step 4 fails after both tries: counted, reported, and the caller goes on
    assert await saver.save(backend, DriverState(step=4), last_checkpoint=2) is None
    assert saver.failure == CheckpointSaveFailure(failures=1, step=4, error=FULL)
    assert _metric("agentrl_trainer_checkpoint_consecutive_failures") == 1
    assert await saver.save(backend, DriverState(step=6), last_checkpoint=2) is None
    assert saver.failure == CheckpointSaveFailure(failures=2, step=6, error=FULL)
    # the third in a row is one too many (maxFailedSaves 3)
    with pytest.raises(CheckpointSaveError) as raised:
        await saver.save(backend, DriverState(step=8), last_checkpoint=2)
    assert raised.value.failure == CheckpointSaveFailure(failures=3, step=8, error=FULL)
    assert str(raised.value) == (
        f"checkpoint save of step 8 failed (3 in a row, checkpoint.maxFailedSaves is 3): {FULL}; "
        "the last checkpoint is step 2"
    )
    assert _metric("agentrl_trainer_checkpoint_save_failures_total") - failures == 3
    assert _metric("agentrl_trainer_checkpoint_consecutive_failures") == 3
    assert clock.waits == [3.0, 3.0, 3.0]
    assert store.steps() == [2] and _leftovers(tmp_path) == []
    # a save that succeeds clears the count
    backend.fail.clear()
    assert await saver.save(backend, DriverState(step=12), last_checkpoint=2) is not None
    assert saver.failure is None
    assert _metric("agentrl_trainer_checkpoint_consecutive_failures") == 0


async def test_a_final_save_that_fails_raises_at_once(tmp_path: Path) -> None:
    saver = CheckpointSaver(
        CheckpointStore(tmp_path), SavePolicy(attempts=2, backoff_seconds=0.0), sleep=_Clock().sleep
    )
    with pytest.raises(CheckpointSaveError, match="no later save makes up for it"):
        await saver.save(_FullVolume({3: None}), DriverState(step=3), last_checkpoint=1, final=True)
    assert saver.failure == CheckpointSaveFailure(failures=1, step=3, error=FULL)


# -- the driver --------------------------------------------------------------------------------


class _Runner:
    """Episodes that finish at once with rewards 1, 0 in each group (every group carries
    signal); with ``hang``, every episode from the ``hang``-th on never finishes."""

    def __init__(self, hang: int | None = None) -> None:
        self.started = 0
        self.hang = hang

    async def run(self, task: Task, *, group_id: str, policy_version: int) -> Trajectory:
        n = self.started
        self.started += 1
        if self.hang is not None and n >= self.hang:
            await asyncio.Event().wait()
        await asyncio.sleep(0)
        return make_trajectory(group_id, float(n % 2 == 0), version=policy_version, n=n)


async def _drive(
    root: Path,
    backend: FakeBackend,
    *,
    max_steps: int,
    checkpoint: dict[str, object],
    tracker: ProgressTracker | None = None,
    runner: _Runner | None = None,
    stop: StopRequest | None = None,
    state: DriverState | None = None,
) -> tuple[object, _Clock]:
    clock = _Clock()
    driver, scheduler = toy_driver(
        root, runner or _Runner(), backend, per_step=2, max_steps=max_steps, state=state,
        checkpoint={"retryBackoffSeconds": 1.0, **checkpoint}, save_sleep=clock.sleep, stop=stop,
    )  # fmt: skip
    if tracker is not None:
        driver.on_step = lambda record: tracker.on_step(record, driver)
    try:
        await asyncio.wait_for(driver.run(), timeout=10)
    finally:
        await scheduler.cancel()
        if tracker is not None:
            tracker.on_checkpoint(driver.last_checkpoint_step, driver.checkpoint_failure)
            await tracker.flush()
    return driver, clock


async def test_training_goes_on_after_a_failed_save_and_the_progress_reports_it(
    tmp_path: Path,
) -> None:
    reporter = FakeProgressReporter()
    state = DriverState()
    tracker = ProgressTracker(reporter, state=state)
    backend = _FullVolume({2: None})  # every try of step 2's save fails; step 3's is fine
    driver, clock = await _drive(
        tmp_path, backend, max_steps=4, state=state, tracker=tracker,
        checkpoint={"intervalSteps": 1, "saveAttempts": 3},
    )  # fmt: skip
    assert [r.step for r in driver.records] == [1, 2, 3, 4]  # step 2's failure stopped nothing
    assert backend.tries == [1, 2, 2, 2, 3, 4]
    assert clock.waits == [1.0, 2.0]
    assert CheckpointStore(tmp_path).steps() == [1, 3, 4]
    by_step = {p.step: p for p in reporter.reports}
    # after step 2: the failure, with the last checkpoint still step 1
    failing = by_step[2]
    assert failing.checkpoint_save_failure == CheckpointSaveFailure(failures=1, step=2, error=FULL)
    assert failing.last_checkpoint_step == 1
    annotation = json.loads(to_annotation(failing))
    assert annotation["checkpointSaveFailure"] == {"failures": 1, "step": 2, "error": FULL}
    # step 3 saved: cleared, and the annotation leaves the field out
    assert by_step[3].checkpoint_save_failure is None
    assert by_step[3].last_checkpoint_step == 3
    assert "checkpointSaveFailure" not in json.loads(to_annotation(reporter.reports[-1]))


async def test_the_trainer_gives_up_at_max_failed_saves_in_a_row(tmp_path: Path) -> None:
    backend = _FullVolume({2: None, 3: None, 4: None})
    with pytest.raises(CheckpointSaveError) as raised:
        await _drive(
            tmp_path, backend, max_steps=10,
            checkpoint={"intervalSteps": 1, "saveAttempts": 2, "maxFailedSaves": 2},
        )  # fmt: skip
    assert raised.value.failure == CheckpointSaveFailure(failures=2, step=3, error=FULL)
    assert "the last checkpoint is step 1" in str(raised.value)
    assert CheckpointStore(tmp_path).steps() == [1]


async def test_a_failed_save_at_the_end_or_at_a_stop_fails_the_run(tmp_path: Path) -> None:
    # the end: no later interval would make up for it
    with pytest.raises(CheckpointSaveError, match="step 2 failed"):
        await _drive(tmp_path / "end", _FullVolume({2: None}), max_steps=2,
                     checkpoint={"saveAttempts": 2})  # fmt: skip
    # a stop between steps (a suspend's SIGTERM): the checkpoint it would resume from fails
    stop = StopRequest()
    reporter = FakeProgressReporter()
    state = DriverState()
    tracker = ProgressTracker(reporter, state=state)

    class _StopAfterOne(_FullVolume):
        def train_step(self, samples):  # type: ignore[no-untyped-def]
            stats = super().train_step(samples)
            stop.request_threadsafe("SIGTERM")
            return stats

    stop.bind(asyncio.get_running_loop())
    with pytest.raises(CheckpointSaveError, match="step 1 failed"):
        await _drive(tmp_path / "stop", _StopAfterOne({1: None}), max_steps=8, stop=stop,
                     state=state, tracker=tracker, runner=_Runner(),
                     checkpoint={"saveAttempts": 2})  # fmt: skip
    # the last report says so (what the status shows while the trainer restarts)
    last: TrainerProgress = reporter.reports[-1]
    assert last.checkpoint_save_failure == CheckpointSaveFailure(failures=1, step=1, error=FULL)
    assert last.last_checkpoint_step == 0
