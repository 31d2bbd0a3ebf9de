"""The driver's held-out evaluation during training (``spec.trainer.evaluation``).

At the start of a run and after every ``intervalSteps`` steps, :class:`PeriodicEvaluation` runs
``attemptsPerTask`` episodes of each task of a stratified sample of the held-out split through
the same episode runner as training (the rollout tier in this process, or the worker actors), as
an asyncio task beside the loop: a step never waits for it, and its episodes go to the
evaluation, never to the driver's buffer (a separate scheduler collects them). An evaluation due
while the previous one still runs is skipped, never queued.

Each result is one :class:`EvaluationRecord`: logged, appended to ``evaluations.jsonl`` beside
``steps.jsonl``, set on the ``agentrl_trainer_eval_pass_at_1`` gauge, and handed to
``on_result`` (the progress annotation the operator turns into status and an ``Evaluated`` event).

Callers: :mod:`agentrl.trainer.assembly` (the session of both the cluster trainer and
``agentrl run``, through :class:`agentrl.trainer.loop.TrainingDriver`), :mod:`agentrl.trainer.pod`
(rank 0 on a cluster) and :mod:`agentrl.local.runner` (its waited-for evaluations).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from agentrl.api.trainer import EvaluationSpec
from agentrl.rollout.evaluation import Evaluation, run_evaluation, stratified_sample
from agentrl.rollout.scheduler import Episodes, RolloutScheduler
from agentrl.rollout.tasks.model import Task
from agentrl.trainer.loop import EVAL_PASS_AT_1

log = logging.getLogger(__name__)

EVALUATIONS_LOG = "evaluations.jsonl"
"""File name of the evaluation log, beside ``steps.jsonl``."""


#: What an evaluation measured: the model as given (``base``), the warm start's weights before
#: any RL step (``warm_start``), or the weights after an RL step (``rl``).
EvaluationStage = Literal["base", "warm_start", "rl"]


class EvaluationRecord(Evaluation):
    """One line of ``evaluations.jsonl``."""

    step: int
    """The step after which it started (0: the start of training); the weights it measured
    are the ones the engines served from then on."""
    stage: EvaluationStage = "rl"
    """``base``, ``warm_start`` (both at step 0) or ``rl``."""
    seconds: float
    """Wall seconds from its start to its end."""


def evaluation_concurrency(spec: EvaluationSpec, concurrency: int) -> int:
    """Episodes an evaluation may run at once: its share of the job's concurrency, at least 1."""
    return max(1, math.ceil(concurrency * spec.concurrency_share))


