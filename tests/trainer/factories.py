"""Trajectory factories and fakes of the driver's collaborators for the trainer tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentrl.api.job import AgentRLJobSpec
from agentrl.api.rollout import ClassAction, TerminalClass
from agentrl.rollout.admission import StalenessAdmission
from agentrl.rollout.scheduler import RolloutScheduler
from agentrl.rollout.tasks.toy import generate_toy_tasks
from agentrl.rollout.trajectory import Trajectory, TruncationCap
from agentrl.trainer.batching import TrainSample
from agentrl.trainer.checkpoint import CheckpointStore, DriverState
from agentrl.trainer.checkpoint_saves import Sleep
from agentrl.trainer.loop import Backend, StepRecord, TaskOrder, TaskStream, TrainingDriver
from agentrl.trainer.stats import LossStats, StepStats
from agentrl.trainer.stopping import StopRequest
from agentrl.trainer.weight_sync import SyncReport


def make_trajectory(
    group: str,
    reward: float | None,
    *,
    terminal: TerminalClass = TerminalClass.COMPLETED,
    action: ClassAction | None = None,
    version: int = 0,
    tokens: tuple[list[int], list[float], list[int]] | None = None,
    n: int = 0,
) -> Trajectory:
    ids, logprobs, mask = tokens or ([1, 2, 3], [0.0, -0.5, -0.7], [0, 1, 1])
    if action is None:
        action = {
            TerminalClass.COMPLETED: ClassAction.TRAIN,
            TerminalClass.TRUNCATED: ClassAction.TRAIN,
            TerminalClass.AGENT_TIMEOUT: ClassAction.MASK,
            TerminalClass.INFRA_ERROR: ClassAction.DROP,
        }[terminal]
    return Trajectory(
        episode_id=f"{group}-{n}-{reward}",
        task_id=group.split("#")[0],
        group_id=group,
        policy_version=version,
        terminal_class=terminal,
        truncation=TruncationCap.TURNS if terminal == TerminalClass.TRUNCATED else None,
        reward=reward,
        training_action=action,
        token_ids=ids,
        logprobs=logprobs,
        loss_mask=mask,
    )


def step_stats(
    *,
    loss: float = 0.0,
    grad_norm: float = 0.0,
    recompute_seconds: float = 0.0,
    update_seconds: float = 0.0,
    clip_fraction: float = 0.0,
    mismatch_abs_mean: float = 0.0,
    ess: float = 1.0,
    correction_fraction: float = 0.0,
) -> StepStats:
    """A backend's report of one step: zero figures (ESS 1) unless given."""
    return StepStats(
        loss=loss,
        grad_norm=grad_norm,
        loss_stats=LossStats(
            clip_fraction=clip_fraction,
            mismatch_abs_mean=mismatch_abs_mean,
            ess=ess,
            correction_fraction=correction_fraction,
            kl=0.0,
            tokens=0,
        ),
        recompute_seconds=recompute_seconds,
        update_seconds=update_seconds,
    )


class FakeBackend:
    """A trainer backend that trains on nothing: each step hands its samples to :meth:`observe`
    and reports :meth:`stats` for the step's number (1, 2, …), zero figures unless a subclass
    says otherwise; a checkpoint holds an empty ``model`` directory."""

    def __init__(self) -> None:
        self.step_count = 0

    def observe(self, samples: Sequence[TrainSample]) -> None:
        return None

    def stats(self, k: int) -> StepStats:
        return step_stats()

    def train_step(self, samples: Sequence[TrainSample]) -> StepStats:
        self.observe(samples)
        self.step_count += 1
        return self.stats(self.step_count)

    def save_state(self, directory: Path) -> None:
        (directory / "model").mkdir(parents=True, exist_ok=True)

    def load_state(self, directory: Path) -> None:
        return None


class FakeSync:
    """A weight sync that pushes nothing: the version pushed becomes the current one."""

    def __init__(self, version: int = 0) -> None:
        self.current_version = version

    async def push(self, version: int) -> SyncReport:
        self.current_version = version
        return SyncReport(version=version, seconds=0.0)

    async def reconcile(self) -> list[str]:
        return []


def toy_spec(
    *,
    group_size: int,
    per_step: int,
    max_steps: int,
    checkpoint: dict[str, Any] | None = None,
) -> AgentRLJobSpec:
    """A job on toy tasks, the torch backend without GPUs, ``maxStaleness`` 1 and a checkpoint
    every 100 steps (none in these short runs but at a stop); ``checkpoint``: fields of
    ``trainer.checkpoint`` to set instead (camelCase)."""
    return AgentRLJobSpec.model_validate(
        {
            "model": {"source": {"path": "tiny"}},
            "dataset": {"format": "toy"},
            "rollout": {"groupSize": group_size},
            "sandbox": {"provider": "local"},
            "trainer": {
                "backend": "torch",
                "gpusPerNode": 0,
                "trajectoriesPerStep": per_step,
                "maxSteps": max_steps,
                "async": {"maxStaleness": 1},
                "checkpoint": {"intervalSteps": 100, **(checkpoint or {})},
            },
        }
    )


def toy_driver(
    root: Path,
    runner: Any,
    backend: Backend,
    *,
    per_step: int,
    max_steps: int,
    group_size: int = 2,
    stream: TaskStream | None = None,
    state: DriverState | None = None,
    concurrency: int = 8,
    steps_log: Path | None = None,
    on_step: Callable[[StepRecord], None] | None = None,
    stop: StopRequest | None = None,
    checkpoint: dict[str, Any] | None = None,
    checkpoints: CheckpointStore | None = None,
    save_sleep: Sleep | None = None,
) -> tuple[TrainingDriver, RolloutScheduler]:
    """A :class:`TrainingDriver` of :func:`toy_spec` on ``backend`` with a :class:`FakeSync`,
    checkpointing under ``root``, and the scheduler that runs its episodes with ``runner``
    (``runner.run(task, group_id=..., policy_version=...)``). ``stream``: by default the first
    8 toy tasks in seed 0's order from the start; ``state``: where a resumed run starts (the
    admission and the weight version at its step); ``checkpoint``: :func:`toy_spec`'s;
    ``checkpoints``: the store (by default one under ``root``); ``save_sleep``: the driver's
    wait between tries of a failed save. The caller runs the driver and cancels the
    scheduler."""
    if state is None:
        state = DriverState()
    if stream is None:
        stream = TaskStream(TaskOrder(generate_toy_tasks(0)[:8], 0), cursor=0, pending=[])
    admission = StalenessAdmission(
        trajectories_per_step=per_step, max_staleness=1, group_size=group_size,
    )  # fmt: skip
    admission.resume_at(state.step)
    scheduler = RolloutScheduler(
        runner=runner, tasks=stream, admission=admission, concurrency=concurrency,
        group_size=group_size,
    )  # fmt: skip
    driver = TrainingDriver(
        spec=toy_spec(
            group_size=group_size, per_step=per_step, max_steps=max_steps, checkpoint=checkpoint
        ),
        backend=backend, source=scheduler, admission=admission, stream=stream, state=state,
        weight_sync=FakeSync(state.step), checkpoints=checkpoints or CheckpointStore(root),
        steps_log=steps_log, on_step=on_step, stop=stop, save_sleep=save_sleep,
    )  # fmt: skip
    return driver, scheduler
