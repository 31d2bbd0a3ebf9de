"""Suspend: what runs, at which scale, for a job that is running, suspended or finished.

Suspending is checkpoint-aware, in two phases:

1. **Suspending** (``spec.suspend`` and trainer pods still stopping): the trainer Job is
   suspended, so Kubernetes sends its pods SIGTERM; the driver finishes the step it is in,
   checkpoints it with its data position and exits (``agentrl.trainer.stopping``) within the
   pods' grace period (``spec.trainer.checkpoint.stopGracePeriodSeconds``). The in-effect
   sandbox concurrency is already zero (the rollout tier starts no new episode), but engines
   and rollout workers stay at the spec's scale: the step being finished may still push its
   weights to the engines.
2. **Suspended** (no trainer pod left stopping): engines and rollout workers scale to zero too.

A trainer pod counts as stopping until it is gone or its ``deletionTimestamp`` (the deletion
time plus its grace period, when the kubelet kills it) has passed: a pod left behind on an
unreachable node does not hold the engines up for ever. Resuming restores every figure from the
spec, and the trainer resumes from its last checkpoint. A finished job (Complete or Failed)
keeps nothing running either, but it is not "suspended": its condition says why it stopped.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from agentrl.api import AgentRLJob
from agentrl.reconcile.concurrency import effective_concurrency
from agentrl.reconcile.constants import Component
from agentrl.reconcile.observed import Observed, sandboxes_charged


class WorkloadScale(BaseModel):
    """The replica counts and switches the builders apply."""

    model_config = ConfigDict(frozen=True)

    engines: int
    """Engine StatefulSet replicas."""
    rollout_workers: int
    """Rollout Deployment replicas."""
    sandbox_concurrency: int
    """Sandbox concurrency in effect (the rollout tier's config)."""
    concurrency_limited_by: str | None
    """What holds concurrency below the spec's, if anything."""
    trainer_suspended: bool
    """``spec.suspend`` of the trainer Job."""
    trainer_stopping: int = 0
    """Trainer pods still stopping while the job suspends (engines and rollout workers wait
    for them to checkpoint); 0 otherwise."""

    @property
    def suspending(self) -> bool:
        """The job is in the first phase of suspending: the trainer is checkpointing."""
        return self.trainer_suspended and self.trainer_stopping > 0


def is_suspended(job: AgentRLJob) -> bool:
    """Whether the user asked for the job to be suspended."""
    return job.spec.suspend


def trainer_pods_stopping(observed: Observed | None, now: datetime | None) -> int:
    """Trainer pods that may still be writing a checkpoint: not finished, and not deleted or
    deleted less than their grace period ago (``now`` None: every deleted one)."""
    if observed is None:
        return 0
    return sum(
        1
        for p in observed.pods
        if p.component == Component.TRAINER.value
        and p.phase not in ("Succeeded", "Failed")
        and (p.deletion_timestamp is None or now is None or p.deletion_timestamp > now)
    )


def workload_scale(
    job: AgentRLJob,
    *,
    finished: bool = False,
    observed: Observed | None = None,
    now: datetime | None = None,
) -> WorkloadScale:
    """The scale of every workload: the spec's when running, zero when suspended or finished;
    ``observed`` brings the namespace's ResourceQuotas, which cap sandbox concurrency, and the
    trainer pods that keep a suspending job's engines up (``now``: to tell which are past their
    grace period)."""
    stopping = 0 if finished or not is_suspended(job) else trainer_pods_stopping(observed, now)
    stopped = (is_suspended(job) and not stopping) or finished
    concurrency = effective_concurrency(
        job,
        finished=finished,
        quotas=observed.quotas if observed is not None else (),
        sandboxes_in_use=sandboxes_charged(observed) if observed is not None else 0,
    )
    return WorkloadScale(
        engines=0 if stopped else job.spec.inference.engines,
        rollout_workers=0 if stopped else job.spec.rollout.workers,
        sandbox_concurrency=concurrency.value,
        concurrency_limited_by=concurrency.limited_by,
        trainer_suspended=is_suspended(job) or finished,
        trainer_stopping=stopping,
    )


def seconds_until_trainer_stopped(
    job: AgentRLJob, observed: Observed | None, now: datetime
) -> float | None:
    """While the job is suspending: seconds until the last deleted trainer pod's grace period
    ends (the reconcile then scales the engines down even if no pod event comes, e.g. for a
    pod on an unreachable node); None otherwise."""
    if not is_suspended(job) or observed is None:
        return None
    deadlines = [
        (p.deletion_timestamp - now).total_seconds()
        for p in observed.pods
        if p.component == Component.TRAINER.value
        and p.deletion_timestamp is not None
        and p.deletion_timestamp > now
    ]
    return max(deadlines) + 1.0 if deadlines else None
