"""The one assembly of a run (:mod:`agentrl.trainer.assembly`): parts resumed at a checkpoint's
step and the session wired over a rollout tier."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agentrl.trainer.assembly import (
    SessionOptions,
    TaskSplit,
    build_admission,
    build_parts,
    open_session,
    peek_state,
    restore_state,
)
from agentrl.trainer.checkpoint import CheckpointStore, DriverState
from tests.trainer.factories import toy_spec


def test_admission_resumes_at_the_checkpoints_step() -> None:
    spec = toy_spec(group_size=2, per_step=4, max_steps=3)
    admission = build_admission(spec, 3)
    assert admission.policy_version == 3
    assert admission.admitted == 12  # the steps before: nothing outstanding
    assert admission.capacity == (1 + 3 + 1) * 4


def test_parts_start_at_the_states_data_position(tmp_path: Path) -> None:
    spec = toy_spec(group_size=2, per_step=4, max_steps=3)
    tasks = TaskSplit.of(spec)
    assert tasks.train and sorted(t.id for t in tasks.all) == sorted(
        t.id for t in [*tasks.train, *tasks.held_out]
    )
    checkpoints = CheckpointStore(tmp_path)
    assert restore_state(checkpoints, backend=None, resume=False) == DriverState()
    assert peek_state(checkpoints).step == 0
    state = DriverState(step=2, task_cursor=5, pending_positions=[3])
    parts = build_parts(
        spec, tasks=tasks, backend=None, checkpoints=checkpoints, state=state, weight_sync=None
    )
    assert parts.stream.cursor == 5
    assert parts.admission.admitted == 8 and parts.admission.policy_version == 2


def fresh_parts(spec: Any, root: Path) -> Any:
    """The parts of a run that starts at step 0, checkpointing under ``root``."""
    return build_parts(
        spec,
        tasks=TaskSplit.of(spec),
        backend=None,
        checkpoints=CheckpointStore(root),
        state=DriverState(),
        weight_sync=None,
    )


class _Scheduler:
    runner = "the tier's runner"
    concurrency = 7
    cancelled = False

    async def cancel(self) -> None:
        self.cancelled = True


def test_session_wires_evaluation_and_driver_to_the_tier(tmp_path: Path) -> None:
    spec = toy_spec(group_size=2, per_step=4, max_steps=3)
    parts = fresh_parts(spec, tmp_path)
    entered: list[Any] = []
    steps: list[Any] = []

    @contextlib.asynccontextmanager
    async def tier(stream: Any, admission: Any) -> AsyncIterator[Any]:
        entered.append((stream, admission))
        yield _Scheduler()
        entered.append("exited")

    async def run() -> None:
        options = SessionOptions(
            steps_log=tmp_path / "steps.jsonl",
            evaluation=spec.trainer.evaluation,
            on_step=lambda record, driver: steps.append((record, driver)),
        )
        async with open_session(parts, tier, options) as session:
            assert entered == [(parts.stream, parts.admission)]
            assert session.driver.source is session.scheduler
            assert session.driver.admission is parts.admission
            assert session.evaluation is not None
            session.driver.on_step("record")  # type: ignore[misc]
            assert steps == [("record", session.driver)]
            scheduler = session.scheduler
        assert entered[-1] == "exited"
        assert scheduler.cancelled

    asyncio.run(run())


async def test_the_fixed_rollout_tier_runs_at_most_the_e2b_plan_limit() -> None:
    """``agentrl run`` has no operator to cap the spec's figure by the provider's own limit, so
    the in-process tier applies it (once: on a cluster the operator's in-effect figure does)."""
    from agentrl.api import AgentRLJobSpec
    from agentrl.rollout.admission import StalenessAdmission
    from agentrl.trainer.assembly import fixed_rollout

    spec = AgentRLJobSpec.model_validate(
        {
            "model": {"source": {"path": "tiny"}},
            "sandbox": {
                "provider": "e2b",
                "concurrency": 64,
                "e2b": {"apiKeySecretRef": {"name": "e2b"}, "maxConcurrent": 10},
            },
        }
    )
    admission = StalenessAdmission(max_staleness=1, trajectories_per_step=4)
    runner: Any = None  # nothing runs: no task
    async with fixed_rollout(spec, runner, stream=[], admission=admission) as scheduler:  # type: ignore[arg-type]
        assert (scheduler.concurrency, scheduler.effective_concurrency) == (64, 10)
        assert scheduler.runner.capacity == 10  # the gate the evaluation shares


async def test_leaving_a_session_cancels_the_episodes_it_would_otherwise_wait_for(
    tmp_path: Path,
) -> None:
    """The driver is done (its stop checkpointed every task in flight as pending): the tier's
    running episodes are cancelled, not drained. Here they never finish, as an episode held for
    a rollout worker whose pod left with the job never does; draining them would hold the
    stopping trainer until its grace period ran out."""
    from agentrl.rollout.scheduler import RolloutScheduler

    spec = toy_spec(group_size=2, per_step=4, max_steps=3)
    parts = fresh_parts(spec, tmp_path)
    started: list[str] = []
    cancelled: list[str] = []

    class Stranded:
        async def run(self, task: Any, *, group_id: str, policy_version: int) -> Any:
            started.append(task.id)
            try:
                await asyncio.Event().wait()  # no worker ever answers
            except asyncio.CancelledError:
                cancelled.append(task.id)
                raise

    @contextlib.asynccontextmanager
    async def tier(stream: Any, admission: Any) -> AsyncIterator[Any]:
        # as the cluster's tiers do: a clean exit stops admitting and drains what runs
        async with RolloutScheduler(
            runner=Stranded(), tasks=stream, concurrency=3, group_size=2, admission=admission
        ) as scheduler:
            yield scheduler

    options = SessionOptions(steps_log=tmp_path / "steps.jsonl")
    async with open_session(parts, tier, options) as session:
        session.scheduler.start()
        while len(started) < 3:
            await asyncio.sleep(0)
    assert len(started) == 3  # the concurrency
    assert sorted(cancelled) == sorted(started)
