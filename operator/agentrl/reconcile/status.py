"""Status of an AgentRLJob from the job and a snapshot of its children: conditions, sub-status
counts, and the Events of the transitions a user cares about.

Pure: :func:`compute_status` takes the job (with the status it has now), an
``observed.Observed`` snapshot, the object's ``metadata.generation`` and ``now``, and returns the
new status, the events, the trainer-restart decision the controller acts on, and the scale of
every workload with the sandbox concurrency in effect (decided here once per reconcile; the
children apply the same figures, see ``plan``). Write the status only when
:func:`status_changed` says so, and post the events only after that write succeeded — then a
retried reconcile neither rewrites an unchanged status nor repeats an event.

Conditions follow the API conventions: every type is present from the first reconcile, reasons
are CamelCase constants, ``lastTransitionTime`` moves only when ``status`` flips, and messages
lift the child's own words — the scheduler's "0/6 nodes are available: 6 Insufficient
amd.com/gpu.", an image pull error, a crash loop's last exit.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict

from agentrl.api import AgentRLJob, AgentRLJobStatus, Condition, ConditionType, Reason
from agentrl.api.status import (
    EngineStatus,
    RolloutStatus,
    SandboxStatus,
    ToolHealthStatus,
    TrainerStatus,
)
from agentrl.api.wire import CheckpointSaveFailure, TrainerProgress, WeightPushFailure
from agentrl.reconcile import preflight, wire_skew
from agentrl.reconcile.constants import ANNOTATION_JOB_COMPLETION_INDEX, Component, ExtraReason
from agentrl.reconcile.labels import sandbox_selector, selector_string
from agentrl.reconcile.observed import Observed, ObservedPod
from agentrl.reconcile.policies import deadline, placement, trainer_restarts
from agentrl.reconcile.policies.suspend import WorkloadScale, workload_scale

ConditionStatus = Literal["True", "False", "Unknown"]
EventType = Literal["Normal", "Warning"]

#: Condition order in ``status.conditions`` (the summary first).
CONDITION_ORDER: tuple[ConditionType, ...] = tuple(ConditionType)
#: Conditions whose True is bad news.
NEGATIVE_CONDITIONS = frozenset({ConditionType.FAILED, ConditionType.DEGRADED})
#: Conditions that flip too often to be worth an event (every weight push), or whose news
#: Degraded already posts (a failed checkpoint save: one Warning, and a Normal once cleared).
QUIET_CONDITIONS = frozenset({ConditionType.WEIGHTS_SYNCED, ConditionType.CHECKPOINT_SAVED})
#: Failed weight pushes in a row to one engine (each after ``weightSync.pushAttempts`` tries,
#: as the trainer reports them in ``agentrl.dev/progress``) from which the job is Degraded and
#: WeightsSynced is False, reason ``WeightPushFailing``. One failure is a blip the next
#: interval retries; three in a row is an engine that does not take weights. The chart's
#: ``AgentRLWeightPushFailing`` alert fires at the same count by default.
WEIGHT_PUSH_FAILURES_DEGRADED: Final = 3
#: Failed checkpoint saves in a row (each after ``checkpoint.saveAttempts`` tries, as the
#: trainer reports them in ``agentrl.dev/progress``) from which the job is Degraded and
#: CheckpointSaved is False, reason ``CheckpointSaveFailing``: the first. The tries already
#: absorbed the blips, and from here every step since the last checkpoint is at risk. The
#: chart's ``AgentRLCheckpointSaveFailing`` alert fires at the same count by default.
CHECKPOINT_SAVE_FAILURES_DEGRADED: Final = 1

#: Container waiting reasons that mean the image cannot be pulled.
IMAGE_PULL_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)
#: Container waiting reasons that mean the container cannot be created or started.
CONTAINER_ERROR_REASONS = frozenset(
    {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
)


class Event(BaseModel):
    """An Event to post on the job."""

    model_config = ConfigDict(frozen=True)

    type: EventType
    reason: str
    message: str


class StatusResult(BaseModel):
    """What :func:`compute_status` decided."""

    model_config = ConfigDict(frozen=True)

    status: AgentRLJobStatus
    """The new status (write it when :func:`status_changed`)."""
    events: list[Event]
    """Events for the transitions, to post after the status write."""
    trainer: trainer_restarts.TrainerRestartDecision
    """The trainer-restart decision (delete the failed Job after the status write)."""
    finished: bool
    """The job is Complete or Failed."""
    scale: WorkloadScale | None = None
    """The scale of every workload and the sandbox concurrency in effect, decided once per
    reconcile (``policies.suspend.workload_scale``): the status reports it and the children
    apply it (``plan``). None when no workload was decided (:func:`invalid_spec_status`)."""


@dataclass(frozen=True)
class _Verdict:
    """A condition's status, reason and message before it becomes a ``Condition``."""

    status: ConditionStatus
    reason: str
    message: str


@dataclass(frozen=True)
class PodProblem:
    """Why a pod is not running, in the child's own words."""

    reason: str
    """Our reason (``Unschedulable``, ``ImagePullError``, ...)."""
    detail: str
    """The kubelet's or the scheduler's message."""