class PeriodicEvaluation:
    """Starts evaluations when due; see the module docstring."""

    def __init__(
        self,
        spec: EvaluationSpec,
        held_out: Sequence[Task],
        *,
        seed: int,
        runner: Episodes,
        concurrency: Callable[[], int],
        log_path: Path | None = None,
        on_result: Callable[[EvaluationRecord], None] | None = None,
    ) -> None:
        """``concurrency``: the job's concurrency in effect (read at each start);
        ``log_path``: ``evaluations.jsonl`` (None: not written)."""
        self.spec = spec
        self.tasks = stratified_sample(held_out, spec.tasks, seed)
        self.runner = runner
        self.concurrency = concurrency
        self.log_path = log_path
        self.on_result = on_result
        self.results: list[EvaluationRecord] = []
        self.skipped = 0
        """Evaluations not started because the previous one was still running."""
        self._task: asyncio.Task[None] | None = None
        self._scheduler: RolloutScheduler | None = None
        """The running evaluation's scheduler."""
        self._last_due: int | None = None
        self.warm_started = False
        """The engines serve the warm start's weights: step 0 measures them (``warm_start``),
        not the model as given (``base``)."""

    def warm_start_done(self) -> None:
        """The warm start's weights replaced the base model's on the engines: the evaluation
        of step 0 is due again, and measures them."""
        self.warm_started = True
        self._last_due = None

    def stage_of(self, step: int) -> EvaluationStage:
        if step > 0:
            return "rl"
        return "warm_start" if self.warm_started else "base"

    @property
    def enabled(self) -> bool:
        return bool(self.tasks)

    def due(self, step: int, *, start: bool = False) -> bool:
        """Whether an evaluation is due after ``step`` (``start``: the run is starting)."""
        if not self.enabled or step == self._last_due:
            return False
        if start:
            return True
        interval = self.spec.interval_steps
        return interval > 0 and step % interval == 0

    def maybe_start(self, step: int, *, start: bool = False) -> None:
        """Start an evaluation beside training when one is due; never waits for it."""
        if not self.due(step, start=start):
            return
        self._last_due = step  # started or skipped: either way not again for this step
        if self._task is not None and not self._task.done():
            self.skipped += 1
            log.warning("evaluation after step %d skipped: the previous one is still running", step)
            # (finish() runs it after all when it is the last step)
            return
        self._task = asyncio.get_running_loop().create_task(
            self._run(step), name=f"evaluation-{step}"
        )

    async def run_now(self, step: int) -> EvaluationRecord | None:
        """Evaluate after ``step`` and wait for it, with the job's whole concurrency (nothing
        trains meanwhile: the figure is of one weight version); the driver then does not start
        another for that step. ``agentrl run``'s figure before training."""
        if not self.enabled:
            return None
        self._last_due = step
        self._task = asyncio.get_running_loop().create_task(
            self._run(step, concurrency=max(1, self.concurrency()))
        )
        await self._task
        return self.results[-1] if self.results and self.results[-1].step == step else None

    async def finish(self, step: int) -> None:
        """Training ended after ``step``: wait for the evaluation in flight, with the job's
        whole concurrency from here on; then run the one due after ``step`` if it was skipped
        (so the trained weights are always measured when the interval says so)."""
        if self._task is not None:
            if self._scheduler is not None and not self._task.done():
                self._scheduler.set_concurrency(max(1, self.concurrency()))
            await self._task
        if self._last_due == step and not any(r.step == step for r in self.results):
            await self.run_now(step)

    async def cancel(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def _remember(self, scheduler: RolloutScheduler) -> None:
        self._scheduler = scheduler

    async def _run(self, step: int, *, concurrency: int | None = None) -> None:
        started = time.monotonic()
        if concurrency is None:
            concurrency = evaluation_concurrency(self.spec, self.concurrency())
        log.info(
            "evaluating after step %d: %d held-out tasks × %d attempts, %d at a time",
            step,
            len(self.tasks),
            self.spec.attempts_per_task,
            concurrency,
        )
        try:
            result = await run_evaluation(
                self.runner,
                self.tasks,
                attempts=self.spec.attempts_per_task,
                concurrency=concurrency,
                on_scheduler=self._remember,
            )
        except asyncio.CancelledError:
            raise
        except Exception:  # an evaluation must never stop training
            log.exception("evaluation after step %d failed", step)
            return
        record = EvaluationRecord(
            step=step,
            stage=self.stage_of(step),
            seconds=time.monotonic() - started,
            **result.model_dump(),
        )
        self.results.append(record)
        log.info(
            "evaluation after step %d (%s): pass@1 %s over %d tasks (%d attempts, %d passed, "
            "%d infra errors left out) in %.1f s",
            step,
            record.stage,
            "n/a" if record.pass_at_1 is None else f"{record.pass_at_1:.3f}",
            record.tasks,
            record.episodes,
            record.passed,
            record.infra_errors,
            record.seconds,
        )
        if record.pass_at_1 is not None:
            EVAL_PASS_AT_1.set(record.pass_at_1)
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("a", encoding="utf-8") as fh:
                fh.write(record.model_dump_json() + "\n")
        if self.on_result is not None:
            self.on_result(record)
