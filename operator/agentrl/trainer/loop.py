"""The asynchronous GRPO driver: trajectories in, steps out, weights pushed, checkpoints kept.

The whole loop, in order::

    for each finished trajectory (rollout scheduler, admission-paced):
        file it in its group                        (buffer)
        if complete groups hold a step's worth:     (batching: never waits for the slowest)
            train one step                          (backend, in a thread: rollouts go on)
            push weights every interval steps       (weight sync; admission opens a version)
            checkpoint every interval steps
            log one StepRecord
            evaluate held-out pass@1 every interval steps (beside the loop, never awaited)

Rollouts never stop for training: episodes keep running against the engines while the backend
steps, which is where asynchronous GRPO gets its speed.

A stop request (:class:`~agentrl.trainer.stopping.StopRequest`: SIGTERM when the job is
suspended or the pod is deleted) ends the loop at the next step boundary: a step whose update has
started is finished, the wait for trajectories between steps is abandoned, and the last finished
step is checkpointed with every task still in flight as pending (restarted on resume, never
scored). The held-out evaluation is cancelled rather than awaited.

Staleness is a hard bound, kept in two places (never by discarding finished work):

* admission (:class:`~agentrl.rollout.admission.StalenessAdmission`) paces new episodes so that
  normally every one is consumed within ``maxStaleness`` versions: the trainer never waits;
* the gate here makes it hard for the straggler: a step that trains version ``u`` takes every
  ready group admitted at ``u − maxStaleness`` or earlier (oldest first), and does not run while
  an episode admitted that early is still running or waiting for its group. Only then would the
  trainer wait for a slow episode, and only for one that is already ``maxStaleness`` behind.

Every counter (trajectories, classes, infra errors, tool use, zero-variance and dropped groups:
:class:`~agentrl.trainer.checkpoint.Counters`, what the status and ``summary.json`` show) counts a
group's trajectories once, when the group leaves the buffer — trained on or dropped — which is
the moment its task leaves the checkpoint's pending tasks. A checkpoint's counters thus cover
exactly the tasks a resume from it does not run again, and a trajectory that finished but was not
trained on before a restart is counted once, when its re-run task's group is. The per-step
windows of ``steps.jsonl`` (``classes``, ``infra_errors``, ``tools``) are counted the same way.

A checkpoint save that fails is retried, counted and reported
(:mod:`agentrl.trainer.checkpoint_saves`): training goes on, Degraded, until
``checkpoint.maxFailedSaves`` failed saves in a row, or a failed save at the end or at a stop,
end the run with :class:`~agentrl.trainer.checkpoint_saves.CheckpointSaveError`.

The step-time breakdown measures the four parts the LMSYS/AMD report splits its step into: actor
update, waiting for rollout, logprob recomputation, weight sync.

Callers: ``agentrl run`` (:mod:`agentrl.local`) and the trainer pod's entry point.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

from prometheus_client import Counter, Gauge
from pydantic import BaseModel, Field

from agentrl.api.job import AgentRLJobSpec
from agentrl.api.rollout import ClassAction, TerminalClass
from agentrl.api.wire import CheckpointSaveFailure, ToolHealth
from agentrl.rollout.admission import StalenessAdmission
from agentrl.rollout.tasks.model import Task
from agentrl.rollout.trajectory import Trajectory
from agentrl.trainer import step_metrics
from agentrl.trainer.batching import StepSelection, select_step
from agentrl.trainer.buffer import Group, GroupBuffer
from agentrl.trainer.checkpoint import CheckpointStore, Counters, DriverState
from agentrl.trainer.checkpoint_saves import CheckpointSaver, SavePolicy, Sleep
from agentrl.trainer.stats import StepStats
from agentrl.trainer.stopping import StopRequest
from agentrl.trainer.weight_sync import SyncReport, WeightSync, observe_failures

log = logging.getLogger(__name__)

STEP = Gauge("agentrl_trainer_step", "Training steps done.")
STEP_SECONDS = Counter(
    "agentrl_trainer_step_seconds_total",
    "Seconds spent per part of the training step.",
    ["part"],
)
BUFFER_GROUPS = Gauge("agentrl_trainer_buffer_ready_groups", "Complete groups waiting.")
STALENESS = Gauge("agentrl_trainer_staleness_max", "Largest staleness in the last step.")
GATE_WAITS = Counter(
    "agentrl_trainer_staleness_gate_waits_total",
    "Times a ready step was held back for an episode at the staleness bound.",
)
EVAL_PASS_AT_1 = Gauge(
    "agentrl_trainer_eval_pass_at_1",
    "Held-out pass@1 at the last evaluation (infra-error attempts left out).",
)


def _group_version(group: Group) -> int:
    return min(t.policy_version for t in group.trajectories)


class Backend(Protocol):
    """What the driver needs of a trainer backend."""

    def train_step(self, samples: Sequence[object]) -> StepStats: ...

    def save_state(self, directory: Path) -> None: ...

    def load_state(self, directory: Path) -> None: ...


class StepTimes(BaseModel):
    """Seconds per part of one step."""

    actor_update: float
    waiting_for_rollout: float
    logprob_recompute: float
    weight_sync: float

    @property
    def total(self) -> float:
        return (
            self.actor_update + self.waiting_for_rollout + self.logprob_recompute + self.weight_sync
        )


class StepRecord(BaseModel):
    """One line of ``steps.jsonl``: everything logged per step."""

    step: int
    wall_seconds: float
    """Seconds since the run started (summed over restarts)."""
    trajectories: int
    tokens: int
    reward_mean: float
    pass_rate: float
    """Share of the step's trajectories with reward 1 (the tests passed)."""
    classes: dict[str, int]
    """Terminal class → trajectories of the groups that left the buffer since the previous
    step (this step's, and those dropped meanwhile): each trajectory in one step's window."""
    infra_errors: int
    """Infra errors in that window (none of them trained on)."""
    loss: float
    grad_norm: float
    clip_fraction: float
    mismatch_abs_mean: float
    """Mean |logprob trainer − engine| over loss tokens."""
    ess: float
    """Effective sample size of the importance weights."""
    correction_fraction: float
    zero_variance_share: float
    """Share of the groups considered for this step whose rewards were all equal."""
    staleness_mean: float
    staleness_max: int
    in_flight: int
    """Episodes running when the step finished."""
    weight_version: int
    times: StepTimes
    trajectory_lengths: list[int] = Field(default_factory=list)
    """Tokens of each trajectory in the step (for the length histogram)."""
    tools: ToolHealth | None = None
    """Tool health of the window of ``classes`` (:mod:`agentrl.rollout.tool_health`); None in
    lines written before it."""


