"""One assembly of a training run: spec → built parts → session, for every way a run starts.

The cluster trainer (``agentrl trainer``, :mod:`agentrl.trainer.pod`) and ``agentrl run``
(:mod:`agentrl.local.runner`) both wire a run here, in three stages:

1. **Inputs** the caller decides, because they really differ between the two: the backend
   (torch in process, megatron rank 0 behind :class:`~agentrl.trainer.ranks.RemoteBackend`), the
   engines and the weight sync towards them (engine Services or local engine processes), where
   checkpoints go and whether to resume, and the rollout tier (:data:`RolloutTier`: worker
   actors or an in-process scheduler following the ConfigMap's in-effect concurrency, or
   :func:`fixed_rollout` at the spec's fixed concurrency).
2. **Parts** (:func:`build_parts`): the held-out split (:class:`TaskSplit`), the driver state
   restored from the newest checkpoint (:func:`restore_state`), the task stream resumed at its
   position, and admission resumed at the checkpoint's step
   (:meth:`~agentrl.rollout.admission.StalenessAdmission.resume_at`).
3. **Warm start** (:func:`warm_up`, when ``spec.trainer.warmStart`` is set): the SFT stage of
   :mod:`agentrl.trainer.warm_start` resumed where its checkpoint left it, then its weights
   pushed to the engines, so the first rollout is of the warmed-up model.
4. **Session** (:func:`open_session`): the running rollout tier, the held-out evaluation
   sharing its episode runner and concurrency, and the :class:`~agentrl.trainer.loop.
   TrainingDriver`; the caller runs the driver (and, for ``agentrl run``, the waited-for
   evaluations before and after). On exit the tier's running episodes are cancelled, not
   waited for: the driver's last checkpoint lists their tasks as pending (a resume runs them
   again), so nothing they would yield is trained on, and a stopping trainer must not wait
   for an episode whose rollout pod left with the job (its worker would wait for a restart
   on a pod that never comes).

The sandbox provider of an in-process rollout tier comes from :func:`sandbox_provider`, i.e.
:func:`agentrl.sandbox.open_provider` with the spec's limits and the sandbox metrics.

Callers: :mod:`agentrl.trainer.pod` (the cluster trainer's driver), :mod:`agentrl.local.runner`
(``agentrl run``), tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.api.job import AgentRLJobSpec
from agentrl.api.sandbox import SandboxProvider as ProviderName
from agentrl.api.sandbox import SandboxSpec
from agentrl.api.trainer import EvaluationSpec
from agentrl.rollout.admission import StalenessAdmission
from agentrl.rollout.episode import EpisodeRunner
from agentrl.rollout.runtime import provider_limit
from agentrl.rollout.scheduler import GatedEpisodes, RolloutScheduler
from agentrl.rollout.tasks import checked_evaluation_set, load_tasks, split_held_out
from agentrl.rollout.tasks.model import Task, with_e2b_templates
from agentrl.rollout.trajectory import Trajectory
from agentrl.sandbox import open_provider
from agentrl.sandbox.metrics import InstrumentedProvider
from agentrl.sandbox.provider import SandboxProvider
from agentrl.trainer.checkpoint import CheckpointStore, DriverState, WarmStartProgress
from agentrl.trainer.evaluation import EvaluationRecord, PeriodicEvaluation
from agentrl.trainer.loop import StepRecord, TaskOrder, TaskStream, TrainingDriver
from agentrl.trainer.stopping import StopRequest

log = logging.getLogger(__name__)

#: Builds the running rollout tier over the run's task stream and admission: yields a started
#: (or startable) scheduler whose ``runner`` the held-out evaluation shares, and stops it on
#: exit. The cluster's: :func:`agentrl.trainer.pod.cluster_rollout`; ``agentrl run``'s:
#: :func:`fixed_rollout`.
RolloutTier = Callable[[TaskStream, StalenessAdmission], AbstractAsyncContextManager[Any]]


# -- parts -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskSplit:
    """The dataset's tasks: those trained on and those held out for pass@1
    (``dataset.heldOutFraction``, chosen by ``dataset.seed``)."""

    train: list[Task]
    held_out: list[Task]

    @classmethod
    def of(cls, spec: AgentRLJobSpec) -> TaskSplit:
        """The run's tasks, split: with ``trainer.evaluation.dataset`` the held-out tasks are
        all of that set and ``spec.dataset`` is trained on whole (its ``heldOutFraction`` is 0,
        the API refuses anything else), else ``spec.dataset`` split by ``heldOutFraction``.
        With ``sandbox.provider: e2b`` each task gets the template of its image
        (``sandbox.e2b.templates``); a task whose image has none refuses the run
        (:class:`~agentrl.rollout.tasks.model.MissingTemplateError`, naming task and image)."""
        tasks = cls._with_templates(spec, load_tasks(spec.dataset))
        train, held_out = split_held_out(tasks, spec.dataset.held_out_fraction, spec.dataset.seed)
        evaluation = spec.trainer.evaluation.dataset
        if evaluation is not None:
            dataset = evaluation.as_dataset(spec.dataset.seed, spec.dataset.image_pull_secrets)
            held_out = checked_evaluation_set(train, cls._with_templates(spec, load_tasks(dataset)))
        return cls(train=train, held_out=held_out)

    @staticmethod
    def _with_templates(spec: AgentRLJobSpec, tasks: list[Task]) -> list[Task]:
        if spec.sandbox.provider != ProviderName.E2B:
            return tasks
        e2b = spec.sandbox.e2b
        return with_e2b_templates(tasks, e2b.templates if e2b is not None else {})

    @property
    def all(self) -> list[Task]:
        return [*self.train, *self.held_out]


def restore_state(
    checkpoints: CheckpointStore, backend: Any, *, resume: bool = True
) -> DriverState:
    """The driver state to start from: the newest checkpoint's (loaded into ``backend``) when
    ``resume`` and there is one, else a fresh start."""
    state = (checkpoints.load(backend) if resume else None) or DriverState()
    if state.step:
        log.info(
            "resuming from the checkpoint of step %d (restart %d): data position %d, "
            "pending positions %s",
            state.step,
            state.restarts,
            state.task_cursor,
            state.pending_positions,
        )
    return state


def peek_state(checkpoints: CheckpointStore) -> DriverState:
    """What a start would resume from, without reading the checkpoint (a dry run)."""
    return DriverState(step=(checkpoints.steps() or [0])[-1])


def build_admission(spec: AgentRLJobSpec, step: int) -> StalenessAdmission:
    """The trainer's staleness admission, resumed at ``step`` (nothing outstanding)."""
    admission = StalenessAdmission(
        trajectories_per_step=spec.trainer.trajectories_per_step,
        max_staleness=spec.trainer.async_.max_staleness,
        policy_version=step,
        group_size=spec.rollout.group_size,
    )
    admission.resume_at(step)
    return admission


