"""activeDeadlineSeconds."""

from __future__ import annotations

from datetime import UTC, datetime

from agentrl.reconcile.policies import deadline
from tests.factories import make_job

START = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def test_the_deadline_is_the_start_plus_the_seconds():
    job = make_job().with_deadline(3600).obj()
    assert deadline.deadline(job, START) == datetime(2026, 3, 1, 13, 0, 0, tzinfo=UTC)


def test_a_job_just_before_its_deadline_has_not_exceeded_it():
    job = make_job().with_deadline(3600).obj()
    now = datetime(2026, 3, 1, 12, 59, 59, tzinfo=UTC)
    assert not deadline.deadline_exceeded(job, START, now)
    assert deadline.seconds_until_deadline(job, START, now) == 1.0


def test_a_job_at_its_deadline_has_exceeded_it():
    job = make_job().with_deadline(3600).obj()
    now = datetime(2026, 3, 1, 13, 0, 0, tzinfo=UTC)
    assert deadline.deadline_exceeded(job, START, now)
    assert deadline.seconds_until_deadline(job, START, now) == 0.0


def test_no_deadline_without_the_field_or_before_the_start_or_while_suspended():
    now = datetime(2030, 1, 1, tzinfo=UTC)
    assert not deadline.deadline_exceeded(make_job().obj(), START, now)
    assert not deadline.deadline_exceeded(make_job().with_deadline(1).obj(), None, now)
    assert not deadline.deadline_exceeded(make_job().with_deadline(1).suspended().obj(), START, now)
    assert deadline.seconds_until_deadline(make_job().obj(), START, now) is None
