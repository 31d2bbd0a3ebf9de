"""The driver's tool health (:mod:`agentrl.rollout.tool_health`) from the trajectories it
counts (each once, as its group leaves the buffer): per step in ``steps.jsonl`` (the window of
``classes``), over the whole job in its counters, its progress report (``status.rollout.tools``)
and its checkpoint, so a resumed run goes on counting; a checkpoint or step line written before
the field still loads."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agentrl.api.rollout import TerminalClass
from agentrl.api.wire import EndReasonCounts
from agentrl.rollout.tasks.model import Task
from agentrl.rollout.trajectory import EndReason, ToolUse, Trajectory, TurnRecord
from agentrl.trainer.checkpoint import CheckpointStore, DriverState
from agentrl.trainer.loop import StepRecord
from agentrl.trainer.progress import FakeProgressReporter, ProgressTracker
from tests.trainer.factories import FakeBackend, make_trajectory, toy_driver


def _turns(n: int) -> list[TurnRecord]:
    return [TurnRecord(action="a", observation="o") for _ in range(n)]


class _Runner:
    """The n-th episode, by n % 4: 0 and 2 submit after 2 replies, each a call (reward 1);
    1 reaches the turn cap after 3 replies without a call, its prefix broken (reward 0); 3 is an
    infra error with 2 replies and 2 calls, which count in ``endReasons`` only."""

    def __init__(self) -> None:
        self.started = 0

    async def run(self, task: Task, *, group_id: str, policy_version: int) -> Trajectory:
        n = self.started
        self.started += 1
        await asyncio.sleep(0)
        kind = n % 4
        if kind == 3:
            base = make_trajectory(group_id, None, terminal=TerminalClass.INFRA_ERROR, n=n)
            return base.model_copy(
                update={"turns": _turns(2), "tool_use": ToolUse(calls=2, prefix_checked=True)}
            )
        if kind == 1:
            base = make_trajectory(
                group_id, 0.0, terminal=TerminalClass.TRUNCATED, version=policy_version, n=n
            )
            use = ToolUse(turns_without_call=3, prefix_checked=True, prefix_break=2)
            return base.model_copy(update={"turns": _turns(3), "tool_use": use})
        base = make_trajectory(group_id, 1.0, version=policy_version, n=n)
        return base.model_copy(
            update={"turns": _turns(2), "tool_use": ToolUse(calls=2, prefix_checked=True)}
        )


async def test_the_driver_reports_tool_health_per_step_and_over_the_job(tmp_path: Path) -> None:
    reporter = FakeProgressReporter()
    state = DriverState()
    tracker = ProgressTracker(reporter, state=state)
    driver, scheduler = toy_driver(
        tmp_path, _Runner(), FakeBackend(), per_step=4, max_steps=3, state=state,
        steps_log=tmp_path / "steps.jsonl",
    )  # fmt: skip
    received: list[Trajectory] = []
    driver.on_trajectory = received.append
    driver.on_step = lambda record: tracker.on_step(record, driver)
    try:
        await asyncio.wait_for(driver.run(), timeout=10)
    finally:
        await scheduler.cancel()
    await tracker.flush()
    # counted: the trajectories of the groups that left the buffer, i.e. of every task the
    # last checkpoint does not list as pending (those still waiting are counted on resume)
    saved = CheckpointStore(tmp_path).load(FakeBackend())
    assert saved is not None
    pending = set(saved.pending_positions)
    received = [t for t in received if driver.stream.position_of(t.group_id) not in pending]

    submitted = sum(t.end_reason == EndReason.SUBMITTED for t in received)
    capped = sum(t.end_reason == EndReason.TURN_CAP for t in received)
    infra = sum(t.end_reason == EndReason.INFRA_ERROR for t in received)
    assert submitted and capped and infra and submitted + capped + infra == len(received)
    episodes, replies = submitted + capped, 2 * submitted + 3 * capped
    # over the job: every trajectory counted, infra errors in endReasons only
    job = state.counters.tools.health()
    assert job is not None
    assert (job.episodes, job.replies) == (episodes, replies)
    assert job.calls_per_episode == 2 * submitted / episodes
    assert job.no_tool_call_rate == 3 * capped / replies
    assert job.parse_failure_rate == 0.0
    assert job.submit_rate == submitted / episodes
    assert job.prefix_break_rate == capped / episodes  # every episode here had its prefix checked
    assert job.end_reasons == EndReasonCounts(
        submitted=submitted, turn_cap=capped, infra_error=infra
    )
    # the last progress report carries it (what the operator writes into status.rollout.tools)
    assert [p.step for p in reporter.reports] == [1, 2, 3]
    assert reporter.reports[-1].tools == job

    # per step: the trajectories received since the previous step, the window of `classes`
    lines = [
        StepRecord.model_validate_json(x)
        for x in (tmp_path / "steps.jsonl").read_text().splitlines()
    ]
    assert lines == driver.records
    for record in lines:
        assert record.tools is not None
        ends = record.tools.end_reasons
        assert ends.submitted == record.classes.get("completed", 0)
        assert ends.turn_cap == record.classes.get("truncated", 0)
        assert ends.infra_error == record.infra_errors
        assert record.tools.episodes == sum(record.classes.values()) - record.infra_errors
    # the steps' windows do not overlap: together at most what the job counted
    assert sum(r.tools.episodes for r in lines if r.tools) <= episodes

    # the checkpoint of the last step holds the tally: a resumed run goes on from it
    assert saved.counters.tools == state.counters.tools


#: A ``steps.jsonl`` line as a trainer without tool health wrote it.
OLD_STEP_LINE = (
    '{"step": 1, "wall_seconds": 1.0, "trajectories": 2, "tokens": 6, "reward_mean": 0.5, '
    '"pass_rate": 0.5, "classes": {"completed": 2}, "infra_errors": 0, "loss": 0.0, '
    '"grad_norm": 0.0, "clip_fraction": 0.0, "mismatch_abs_mean": 0.0, "ess": 1.0, '
    '"correction_fraction": 0.0, "zero_variance_share": 0.0, "staleness_mean": 0.0, '
    '"staleness_max": 0, "in_flight": 0, "weight_version": 1, "times": {"actor_update": 0, '
    '"waiting_for_rollout": 0, "logprob_recompute": 0, "weight_sync": 0}}'
)


def test_a_checkpoint_and_a_step_line_from_before_tool_health_still_load() -> None:
    old = DriverState.model_validate_json(
        '{"step": 5, "counters": {"trajectories": 9, "classes": {"completed": 9}}}'
    )
    assert old.counters.tools.health() is None  # counting starts again at the resume
    assert StepRecord.model_validate_json(OLD_STEP_LINE).tools is None