@dataclass
class RunParts:
    """A run built and not started: what :func:`open_session` wires together."""

    spec: AgentRLJobSpec
    tasks: TaskSplit
    backend: Any
    checkpoints: CheckpointStore
    state: DriverState
    stream: TaskStream
    admission: StalenessAdmission
    weight_sync: Any


def build_parts(
    spec: AgentRLJobSpec,
    *,
    tasks: TaskSplit,
    backend: Any,
    checkpoints: CheckpointStore,
    state: DriverState,
    weight_sync: Any,
) -> RunParts:
    """The task stream at ``state``'s data position and admission at its step, with the
    caller's backend, checkpoints and weight sync."""
    stream = TaskStream(
        TaskOrder(tasks.train, spec.dataset.seed),
        cursor=state.task_cursor,
        pending=state.pending_positions,
    )
    return RunParts(
        spec=spec,
        tasks=tasks,
        backend=backend,
        checkpoints=checkpoints,
        state=state,
        stream=stream,
        admission=build_admission(spec, state.step),
        weight_sync=weight_sync,
    )


def sandbox_provider(
    spec: SandboxSpec,
    *,
    wrap: Callable[[SandboxProvider], Any] | None = None,
    **where: Any,
) -> InstrumentedProvider:
    """The sandbox provider of an in-process rollout tier: :func:`agentrl.sandbox.open_provider`
    (``where``: its ``pods``, ``namespace``, ``worker_id``, ``local_base_dir``), the spec's
    limits and the sandbox metrics; ``wrap`` goes between the provider and its metrics
    (``agentrl run --chaos``). The caller closes it (``aclose``)."""
    provider = open_provider(spec, **where)
    if wrap is None:
        return provider
    return InstrumentedProvider(wrap(provider.inner))


@contextlib.asynccontextmanager
async def fixed_rollout(
    spec: AgentRLJobSpec, runner: EpisodeRunner, stream: TaskStream, admission: StalenessAdmission
) -> AsyncIterator[RolloutScheduler]:
    """The in-process rollout tier at the spec's fixed ``sandbox.concurrency`` over ``runner``
    (``agentrl run``): one gate of live episodes for training and the held-out evaluations, so
    together they never run more than that. The driver starts it; cancelled on exit."""
    concurrency = spec.sandbox.concurrency
    scheduler = RolloutScheduler(
        # the scheduler sets the gate to the effective figure (the provider's own limit applied)
        runner=GatedEpisodes(runner, concurrency),
        tasks=stream,
        concurrency=concurrency,
        group_size=spec.rollout.group_size,
        admission=admission,
        provider_limit=provider_limit(spec),
        batch_size=spec.trainer.trajectories_per_step,
    )
    try:
        yield scheduler
    finally:
        await scheduler.cancel()


