"""Suspend: what runs, at which scale, for a job that is running, suspended or finished.

Suspended (``spec.suspend``): engines and rollout workers scale to zero, the in-effect sandbox
concurrency is zero (so the rollout tier starts no sandbox), and the trainer Job is suspended
(Kubernetes deletes its pods; resuming re-creates them and the trainer resumes from its last
checkpoint). Resuming restores every figure from the spec. A finished job (Complete or Failed)
keeps nothing running either, but it is not "suspended": its condition says why it stopped.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from agentrl.api import AgentRLJob
from agentrl.reconcile.concurrency import effective_concurrency
from agentrl.reconcile.observed import Observed
from agentrl.reconcile.quotas import sandboxes_charged


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


def is_suspended(job: AgentRLJob) -> bool:
    """Whether the user asked for the job to be suspended."""
    return job.spec.suspend


def workload_scale(
    job: AgentRLJob, *, finished: bool = False, observed: Observed | None = None
) -> WorkloadScale:
    """The scale of every workload: the spec's when running, zero when suspended or finished;
    ``observed`` brings the namespace's ResourceQuotas, which cap sandbox concurrency."""
    stopped = is_suspended(job) or finished
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
        trainer_suspended=stopped,
    )
