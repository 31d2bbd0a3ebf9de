"""The driver's held-out evaluation: at the start and every ``intervalSteps``, through the same
episode runner as training, beside the loop; its episodes never reach a training step, infra
errors are left out of pass@1 and counted; the progress annotation carries the result."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

from agentrl.api.job import AgentRLJobSpec
from agentrl.api.rollout import TerminalClass
from agentrl.rollout.admission import StalenessAdmission
from agentrl.rollout.scheduler import GatedEpisodes, RolloutScheduler
from agentrl.rollout.tasks.model import Task
from agentrl.rollout.tasks.toy import generate_toy_tasks
from agentrl.rollout.trajectory import Trajectory
from agentrl.trainer.checkpoint import CheckpointStore, DriverState
from agentrl.trainer.evaluation import PeriodicEvaluation
from agentrl.trainer.loop import EVAL_PASS_AT_1, TaskOrder, TaskStream, TrainingDriver
from agentrl.trainer.progress import FakeProgressReporter, ProgressTracker
from tests.trainer.factories import FakeSync, make_trajectory
from tests.trainer.test_staleness_bound import _Backend


class _Runner:
    """One runner for both kinds of episode, as on a cluster. Training episodes: rewards 1, 0
    within each group, a little slower than evaluation's. Held-out task ``H0``: every other attempt
    passes and the others are infra errors; ``H1``: every attempt fails."""

    def __init__(self, held_out: set[str]) -> None:
        self.held_out = held_out
        self.calls: Counter[str] = Counter()
        self.n = 0
        self.live = 0
        self.peak = 0
        """Most episodes running at once, training's and evaluation's together."""

    async def run(self, task: Task, *, group_id: str, policy_version: int) -> Trajectory:
        self.live += 1
        self.peak = max(self.peak, self.live)
        try:
            return await self._run(task, group_id=group_id, policy_version=policy_version)
        finally:
            self.live -= 1

    async def _run(self, task: Task, *, group_id: str, policy_version: int) -> Trajectory:
        self.n += 1
        self.calls[task.id] += 1
        if task.id not in self.held_out:
            self.calls[group_id] += 1
            reward = float(self.calls[group_id] % 2)  # 1 then 0 within a group: never all equal
            await asyncio.sleep(0.005)
            return make_trajectory(group_id, reward, version=policy_version, n=self.n)
        k = self.calls[task.id]  # read before yielding: attempts of a task run side by side
        await asyncio.sleep(0)
        if task.id == "H0" and k % 2 == 0:
            return make_trajectory(
                group_id, None, terminal=TerminalClass.INFRA_ERROR, version=policy_version, n=self.n
            )
        reward = 1.0 if task.id == "H0" else 0.0
        return make_trajectory(group_id, reward, version=policy_version, n=self.n)


async def test_evaluations_run_at_the_start_and_every_interval_and_are_never_trained_on(
    tmp_path: Path,
) -> None:
    spec = AgentRLJobSpec.model_validate(
        {
            "model": {"source": {"path": "tiny"}},
            "dataset": {"format": "toy", "heldOutFraction": 0.2},
            "rollout": {"groupSize": 2},
            "sandbox": {"provider": "local", "concurrency": 8},
            "trainer": {
                "backend": "torch",
                "gpusPerNode": 0,
                "trajectoriesPerStep": 2,
                "maxSteps": 6,
                "async": {"maxStaleness": 1},
                "checkpoint": {"intervalSteps": 100},
                "evaluation": {"intervalSteps": 3, "tasks": 2, "attemptsPerTask": 2},
            },
        }
    )
    toy = generate_toy_tasks(0)
    held_out = [toy[0].model_copy(update={"id": f"H{i}"}) for i in range(2)]
    runner = _Runner({t.id for t in held_out})
    episodes = GatedEpisodes(runner)  # as agentrl run and a trainer without rollout workers
    admission = StalenessAdmission(trajectories_per_step=2, max_staleness=1, group_size=2)
    stream = TaskStream(TaskOrder(toy[:8], 0), cursor=0, pending=[])
    scheduler = RolloutScheduler(
        runner=episodes, tasks=stream, concurrency=8, group_size=2, admission=admission
    )
    reporter = FakeProgressReporter()
    state = DriverState()
    tracker = ProgressTracker(reporter, state=state)
    evaluation = PeriodicEvaluation(
        spec.trainer.evaluation,
        held_out,
        seed=0,
        runner=episodes,
        concurrency=lambda: scheduler.concurrency,
        log_path=tmp_path / "evaluations.jsonl",
        on_result=tracker.on_evaluation,
    )
    backend = _Backend()
    driver = TrainingDriver(
        spec=spec,
        backend=backend,
        source=scheduler,
        admission=admission,
        weight_sync=FakeSync(),
        checkpoints=CheckpointStore(tmp_path / "checkpoints"),
        stream=stream,
        state=state,
        on_step=lambda record: tracker.on_step(record, driver),
        evaluation=evaluation,
    )
    try:
        await asyncio.wait_for(driver.run(), timeout=20)
        await tracker.flush()
    finally:
        await scheduler.cancel()

    # at the start (step 0) and after steps 3 and 6; none skipped (each ended before the next)
    assert [r.step for r in evaluation.results] == [0, 3, 6]
    assert evaluation.skipped == 0
    # never trained on: no held-out group in any step; every step had its 2 training samples
    trained = [group for step in backend.trained for group, _ in step]
    assert len(backend.trained) == 6
    assert all(r.trajectories == 2 for r in driver.records)
    assert not [g for g in trained if g.split("#")[0] in {"H0", "H1"}]
    # nor counted as training episodes (the driver saw only its own trajectories)
    assert sum(driver.records[i].classes.get("completed", 0) for i in range(6)) >= 12
    assert "infra_error" not in state.counters.classes
    # 2 attempts per task per evaluation: H0 pass + infra error → 1/1; H1 fail, fail → 0/2;
    # pass@1 = (1 + 0) / 2 = 0.5 over 3 counted attempts, 1 infra error left out
    for r in evaluation.results:
        assert (r.pass_at_1, r.episodes, r.passed, r.infra_errors, r.tasks) == (0.5, 3, 1, 1, 2)
    assert runner.calls["H0"] == runner.calls["H1"] == 6
    # training's episodes and the evaluations' shared the job's 8 slots, never more
    assert 0 < runner.peak <= 8
    assert EVAL_PASS_AT_1._value.get() == 0.5
    lines = [json.loads(x) for x in (tmp_path / "evaluations.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 3, 6]
    # the progress annotation: the evaluation reported at once, then carried by every step
    evaluated = [p for p in reporter.reports if p.eval_step is not None]
    assert {p.eval_step for p in evaluated} == {0, 3, 6}
    last = reporter.reports[-1]
    assert (last.pass_at_1, last.eval_step, last.eval_episodes, last.eval_infra_errors) == (
        0.5,
        6,
        3,
        1,
    )
    step_reports = [p for p in reporter.reports if p.step == 2]
    assert step_reports and all(p.eval_step == 0 for p in step_reports)


async def test_an_evaluation_still_running_is_skipped_not_queued_and_training_goes_on(
    tmp_path: Path,
) -> None:
    release = asyncio.Event()

    class _Slow:
        async def run(self, task: Task, *, group_id: str, policy_version: int) -> Trajectory:
            await release.wait()
            return make_trajectory(group_id, 1.0, version=policy_version)

    spec = AgentRLJobSpec.model_validate(
        {
            "model": {"source": {"path": "tiny"}},
            "dataset": {"format": "toy"},
            "sandbox": {"provider": "local"},
            "trainer": {
                "backend": "torch",
                "gpusPerNode": 0,
                "evaluation": {"intervalSteps": 1, "tasks": 1, "attemptsPerTask": 1},
            },
        }
    )
    evaluation = PeriodicEvaluation(
        spec.trainer.evaluation,
        generate_toy_tasks(0)[:1],
        seed=0,
        runner=_Slow(),
        concurrency=lambda: 4,
    )
    evaluation.maybe_start(0, start=True)
    evaluation.maybe_start(1)  # the first still runs: skipped
    evaluation.maybe_start(1)  # not due twice
    assert evaluation.skipped == 1
    release.set()
    await asyncio.wait_for(evaluation.finish(0), timeout=5)
    assert [r.step for r in evaluation.results] == [0]
    evaluation.maybe_start(2)
    evaluation.maybe_start(3)  # skipped while 2 runs; the last step: finish runs it after all
    await asyncio.wait_for(evaluation.finish(3), timeout=5)
    assert [r.step for r in evaluation.results] == [0, 2, 3]
    assert evaluation.skipped == 2
