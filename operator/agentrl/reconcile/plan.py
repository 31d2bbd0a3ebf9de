"""One reconcile, decided: from the job, what was observed and ``now``, everything the
controller must do — the children to apply, the status to write (and whether to write it), the
events to post, what to delete and when to look again.

The controller stays thin::

    job = AgentRLJob.model_validate(body)
    ctx = BuildContext.for_job(job, images=settings.images)
    observed = observe(statefulset=..., trainer_job=..., deployment=..., pods=...)
    p = plan(job, ctx, observed, generation=body["metadata"]["generation"], now=utcnow())
    if p.delete_job: delete the AgentRLJob; return
    for obj in p.children: server-side apply obj (field manager constants.FIELD_MANAGER, force)
    if p.write_status: patch status with status.status_body(p.status)
    for ref in p.delete: delete ref (propagationPolicy Background)
    for e in p.events: post e on the job        # only after the status write succeeded
    requeue after p.requeue_after_seconds (if not None)

Building every child before anything is applied means a spec the builders refuse (e.g. engine
flags) is never half-applied: the plan then carries no children and a Ready=False/InvalidSpec
status instead.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from agentrl.api import AgentRLJob, AgentRLJobStatus
from agentrl.api.engine_flags import EngineFlagError
from agentrl.reconcile.children import ChildRef, TrainerJobPlan, child_ref, desired_children
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.observed import Observed
from agentrl.reconcile.policies import deadline, suspend, ttl
from agentrl.reconcile.status import (
    Event,
    StatusResult,
    compute_status,
    invalid_spec_status,
    parse_time,
    status_changed,
)
from agentrl.reconcile.trainer import trainer_job as build_trainer_job


class Plan(BaseModel):
    """What one reconcile does."""

    model_config = ConfigDict(frozen=True)

    children: list[dict[str, Any]]
    """Objects to server-side apply, in order."""
    status: AgentRLJobStatus
    """The new ``AgentRLJobStatus``."""
    write_status: bool
    """Whether the status differs from the job's current one."""
    events: list[Event]
    """Events to post after the status write."""
    delete: list[ChildRef]
    """Children to delete after the status write (a failed trainer attempt)."""
    delete_job: bool = False
    """``ttlSecondsAfterFinished`` has passed: delete the job itself."""
    requeue_after_seconds: float | None = None
    """Reconcile again after this long (a deadline or TTL falls due), besides the usual watch."""


def _trainer_job_plan(result: StatusResult, observed: Observed) -> TrainerJobPlan:
    existing = observed.trainer_job
    keep_hands_off = result.trainer.delete_failed_job or (
        existing is not None
        and (existing.deleting or existing.complete or existing.failed_condition is not None)
    )
    if result.finished and existing is None:
        keep_hands_off = True
    return TrainerJobPlan(apply=not keep_hands_off, attempt=result.trainer.restarts)


def _requeue(
    job: AgentRLJob, result: StatusResult, now: datetime, observed: Observed
) -> float | None:
    status = result.status
    waits = [
        suspend.seconds_until_trainer_stopped(job, observed, now),
        deadline.seconds_until_deadline(job, parse_time(status.start_time), now)
        if not result.finished
        else None,
        ttl.seconds_until_deletion(job, parse_time(status.completion_time), now),
    ]
    due = [w for w in waits if w is not None]
    return min(due) if due else None


def plan(
    job: AgentRLJob, ctx: BuildContext, observed: Observed, *, generation: int, now: datetime
) -> Plan:
    """Everything one reconcile of ``job`` does, decided without I/O."""
    result = compute_status(job, observed, generation=generation, now=now)
    write = status_changed(job.status, result.status)
    if result.finished and ttl.should_delete(job, parse_time(result.status.completion_time), now):
        return Plan(
            children=[],
            status=result.status,
            write_status=False,
            events=[],
            delete=[],
            delete_job=True,
        )
    try:
        children = desired_children(
            job,
            ctx,
            scale=result.scale,
            trainer_job=_trainer_job_plan(result, observed),
            observed=observed,
        )
    except EngineFlagError as exc:
        invalid = invalid_spec_status(job, str(exc), generation=generation, now=now)
        return Plan(
            children=[],
            status=invalid.status,
            write_status=status_changed(job.status, invalid.status),
            events=invalid.events,
            delete=[],
        )
    delete: list[ChildRef] = []
    if result.trainer.delete_failed_job:
        delete.append(child_ref(build_trainer_job(job, ctx)))
    return Plan(
        children=children,
        status=result.status,
        write_status=write,
        events=result.events,
        delete=delete,
        requeue_after_seconds=_requeue(job, result, now, observed),
    )