# ---- pod problems ----------------------------------------------------------------------------


def pod_problem(pod: ObservedPod) -> PodProblem | None:
    """The most telling reason a pod is not running, or None."""
    scheduled = pod.condition("PodScheduled")
    if scheduled is not None and scheduled.status == "False":
        detail = scheduled.message or scheduled.reason or "not scheduled"
        return PodProblem(Reason.UNSCHEDULABLE, detail)
    for container in pod.containers:
        waiting = container.waiting_reason
        if waiting in IMAGE_PULL_REASONS:
            detail = f"container {container.name}: {waiting}: {container.waiting_message or ''}"
            return PodProblem(Reason.IMAGE_PULL_ERROR, detail.rstrip(": "))
    for container in pod.containers:
        if container.waiting_reason == "CrashLoopBackOff":
            last = container.last_terminated_reason or "unknown"
            code = container.last_terminated_exit_code
            detail = (
                f"container {container.name} is in CrashLoopBackOff after "
                f"{container.restart_count} restarts; last exit: {last}"
                + (f" (exit code {code})" if code is not None else "")
            )
            return PodProblem(Reason.CRASH_LOOP, detail)
        if container.waiting_reason in CONTAINER_ERROR_REASONS:
            detail = (
                f"container {container.name}: {container.waiting_reason}: "
                f"{container.waiting_message or ''}"
            )
            return PodProblem(ExtraReason.CONTAINER_ERROR, detail.rstrip(": "))
    return None


#: Which problem to report when pods have different ones: the one a user must act on first.
_PROBLEM_ORDER = (
    Reason.UNSCHEDULABLE,
    Reason.IMAGE_PULL_ERROR,
    ExtraReason.CONTAINER_ERROR,
    Reason.CRASH_LOOP,
)
#: Reasons that mean something is wrong (a Warning event, and the Ready reason when they hold a
#: component down).
PROBLEM_REASONS = frozenset(
    {
        *_PROBLEM_ORDER,
        Reason.TRAINER_RESTARTING,
        Reason.WATCHDOG_CRASH_LOOP,
        Reason.GPU_CAPACITY_INSUFFICIENT,
        Reason.VERSION_SKEW,
    }
)


def worst_problem(pods: list[ObservedPod], *, what: str) -> PodProblem | None:
    """The first problem in :data:`_PROBLEM_ORDER` among ``pods`` that are not ready, as
    ``"<n> <what> pod(s) <reason>; <first pod>: <detail>"``."""
    found = [(p, prob) for p in pods if not p.ready and (prob := pod_problem(p)) is not None]
    for reason in _PROBLEM_ORDER:
        hits = [(p, prob) for p, prob in found if prob.reason == reason]
        if hits:
            pod, prob = hits[0]
            plural = "pod" if len(hits) == 1 else "pods"
            return PodProblem(
                reason, f"{len(hits)} {what} {plural} {reason}; {pod.name}: {prob.detail}"
            )
    return None


# ---- component conditions -------------------------------------------------------------------


def engines_verdict(job: AgentRLJob, observed: Observed, desired: int) -> _Verdict:
    """EnginesReady while the job runs."""
    if observed.engine_set is None:
        return _Verdict("False", Reason.RECONCILING, "the engine StatefulSet is not created yet")
    if placement.engines_held(job, observed):
        return waiting_for_trainer_verdict(job, observed, desired)
    pods = observed.pods_of(Component.ENGINE)
    ready = sum(p.ready for p in pods)
    summary = f"{ready}/{desired} engines ready"
    if ready >= desired:
        return _Verdict("True", Reason.ENGINES_AVAILABLE, summary)
    problem = worst_problem(pods, what="engine")
    if problem is not None:
        return _Verdict("False", problem.reason, f"{summary}: {problem.detail}")
    starting = sum(p.phase == "Running" and not p.ready for p in pods)
    detail = f" ({starting} loading the model or capturing graphs)" if starting else ""
    return _Verdict("False", Reason.ENGINES_PROGRESSING, summary + detail)


def waiting_for_trainer_verdict(job: AgentRLJob, observed: Observed, desired: int) -> _Verdict:
    """EnginesReady while the engines wait for the trainer's pods (``policies.placement``),
    with the reason the trainer's pods wait, when the scheduler gave one."""
    nodes = job.spec.trainer.nodes
    message = (
        f"0/{desired} engines: created once the trainer's pods are scheduled, so whole nodes "
        f"stay free for them ({placement.trainer_pods_scheduled(observed)}/{nodes} scheduled)"
    )
    problem = worst_problem(observed.pods_of(Component.TRAINER), what="trainer")
    if problem is not None:
        message += f": {problem.detail}"
    return _Verdict("False", Reason.WAITING_FOR_TRAINER, message)


def gpus_verdict(
    job: AgentRLJob, observed: Observed, *, suspended: bool, finished: bool
) -> _Verdict:
    """GPUsAvailable: the GPU preflight (``reconcile.preflight``)."""
    found = preflight.verdict(job, observed, suspended=suspended, finished=finished)
    return _Verdict(found.status, found.reason, found.message)


