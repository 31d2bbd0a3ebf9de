"""The staleness bound is hard: admission paces the normal case, the trainer's gate holds a step
back for a straggler at the bound; finished work is never thrown away."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

from agentrl.api.rollout import TerminalClass
from agentrl.rollout.admission import StalenessAdmission
from agentrl.rollout.tasks.model import Task
from agentrl.rollout.tasks.toy import generate_toy_tasks
from agentrl.rollout.trajectory import Trajectory
from agentrl.trainer.batching import TrainSample
from agentrl.trainer.loop import StepRecord, TaskOrder
from tests.trainer.factories import FakeBackend, make_trajectory, toy_driver


def test_a_released_slot_does_not_start_a_group_that_cannot_be_admitted_whole() -> None:
    # 4 per step, staleness 0, groups of 4: the limit at version 0 is (0 + 0 + 1) · 4 = 4.
    admission = StalenessAdmission(trajectories_per_step=4, max_staleness=0, group_size=4)
    assert [admission.try_admit() for _ in range(4)] == [0, 0, 0, 0]
    admission.release()  # one episode dropped: 3 admitted, 1 slot free
    # per-episode admission would start a new group here and leave 3 of its 4 waiting
    assert admission.try_admit() is None
    admission.set_policy_version(1)  # limit (0 + 1 + 1) · 4 = 8; 3 + 4 ≤ 8: the group fits
    assert [admission.try_admit() for _ in range(4)] == [1, 1, 1, 1]
    assert admission.try_admit() is None  # 7 + 4 > 8


def test_the_rest_of_a_started_group_is_admitted_even_past_the_limit() -> None:
    # A group larger than a step (8 > 2 · (0 + 0 + 1)) starts alone and is admitted whole.
    admission = StalenessAdmission(trajectories_per_step=2, max_staleness=0, group_size=8)
    assert [admission.try_admit() for _ in range(8)] == [0] * 8
    assert admission.try_admit() is None


class _Backend(FakeBackend):
    """Records, per step, the (group, admission version) of every sample it trained on."""

    def __init__(self) -> None:
        super().__init__()
        self.trained: list[list[tuple[str, int]]] = []

    def observe(self, samples: Sequence[TrainSample]) -> None:
        self.trained.append([(s.trajectory.group_id, s.trajectory.policy_version) for s in samples])


class _Runner:
    """Episodes that finish at once, except the second episode of the first group: it runs
    until 6 other episodes have finished, or 0.5 s at most (so a trainer that waits for it is
    not left waiting forever)."""

    def __init__(self) -> None:
        self.finished = 0
        self.started = 0

    async def run(self, task: Task, *, group_id: str, policy_version: int) -> Trajectory:
        n = self.started
        self.started += 1
        if n == 1:
            deadline = asyncio.get_running_loop().time() + 0.5
            while self.finished < 6 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.001)
        else:
            await asyncio.sleep(0)
        self.finished += 1
        # rewards 1, 0 within each group: every group carries signal (no zero variance)
        return make_trajectory(group_id, float(n % 2 == 0), version=policy_version, n=n)


async def _train(
    tmp_path: Path, *, steps: int, steps_log: Path | None = None
) -> tuple[list[StepRecord], list[list[tuple[str, int]]]]:
    backend = _Backend()
    driver, scheduler = toy_driver(
        tmp_path, _Runner(), backend, per_step=2, max_steps=steps, steps_log=steps_log
    )
    try:
        await asyncio.wait_for(driver.run(), timeout=10)
    finally:
        await scheduler.cancel()
    return driver.records, backend.trained


async def test_a_straggler_is_never_trained_on_more_than_max_staleness_versions_late(
    tmp_path: Path,
) -> None:
    # Steps of 2 (one group of 2), maxStaleness 1. Groups g0, g1 start at version 0; g0's
    # second episode is slow. Step 1 trains version 0 on g1. Step 2 would train version 1 on
    # g2 (admitted at 1) — and the old rule did, then version 2 on g3, and only then g0 at
    # staleness 3 - 0 = 3. The gate holds step 2 until g0 is in and takes it first (oldest
    # version first): g0 is trained on at version 1, staleness 1 - 0 = 1; g2 follows at
    # version 2, staleness 2 - 1 = 1.
    records, trained = await _train(tmp_path, steps=6)
    assert [r.step for r in records] == [1, 2, 3, 4, 5, 6]
    # The step that trains version u is the u+1-th; g0 (the first group) was trained on, at
    # version 1 (step 2), both its episodes admitted at version 0.
    first_group = f"{TaskOrder(generate_toy_tasks(0)[:8], 0)[0].id}#0"
    when = [u for u, step in enumerate(trained) for g, _ in step if g == first_group]
    assert when == [1, 1]
    for u, step in enumerate(trained):
        assert all(u - version <= 1 for _, version in step)
    assert [r.staleness_max for r in records[:3]] == [0, 1, 1]
    assert all(r.trajectories == 2 for r in records)  # nothing was thrown away or merged


async def test_the_first_step_does_not_wait_for_the_slowest_member_of_a_batch(
    tmp_path: Path,
) -> None:
    # Step 1 trains version 0; 0 - 1 < 0, so nothing admitted at version 0 is at the bound
    # yet: it trains on g1 while g0's slow episode is still running.
    records, _ = await _train(tmp_path, steps=1)
    assert len(records) == 1
    assert records[0].trajectories == 2
    assert records[0].in_flight >= 1
    # counted as their group leaves the buffer: g1's two (g0's first waits with its group)
    assert records[0].classes == {TerminalClass.COMPLETED.value: 2}


async def test_each_step_is_logged_on_a_fresh_volume_before_any_checkpoint(tmp_path: Path) -> None:
    # The trainer pod logs steps to CHECKPOINT/trainer/steps.jsonl; on a fresh checkpoint
    # volume that directory does not exist until the first checkpoint (intervalSteps 100 here).
    log = tmp_path / "volume" / "trainer" / "steps.jsonl"
    await _train(tmp_path, steps=3, steps_log=log)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3]
    assert [line["trajectories"] for line in lines] == [2, 2, 2]
