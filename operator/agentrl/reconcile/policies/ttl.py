"""``spec.ttlSecondsAfterFinished``: delete the job this long after it became Complete or
Failed (its children go with it through their ownerReferences).

The clock starts at ``status.completionTime``. Without the field a finished job stays.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from agentrl.api import AgentRLJob


def deletion_time(job: AgentRLJob, completion_time: datetime | None) -> datetime | None:
    """When the finished job is to be deleted; None when it never is (or is not finished)."""
    ttl = job.spec.ttl_seconds_after_finished
    if ttl is None or completion_time is None:
        return None
    return completion_time + timedelta(seconds=ttl)


def should_delete(job: AgentRLJob, completion_time: datetime | None, now: datetime) -> bool:
    """Whether the job is due for deletion at ``now``."""
    at = deletion_time(job, completion_time)
    return at is not None and now >= at


def seconds_until_deletion(
    job: AgentRLJob, completion_time: datetime | None, now: datetime
) -> float | None:
    """Seconds from ``now`` to the deletion (for a requeue), None when none is due."""
    at = deletion_time(job, completion_time)
    return None if at is None else max(0.0, (at - now).total_seconds())