def sandbox_pool_verdict(job: AgentRLJob, observed: Observed, scale: WorkloadScale) -> _Verdict:
    """SandboxPoolReady while the job runs: rollout workers up, sandboxes schedulable, and the
    sandbox concurrency in effect (``scale``)."""
    workers = scale.rollout_workers
    if observed.rollout is None:
        return _Verdict("False", Reason.RECONCILING, "the rollout Deployment is not created yet")
    pods = observed.pods_of(Component.ROLLOUT)
    ready = sum(p.ready for p in pods)
    summary = f"{ready}/{workers} rollout workers ready"
    if ready < workers:
        problem = worst_problem(pods, what="rollout")
        if problem is not None:
            return _Verdict("False", problem.reason, f"{summary}: {problem.detail}")
        return _Verdict("False", Reason.ROLLOUT_PROGRESSING, summary)
    sandboxes = observed.pods_of(Component.SANDBOX)
    unschedulable = [
        p for p in sandboxes if (prob := pod_problem(p)) and prob.reason == Reason.UNSCHEDULABLE
    ]
    if unschedulable:
        problem = worst_problem(unschedulable, what="sandbox")
        assert problem is not None
        return _Verdict("False", Reason.UNSCHEDULABLE, f"{summary}: {problem.detail}")
    concurrency = scale.sandbox_concurrency
    if scale.concurrency_limited_by is not None:
        return _Verdict(
            "True",
            Reason.QUOTA_LIMITED,
            f"{summary}; concurrency {concurrency} of {job.spec.sandbox.concurrency} desired, "
            f"limited by {scale.concurrency_limited_by}",
        )
    return _Verdict("True", Reason.POOL_READY, f"{summary}; concurrency {concurrency}")


def trainer_verdict(
    job: AgentRLJob, observed: Observed, decision: trainer_restarts.TrainerRestartDecision
) -> _Verdict:
    """TrainerReady while the job runs."""
    nodes = job.spec.trainer.nodes
    limit = job.spec.trainer.backoff_limit
    if decision.restarted or decision.delete_failed_job:
        return _Verdict(
            "False",
            Reason.TRAINER_RESTARTING,
            f"restarting from the last checkpoint (restart {decision.restarts} of {limit}) "
            f"after: {decision.failure_message}",
        )
    if observed.trainer_job is None:
        if decision.restarts > 0:
            return _Verdict(
                "False",
                Reason.TRAINER_RESTARTING,
                f"creating the trainer for restart {decision.restarts} of {limit}",
            )
        return _Verdict("False", Reason.TRAINER_PENDING, "the trainer Job is not created yet")
    pods = observed.pods_of(Component.TRAINER)
    running = sum(p.phase == "Running" and p.ready for p in pods)
    summary = f"{running}/{nodes} trainer pods running"
    if running >= nodes:
        return _Verdict("True", Reason.TRAINER_RUNNING, summary)
    problem = worst_problem(pods, what="trainer")
    if problem is not None:
        return _Verdict("False", problem.reason, f"{summary}: {problem.detail}")
    return _Verdict("False", Reason.TRAINER_PENDING, summary)


def _target_weight_version(progress: TrainerProgress | None) -> str | None:
    return None if progress is None else progress.weight_version


def failing_pushes(progress: TrainerProgress | None) -> list[WeightPushFailure]:
    """The engines the trainer reports with at least :data:`WEIGHT_PUSH_FAILURES_DEGRADED`
    failed pushes in a row, most failures first."""
    failures = (progress.weight_push_failures or []) if progress is not None else []
    failing = [f for f in failures if f.failures >= WEIGHT_PUSH_FAILURES_DEGRADED]
    return sorted(failing, key=lambda f: (-f.failures, f.engine))


def weight_push_message(failing: list[WeightPushFailure]) -> str:
    """Each failing engine, its count and the last error, in the trainer's words."""
    parts = []
    for f in failing:
        version = f" (last: weight version {f.version})" if f.version is not None else ""
        parts.append(f"{f.engine}: {f.failures} weight pushes in a row failed{version}: {f.error}")
    return "; ".join(parts)


def weights_verdict(observed: Observed, progress: TrainerProgress | None) -> _Verdict:
    """WeightsSynced: every ready engine serves the trainer's last pushed weights; False with
    ``WeightPushFailing`` while the trainer reports an engine whose pushes keep failing."""
    failing = failing_pushes(progress)
    if failing:
        return _Verdict("False", Reason.WEIGHT_PUSH_FAILING, weight_push_message(failing))
    target = _target_weight_version(progress)
    if target is None:
        return _Verdict(
            "Unknown", ExtraReason.WEIGHT_VERSION_UNKNOWN, "the trainer has pushed no weights yet"
        )
    ready = [p for p in observed.pods_of(Component.ENGINE) if p.ready]
    if not ready:
        return _Verdict("Unknown", ExtraReason.WEIGHT_VERSION_UNKNOWN, "no engine is ready")
    behind = [
        f"{p.name} ({v})"
        for p in ready
        if (v := (p.watchdog.weight_version if p.watchdog else None) or "unknown") != target
    ]
    if behind:
        return _Verdict(
            "False",
            ExtraReason.WEIGHTS_BEHIND,
            f"{len(behind)} of {len(ready)} ready engines do not serve weight version {target}: "
            + ", ".join(behind),
        )
    return _Verdict(
        "True",
        ExtraReason.WEIGHTS_CURRENT,
        f"{len(ready)} ready engines serve weight version {target}",
    )