class TaskOrder:
    """The deterministic data order: position ``k`` → task, epoch by epoch, each epoch a fresh
    seeded permutation. A resumed run continues from a position, so it sees the same order."""

    def __init__(self, tasks: Sequence[Task], seed: int) -> None:
        if not tasks:
            raise ValueError("no training tasks")
        self.tasks = list(tasks)
        self.seed = seed
        self._perms: dict[int, list[int]] = {}

    def __getitem__(self, position: int) -> Task:
        import random

        n = len(self.tasks)
        epoch, offset = divmod(position, n)
        perm = self._perms.get(epoch)
        if perm is None:
            perm = list(range(n))
            random.Random(f"{self.seed}:{epoch}").shuffle(perm)
            self._perms[epoch] = perm
        return self.tasks[perm[offset]]


class TaskStream:
    """The iterator handed to the rollout scheduler: pending positions first (after a resume),
    then the order from the cursor. Remembers which position each handed-out task had."""

    def __init__(self, order: TaskOrder, *, cursor: int, pending: Sequence[int]) -> None:
        self.order = order
        self.cursor = cursor
        self._replay = list(pending)
        self.positions: list[int] = []
        """n-th task handed out → its position (the scheduler numbers groups by n)."""
        self.outstanding: set[int] = set(pending)

    def __iter__(self) -> Iterator[Task]:
        return self

    def __next__(self) -> Task:
        if self._replay:
            position = self._replay.pop(0)
        else:
            position = self.cursor
            self.cursor += 1
        self.positions.append(position)
        self.outstanding.add(position)
        return self.order[position]

    def position_of(self, group_id: str) -> int:
        """The position of a group named ``TASK#n`` by the scheduler."""
        return self.positions[int(group_id.rsplit("#", 1)[1])]

    def retire(self, group_id: str) -> None:
        self.outstanding.discard(self.position_of(group_id))


