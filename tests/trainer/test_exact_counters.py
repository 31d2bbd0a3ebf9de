"""The driver's counters count each trajectory once across restarts: a trajectory that finished
but was not trained on when the checkpoint was written is counted once, when the resumed run's
re-run of its task leaves the buffer — not in the checkpoint and again after the resume.

Every outcome is fixed by the task's position in the data order and the member's index in its
group (:func:`_outcome`), so a task re-run after a resume ends as it did before, and the
expected counters are worked out by hand from the positions each run retired (trained on or
dropped): each position's group counted once. Suspend and resume is the stop path
(SIGTERM at a step boundary); a crash resumes from an older interval checkpoint."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agentrl.api.rollout import TerminalClass
from agentrl.rollout.tasks.model import Task
from agentrl.rollout.tasks.toy import generate_toy_tasks
from agentrl.rollout.trajectory import ToolUse, Trajectory, TurnRecord
from agentrl.trainer.batching import TrainSample
from agentrl.trainer.checkpoint import CheckpointStore, Counters, DriverState
from agentrl.trainer.loop import TaskOrder, TaskStream, TrainingDriver
from agentrl.trainer.stopping import StopRequest
from tests.trainer.factories import FakeBackend, make_trajectory, toy_driver

TASKS = generate_toy_tasks(0)[:10]
SEED = 3
GROUP = 3
PER_STEP = 6  # two groups of three


@dataclass(frozen=True)
class _Outcome:
    terminal: TerminalClass
    reward: float | None
    turns: int
    tool_use: ToolUse


def _flat(position: int) -> bool:
    """Every member of the group gets reward 1: no signal (dropped under ``dropAndRefill``)."""
    return position % 5 == 3


def _outcome(position: int, member: int) -> _Outcome:
    """Member 2 of every third position (1, 4, 7, ...) is an infra error; member 1 of
    positions 2, 6, 10, ... is truncated at the turn cap; the others submit. Rewards: 1 for
    member 0, 0 for the others, except in the flat positions (3, 8, 13, ...)."""
    checked = ToolUse(calls=2, prefix_checked=True)
    if member == 2 and position % 3 == 1:
        return _Outcome(TerminalClass.INFRA_ERROR, None, 2, checked)
    reward = 1.0 if member == 0 or _flat(position) else 0.0
    if member == 1 and position % 4 == 2:
        broken = ToolUse(turns_without_call=3, prefix_checked=True, prefix_break=2)
        return _Outcome(TerminalClass.TRUNCATED, reward, 3, broken)
    return _Outcome(TerminalClass.COMPLETED, reward, 2, checked)


def expected(positions: Iterable[int]) -> dict[str, Any]:
    """The counters of the groups of ``positions``, each counted once, worked out from
    :func:`_outcome` alone."""
    out: dict[str, Any] = {
        "trajectories": 0, "trained": 0, "infra": 0, "dropped": 0, "zero_variance": 0,
        "classes": {}, "episodes": 0, "replies": 0, "calls": 0, "no_call": 0, "breaks": 0,
        "end_reasons": {},
    }  # fmt: skip
    end_reason = {
        TerminalClass.COMPLETED: "submitted",
        TerminalClass.TRUNCATED: "turn_cap",
        TerminalClass.INFRA_ERROR: "infra_error",
    }
    for position in positions:
        members = [_outcome(position, m) for m in range(GROUP)]
        rewards = [o.reward for o in members if o.terminal != TerminalClass.INFRA_ERROR]
        flat = len(set(rewards)) == 1
        out["zero_variance"] += flat
        out["dropped"] += flat  # dropAndRefill: a flat group leaves without training
        out["trained"] += 0 if flat else len(rewards)
        for o in members:
            out["trajectories"] += 1
            out["classes"][o.terminal.value] = out["classes"].get(o.terminal.value, 0) + 1
            reason = end_reason[o.terminal]
            out["end_reasons"][reason] = out["end_reasons"].get(reason, 0) + 1
            if o.terminal == TerminalClass.INFRA_ERROR:
                out["infra"] += 1
                continue
            out["episodes"] += 1
            out["replies"] += o.turns
            out["calls"] += o.tool_use.calls
            out["no_call"] += o.tool_use.turns_without_call
            out["breaks"] += o.tool_use.prefix_break is not None
    return out


def counted(counters: Counters) -> dict[str, Any]:
    """The same figures from the driver's counters."""
    tools = counters.tools
    return {
        "trajectories": counters.trajectories,
        "trained": counters.trained_trajectories,
        "infra": counters.infra_errors,
        "dropped": counters.dropped_groups,
        "zero_variance": counters.zero_variance_groups,
        "classes": counters.classes,
        "episodes": tools.episodes,
        "replies": tools.replies,
        "calls": tools.calls,
        "no_call": tools.turns_without_call,
        "breaks": tools.prefix_breaks,
        "end_reasons": tools.end_reasons,
    }