def checkpoint_save_message(
    job: AgentRLJob, failure: CheckpointSaveFailure, last_checkpoint_step: int
) -> str:
    """The failed saves in the trainer's words, and what happens next."""
    checkpoint = job.spec.trainer.checkpoint
    return (
        f"{failure.failures} checkpoint save{'s' if failure.failures != 1 else ''} in a row "
        f"failed, the last of step {failure.step} "
        f"after {checkpoint.save_attempts} tries: {failure.error}; the last checkpoint is step "
        f"{last_checkpoint_step}; the trainer keeps training and exits at "
        f"{checkpoint.max_failed_saves} failed saves in a row (checkpoint.maxFailedSaves)"
    )


def checkpoint_verdict(
    job: AgentRLJob, previous: AgentRLJobStatus, progress: TrainerProgress | None
) -> _Verdict:
    """CheckpointSaved: False with ``CheckpointSaveFailing`` while the trainer reports
    :data:`CHECKPOINT_SAVE_FAILURES_DEGRADED` failed saves in a row or more; True once it has
    written one (and none failed since); Unknown before. With no trainer reporting (restarting,
    suspended, finished) the trainer's last word stands: the checkpoints on the volume are
    what they were."""
    failure = progress.checkpoint_save_failure if progress is not None else None
    if (
        progress is not None
        and failure is not None
        and failure.failures >= CHECKPOINT_SAVE_FAILURES_DEGRADED
    ):
        return _Verdict(
            "False",
            Reason.CHECKPOINT_SAVE_FAILING,
            checkpoint_save_message(job, failure, progress.last_checkpoint_step),
        )
    if progress is None:
        old = _condition(previous, ConditionType.CHECKPOINT_SAVED)
        if old is not None:
            return _Verdict(old.status, old.reason, old.message)
        return _Verdict("Unknown", Reason.NO_CHECKPOINT_YET, "the trainer has not reported yet")
    if progress.last_checkpoint_step > 0:
        return _Verdict(
            "True",
            Reason.CHECKPOINT_WRITTEN,
            f"the last checkpoint is step {progress.last_checkpoint_step}",
        )
    return _Verdict(
        "Unknown",
        Reason.NO_CHECKPOINT_YET,
        f"no checkpoint since the start (one every {job.spec.trainer.checkpoint.interval_steps} "
        "steps)",
    )


def degraded_verdict(
    observed: Observed,
    progress: TrainerProgress | None = None,
    checkpoint: _Verdict | None = None,
) -> _Verdict:
    """Degraded: the trainer's checkpoint saves fail (``checkpoint``, the CheckpointSaved
    verdict, is False), an engine's watchdog tripped its crash-loop guard, or the trainer's
    weight pushes to an engine failed :data:`WEIGHT_PUSH_FAILURES_DEGRADED` times in a row.
    Several can hold; the message says each. The reason is the failing saves' first (every
    step since the last checkpoint is at risk), then the crash loop's (the pushes to a
    crash-looping engine fail as a consequence)."""
    looping = [
        (p, p.watchdog)
        for p in observed.pods_of(Component.ENGINE)
        if p.watchdog and p.watchdog.crash_loop
    ]
    failing = failing_pushes(progress)
    found: list[tuple[str, str]] = []
    if checkpoint is not None and checkpoint.reason == Reason.CHECKPOINT_SAVE_FAILING:
        found.append((Reason.CHECKPOINT_SAVE_FAILING, checkpoint.message))
    if looping:
        parts = []
        for pod, report in looping:
            part = f"{pod.name}: {report.restarts_in_window} restarts within the watchdog's window"
            if report.last_fault is not None:
                part += f"; last fault {report.last_fault.signature}: {report.last_fault.line}"
            parts.append(part)
        found.append(
            (
                Reason.WATCHDOG_CRASH_LOOP,
                "crash-loop guard tripped (HIP graphs stay on): " + "; ".join(parts),
            )
        )
    if failing:
        found.append(
            (
                Reason.WEIGHT_PUSH_FAILING,
                "the trainer keeps training, its weights do not reach every engine: "
                + weight_push_message(failing),
            )
        )
    if not found:
        return _Verdict(
            "False",
            ExtraReason.AS_EXPECTED,
            "no engine is crash-looping or failing weight pushes, no checkpoint save is failing",
        )
    return _Verdict("True", found[0][0], "; ".join(message for _, message in found))


# ---- terminal state -------------------------------------------------------------------------


