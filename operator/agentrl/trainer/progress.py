"""The trainer's progress on its own pod: ``agentrl.dev/progress``, the annotation the operator
reads into the job's status (:class:`agentrl.api.wire.TrainerProgress`, camelCase JSON).

:class:`ProgressTracker` turns each step's :class:`~agentrl.trainer.loop.StepRecord` and the
driver's running counters into a :class:`TrainerProgress` and hands it to a
:class:`ProgressReporter`: :class:`LightkubeProgressReporter` merge-patches the pod (its
ServiceAccount needs ``patch`` on its own pod), :class:`FakeProgressReporter` records (tests),
:class:`LoggingProgressReporter` logs (outside a pod). Reporting never stops training: an API
error is logged and the next step reports again. The last held-out evaluation
(:meth:`ProgressTracker.on_evaluation`) is reported at once and carried in every later report,
and so are the engines whose weight pushes are failing (``weightPushFailures``: each engine, its
failed pushes in a row and the last error, from the last push's
:class:`~agentrl.trainer.weight_sync.SyncReport`), which the operator turns into ``Degraded``,
and the checkpoint saves failing now (``checkpointSaveFailure``: the count in a row, the step and
the last error, from :attr:`~agentrl.trainer.loop.TrainingDriver.checkpoint_failure`), which it
turns into ``CheckpointSaved=False`` and ``Degraded``. After the driver's run (its last
checkpoint, or the failure that ended it) :meth:`ProgressTracker.on_checkpoint` reports again.

Callers: :mod:`agentrl.trainer.pod` (the driver, rank 0).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentrl.api.wire import (
    ANNOTATION_PROGRESS,
    CheckpointSaveFailure,
    TrainerProgress,
    TrainerStage,
    WeightPushFailure,
)
from agentrl.trainer.checkpoint import DriverState, WarmStartProgress
from agentrl.trainer.loop import StepRecord

log = logging.getLogger(__name__)


def to_annotation(progress: TrainerProgress) -> str:
    """The annotation value: camelCase JSON, unset fields left out."""
    return progress.model_dump_json(by_alias=True, exclude_none=True)


class ProgressReporter(Protocol):
    """Where rank 0 reports its progress."""

    async def report(self, progress: TrainerProgress) -> None: ...


@dataclass
class FakeProgressReporter:
    """Records every report (tests)."""

    reports: list[TrainerProgress] = field(default_factory=list)

    async def report(self, progress: TrainerProgress) -> None:
        self.reports.append(progress)


class LoggingProgressReporter:
    """Logs the progress (no pod to annotate)."""

    async def report(self, progress: TrainerProgress) -> None:
        log.info("progress: %s", to_annotation(progress))


class LightkubeProgressReporter:
    """Merge-patches ``agentrl.dev/progress`` on the trainer's own pod."""

    def __init__(self, *, pod_name: str, namespace: str, client: Any = None) -> None:
        """``client``: a ``lightkube.AsyncClient``; None builds one from the in-cluster config."""
        self.pod_name = pod_name
        self.namespace = namespace
        self._client = client

    async def report(self, progress: TrainerProgress) -> None:
        from lightkube.resources.core_v1 import Pod
        from lightkube.types import PatchType

        if self._client is None:
            from lightkube import AsyncClient

            self._client = AsyncClient()
        patch = {"metadata": {"annotations": {ANNOTATION_PROGRESS: to_annotation(progress)}}}
        try:
            await self._client.patch(
                Pod, self.pod_name, patch, namespace=self.namespace, patch_type=PatchType.MERGE
            )
        except Exception:  # reporting must never stop training
            log.exception("could not annotate pod %s/%s", self.namespace, self.pod_name)


def reporter_for(env: Any) -> ProgressReporter:
    """Lightkube inside a pod (``POD_NAME``/``POD_NAMESPACE`` set), logging elsewhere."""
    if env.pod_name and env.namespace:
        return LightkubeProgressReporter(pod_name=env.pod_name, namespace=env.namespace)
    return LoggingProgressReporter()


def progress_of(
    record: StepRecord,
    state: DriverState,
    *,
    last_checkpoint_step: int,
    hours: float,
    push_failures: list[WeightPushFailure] | None = None,
    checkpoint_failure: CheckpointSaveFailure | None = None,
) -> TrainerProgress:
    """The annotation's content after ``record``'s step; ``push_failures``: the engines whose
    weight pushes are failing after the last push (none: left out); ``checkpoint_failure``:
    the checkpoint saves failing now (None: left out)."""
    counters = state.counters
    seen = max(counters.trajectories, 1)
    return TrainerProgress(
        step=record.step,
        last_checkpoint_step=last_checkpoint_step,
        weight_version=str(record.weight_version),
        trajectories_per_hour=counters.trained_trajectories / hours if hours > 0 else 0.0,
        mean_reward=record.reward_mean,
        infra_error_rate=counters.infra_errors / seen,
        truncated_rate=counters.classes.get("truncated", 0) / seen,
        tools=counters.tools.health(),
        weight_push_failures=list(push_failures) if push_failures else None,
        checkpoint_save_failure=checkpoint_failure,
    )


