"""Trainer restarts: counted, whole-group, up to backoffLimit, safe across operator restarts."""

from __future__ import annotations

from agentrl.api import Reason
from agentrl.reconcile.observed import pod_from_object, trainer_job_from_object
from agentrl.reconcile.policies.trainer_restarts import TrainerRestartDecision, decide
from tests.factories import make_job, make_pod, make_trainer_job

FAILED = ("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit")


def _decide(limit, recorded, job_obj):
    job = make_job().with_trainer(backoffLimit=limit).obj()
    observed = None if job_obj is None else trainer_job_from_object(job_obj)
    return decide(job, recorded_restarts=recorded, observed=observed)


def test_a_running_trainer_keeps_its_count():
    assert _decide(3, 1, make_trainer_job(attempt=1, active=2)) == TrainerRestartDecision(
        restarts=1
    )


def test_no_trainer_job_keeps_the_count():
    assert _decide(3, 2, None) == TrainerRestartDecision(restarts=2)


def test_the_first_failure_is_restart_one_and_deletes_the_failed_attempt():
    decision = _decide(3, 0, make_trainer_job(attempt=0, failed=1, condition=FAILED))
    assert decision == TrainerRestartDecision(
        restarts=1,
        delete_failed_job=True,
        restarted=True,
        failure_message="Job has reached the specified backoff limit",
    )


def test_the_last_allowed_restart_is_still_taken():
    # backoffLimit 3: restarts 1, 2, 3 are allowed; attempt 2 failing becomes restart 3.
    decision = _decide(3, 2, make_trainer_job(attempt=2, failed=1, condition=FAILED))
    assert (decision.restarts, decision.restarted, decision.fail_reason) == (3, True, None)


def test_a_failure_past_the_backoff_limit_fails_the_job_and_keeps_the_job_for_its_logs():
    decision = _decide(3, 3, make_trainer_job(attempt=3, failed=1, condition=FAILED))
    assert decision.fail_reason == Reason.BACKOFF_LIMIT_EXCEEDED
    assert decision.restarts == 3
    assert not decision.delete_failed_job
    assert not decision.restarted


def test_a_zero_backoff_limit_fails_on_the_first_failure():
    decision = _decide(0, 0, make_trainer_job(attempt=0, failed=1, condition=FAILED))
    assert decision.fail_reason == Reason.BACKOFF_LIMIT_EXCEEDED


def test_an_attempt_already_counted_is_deleted_without_counting_it_again():
    # The operator wrote restarts=2 and died before deleting attempt 1.
    decision = _decide(3, 2, make_trainer_job(attempt=1, failed=1, condition=FAILED))
    assert decision.restarts == 2
    assert decision.delete_failed_job
    assert not decision.restarted


def test_a_trainer_job_past_its_deadline_fails_the_job_without_a_restart():
    deadline = ("Failed", "DeadlineExceeded", "Job was active longer than specified deadline")
    decision = _decide(3, 0, make_trainer_job(attempt=0, condition=deadline))
    assert decision.fail_reason == Reason.DEADLINE_EXCEEDED
    assert not decision.delete_failed_job


def test_a_failed_job_being_deleted_is_waited_for():
    decision = _decide(3, 1, make_trainer_job(attempt=0, condition=FAILED, deleting=True))
    assert decision == TrainerRestartDecision(restarts=1)


def test_the_failed_trainers_last_log_lines_are_in_the_message():
    # what the kubelet writes with FallbackToLogsOnError: the tail of the log
    log = (
        'Traceback (most recent call last):\n  File "/opt/venv/lib/python3.11/site-packages/'
        'agentrl/trainer/loop.py", line 395, in _train\n'
        '    with self.steps_log.open("a", encoding="utf-8") as fh:\n\n'
        "FileNotFoundError: [Errno 2] No such file or directory: "
        "'/checkpoints/trainer/steps.jsonl'\n"
    )
    pods = [
        pod_from_object(make_pod("demo-trainer-0-x", "trainer").failed("trainer", 1, log).obj()),
        pod_from_object(make_pod("demo-trainer-1-y", "trainer").failed("trainer", 0).obj()),
    ]
    job = make_job().with_trainer(backoffLimit=3).obj()
    observed = trainer_job_from_object(make_trainer_job(attempt=0, failed=1, condition=FAILED))
    decision = decide(job, recorded_restarts=0, observed=observed, pods=pods)
    assert decision.failure_message == (
        "Job has reached the specified backoff limit; pod demo-trainer-0-x exited 1: "
        'File "/opt/venv/lib/python3.11/site-packages/agentrl/trainer/loop.py", line 395, in '
        '_train | with self.steps_log.open("a", encoding="utf-8") as fh: | '
        "FileNotFoundError: [Errno 2] No such file or directory: "
        "'/checkpoints/trainer/steps.jsonl'"
    )
