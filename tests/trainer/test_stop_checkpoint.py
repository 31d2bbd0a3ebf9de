"""A termination signal stops the trainer cleanly: the step in progress is finished, the last
finished step is checkpointed with its data position, in-flight tasks are pending (never scored,
never trained on), and a resumed run continues at the next step without repeating or skipping
data."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Sequence
from pathlib import Path

from agentrl.rollout.tasks.model import Task
from agentrl.rollout.tasks.toy import generate_toy_tasks
from agentrl.rollout.trajectory import Trajectory
from agentrl.trainer.batching import TrainSample
from agentrl.trainer.checkpoint import CheckpointStore, DriverState
from agentrl.trainer.loop import TaskOrder, TaskStream, TrainingDriver
from agentrl.trainer.stopping import (
    STOPPED_EXIT_CODE,
    StopRequest,
    ignore_stop,
    on_stop_signals,
)
from tests.trainer.factories import FakeBackend, make_trajectory, toy_driver

TASKS = generate_toy_tasks(0)[:10]
SEED = 5
GROUP = 2
PER_STEP = 2  # one group per step


class _Backend(FakeBackend):
    """Records the task positions each step trained on; ``signal_at``: the step during whose
    update it sends this process SIGTERM (a real signal, through the real handler)."""

    def __init__(self, stream: TaskStream, *, signal_at: int | None = None) -> None:
        super().__init__()
        self.stream = stream
        self.signal_at = signal_at
        self.steps: list[list[int]] = []

    def observe(self, samples: Sequence[TrainSample]) -> None:
        if self.signal_at == len(self.steps) + 1:
            os.kill(os.getpid(), signal.SIGTERM)
        self.steps.append(sorted({self.stream.position_of(s.trajectory.group_id) for s in samples}))


class _Runner:
    """Episodes that finish at once with rewards 1, 0 in each group (every group carries
    signal), except those of tasks ``hang``: they never finish (an episode in flight)."""

    def __init__(self, hang: int | None = None) -> None:
        self.started: list[str] = []
        self.hang = hang

    async def run(self, task: Task, *, group_id: str, policy_version: int) -> Trajectory:
        n = len(self.started)
        self.started.append(group_id)
        if self.hang is not None and n >= self.hang:
            await asyncio.Event().wait()
        await asyncio.sleep(0.001)
        return make_trajectory(group_id, float(n % 2 == 0), version=policy_version, n=n)


async def _signal_after_steps(driver: TrainingDriver, steps: int) -> None:
    """SIGTERM to this process once ``driver`` has recorded ``steps`` steps."""
    while len(driver.records) < steps:
        await asyncio.sleep(0.01)
    os.kill(os.getpid(), signal.SIGTERM)


async def _run(
    root: Path,
    *,
    max_steps: int,
    state: DriverState,
    signal_at: int | None = None,
    hang: int | None = None,
    stop: StopRequest | None = None,
    concurrency: int = 4,
    signal_after: int | None = None,
) -> tuple[TrainingDriver, _Backend, TaskStream]:
    """``signal_after``: send this process SIGTERM once the driver has recorded that many steps
    (between steps: with ``hang`` nothing else finishes, so the driver is then waiting)."""
    stream = TaskStream(
        TaskOrder(TASKS, SEED), cursor=state.task_cursor, pending=state.pending_positions
    )
    backend = _Backend(stream, signal_at=signal_at)
    stop = stop or StopRequest()
    # a checkpoint only every 100 steps: only the stop writes one
    driver, scheduler = toy_driver(
        root,
        _Runner(hang),
        backend,
        per_step=PER_STEP,
        max_steps=max_steps,
        group_size=GROUP,
        stream=stream,
        state=state,
        concurrency=concurrency,
        stop=stop,
    )
    requester = (
        asyncio.create_task(_signal_after_steps(driver, signal_after))
        if signal_after is not None
        else None
    )
    try:
        with on_stop_signals(stop) as installed:
            assert installed  # pytest runs the test's event loop on the main thread
            await asyncio.wait_for(driver.run(), timeout=10)
    finally:
        await scheduler.cancel()
        if requester is not None:
            requester.cancel()
            await asyncio.gather(requester, return_exceptions=True)
    return driver, backend, stream


async def test_sigterm_during_a_step_finishes_it_and_checkpoints_its_data_position(
    tmp_path: Path,
) -> None:
    driver, backend, stream = await _run(tmp_path, max_steps=8, state=DriverState(), signal_at=3)
    assert driver.stopped and driver.stop is not None and driver.stop.reason == "SIGTERM"
    # step 3 was under way when the signal came: it was finished, and nothing after it ran
    assert len(backend.steps) == 3
    store = CheckpointStore(tmp_path)
    assert store.steps() == [3]
    saved = DriverState.model_validate_json(
        (tmp_path / "step-00000003" / "driver.json").read_text()
    )
    trained = {p for step in backend.steps for p in step}
    # Expected independently of the stream's bookkeeping: the cursor is every task handed out
    # (the scheduler started one group per task), and pending is each of them not trained on.
    handed_out = len(stream.positions)
    assert saved.task_cursor == handed_out
    assert saved.pending_positions == sorted(set(range(handed_out)) - trained)
    assert saved.counters.trained_trajectories == 3 * PER_STEP
    assert saved.counters.infra_errors_in_training == 0


async def test_a_resumed_run_continues_at_the_next_step_without_repeating_or_skipping_data(
    tmp_path: Path,
) -> None:
    _, first, first_stream = await _run(tmp_path, max_steps=8, state=DriverState(), signal_at=3)
    store = CheckpointStore(tmp_path)
    state = store.load(_Backend(first_stream))
    assert state is not None and state.step == 3 and state.restarts == 1
    pending, cursor = list(state.pending_positions), state.task_cursor
    driver, second, second_stream = await _run(tmp_path, max_steps=6, state=state)
    assert [r.step for r in driver.records] == [4, 5, 6]
    assert len(second.steps) == 3
    before = [p for step in first.steps for p in step]
    after = [p for step in second.steps for p in step]
    assert not set(before) & set(after)  # no step's data is trained twice
    # the resumed run hands out the pending tasks first, then continues the order at the cursor
    expected = pending + list(range(cursor, cursor + len(second_stream.positions) - len(pending)))
    assert second_stream.positions == expected
    # nothing skipped: every position handed out by either run is trained on or still pending
    final = CheckpointStore(tmp_path).steps()[-1]
    assert final == 6
    last = DriverState.model_validate_json(
        (tmp_path / f"step-{final:08d}" / "driver.json").read_text()
    )
    assert sorted(before + after + last.pending_positions) == list(range(last.task_cursor))


async def test_a_stop_between_steps_abandons_the_wait_and_keeps_in_flight_tasks_pending(
    tmp_path: Path,
) -> None:
    stop = StopRequest()
    # episodes 0 and 1 (the first group) finish, every later one hangs; the signal comes once
    # step 1 is recorded, while the driver waits for a batch that never completes
    _, backend, stream = await _run(
        tmp_path, max_steps=8, state=DriverState(), hang=2, stop=stop, signal_after=1
    )
    assert stop.requested and len(backend.steps) == 1
    saved = CheckpointStore(tmp_path).load(_Backend(stream))
    assert saved is not None and saved.step == 1
    assert saved.pending_positions == list(range(1, len(stream.positions)))
    assert saved.pending_positions  # the hanging groups were in flight: restarted on resume
    assert saved.counters.trained_trajectories == PER_STEP


async def test_a_stop_requested_from_another_thread_before_the_loop_binds_still_takes_effect():
    # under Ray, pod 0's SIGTERM reaches the driver actor's request_stop from another thread,
    # possibly while the driver is still starting
    stop = StopRequest()
    stop.request_threadsafe("SIGTERM")
    assert not stop.requested
    stop.bind(asyncio.get_running_loop())
    await asyncio.wait_for(stop.wait(), timeout=1)
    assert stop.reason == "SIGTERM"


def test_a_stopped_trainer_exits_143_so_a_deleted_pod_is_never_a_completed_index() -> None:
    from agentrl.trainer.pod import Built

    built = Built(
        job="j", backend="torch", weight_sync="DiskWeightSync", engines=[], world_size=1,
        rank=0, checkpoint_dir="/c", resume_step=0, train_tasks=1,
    )  # fmt: skip
    assert built.exit_code == 0
    assert built.model_copy(update={"stopped": "SIGTERM"}).exit_code == 143 == STOPPED_EXIT_CODE


def test_ignore_stop_sets_the_handler_on_the_main_thread_and_leaves_it_from_another() -> None:
    # a process may run a Ray node's join in a thread (the two-node placement test does):
    # signal.signal raises ValueError there, and the main thread's disposition must stay
    previous = signal.getsignal(signal.SIGTERM)
    try:
        errors: list[BaseException] = []

        def on_thread() -> None:
            try:
                ignore_stop()
            except BaseException as exc:  # the test reports what was raised
                errors.append(exc)

        thread = threading.Thread(target=on_thread)
        thread.start()
        thread.join()
        assert errors == []
        assert signal.getsignal(signal.SIGTERM) is previous
        ignore_stop()
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler) and handler is not previous
        assert handler not in (signal.SIG_IGN, signal.SIG_DFL)  # Ray's children must not inherit
    finally:
        signal.signal(signal.SIGTERM, previous)