class _Runner:
    """Episodes ending as :func:`_outcome` says for their task's position and their index in
    the group; those in ``hang`` (position, member) never end (an episode in flight)."""

    def __init__(self, stream: TaskStream, hang: frozenset[tuple[int, int]] = frozenset()) -> None:
        self.stream = stream
        self.hang = hang
        self.members: dict[str, int] = {}
        self.received: list[tuple[int, Trajectory]] = []

    async def run(self, task: Task, *, group_id: str, policy_version: int) -> Trajectory:
        position = self.stream.position_of(group_id)
        member = self.members.get(group_id, 0)
        self.members[group_id] = member + 1
        if (position, member) in self.hang:
            await asyncio.Event().wait()
        await asyncio.sleep(0.001)
        o = _outcome(position, member)
        base = make_trajectory(
            group_id, o.reward, terminal=o.terminal, version=policy_version, n=member
        )
        turns = [TurnRecord(action="a", observation="o") for _ in range(o.turns)]
        return base.model_copy(update={"turns": turns, "tool_use": o.tool_use})


class _Backend(FakeBackend):
    """Counts the samples of every step."""

    def __init__(self) -> None:
        super().__init__()
        self.samples = 0

    def observe(self, samples: Sequence[TrainSample]) -> None:
        self.samples += len(samples)


@dataclass
class _Run:
    driver: TrainingDriver
    stream: TaskStream
    backend: _Backend
    received: list[int] = field(default_factory=list)
    """The position of every trajectory the driver received."""


def _stream(state: DriverState) -> TaskStream:
    order = TaskOrder(TASKS, SEED)
    return TaskStream(order, cursor=state.task_cursor, pending=state.pending_positions)


def _open(
    root: Path,
    state: DriverState,
    *,
    max_steps: int,
    hang: frozenset[tuple[int, int]] = frozenset(),
    stop: StopRequest | None = None,
    checkpoint: dict[str, Any] | None = None,
) -> tuple[_Run, Any]:
    stream = _stream(state)
    backend = _Backend()
    driver, scheduler = toy_driver(
        root, _Runner(stream, hang), backend, per_step=PER_STEP, max_steps=max_steps,
        group_size=GROUP, stream=stream, state=state, concurrency=12, stop=stop,
        checkpoint=checkpoint,
    )  # fmt: skip
    run = _Run(driver=driver, stream=stream, backend=backend)
    driver.on_trajectory = lambda t: run.received.append(stream.position_of(t.group_id))
    return run, scheduler


async def _quiet(run: _Run, *, steps: int) -> None:
    """Until the driver has made ``steps`` steps and nothing has arrived for 0.3 s (every
    episode that can finish has: the rest hang, or wait for admission that the staleness gate
    holds back)."""
    seen = -1
    while len(run.driver.records) < steps or len(run.received) != seen:
        seen = len(run.received)
        await asyncio.sleep(0.3)


def _saved(root: Path, step: int) -> DriverState:
    return DriverState.model_validate_json((root / f"step-{step:08d}" / "driver.json").read_text())


def _retired(state: DriverState, since: DriverState | None = None) -> set[int]:
    """Positions a checkpoint does not replay (trained on or dropped) among those handed out
    since the checkpoint ``since`` (None: since the start): its pending ones and the order from
    its cursor on, up to ``state``'s cursor. (Not the stream's own list: a run that ends at
    ``maxSteps`` hands out more tasks while the checkpoint is written.)"""
    start = since.task_cursor if since is not None else 0
    handed = set(range(start, state.task_cursor))
    if since is not None:
        handed |= set(since.pending_positions)
    return handed - set(state.pending_positions)