def _condition(status: AgentRLJobStatus, type_: ConditionType) -> Condition | None:
    return next((c for c in status.conditions if c.type == type_.value), None)


def _is_true(status: AgentRLJobStatus, type_: ConditionType) -> bool:
    cond = _condition(status, type_)
    return cond is not None and cond.status == "True"


def parse_time(value: str | None) -> datetime | None:
    """An RFC 3339 status time → aware datetime (None passes through)."""
    if value is None:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def format_time(value: datetime) -> str:
    """Aware datetime → RFC 3339 in UTC with second precision, as Kubernetes writes it."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _terminal(
    job: AgentRLJob,
    previous: AgentRLJobStatus,
    observed: Observed,
    decision: trainer_restarts.TrainerRestartDecision,
    start_time: datetime | None,
    now: datetime,
) -> tuple[_Verdict, _Verdict] | None:
    """(Complete, Failed) verdicts once the job has finished; None while it runs. Finished is
    for good: a Complete or Failed job stays so."""
    if _is_true(previous, ConditionType.COMPLETE) or _is_true(previous, ConditionType.FAILED):
        kept = []
        for type_ in (ConditionType.COMPLETE, ConditionType.FAILED):
            cond = _condition(previous, type_)
            kept.append(
                _Verdict(cond.status, cond.reason, cond.message)
                if cond is not None
                else _Verdict("False", ExtraReason.NOT_FINISHED, "")
            )
        return kept[0], kept[1]
    trainer_job = observed.trainer_job
    if trainer_job is not None and trainer_job.complete and not job.spec.suspend:
        done = _Verdict("True", Reason.TRAINER_SUCCEEDED, "the trainer finished all steps")
        return done, _Verdict("False", Reason.TRAINER_SUCCEEDED, "the job completed")
    if decision.fail_reason is not None:
        limit = job.spec.trainer.backoff_limit
        if decision.fail_reason == Reason.BACKOFF_LIMIT_EXCEEDED:
            message = (
                f"the trainer failed {decision.restarts + 1} times, past backoffLimit {limit}: "
                f"{decision.failure_message}"
            )
        elif decision.fail_reason == Reason.VERSION_SKEW:
            message = (
                "the trainer refused the operator's runtime.yaml, and a restart of the same "
                f"image would refuse it again: {decision.failure_message}"
            )
        else:
            message = f"the trainer Job ran past its deadline: {decision.failure_message}"
        return (
            _Verdict("False", decision.fail_reason, message),
            _Verdict("True", decision.fail_reason, message),
        )
    if deadline.deadline_exceeded(job, start_time, now):
        message = (
            f"the job ran longer than activeDeadlineSeconds ({job.spec.active_deadline_seconds} s)"
        )
        return (
            _Verdict("False", Reason.DEADLINE_EXCEEDED, message),
            _Verdict("True", Reason.DEADLINE_EXCEEDED, message),
        )
    return None


# ---- assembly -------------------------------------------------------------------------------


def _trainer_progress(observed: Observed) -> TrainerProgress | None:
    """The driver's progress: from rank 0's pod, else any trainer pod that has one."""
    pods = observed.pods_of(Component.TRAINER)
    pods.sort(key=lambda p: p.annotations.get(ANNOTATION_JOB_COMPLETION_INDEX) != "0")
    return next((p.progress for p in pods if p.progress is not None), None)


def _sub_status(
    job: AgentRLJob,
    previous: AgentRLJobStatus,
    observed: Observed,
    decision: trainer_restarts.TrainerRestartDecision,
    progress: TrainerProgress | None,
    scale: WorkloadScale,
) -> tuple[EngineStatus, SandboxStatus, TrainerStatus, RolloutStatus]:
    engine_pods = observed.pods_of(Component.ENGINE)
    reports = [p.watchdog for p in engine_pods if p.watchdog is not None]
    versions = [
        int(r.weight_version) for r in reports if r.weight_version and r.weight_version.isdigit()
    ]
    engines = EngineStatus(
        replicas=scale.engines,
        ready=sum(p.ready for p in engine_pods),
        restarts=sum(
            c.restart_count for p in engine_pods for c in p.containers if c.name == "engine"
        ),
        faults=sum(r.faults for r in reports),
        weight_version=min(versions) if versions else None,
    )
    sandboxes = observed.pods_of(Component.SANDBOX)
    sandbox = SandboxStatus(
        concurrency=scale.sandbox_concurrency,
        desired=job.spec.sandbox.concurrency,
        limited_by=scale.concurrency_limited_by,
        ready=sum(p.ready for p in sandboxes),
        # One sandbox per episode: every live sandbox pod is in use.
        in_use=len(sandboxes),
        selector=selector_string(sandbox_selector(job)),
        last_scale_time=previous.sandbox.last_scale_time,
        last_scale_reason=previous.sandbox.last_scale_reason,
    )
    trainer_pods = observed.pods_of(Component.TRAINER)
    trainer = TrainerStatus(
        step=progress.step if progress else previous.trainer.step,
        last_checkpoint_step=(
            progress.last_checkpoint_step if progress else previous.trainer.last_checkpoint_step
        ),
        restarts=decision.restarts,
        active=sum(p.phase == "Running" for p in trainer_pods),
        **_stage_fields(progress, previous.trainer),
    )
    rollout = (
        RolloutStatus(
            # one decimal: the figure is a printer column (Traj/h), not a raw float
            trajectories_per_hour=round(progress.trajectories_per_hour, 1),
            mean_reward=progress.mean_reward,
            infra_error_rate=progress.infra_error_rate,
            truncated_rate=progress.truncated_rate,
            tools=_tool_health(progress, previous.rollout),
            **_evaluation_fields(progress, previous.rollout),
        )
        if progress
        else previous.rollout
    )
    return engines, sandbox, trainer, rollout


def _stage_fields(progress: TrainerProgress | None, previous: TrainerStatus) -> dict[str, Any]:
    """The trainer's stage and the warm start's figures: the progress's, else those already in
    status (a restarted trainer has not reported yet)."""
    if progress is None or progress.stage is None:
        return {
            "stage": previous.stage,
            "warm_start_progress": previous.warm_start_progress,
            "warm_start_loss": previous.warm_start_loss,
        }
    return {
        "stage": progress.stage.value,
        "warm_start_progress": (
            progress.warm_start_progress
            if progress.warm_start_progress is not None
            else previous.warm_start_progress
        ),
        "warm_start_loss": (
            progress.warm_start_loss
            if progress.warm_start_loss is not None
            else previous.warm_start_loss
        ),
    }


def _tool_health(progress: TrainerProgress, previous: RolloutStatus) -> ToolHealthStatus | None:
    """The trainer's tool health, else the one already in status (a report before the first
    step of a restarted trainer carries none; an older trainer never does)."""
    if progress.tools is None:
        return previous.tools
    return ToolHealthStatus.model_validate(progress.tools.model_dump())


def _evaluation_fields(progress: TrainerProgress, previous: RolloutStatus) -> dict[str, Any]:
    """The last evaluation's figures: the progress's when it reports one, else the ones already
    in status (a restarted trainer reports steps before its first evaluation ends)."""
    reports = progress.eval_step is not None or progress.pass_at_1 is not None
    source: TrainerProgress | RolloutStatus = progress if reports else previous
    return {
        "pass_at_1": source.pass_at_1,
        "eval_step": source.eval_step,
        "eval_episodes": source.eval_episodes,
        "eval_infra_errors": source.eval_infra_errors,
        # the warm start's two points stay once measured (a restarted trainer does not repeat)
        "pass_at_1_base": _first_known(progress.pass_at_1_base, previous.pass_at_1_base),
        "pass_at_1_warm_start": _first_known(
            progress.pass_at_1_warm_start, previous.pass_at_1_warm_start
        ),
    }


def _first_known(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


def _evaluation_event(previous: RolloutStatus, new: RolloutStatus) -> Event | None:
    """``Evaluated`` when the status carries an evaluation it did not carry before (compared
    with the status already written, so a restarted operator does not post it again)."""
    if new.eval_step is None or new.eval_step == previous.eval_step:
        return None
    figure = "n/a" if new.pass_at_1 is None else f"{new.pass_at_1:.3f}"
    return Event(
        type="Normal",
        reason=Reason.EVALUATED,
        message=f"held-out pass@1 {figure} after step {new.eval_step} over "
        f"{new.eval_episodes} attempts ({new.eval_infra_errors} infra errors left out)",
    )


def _ready_verdict(components: dict[ConditionType, _Verdict]) -> _Verdict:
    down = {t: v for t, v in components.items() if v.status != "True"}
    if not down:
        return _Verdict("True", Reason.ALL_READY, "engines, sandbox pool and trainer are ready")
    # The printer column shows Ready's reason: name the problem when there is one.
    problems = [v.reason for v in down.values() if v.reason in PROBLEM_REASONS]
    reason = problems[0] if problems else Reason.COMPONENTS_NOT_READY
    return _Verdict("False", reason, "; ".join(f"{t.value}: {v.message}" for t, v in down.items()))


def _verdicts(
    job: AgentRLJob,
    previous: AgentRLJobStatus,
    observed: Observed,
    decision: trainer_restarts.TrainerRestartDecision,
    terminal: tuple[_Verdict, _Verdict] | None,
    progress: TrainerProgress | None,
    scale: WorkloadScale,
) -> dict[ConditionType, _Verdict]:
    suspended = job.spec.suspend
    # 0 once the job has finished: its workloads are already scaled to zero.
    stopping = scale.trainer_stopping
    out: dict[ConditionType, _Verdict] = {}
    if terminal is not None:
        complete, failed = terminal
        ending = complete if complete.status == "True" else failed
        stopped = _Verdict(
            "False", ExtraReason.JOB_FINISHED, "the job has finished: " + ending.message
        )
        components = dict.fromkeys(
            (
                ConditionType.ENGINES_READY,
                ConditionType.SANDBOX_POOL_READY,
                ConditionType.TRAINER_READY,
            ),
            stopped,
        )
        out[ConditionType.READY] = _Verdict("False", ending.reason, ending.message)
    elif suspended:
        if stopping:
            off = _Verdict(
                "False",
                Reason.SUSPENDING,
                "the job is suspending: scaled to zero once the trainer has checkpointed",
            )
            ready = _Verdict(
                "False", Reason.SUSPENDING, "the job is suspending: the trainer is checkpointing"
            )
        else:
            off = _Verdict("False", Reason.SUSPENDED, "scaled to zero while the job is suspended")
            ready = _Verdict("False", Reason.SUSPENDED, "the job is suspended")
        components = dict.fromkeys(
            (
                ConditionType.ENGINES_READY,
                ConditionType.SANDBOX_POOL_READY,
                ConditionType.TRAINER_READY,
            ),
            off,
        )
        out[ConditionType.READY] = ready
        complete = failed = _Verdict("False", ExtraReason.NOT_FINISHED, "the job is suspended")
    else:
        components = {
            ConditionType.ENGINES_READY: engines_verdict(job, observed, scale.engines),
            ConditionType.SANDBOX_POOL_READY: sandbox_pool_verdict(job, observed, scale),
            ConditionType.TRAINER_READY: trainer_verdict(job, observed, decision),
        }
        out[ConditionType.READY] = _ready_verdict(components)
        complete = failed = _Verdict("False", ExtraReason.NOT_FINISHED, "the job is running")
    out.update(components)
    out[ConditionType.WEIGHTS_SYNCED] = weights_verdict(observed, progress)
    out[ConditionType.SUSPENDED] = _suspended_verdict(job, previous, observed, stopping)
    out[ConditionType.COMPLETE] = complete
    out[ConditionType.FAILED] = failed
    checkpoint = checkpoint_verdict(job, previous, progress)
    out[ConditionType.DEGRADED] = degraded_verdict(observed, progress, checkpoint)
    out[ConditionType.GPUS_AVAILABLE] = gpus_verdict(
        job, observed, suspended=suspended, finished=terminal is not None
    )
    out[ConditionType.CHECKPOINT_SAVED] = checkpoint
    wire = wire_skew.verdict(observed, _condition(previous, ConditionType.WIRE_COMPATIBLE))
    out[ConditionType.WIRE_COMPATIBLE] = _Verdict(wire.status, wire.reason, wire.message)
    return out


def _suspended_verdict(
    job: AgentRLJob, previous: AgentRLJobStatus, observed: Observed, stopping: int
) -> _Verdict:
    """``stopping``: trainer pods still within their grace period (``policies.suspend``)."""
    if job.spec.suspend and stopping:
        return _Verdict(
            "False",
            Reason.SUSPENDING,
            f"the trainer is writing its checkpoint ({stopping} trainer pods stopping, at most "
            f"{job.spec.trainer.checkpoint.stop_grace_period_seconds}s); sandbox concurrency is "
            "0, engines and rollout workers scale to zero once it has",
        )
    if job.spec.suspend:
        left = sum(
            1
            for c in (Component.ENGINE, Component.ROLLOUT, Component.TRAINER, Component.SANDBOX)
            for _ in observed.pods_of(c)
        )
        tail = f" ({left} pods still terminating)" if left else ""
        return _Verdict(
            "True",
            Reason.SUSPENDED,
            "engines, rollout workers and sandboxes scaled to zero, trainer Job suspended" + tail,
        )
    if _is_true(previous, ConditionType.SUSPENDED):
        return _Verdict("False", Reason.RESUMED, "the job was resumed")
    prev = _condition(previous, ConditionType.SUSPENDED)
    if prev is not None and prev.reason == Reason.RESUMED:
        return _Verdict("False", Reason.RESUMED, prev.message)
    return _Verdict("False", Reason.NOT_SUSPENDED, "the job is not suspended")


def merge_condition(
    previous: Condition | None,
    type_: ConditionType,
    verdict: _Verdict,
    *,
    generation: int,
    now: datetime,
) -> Condition:
    """The new condition; ``lastTransitionTime`` is kept unless ``status`` flips."""
    if previous is None or previous.status != verdict.status:
        transition = format_time(now)
    else:
        transition = previous.last_transition_time
    return Condition(
        type=type_.value,
        status=verdict.status,
        reason=verdict.reason,
        message=verdict.message,
        observed_generation=generation,
        last_transition_time=transition,
    )


def _event(previous: Condition | None, new: Condition) -> Event | None:
    """The Event for one condition's transition, or None when it is not worth one."""
    if previous is not None and (previous.status, previous.reason) == (new.status, new.reason):
        return None
    type_ = ConditionType(new.type)
    if type_ in QUIET_CONDITIONS or new.reason == Reason.RECONCILING:
        return None
    if type_ in NEGATIVE_CONDITIONS:
        if new.status == "True":
            return Event(type="Warning", reason=new.reason, message=new.message)
        if previous is not None and previous.status == "True":
            return Event(type="Normal", reason=new.reason, message=new.message)
        return None
    if type_ is ConditionType.SUSPENDED:
        if new.status == "True" or new.reason in (Reason.RESUMED, Reason.SUSPENDING):
            return Event(type="Normal", reason=new.reason, message=new.message)
        return None
    if new.status == "True":
        return Event(type="Normal", reason=new.reason, message=new.message)
    if new.reason in PROBLEM_REASONS and type_ is not ConditionType.READY:
        return Event(type="Warning", reason=new.reason, message=f"{new.type}: {new.message}")
    return None


