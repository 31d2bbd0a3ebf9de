"""ttlSecondsAfterFinished."""

from __future__ import annotations

from datetime import UTC, datetime

from agentrl.reconcile.policies import ttl
from tests.factories import make_job

DONE = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def test_a_finished_job_is_deleted_ttl_seconds_after_completion():
    job = make_job().with_ttl(600).obj()
    assert ttl.deletion_time(job, DONE) == datetime(2026, 3, 1, 12, 10, 0, tzinfo=UTC)
    assert not ttl.should_delete(job, DONE, datetime(2026, 3, 1, 12, 9, 59, tzinfo=UTC))
    assert ttl.should_delete(job, DONE, datetime(2026, 3, 1, 12, 10, 0, tzinfo=UTC))


def test_seconds_until_deletion_counts_down_to_zero():
    job = make_job().with_ttl(600).obj()
    assert ttl.seconds_until_deletion(job, DONE, datetime(2026, 3, 1, 12, 4, 0, tzinfo=UTC)) == 360
    assert ttl.seconds_until_deletion(job, DONE, datetime(2026, 3, 2, tzinfo=UTC)) == 0.0


def test_a_zero_ttl_deletes_at_completion():
    job = make_job().with_ttl(0).obj()
    assert ttl.should_delete(job, DONE, DONE)


def test_no_deletion_without_the_field_or_before_the_job_finished():
    now = datetime(2030, 1, 1, tzinfo=UTC)
    assert not ttl.should_delete(make_job().obj(), DONE, now)
    assert not ttl.should_delete(make_job().with_ttl(1).obj(), None, now)
    assert ttl.seconds_until_deletion(make_job().obj(), DONE, now) is None