# -- warm start ------------------------------------------------------------------------------


async def warm_up(
    parts: RunParts,
    turns: Any,
    *,
    log_dir: Path,
    on_progress: Callable[[WarmStartProgress], None] | None = None,
    stop: StopRequest | None = None,
) -> WarmStartProgress | None:
    """The warm-start stage of ``spec.trainer.warmStart`` (None when the job has none), then
    its weights pushed to the engines as version ``state.step`` (0), so the engines serve them
    before the first rollout. ``turns``: the rollout's turn tokenizer (template, tools and
    tool-call parser the conversations are rendered with). Trains in a worker thread;
    ``on_progress`` is called on this event loop. Returns the stage's progress (not ``done``
    when ``stop`` was requested: it checkpointed where it was). A stage finished before a
    restart is not trained again; its weights are pushed again while RL has not stepped."""
    from agentrl.rollout.conversations import read_warm_start
    from agentrl.trainer.warm_start import WARM_START_LOG, WarmStart, checked_conversations

    spec = parts.spec.trainer.warm_start
    if spec is None:
        return None
    state = parts.state
    if state.warm_start is None or not state.warm_start.done:
        report = await asyncio.to_thread(
            read_warm_start, spec.dataset, turns, tokens_per_batch=spec.tokens_per_batch
        )
        checked_conversations(report, spec.dataset)
        loop = asyncio.get_running_loop()
        stage = WarmStart(
            spec,
            parts.spec.trainer,
            report,
            backend=parts.backend,
            checkpoints=parts.checkpoints,
            state=state,
            log_path=log_dir / WARM_START_LOG,
            on_progress=(
                None if on_progress is None else lambda p: loop.call_soon_threadsafe(on_progress, p)
            ),
        )
        if on_progress is not None:
            on_progress(stage.progress.model_copy())
        progress = await asyncio.to_thread(
            stage.run, should_stop=lambda: stop is not None and stop.requested
        )
        if not progress.done:
            return progress
    assert state.warm_start is not None
    if state.step == 0:
        await parts.weight_sync.push(state.step)
    return state.warm_start


# -- session ---------------------------------------------------------------------------------


@dataclass
class SessionOptions:
    """What the caller observes and bounds of a session."""

    steps_log: Path
    """``steps.jsonl``: one line per step."""
    evaluation: EvaluationSpec | None = None
    """The held-out evaluation; None: none."""
    evaluations_log: Path | None = None
    """``evaluations.jsonl``."""
    on_evaluation: Callable[[EvaluationRecord], None] | None = None
    on_step: Callable[[StepRecord, TrainingDriver], None] | None = None
    on_trajectory: Callable[[Trajectory], None] | None = None
    max_steps: int | None = None
    """Override ``trainer.maxSteps``."""
    stop: StopRequest | None = None


@dataclass
class Session:
    """A wired run: the running rollout tier, the evaluation and the driver to run."""

    parts: RunParts
    scheduler: Any
    evaluation: PeriodicEvaluation | None
    driver: TrainingDriver


@contextlib.asynccontextmanager
async def open_session(
    parts: RunParts, rollout: RolloutTier, options: SessionOptions
) -> AsyncIterator[Session]:
    """Enter ``rollout`` over the parts' task stream and admission, and wire the held-out
    evaluation (through the same episode runner, sharing the tier's concurrency) and the
    training driver to it. On exit the tier's running episodes are cancelled (the module's
    docstring, stage 4), then the tier closes."""
    spec = parts.spec
    async with rollout(parts.stream, parts.admission) as scheduler, _cancelled_on_exit(scheduler):
        evaluation = (
            None
            if options.evaluation is None
            else PeriodicEvaluation(
                options.evaluation,
                parts.tasks.held_out,
                seed=spec.dataset.seed,
                runner=scheduler.runner,
                concurrency=lambda: scheduler.concurrency,
                log_path=options.evaluations_log,
                on_result=options.on_evaluation,
            )
        )
        on_step = options.on_step
        driver = TrainingDriver(
            spec=spec,
            backend=parts.backend,
            source=scheduler,
            admission=parts.admission,
            weight_sync=parts.weight_sync,
            checkpoints=parts.checkpoints,
            stream=parts.stream,
            state=parts.state,
            steps_log=options.steps_log,
            on_step=None if on_step is None else (lambda record: on_step(record, driver)),
            on_trajectory=options.on_trajectory,
            max_steps=options.max_steps,
            evaluation=evaluation,
            stop=options.stop,
        )
        yield Session(parts=parts, scheduler=scheduler, evaluation=evaluation, driver=driver)


@contextlib.asynccontextmanager
async def _cancelled_on_exit(scheduler: Any) -> AsyncIterator[None]:
    try:
        yield
    finally:
        await scheduler.cancel()