def compute_status(
    job: AgentRLJob, observed: Observed, *, generation: int, now: datetime
) -> StatusResult:
    """The job's new status from its current one (``job.status``) and ``observed``."""
    previous = job.status or AgentRLJobStatus()
    decision = trainer_restarts.decide(
        job,
        recorded_restarts=previous.trainer.restarts,
        observed=observed.trainer_job,
        pods=observed.pods_of(Component.TRAINER),
    )
    prev_start = parse_time(previous.start_time)
    terminal = _terminal(job, previous, observed, decision, prev_start, now)
    finished = terminal is not None
    # Like a Kubernetes Job: the clock (and activeDeadlineSeconds) restarts on resume.
    if finished:
        start_time = prev_start
    elif job.spec.suspend:
        start_time = None
    else:
        start_time = prev_start or now
    completion = previous.completion_time or (format_time(now) if finished else None)
    progress = _trainer_progress(observed)
    # The one place a reconcile decides the workloads' scale and the concurrency in effect.
    scale = workload_scale(job, finished=finished, observed=observed, now=now)
    verdicts = _verdicts(job, previous, observed, decision, terminal, progress, scale)
    conditions = []
    events: list[Event] = []
    for type_ in CONDITION_ORDER:
        old = _condition(previous, type_)
        cond = merge_condition(old, type_, verdicts[type_], generation=generation, now=now)
        conditions.append(cond)
        event = _event(old, cond)
        if event is not None:
            events.append(event)
    if decision.restarted:
        events.append(
            Event(
                type="Warning",
                reason=Reason.TRAINER_RESTARTING,
                message=f"trainer restart {decision.restarts} of "
                f"{job.spec.trainer.backoff_limit} from the last checkpoint after: "
                f"{decision.failure_message}",
            )
        )
        # The restart event says it better than the TrainerReady transition would.
        events = [
            e for e in events if not e.message.startswith(f"{ConditionType.TRAINER_READY.value}:")
        ]
    engines, sandbox, trainer, rollout = _sub_status(
        job, previous, observed, decision, progress, scale
    )
    evaluated = _evaluation_event(previous.rollout, rollout)
    if evaluated is not None:
        events.append(evaluated)
    status = AgentRLJobStatus(
        observed_generation=generation,
        conditions=conditions,
        ready_reason=verdicts[ConditionType.READY].reason,
        degraded_reason=(
            verdicts[ConditionType.DEGRADED].reason
            if verdicts[ConditionType.DEGRADED].status == "True"
            else None
        ),
        start_time=None if start_time is None else format_time(start_time),
        completion_time=completion,
        engines=engines,
        sandbox=sandbox,
        trainer=trainer,
        rollout=rollout,
    )
    return StatusResult(
        status=status, events=events, trainer=decision, finished=finished, scale=scale
    )