def stage_fields(warm: WarmStartProgress | None) -> dict[str, Any]:
    """The annotation's stage fields for the warm start's progress ``warm`` (None: the job has
    none, so it only ever trains)."""
    if warm is None:
        return {"stage": TrainerStage.TRAINING}
    return {
        "stage": TrainerStage.TRAINING if warm.done else TrainerStage.WARMING_UP,
        "warm_start_progress": warm.fraction,
        "warm_start_loss": warm.loss,
    }


class ProgressTracker:
    """Reports after every step; the driver calls :meth:`on_step` from its loop."""

    def __init__(self, reporter: ProgressReporter, *, state: DriverState) -> None:
        self.reporter = reporter
        self.state = state
        self._started = time.monotonic() - state.elapsed_seconds
        self._pending: list[Any] = []
        self._last: TrainerProgress | None = None
        self._evaluation: dict[str, Any] = {}

    def on_step(self, record: StepRecord, driver: Any) -> None:
        hours = (time.monotonic() - self._started) / 3600.0
        last_sync = getattr(driver, "last_sync", None)
        self._last = progress_of(
            record,
            self.state,
            last_checkpoint_step=getattr(driver, "_last_checkpoint", 0),
            hours=hours,
            push_failures=last_sync.failures if last_sync is not None else None,
            checkpoint_failure=getattr(driver, "checkpoint_failure", None),
        )
        self._send()

    def _stage_fields(self) -> dict[str, Any]:
        """The stage fields every report carries: RL's once it steps, the warm start's last
        figures kept."""
        return stage_fields(self.state.warm_start)

    def on_evaluation(self, record: Any) -> None:
        """A held-out evaluation finished (an :class:`agentrl.trainer.evaluation.
        EvaluationRecord`): report it now, and with every step from here on."""
        stage = getattr(record, "stage", "rl")
        self._evaluation.update(
            {
                "pass_at_1": record.pass_at_1,
                "eval_step": record.step,
                "eval_episodes": record.episodes,
                "eval_infra_errors": record.infra_errors,
            }
        )
        if stage == "base":
            self._evaluation["pass_at_1_base"] = record.pass_at_1
        elif stage == "warm_start":
            self._evaluation["pass_at_1_warm_start"] = record.pass_at_1
        if self._last is None:  # before the first step of this run
            self._last = TrainerProgress(step=self.state.step, last_checkpoint_step=self.state.step)
        self._send()

    def on_warm_start(self, progress: WarmStartProgress) -> None:
        """The warm start made an update (or is starting, or resuming): report the stage."""
        last = self._last or TrainerProgress(
            step=self.state.step, last_checkpoint_step=self.state.step
        )
        self._last = last.model_copy(update=stage_fields(progress))
        self._send()

    def on_stop(self, checkpoint_step: int) -> None:
        """The driver stopped early (SIGTERM) after checkpointing ``checkpoint_step``: report
        it, so the status shows the step a resume continues from."""
        last = self._last or TrainerProgress(step=self.state.step)
        self._last = last.model_copy(update={"last_checkpoint_step": checkpoint_step})
        self._send()

    def on_checkpoint(self, checkpoint_step: int, failure: CheckpointSaveFailure | None) -> None:
        """The driver's run ended (its last step done, a stop, or a failed save): report its
        last checkpoint and the saves failing now, so the status neither keeps a failure a
        later save made good nor misses the one that ended the run."""
        last = self._last or TrainerProgress(step=self.state.step)
        self._last = last.model_copy(
            update={"last_checkpoint_step": checkpoint_step, "checkpoint_save_failure": failure}
        )
        self._send()

    def _send(self) -> None:
        import asyncio

        assert self._last is not None
        stage = {} if self._last.stage is not None else self._stage_fields()
        progress = self._last.model_copy(update={**stage, **self._evaluation})
        self._pending = [t for t in self._pending if not t.done()]
        self._pending.append(asyncio.get_running_loop().create_task(self.reporter.report(progress)))

    async def flush(self) -> None:
        """Wait for reports still in flight."""
        import asyncio

        await asyncio.gather(*self._pending, return_exceptions=True)
        self._pending = []