class TrajectorySource(Protocol):
    """The rollout scheduler as the driver sees it."""

    @property
    def in_flight(self) -> int: ...

    @property
    def oldest_in_flight_version(self) -> int | None: ...

    def trajectories(self) -> object: ...

    def stop(self) -> None:
        """Start no more episodes (running ones go on until cancelled)."""

    async def cancel(self) -> None: ...


class Evaluator(Protocol):
    """The held-out evaluation as the driver sees it
    (:class:`agentrl.trainer.evaluation.PeriodicEvaluation`)."""

    def maybe_start(self, step: int, *, start: bool = False) -> None: ...

    async def finish(self, step: int) -> None: ...

    async def cancel(self) -> None: ...


class TrainingDriver:
    """Runs the loop above until ``trainer.maxSteps``."""

    def __init__(
        self,
        *,
        spec: AgentRLJobSpec,
        backend: Backend,
        source: TrajectorySource,
        admission: StalenessAdmission,
        weight_sync: WeightSync,
        checkpoints: CheckpointStore,
        stream: TaskStream,
        state: DriverState,
        steps_log: Path | None = None,
        on_step: Callable[[StepRecord], None] | None = None,
        on_trajectory: Callable[[Trajectory], None] | None = None,
        max_steps: int | None = None,
        evaluation: Evaluator | None = None,
        stop: StopRequest | None = None,
        save_sleep: Sleep | None = None,
    ) -> None:
        """``stop``: ends the loop cleanly at the next step boundary once requested (see the
        module docstring); None runs to ``max_steps``. ``save_sleep``: the wait between tries
        of a failed checkpoint save (None: ``asyncio.sleep``; for tests)."""
        self.spec = spec
        self.backend = backend
        self.source = source
        self.admission = admission
        self.weight_sync = weight_sync
        self.checkpoints = checkpoints
        self.stream = stream
        self.state = state
        self.steps_log = steps_log
        self.on_step = on_step
        self.on_trajectory = on_trajectory
        self.max_steps = max_steps or spec.trainer.max_steps
        self.evaluation = evaluation
        self.stop = stop
        self.saver = CheckpointSaver(
            checkpoints, SavePolicy.from_spec(spec.trainer.checkpoint), sleep=save_sleep
        )
        self.buffer = GroupBuffer(spec.rollout.group_size)
        self.records: list[StepRecord] = []
        self._window = Counters()
        """What left the buffer since the previous step (the step line's ``classes``,
        ``infra_errors`` and ``tools``)."""
        self._considered_groups = 0
        self._zero_variance = 0
        self._last_checkpoint = state.step
        self.last_sync: SyncReport | None = None
        """The last push's report (its ``failures`` go into the trainer's progress)."""

    @property
    def last_checkpoint_step(self) -> int:
        """The step of the newest checkpoint this driver wrote or resumed from."""
        return self._last_checkpoint

    @property
    def checkpoint_failure(self) -> CheckpointSaveFailure | None:
        """The checkpoint saves failing now (None: the last save succeeded); it goes into the
        trainer's progress."""
        return self.saver.failure

    @property
    def stopped(self) -> bool:
        """A stop was requested (the loop ended, or ends, before ``max_steps``)."""
        return self.stop is not None and self.stop.requested

    async def run(self) -> DriverState:
        """Train until ``max_steps`` or a stop request; on either and on cancellation,
        checkpoint the last finished step."""
        started = time.monotonic() - self.state.elapsed_seconds
        self._started = started
        ready_since = time.monotonic()
        iterator = self.source.trajectories().__aiter__()  # type: ignore[attr-defined]
        if self.evaluation is not None:
            self.evaluation.maybe_start(self.state.step, start=True)
        try:
            while self.state.step < self.max_steps:
                try:
                    trajectory = await self._next_or_stop(iterator)
                except StopAsyncIteration:
                    log.warning("the rollout tier ran out of tasks at step %d", self.state.step)
                    break
                if trajectory is None:  # stop requested between steps
                    break
                self._receive(trajectory)
                ready, must_take = self._ready_oldest_first()
                selection = select_step(
                    ready,
                    trajectories_per_step=max(self.spec.trainer.trajectories_per_step, must_take),
                    algorithm=self.spec.trainer.algorithm,
                )
                BUFFER_GROUPS.set(self.buffer.ready_groups)
                if selection is None:
                    continue
                self._retire_dropped(selection)
                if not selection.samples or self._straggler_too_old():
                    continue
                waited = time.monotonic() - ready_since
                await self._train(selection, waited)
                ready_since = time.monotonic()
                if self.stopped:  # requested during the step: it is finished, go no further
                    break
                if self.evaluation is not None:
                    self.evaluation.maybe_start(self.state.step)
        except asyncio.CancelledError:
            await self._stop_and_checkpoint()
            if self.evaluation is not None:
                await self.evaluation.cancel()
            raise
        finally:
            self.state.elapsed_seconds = time.monotonic() - started
        await self._end()
        return self.state

    async def _end(self) -> None:
        """After the last step: checkpoint it; then await the held-out evaluation, or on a
        stop cancel it."""
        if not self.stopped:
            await self._checkpoint_if_new(final=True)
            if self.evaluation is not None:  # training is over: nothing waits behind it
                await self.evaluation.finish(self.state.step)
            return
        await self._stop_and_checkpoint()
        log.warning(
            "stopped (%s) after step %d; checkpoint at step %d, %d tasks pending",
            self.stop.reason if self.stop is not None else None,
            self.state.step,
            self._last_checkpoint,
            len(self.state.pending_positions),
        )
        if self.evaluation is not None:  # the grace period is for the checkpoint
            await self.evaluation.cancel()

    async def _stop_and_checkpoint(self) -> None:
        """On a stop or cancellation: the source starts no more episodes, so the checkpoint's
        cursor and pending tasks are final (the caller cancels the running ones)."""
        self.source.stop()
        await self._checkpoint_if_new(final=True)

    async def _next_or_stop(self, iterator: object) -> Trajectory | None:
        """The next finished trajectory, or None once a stop is requested (the wait for it is
        abandoned). Raises StopAsyncIteration when the rollout tier runs out of tasks."""
        if self.stop is None:
            return await iterator.__anext__()  # type: ignore[attr-defined,no-any-return]
        if self.stop.requested:
            return None
        following = asyncio.ensure_future(iterator.__anext__())  # type: ignore[attr-defined]
        stopping = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait({following, stopping}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled: leave nothing running
            following.cancel()
            raise
        finally:
            stopping.cancel()
        if following.done():
            return following.result()  # type: ignore[no-any-return]
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
            await following
        return None

    # -- the staleness gate ------------------------------------------------------------------

    @property
    def _oldest_allowed(self) -> int:
        """The lowest admission version the next step's samples may have and still leave every
        outstanding episode within the bound at the step after."""
        return self.state.step - self.spec.trainer.async_.max_staleness

    def _ready_oldest_first(self) -> tuple[list[Group], int]:
        """Complete groups, oldest admission version first (completion order among equals),
        and how many trajectories of them the next step must take (the ones at the bound)."""
        ready = sorted(self.buffer.ready(), key=_group_version)  # stable: completion order
        must = sum(len(g.trainable()) for g in ready if _group_version(g) <= self._oldest_allowed)
        return ready, must

    def _straggler_too_old(self) -> bool:
        """An episode admitted at the bound is still running or waiting for its group: the
        step must wait for it (otherwise it would be trained on too stale)."""
        versions = [t.policy_version for g in self.buffer.open_groups for t in g.trajectories]
        running = self.source.oldest_in_flight_version
        if running is not None:
            versions.append(running)
        blocked = bool(versions) and min(versions) <= self._oldest_allowed
        if blocked:
            GATE_WAITS.inc()
        return blocked

    # -- the parts ---------------------------------------------------------------------------

    def _receive(self, trajectory: Trajectory) -> None:
        """File a finished trajectory; it is counted once its group leaves (:meth:`_leave`)."""
        if self.on_trajectory is not None:
            self.on_trajectory(trajectory)
        self.buffer.add(trajectory, now=time.monotonic())

    def _leave(self, groups: Sequence[Group], *, zero_variance: int) -> None:
        """``groups`` leave the buffer for good (trained on or dropped): their tasks are no
        longer pending, and their trajectories are counted, once (module docstring)."""
        for group in groups:
            self.buffer.pop(group.group_id)
            self.stream.retire(group.group_id)
            for trajectory in group.trajectories:
                self.state.counters.add(trajectory)
                self._window.add(trajectory)
        self._considered_groups += len(groups)
        self._zero_variance += zero_variance
        self.state.counters.zero_variance_groups += zero_variance

    def _retire_dropped(self, selection: StepSelection) -> None:
        self._leave(selection.dropped, zero_variance=selection.zero_variance_dropped)
        for group in selection.dropped:
            # Their slots go back to admission so other groups refill the step (infra-dropped
            # members were already released by the scheduler).
            for t in group.trajectories:
                if t.training_action != ClassAction.DROP:
                    self.admission.release()
            self.state.counters.dropped_groups += 1

    async def _train(self, selection: StepSelection, waited: float) -> None:
        samples = selection.samples
        # Infra errors never carry a reward into a loss; counted to prove it, not assumed.
        leaked = sum(s.trajectory.terminal_class == TerminalClass.INFRA_ERROR for s in samples)
        self.state.counters.infra_errors_in_training += leaked
        stats = await asyncio.to_thread(self.backend.train_step, samples)
        self._leave(
            selection.taken, zero_variance=selection.zero_variance - selection.zero_variance_dropped
        )
        self.state.step += 1
        self.state.counters.trained_trajectories += len(samples)
        version_trained = self.state.step - 1
        sync_seconds = 0.0
        if self.state.step % self.spec.trainer.weight_sync.interval_steps == 0:
            await self.weight_sync.reconcile()
            report = await self.weight_sync.push(self.state.step)
            self.last_sync = report
            observe_failures(report)  # this process's gauge, wherever the sync runs
            sync_seconds = report.seconds
            self.admission.set_policy_version(self.state.step)
        if self.state.step % self.spec.trainer.checkpoint.interval_steps == 0:
            await self._checkpoint()
        staleness = [version_trained - s.trajectory.policy_version for s in samples]
        rewards = [s.trajectory.reward or 0.0 for s in samples]
        times = StepTimes(
            actor_update=stats.update_seconds,
            waiting_for_rollout=waited,
            logprob_recompute=stats.recompute_seconds,
            weight_sync=sync_seconds,
        )
        for part, seconds in times.model_dump().items():
            STEP_SECONDS.labels(part=part).inc(seconds)
        STEP.set(self.state.step)
        STALENESS.set(max(staleness))
        record = StepRecord(
            step=self.state.step,
            wall_seconds=time.monotonic() - self._started,
            trajectories=len(samples),
            tokens=sum(len(s.trajectory.token_ids) for s in samples),
            reward_mean=sum(rewards) / len(rewards),
            pass_rate=sum(r >= 1.0 for r in rewards) / len(rewards),
            classes=dict(self._window.classes),
            infra_errors=self._window.infra_errors,
            loss=stats.loss,
            grad_norm=stats.grad_norm,
            clip_fraction=stats.loss_stats.clip_fraction,
            mismatch_abs_mean=stats.loss_stats.mismatch_abs_mean,
            ess=stats.loss_stats.ess,
            correction_fraction=stats.loss_stats.correction_fraction,
            zero_variance_share=self._zero_variance / max(self._considered_groups, 1),
            staleness_mean=sum(staleness) / len(staleness),
            staleness_max=max(staleness),
            in_flight=self.source.in_flight,
            weight_version=self.weight_sync.current_version,
            times=times,
            trajectory_lengths=[len(s.trajectory.token_ids) for s in samples],
            tools=self._window.tools.health(),
        )
        self._window = Counters()
        self._considered_groups = 0
        self._zero_variance = 0
        step_metrics.observe(record)
        self.records.append(record)
        if self.steps_log is not None:
            # a fresh checkpoint volume has no directory yet (the first checkpoint makes it)
            self.steps_log.parent.mkdir(parents=True, exist_ok=True)
            with self.steps_log.open("a", encoding="utf-8") as fh:
                fh.write(record.model_dump_json() + "\n")
        if self.on_step is not None:
            self.on_step(record)

    async def _checkpoint(self, *, final: bool = False) -> None:
        """Save the step with its data position; a failed save is retried, counted and
        reported, and raises once it is one too many (``final``: at the end or a stop)."""
        self.state.task_cursor = self.stream.cursor
        self.state.pending_positions = sorted(self.stream.outstanding)
        self.state.elapsed_seconds = time.monotonic() - self._started
        saved = await self.saver.save(
            self.backend, self.state, last_checkpoint=self._last_checkpoint, final=final
        )
        if saved is not None:
            self._last_checkpoint = self.state.step

    async def _checkpoint_if_new(self, *, final: bool = False) -> None:
        if self.state.step > self._last_checkpoint:
            await self._checkpoint(final=final)