@pytest.mark.parametrize("how", ["stop", "crash"])
async def test_a_trajectory_finished_before_a_restart_and_trained_after_it_counts_once(
    tmp_path: Path, how: str
) -> None:
    # Run 1: the third member of position 1 never ends. Step 1 trains two groups; then the
    # staleness gate holds step 2 back for that group (admitted at version 0), so its first
    # two members and complete groups wait in the buffer, finished and untrained. "stop": a
    # suspend's SIGTERM, and the checkpoint of step 1 is written then; "crash": the step-1
    # checkpoint of checkpoint.intervalSteps 1 is written at once, and the trainer dies later
    # (cancelled: no later step to save). Either lists their tasks as pending.
    stop = StopRequest()
    first, scheduler = _open(
        tmp_path, DriverState(), max_steps=8, hang=frozenset({(1, 2)}), stop=stop,
        checkpoint={"intervalSteps": 1} if how == "crash" else None,
    )  # fmt: skip
    at_save: list[int] = []  # what had arrived when the checkpoint was written
    if how == "crash":  # the step line follows the save with nothing in between
        first.driver.on_step = lambda r: at_save.extend(first.received)
    task = asyncio.ensure_future(first.driver.run())
    try:
        await asyncio.wait_for(_quiet(first, steps=1), timeout=20)
        if how == "stop":
            stop.request("SIGTERM")
            await asyncio.wait_for(task, timeout=10)
            at_save = list(first.received)
        else:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    finally:
        await scheduler.cancel()
    assert [r.step for r in first.driver.records] == [1]
    assert CheckpointStore(tmp_path).steps() == [1]
    checkpoint = _saved(tmp_path, 1)
    pending = set(checkpoint.pending_positions)
    waiting = [p for p in at_save if p in pending]
    # the case at issue: trajectories received before the checkpoint whose tasks the resume
    # runs again, among them the first two of the group left open by the hang
    assert waiting.count(1) == 2, (at_save, pending)
    run_1 = _retired(checkpoint)
    assert first.backend.samples == expected(run_1)["trained"]
    # the checkpoint counts exactly the tasks it does not replay, each once
    assert counted(checkpoint.counters) == expected(run_1)

    # Run 2: resumed from that checkpoint, nothing hangs; it trains to step 4.
    state = CheckpointStore(tmp_path).load(FakeBackend())
    assert state is not None and state.restarts == 1
    second, scheduler = _open(tmp_path, state, max_steps=4)
    try:
        await asyncio.wait_for(second.driver.run(), timeout=20)
    finally:
        await scheduler.cancel()
    final = _saved(tmp_path, 4)
    # the pending tasks were run again first, then the order went on at the cursor
    assert second.stream.positions[: len(pending)] == checkpoint.pending_positions
    run_2 = _retired(final, since=checkpoint)
    assert not run_1 & run_2
    assert run_2 & set(waiting)  # tasks whose first trajectories came in run 1, retired in run 2
    want = expected(run_1 | run_2)
    assert counted(final.counters) == want
    assert counted(second.driver.state.counters) == want  # what status and summary.json show
    assert first.backend.samples + second.backend.samples == want["trained"]
    assert want["infra"] and want["dropped"] and want["classes"]["truncated"]  # all exercised
    # the step lines of each run add up to what it counted (no group dropped after its last)
    lines = first.driver.records + second.driver.records
    in_lines = sum(sum(r.classes.values()) for r in lines)
    assert in_lines <= want["trajectories"]
    assert sum(r.infra_errors for r in lines) <= want["infra"]


async def test_a_crash_resumed_from_an_older_checkpoint_counts_each_task_once(
    tmp_path: Path,
) -> None:
    # Run 1 checkpoints every 2 steps and "crashes" after step 3: its step-3 checkpoint is
    # lost, so the resume starts from step 2 and runs again what came after it (the groups
    # run 1 trained on or dropped after step 2 included).
    first, scheduler = _open(tmp_path, DriverState(), max_steps=3,
                             checkpoint={"intervalSteps": 2})  # fmt: skip
    try:
        await asyncio.wait_for(first.driver.run(), timeout=20)
    finally:
        await scheduler.cancel()
    shutil.rmtree(tmp_path / "step-00000003")
    at_2 = _saved(tmp_path, 2)
    run_1 = _retired(at_2)
    assert counted(at_2.counters) == expected(run_1)
    # run 1 retired more after that checkpoint: those are the ones a naive count would repeat
    assert first.driver.state.counters.trajectories > at_2.counters.trajectories

    state = CheckpointStore(tmp_path).load(FakeBackend())
    assert state is not None and state.step == 2
    second, scheduler = _open(tmp_path, state, max_steps=5, checkpoint={"intervalSteps": 2})
    try:
        await asyncio.wait_for(second.driver.run(), timeout=20)
    finally:
        await scheduler.cancel()
    final = _saved(tmp_path, 5)
    run_2 = _retired(final, since=at_2)
    assert not run_1 & run_2
    assert counted(final.counters) == expected(run_1 | run_2)
