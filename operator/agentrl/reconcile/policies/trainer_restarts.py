"""Trainer restarts: a failed trainer restarts from its last checkpoint, as a whole, up to
``spec.trainer.backoffLimit`` times; every restart is counted in ``status.trainer.restarts``.

Why whole-group restarts by the operator instead of the Job's own pod retries: when one rank of
a distributed trainer dies, the others hang in a collective until they time out, so retrying
one pod cannot recover. The trainer Job therefore runs with ``backoffLimit: 0`` (its first pod
failure fails it, except node disruptions, which its podFailurePolicy ignores) and the operator
deletes the failed Job and creates a fresh one — every rank restarts together and resumes from
the checkpoint. This is how KubeRay's RayJob retries (a new cluster per attempt).

Counting survives operator restarts: each trainer Job carries its attempt number
(``agentrl.dev/trainer-attempt``) and the count lives in the job's status. A failed Job whose
attempt is below the recorded count was already counted (the operator died between writing the
status and deleting the Job), so it is deleted without counting it again.

A Job that failed because its ``activeDeadlineSeconds`` passed is not restarted: the deadline
is the job's, not the attempt's. Nor is a trainer that refused the operator's ``runtime.yaml``
as written in a wire contract version more than one minor version from its own (its last words
start with ``api.wire.WIRE_SKEW_PREFIX``): the next attempt runs the same image against the same
operator and can only refuse again, so the job fails at once (``VersionSkew``, naming both
versions) instead of spending ``backoffLimit`` on it.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from agentrl.api import AgentRLJob, Reason
from agentrl.api.wire import skew_line
from agentrl.reconcile.observed import ObservedPod, ObservedTrainerJob

#: The reason Kubernetes gives a Job that ran past its activeDeadlineSeconds.
JOB_DEADLINE_REASON = "DeadlineExceeded"
#: The trainer container's name (``reconcile.trainer``).
TRAINER_CONTAINER = "trainer"
#: How much of a failed trainer's last words goes into the message (lines, characters).
LAST_WORDS_LINES = 3
LAST_WORDS_CHARS = 600


class TrainerRestartDecision(BaseModel):
    """What to do about the trainer's failures."""

    model_config = ConfigDict(frozen=True)

    restarts: int
    """``status.trainer.restarts`` after this decision; also the attempt number of the trainer
    Job to run next."""
    delete_failed_job: bool = False
    """Delete the observed (failed) trainer Job so the next reconcile creates the next
    attempt. Write the status first, then delete."""
    restarted: bool = False
    """This decision counted a new restart (post a TrainerRestarting event)."""
    fail_reason: Reason | None = None
    """The job is Failed: ``BackoffLimitExceeded``, ``DeadlineExceeded`` or ``VersionSkew``."""
    failure_message: str | None = None
    """The trainer Job's own failure message, for the condition and the event."""


def last_words(pods: Sequence[ObservedPod]) -> str | None:
    """Why the trainer's pods failed, in their own words: each failed trainer container's exit
    code and the last lines of its termination message (the tail of its log: the trainer
    container's ``terminationMessagePolicy`` is ``FallbackToLogsOnError``). The Job's own
    message only says that its backoff limit was reached."""
    said = []
    for pod in pods:
        for container in pod.containers:
            code = container.terminated_exit_code
            if container.name != TRAINER_CONTAINER or code in (None, 0):
                continue
            lines = [ln.strip() for ln in (container.terminated_message or "").splitlines()]
            tail = " | ".join([ln for ln in lines if ln][-LAST_WORDS_LINES:])
            if len(tail) > LAST_WORDS_CHARS:
                tail = "…" + tail[-LAST_WORDS_CHARS:]
            said.append(f"pod {pod.name} exited {code}" + (f": {tail}" if tail else ""))
    return "; ".join(said) or None


def refusal(pods: Sequence[ObservedPod]) -> str | None:
    """A failed trainer container's refusal of ``runtime.yaml`` (wire contract skew), as
    ``pod NAME: wire contract skew: ...``; None when no trainer refused it."""
    for pod in pods:
        for container in pod.containers:
            if container.name != TRAINER_CONTAINER or container.terminated_exit_code in (None, 0):
                continue
            found = skew_line(container.terminated_message)
            if found is not None:
                return f"pod {pod.name}: {found.line}"
    return None


def decide(
    job: AgentRLJob,
    *,
    recorded_restarts: int,
    observed: ObservedTrainerJob | None,
    pods: Sequence[ObservedPod] = (),
) -> TrainerRestartDecision:
    """Restart, give up or carry on, from the recorded count and the observed trainer Job
    (``pods``: the trainer's pods, whose last words go into the failure message)."""
    failed = None if observed is None else observed.failed_condition
    if observed is None or failed is None or observed.deleting:
        return TrainerRestartDecision(restarts=recorded_restarts)
    message = failed.message or failed.reason or "the trainer Job failed"
    if (words := last_words(pods)) is not None:
        message = f"{message}; {words}"
    if observed.attempt < recorded_restarts:
        # Counted already; the operator stopped before deleting it.
        return TrainerRestartDecision(
            restarts=recorded_restarts, delete_failed_job=True, failure_message=message
        )
    if failed.reason == JOB_DEADLINE_REASON:
        return TrainerRestartDecision(
            restarts=recorded_restarts,
            fail_reason=Reason.DEADLINE_EXCEEDED,
            failure_message=message,
        )
    if (refused := refusal(pods)) is not None:
        return TrainerRestartDecision(
            restarts=recorded_restarts, fail_reason=Reason.VERSION_SKEW, failure_message=refused
        )
    if recorded_restarts >= job.spec.trainer.backoff_limit:
        return TrainerRestartDecision(
            restarts=recorded_restarts,
            fail_reason=Reason.BACKOFF_LIMIT_EXCEEDED,
            failure_message=message,
        )
    return TrainerRestartDecision(
        restarts=recorded_restarts + 1,
        delete_failed_job=True,
        restarted=True,
        failure_message=message,
    )
