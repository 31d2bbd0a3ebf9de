"""``spec.activeDeadlineSeconds``: a job that has run this long is Failed (DeadlineExceeded).

The clock starts at ``status.startTime``, which the status computation sets when the job first
runs unsuspended and clears while it is suspended — the same rule as a Kubernetes Job, whose
deadline restarts on resume. A suspended job has no deadline running.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from agentrl.api import AgentRLJob


def deadline(job: AgentRLJob, start_time: datetime | None) -> datetime | None:
    """When the job's deadline passes; None without a deadline or while not started."""
    seconds = job.spec.active_deadline_seconds
    if seconds is None or start_time is None or job.spec.suspend:
        return None
    return start_time + timedelta(seconds=seconds)


def deadline_exceeded(job: AgentRLJob, start_time: datetime | None, now: datetime) -> bool:
    """Whether the deadline has passed at ``now``."""
    at = deadline(job, start_time)
    return at is not None and now >= at


def seconds_until_deadline(
    job: AgentRLJob, start_time: datetime | None, now: datetime
) -> float | None:
    """Seconds from ``now`` to the deadline (for a requeue), None when none is running."""
    at = deadline(job, start_time)
    return None if at is None else max(0.0, (at - now).total_seconds())
