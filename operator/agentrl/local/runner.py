"""``agentrl run``'s engine room: one AgentRLJob on this machine, through the cluster's code paths.

What runs where:

* engines — ``spec.inference.engines`` tiny CPU engine processes (:mod:`agentrl.local.engines`),
  reached through :class:`agentrl.engine_client.client.EngineClient` like SGLang on a cluster;
* rollout — :class:`agentrl.rollout.scheduler.RolloutScheduler` with the token agent, the
  verifier and local sandboxes (:class:`agentrl.sandbox.local.LocalProvider`, built and
  instrumented by :func:`agentrl.sandbox.open_provider` as in a rollout worker), paced by the
  trainer's :class:`~agentrl.rollout.admission.StalenessAdmission`;
* trainer — :class:`agentrl.trainer.loop.TrainingDriver` with the torch backend, disk weight sync
  to the engines' ``/update_weights_from_disk``, and checkpoints.

Held-out pass@1 is measured on tasks the trainer never sees (``dataset.heldOutFraction``) with
the same agent, engines and verifier (:mod:`agentrl.trainer.evaluation`, one line each in
``logs/evaluations.jsonl``): before the first step, waited for (the untrained weights alone);
by the driver every ``trainer.evaluation.intervalSteps`` steps, beside training, as on a
cluster; and once more after the last step when the driver's last evaluation was earlier.

Callers: :mod:`agentrl.local.cli` (directly, or inside a Ray actor) and ``bench/local_learning.py``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from agentrl.api import AgentRLJob
from agentrl.api.job import AgentRLJobSpec
from agentrl.api.rollout import TerminalClass
from agentrl.api.trainer import EvaluationSpec
from agentrl.engine_client.client import EngineClient, connection_pool_size
from agentrl.local.engines import EngineChaos, LocalEngine, LocalEngines
from agentrl.rollout.admission import StalenessAdmission
from agentrl.rollout.agent import TokenAgent, TurnTokenizer, WordTurnTokenizer
from agentrl.rollout.balancer import EnginePool
from agentrl.rollout.caps import EpisodeCaps
from agentrl.rollout.conversations import job_turn_tokenizer
from agentrl.rollout.episode import EpisodeRunner
from agentrl.rollout.evaluation import Evaluation
from agentrl.rollout.tasks import offered_edits
from agentrl.rollout.tasks.model import Task
from agentrl.rollout.trajectory import Trajectory
from agentrl.sandbox.errors import SandboxCreateError
from agentrl.sandbox.provider import Sandbox, SandboxProvider, SandboxRequest
from agentrl.tiny import policy as tiny
from agentrl.tiny.served import is_hf_model_dir
from agentrl.tiny.tokenizer import get_tokenizer
from agentrl.trainer.assembly import (
    SessionOptions,
    TaskSplit,
    build_parts,
    fixed_rollout,
    open_session,
    restore_state,
    sandbox_provider,
    warm_up,
)
from agentrl.trainer.checkpoint import CheckpointStore, DriverState, WarmStartProgress
from agentrl.trainer.evaluation import EVALUATIONS_LOG, EvaluationRecord, PeriodicEvaluation
from agentrl.trainer.factories import torch_backend_for
from agentrl.trainer.loop import StepRecord, TaskStream
from agentrl.trainer.weight_sync import DiskWeightSync, PushRetry

log = logging.getLogger(__name__)


class RunOptions(BaseModel):
    """Knobs of a local run that are not part of the manifest."""

    run_dir: Path
    """Where weights, checkpoints, logs and the report go."""
    resume: bool = False
    """Continue from the newest checkpoint in ``run_dir``."""
    max_steps: int | None = None
    """Override ``trainer.maxSteps`` (a short smoke run)."""
    chaos_rate: float = Field(default=0.0, ge=0.0, le=0.5)
    """Injected failure rate: sandbox creations that fail, and engine crashes per request."""
    eval_samples: int | None = Field(default=None, ge=1)
    """Episodes per held-out task when measuring pass@1; None: the spec's
    ``trainer.evaluation.attemptsPerTask``."""
    skip_eval: bool = False
    """Skip the held-out measurements (pass@1 is then reported as null)."""
    seed: int = 0


class RunResult(BaseModel):
    """Everything :mod:`agentrl.local.report` needs."""

    job_name: str
    state: DriverState
    records: list[StepRecord]
    before: Evaluation | None
    """pass@1 of the model as given (base)."""
    after: Evaluation | None
    """pass@1 after the last RL step."""
    after_warm_start: Evaluation | None = None
    """pass@1 after the warm start, before RL (``spec.trainer.warmStart``; None without)."""
    warm_start: WarmStartProgress | None = None
    """The warm-start stage's progress at the end (None: the job has none)."""
    infra_error_attempts: int
    """Episode attempts that ended in an infra error (retried or dropped)."""
    engine_restarts: int
    long_tail_shares: list[float]
    train_tasks: int
    held_out_tasks: int
    evaluations: list[EvaluationRecord] = Field(default_factory=list)
    """The driver's evaluations (at the start and every ``intervalSteps``)."""
    train_episode_seconds: float = 0.0
    """Wall seconds of the training episodes, summed (the evaluations' share is relative to
    this plus their own)."""
    wall_seconds: float
    caps: dict[str, int]
    """The trajectory caps, for the length histogram (tokens)."""
    interrupted: bool = False