def invalid_spec_status(
    job: AgentRLJob, message: str, *, generation: int, now: datetime
) -> StatusResult:
    """The status of a job whose spec the operator refuses (e.g. ``EngineFlagError``): Ready
    False with reason InvalidSpec and the message naming the field; nothing else changes."""
    previous = job.status or AgentRLJobStatus()
    old = _condition(previous, ConditionType.READY)
    ready = merge_condition(
        old,
        ConditionType.READY,
        _Verdict("False", Reason.INVALID_SPEC, message),
        generation=generation,
        now=now,
    )
    others = [c for c in previous.conditions if c.type != ConditionType.READY.value]
    status = previous.model_copy(
        update={
            "conditions": [ready, *others],
            "ready_reason": Reason.INVALID_SPEC.value,
            "observed_generation": generation,
        }
    )
    changed = old is None or (old.reason, old.message) != (ready.reason, ready.message)
    events = [Event(type="Warning", reason=Reason.INVALID_SPEC, message=message)] if changed else []
    return StatusResult(
        status=status,
        events=events,
        trainer=trainer_restarts.TrainerRestartDecision(restarts=previous.trainer.restarts),
        finished=False,
    )


def status_body(status: AgentRLJobStatus) -> dict[str, object]:
    """The status as written to the API server (camelCase, no nulls)."""
    return status.to_manifest()


def status_changed(old: AgentRLJobStatus | dict[str, object] | None, new: AgentRLJobStatus) -> bool:
    """Whether writing ``new`` would change anything (minimal writes). ``old`` may be the raw
    status from the API server."""
    if old is None:
        return True
    old_model = old if isinstance(old, AgentRLJobStatus) else AgentRLJobStatus.model_validate(old)
    return status_body(old_model) != status_body(new)