class ChaosProvider:
    """A provider wrapper that fails sandbox creation with probability ``rate`` (an infra
    error the rollout tier must classify and retry, never score)."""

    def __init__(self, inner: SandboxProvider, rate: float, seed: int) -> None:
        self.inner = inner
        self.rate = rate
        self.name = f"chaos+{inner.name}"
        self._rng = random.Random(seed)
        self.injected = 0

    async def create(self, request: SandboxRequest) -> Sandbox:
        if self._rng.random() < self.rate:
            self.injected += 1
            raise SandboxCreateError("chaos: injected sandbox creation failure")
        return await self.inner.create(request)

    async def close(self) -> None:
        await self.inner.close()

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


class CountingRunner(EpisodeRunner):
    """The rollout tier's runner, counting every attempt that ended in an infra error in the
    driver's state, so the count is checkpointed with it and a resumed run goes on from it."""

    def __init__(self, *, state: DriverState, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.state = state

    async def run_attempt(
        self, task: Task, *, group_id: str, policy_version: int, attempt: int = 0
    ) -> Trajectory:
        trajectory = await super().run_attempt(
            task, group_id=group_id, policy_version=policy_version, attempt=attempt
        )
        if trajectory.terminal_class == TerminalClass.INFRA_ERROR:
            self.state.infra_error_attempts += 1
        return trajectory


def edit_vocabulary(tasks: list[Task]) -> tuple[str, ...]:
    """The candidate edit names of the dataset the tiny policy can write (its prior spreads
    over these, like a pretrained model that read the tool list)."""
    vocab = set(get_tokenizer().vocab)
    names = sorted({e.name for t in tasks for e in t.candidate_edits} & vocab)
    return tuple(names) or tiny.DEFAULT_PRIOR_EDITS


class _EpisodeSeconds:
    """The driver's ``on_trajectory``: sums the training episodes' wall seconds, then calls
    the caller's hook."""

    def __init__(self, then: Callable[[Trajectory], None] | None) -> None:
        self.then = then
        self.seconds = 0.0

    def __call__(self, trajectory: Trajectory) -> None:
        self.seconds += trajectory.timings.total_seconds
        if self.then is not None:
            self.then(trajectory)


def _turn_tokenizer(spec: AgentRLJobSpec, weights: Path) -> TurnTokenizer:
    """What the engines' ``/model_info`` would point the rollout at (as on a cluster,
    :func:`agentrl.rollout.runtime.turn_tokenizer_for`): the HF tokenizer and chat template
    beside the exported weights, or the tiny policy's word tokenizer."""
    if is_hf_model_dir(weights):
        return job_turn_tokenizer(
            spec.model, model_dir=str(weights), edits=offered_edits(spec.dataset)
        )
    return WordTurnTokenizer()


def _evaluation_spec(spec: EvaluationSpec, options: RunOptions) -> EvaluationSpec:
    """The spec's evaluation, ``--eval-samples`` overriding its attempts per task."""
    if options.eval_samples is None:
        return spec
    return spec.model_copy(update={"attempts_per_task": options.eval_samples})


async def _final_evaluation(
    evaluation: PeriodicEvaluation,
    step: int,
    weight_sync: DiskWeightSync,
    phase: Callable[[str], None],
) -> Evaluation | None:
    """pass@1 of the trained weights: the driver's last evaluation when it measured the last
    step (training was over while it ran), else one more with the whole concurrency."""
    results = evaluation.results
    if results and results[-1].step == step:
        return results[-1]
    await weight_sync.reconcile()
    phase("measuring held-out pass@1 (after)")
    return await evaluation.run_now(step)


async def run_local(
    job: AgentRLJob,
    options: RunOptions,
    *,
    on_step: Callable[[StepRecord], None] | None = None,
    on_trajectory: Callable[[Trajectory], None] | None = None,
    on_phase: Callable[[str], None] | None = None,
    on_warm_start: Callable[[WarmStartProgress], None] | None = None,
) -> RunResult:
    """Run ``job`` on this machine; see the module docstring."""
    started = time.monotonic()
    spec = job.spec
    phase = on_phase or (lambda _: None)
    run_dir = options.run_dir
    for sub in ("weights", "checkpoints", "logs", "sandboxes"):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)

    tasks = TaskSplit.of(spec)

    phase("building the policy")
    builtin = spec.model.source.path == tiny.BUILTIN_PATH
    backend = torch_backend_for(
        spec,
        None if builtin else Path(spec.model.source.path),
        seed=options.seed,
        edit_names=edit_vocabulary(tasks.all) if builtin else None,
    )
    checkpoints = CheckpointStore(run_dir / "checkpoints")
    state = restore_state(checkpoints, backend, resume=options.resume)
    steps_log = run_dir / "logs" / "steps.jsonl"
    if not options.resume and steps_log.exists():
        steps_log.unlink()

    # Engines start from these weights and come back to them after a crash (never pruned).
    start_weights = run_dir / "weights" / f"start-{state.step}"
    backend.export_weights(start_weights)
    chaos = (
        EngineChaos(rate=options.chaos_rate / 10, seed=options.seed) if options.chaos_rate else None
    )
    engines = LocalEngines(
        [
            LocalEngine(
                i,
                model_path=start_weights,
                weight_version=str(state.step),
                context_length=spec.inference.context_length,
                max_running_requests=spec.inference.max_running_requests,
                log_dir=run_dir / "logs",
                seed=options.seed + i,
                chaos=chaos,
            )
            for i in range(spec.inference.engines)
        ]
    )
    phase("starting engines")
    engines.start()
    pool_size = connection_pool_size(spec)
    clients = [
        EngineClient(
            url, max_connections=pool_size, timeout_seconds=spec.rollout.llm_timeout_seconds
        )
        for url in engines.urls
    ]
    # the same factory as the cluster's in-process tier and the rollout workers': the spec's
    # limits and the sandbox metrics (agentrl_sandbox_startup_seconds ...) on --metrics-port;
    # injected failures are counted
    provider = sandbox_provider(
        spec.sandbox,
        local_base_dir=str(run_dir / "sandboxes"),
        wrap=(
            (lambda inner: ChaosProvider(inner, options.chaos_rate, options.seed))
            if options.chaos_rate
            else None
        ),
    )
    pool = EnginePool(clients, wait_ready_seconds=30.0)
    caps = EpisodeCaps.from_spec(spec)
    turns = _turn_tokenizer(spec, start_weights)
    runner = CountingRunner(
        state=state,
        provider=provider,
        agent=TokenAgent(pool, turns, caps),
        caps=caps,
        failure_policy=spec.rollout.failure_policy,
        on_release=pool.release,
    )
    weight_sync = DiskWeightSync(
        clients,
        export=backend.export_weights,
        weights_dir=run_dir / "weights",
        initial_version=state.step,
        initial_path=start_weights,
        retry=PushRetry.from_spec(spec.trainer.weight_sync),
    )
    parts = build_parts(
        spec,
        tasks=tasks,
        backend=backend,
        checkpoints=checkpoints,
        state=state,
        weight_sync=weight_sync,
    )
    evals_log = run_dir / "logs" / EVALUATIONS_LOG
    train_seconds = _EpisodeSeconds(on_trajectory)
    session_options = SessionOptions(
        steps_log=steps_log,
        evaluation=None
        if options.skip_eval
        else _evaluation_spec(spec.trainer.evaluation, options),
        evaluations_log=evals_log,
        on_step=None if on_step is None else (lambda record, _driver: on_step(record)),
        on_trajectory=train_seconds,
        max_steps=options.max_steps,
    )

    def rollout(stream: TaskStream, admission: StalenessAdmission) -> Any:
        return fixed_rollout(spec, runner, stream, admission)

    before: Evaluation | None = None
    after: Evaluation | None = None
    after_warm_start: Evaluation | None = None
    warm: WarmStartProgress | None = None
    evaluation: PeriodicEvaluation | None = None

    records: list[StepRecord] = []
    long_tail: list[float] = []
    interrupted = False
    try:
        for client in clients:
            await client.wait_healthy(deadline_seconds=120.0)
        # Readiness probing starts once the engines are up (before, every probe would fail).
        pool.start_health(1.0)
        if not options.resume:
            evals_log.unlink(missing_ok=True)
        async with open_session(parts, rollout, session_options) as session:
            evaluation, driver = session.evaluation, session.driver
            if evaluation is not None and not options.resume:
                # Before training, and waited for: the untrained weights alone, with the whole
                # concurrency (the driver's evaluations at the interval run beside training).
                phase("measuring held-out pass@1 (base)")
                before = await evaluation.run_now(state.step)
            if spec.trainer.warm_start is not None:
                fresh = state.warm_start is None or not state.warm_start.done
                phase("warm start")
                warm = await warm_up(
                    parts, turns, log_dir=run_dir / "logs", on_progress=on_warm_start
                )
                # an engine restarted after a crash comes back to the warm start's weights
                backend.export_weights(start_weights)
                if evaluation is not None and fresh:
                    evaluation.warm_start_done()
                    phase("measuring held-out pass@1 (after the warm start)")
                    after_warm_start = await evaluation.run_now(state.step)
            phase("training")
            try:
                state = await driver.run()
            finally:
                records = driver.records
                long_tail = list(session.scheduler.long_tail_shares)
        if evaluation is not None:
            after = await _final_evaluation(evaluation, state.step, weight_sync, phase)
    except asyncio.CancelledError:
        interrupted = True
    finally:
        await pool.stop_health()
        for client in clients:
            await client.close()
        await provider.aclose()
        await engines.stop()
    if options.resume and steps_log.exists():
        records = [
            StepRecord.model_validate_json(line)
            for line in steps_log.read_text().splitlines()
            if line.strip()
        ]
    return RunResult(
        job_name=job.metadata.name,
        state=state,
        records=records,
        before=before,
        after=after,
        after_warm_start=after_warm_start,
        warm_start=warm,
        infra_error_attempts=state.infra_error_attempts,
        engine_restarts=engines.restarts,
        long_tail_shares=long_tail,
        train_tasks=len(tasks.train),
        held_out_tasks=len(tasks.held_out),
        evaluations=list(evaluation.results) if evaluation is not None else [],
        train_episode_seconds=train_seconds.seconds,
        wall_seconds=time.monotonic() - started,
        caps={
            "max_trajectory_tokens": caps.max_trajectory_tokens,
            "max_tokens_per_turn": caps.max_tokens_per_turn,
        },
        interrupted=interrupted,
    )


def load_manifest(path: Path) -> AgentRLJob:
    """Parse and validate a manifest file (schema and cross-field rules)."""
    from agentrl.api.validation import load_job

    return load_job(path.read_text(encoding="utf-8"))


def dump_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
