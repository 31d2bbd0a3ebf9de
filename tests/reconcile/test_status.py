"""Status computation: conditions, messages lifted from children, sub-status, events, minimal
writes. Table-driven where the shape repeats."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agentrl.reconcile.observed import observe
from agentrl.reconcile.status import compute_status, status_body, status_changed
from tests.factories import (
    make_deployment,
    make_job,
    make_pod,
    make_statefulset,
    make_trainer_job,
)

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
SCHEDULER = "0/6 nodes are available: 6 Insufficient amd.com/gpu."


def _cond(result, type_):
    return next(c for c in result.status.conditions if c.type == type_)


def _healthy_objects(engines=2, nodes=1, workers=1, extra_pods=()):
    pods = [make_pod(f"demo-engine-{i}", "engine").running().obj() for i in range(engines)]
    pods += [
        make_pod(f"demo-trainer-{i}-x", "trainer")
        .running()
        .annotated("batch.kubernetes.io/job-completion-index", str(i))
        .obj()
        for i in range(nodes)
    ]
    pods += [make_pod(f"demo-rollout-{i}", "rollout").running().obj() for i in range(workers)]
    pods += list(extra_pods)
    return {
        "statefulset": make_statefulset(engines, engines),
        "trainer_job": make_trainer_job(active=nodes),
        "deployment": make_deployment(workers, workers),
        "pods": pods,
    }


def _compute(job, objects, now=NOW, generation=3):
    return compute_status(job, observe(**objects), generation=generation, now=now)


@dataclass
class Case:
    name: str
    objects: dict[str, Any]
    condition: str
    status: str
    reason: str
    message_contains: list[str] = field(default_factory=list)


def _replace_pod(objects, name, pod):
    objects["pods"] = [p for p in objects["pods"] if p["metadata"]["name"] != name] + [pod]
    return objects


CASES = [
    Case(
        "all components up make the job Ready",
        _healthy_objects(),
        "Ready",
        "True",
        "AllComponentsReady",
    ),
    Case(
        "an engine pod Pending with the scheduler's message is Unschedulable with that text",
        _replace_pod(
            _healthy_objects(),
            "demo-engine-1",
            make_pod("demo-engine-1", "engine").unschedulable(SCHEDULER).obj(),
        ),
        "EnginesReady",
        "False",
        "Unschedulable",
        ["1/2 engines ready", "demo-engine-1", SCHEDULER],
    ),
    Case(
        "the Ready reason names the scheduling problem for the printer column",
        _replace_pod(
            _healthy_objects(),
            "demo-engine-1",
            make_pod("demo-engine-1", "engine").unschedulable(SCHEDULER).obj(),
        ),
        "Ready",
        "False",
        "Unschedulable",
        ["EnginesReady: 1/2 engines ready", SCHEDULER],
    ),
    Case(
        "an engine image that cannot be pulled is an ImagePullError with the kubelet's words",
        _replace_pod(
            _healthy_objects(),
            "demo-engine-0",
            make_pod("demo-engine-0", "engine")
            .waiting("engine", "ImagePullBackOff", 'Back-off pulling image "bad:tag"')
            .obj(),
        ),
        "EnginesReady",
        "False",
        "ImagePullError",
        ["container engine: ImagePullBackOff", 'Back-off pulling image "bad:tag"'],
    ),
    Case(
        "a crash-looping engine reports its restarts and last exit",
        _replace_pod(
            _healthy_objects(),
            "demo-engine-0",
            make_pod("demo-engine-0", "engine")
            .waiting(
                "engine",
                "CrashLoopBackOff",
                "back-off 5m0s",
                restarts=7,
                last_reason="Error",
                last_exit_code=134,
            )
            .obj(),
        ),
        "EnginesReady",
        "False",
        "CrashLoopBackOff",
        ["after 7 restarts", "last exit: Error (exit code 134)"],
    ),
    Case(
        "an unschedulable pod is reported before a crash loop on another pod",
        {
            **_healthy_objects(engines=0),
            "statefulset": make_statefulset(2, 0),
            "pods": [
                make_pod("demo-engine-0", "engine")
                .waiting("engine", "CrashLoopBackOff", restarts=2)
                .obj(),
                make_pod("demo-engine-1", "engine").unschedulable(SCHEDULER).obj(),
                *_healthy_objects(engines=0)["pods"],
            ],
        },
        "EnginesReady",
        "False",
        "Unschedulable",
        ["0/2 engines ready", "1 engine pod Unschedulable"],
    ),
    Case(
        "engines running but not yet ready are loading",
        _replace_pod(
            _healthy_objects(),
            "demo-engine-1",
            make_pod("demo-engine-1", "engine").running(ready=False).obj(),
        ),
        "EnginesReady",
        "False",
        "EnginesProgressing",
        ["1/2 engines ready (1 loading the model or capturing graphs)"],
    ),
    Case(
        "no StatefulSet yet is Reconciling",
        {**_healthy_objects(), "statefulset": None},
        "EnginesReady",
        "False",
        "Reconciling",
        ["not created yet"],
    ),
    Case(
        "a trainer pod that cannot be scheduled keeps the trainer not ready with that reason",
        _replace_pod(
            _healthy_objects(),
            "demo-trainer-0-x",
            make_pod("demo-trainer-0-x", "trainer").unschedulable(SCHEDULER).obj(),
        ),
        "TrainerReady",
        "False",
        "Unschedulable",
        ["0/1 trainer pods running", SCHEDULER],
    ),
    Case(
        "rollout workers still starting keep the sandbox pool not ready",
        {**_healthy_objects(workers=0), "deployment": make_deployment(1, 0)},
        "SandboxPoolReady",
        "False",
        "RolloutProgressing",
        ["0/1 rollout workers ready"],
    ),
    Case(
        "sandbox pods the scheduler cannot place make the pool Unschedulable",
        _healthy_objects(
            extra_pods=[
                make_pod("demo-sbx-a", "sandbox")
                .unschedulable("0/6 nodes are available: 6 Insufficient cpu.")
                .obj()
            ]
        ),
        "SandboxPoolReady",
        "False",
        "Unschedulable",
        ["6 Insufficient cpu."],
    ),
    Case(
        "a tripped watchdog crash-loop guard makes the job Degraded with the fault",
        _replace_pod(
            _healthy_objects(),
            "demo-engine-0",
            make_pod("demo-engine-0", "engine")
            .running()
            .annotated(
                "agentrl.dev/watchdog",
                {
                    "state": "Degraded",
                    "ready": True,
                    "restarts": 6,
                    "restartsInWindow": 6,
                    "faults": 6,
                    "lastFault": {
                        "signature": "GPU_HANG",
                        "line": "HW Exception by GPU node-2 reason :GPU Hang",
                        "time": "2026-03-01T11:59:00Z",
                    },
                },
            )
            .obj(),
        ),
        "Degraded",
        "True",
        "WatchdogCrashLoop",
        ["demo-engine-0: 6 restarts", "GPU_HANG", "reason :GPU Hang", "graphs stay on"],
    ),
    Case(
        "without a crash loop the job is not Degraded",
        _healthy_objects(),
        "Degraded",
        "False",
        "AsExpected",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_condition(case):
    result = _compute(make_job().with_engines(2).obj(), case.objects)
    cond = _cond(result, case.condition)
    assert (cond.status, cond.reason) == (case.status, case.reason), cond.message
    for text in case.message_contains:
        assert text in cond.message


def test_every_condition_type_is_present_in_a_fixed_order_with_the_generation():
    result = _compute(make_job().obj(), _healthy_objects(engines=1), generation=7)
    assert [c.type for c in result.status.conditions] == [
        "Ready",
        "EnginesReady",
        "SandboxPoolReady",
        "TrainerReady",
        "WeightsSynced",
        "Suspended",
        "Complete",
        "Failed",
        "Degraded",
        "GPUsAvailable",
        "CheckpointSaved",
        "WireCompatible",
    ]
    assert {c.observed_generation for c in result.status.conditions} == {7}
    assert result.status.observed_generation == 7
    assert result.status.ready_reason == "AllComponentsReady"


def test_last_transition_time_is_kept_when_the_status_does_not_flip():
    job = make_job().with_engines(2)
    first = _compute(job.obj(), _healthy_objects())
    later = NOW + timedelta(minutes=5)
    # Same status, only the message changes (2/2 → still True): the time stays.
    second = _compute(
        job.with_status(status_body(first.status)).obj(), _healthy_objects(), now=later
    )
    assert _cond(second, "Ready").last_transition_time == "2026-03-01T12:00:00Z"
    # Now an engine goes down: EnginesReady flips and moves its time.
    down = _replace_pod(
        _healthy_objects(),
        "demo-engine-1",
        make_pod("demo-engine-1", "engine").running(ready=False).obj(),
    )
    third = _compute(job.with_status(status_body(second.status)).obj(), down, now=later)
    assert _cond(third, "EnginesReady").last_transition_time == "2026-03-01T12:05:00Z"
    assert _cond(third, "Suspended").last_transition_time == "2026-03-01T12:00:00Z"


def test_an_unchanged_status_needs_no_write_and_posts_no_event():
    job = make_job().with_engines(2)
    first = _compute(job.obj(), _healthy_objects())
    assert status_changed(None, first.status)
    again = _compute(
        job.with_status(status_body(first.status)).obj(),
        _healthy_objects(),
        now=NOW + timedelta(seconds=30),
    )
    assert not status_changed(job.obj().status, again.status)
    assert again.events == []


def test_a_raw_status_dict_from_the_api_server_is_compared_by_value():
    first = _compute(make_job().obj(), _healthy_objects(engines=1))
    assert not status_changed(status_body(first.status), first.status)


def test_sub_status_counts_engines_sandboxes_and_the_trainer():
    sandboxes = [
        make_pod("demo-sbx-a", "sandbox").running().obj(),
        make_pod("demo-sbx-b", "sandbox").running(ready=False).obj(),
        make_pod("demo-sbx-c", "sandbox").running().deleting().obj(),  # going away: not counted
    ]
    objects = _healthy_objects(extra_pods=sandboxes)
    objects = _replace_pod(
        objects,
        "demo-engine-1",
        make_pod("demo-engine-1", "engine")
        .running(containers=("engine", "watchdog"))
        .restarts("engine", 2)
        .annotated("agentrl.dev/watchdog", {"state": "Ready", "faults": 3, "weightVersion": "5"})
        .obj(),
    )
    objects = _replace_pod(
        objects,
        "demo-engine-0",
        make_pod("demo-engine-0", "engine")
        .running(containers=("engine", "watchdog"))
        .restarts("engine", 1)
        .restarts("watchdog", 4)  # the sidecar's restarts are not engine restarts
        .annotated("agentrl.dev/watchdog", {"state": "Ready", "faults": 1, "weightVersion": "4"})
        .obj(),
    )
    status = _compute(make_job().with_engines(2).with_concurrency(40).obj(), objects).status
    assert status.engines.model_dump() == {
        "replicas": 2,
        "ready": 2,
        "restarts": 3,  # 2 + 1
        "faults": 4,  # 3 + 1
        "weight_version": 4,  # the lowest served
    }
    assert (status.sandbox.concurrency, status.sandbox.desired) == (40, 40)
    assert (status.sandbox.ready, status.sandbox.in_use) == (1, 2)
    assert status.sandbox.selector == "agentrl.dev/job=demo,app.kubernetes.io/component=sandbox"
    assert (status.trainer.active, status.trainer.restarts) == (1, 0)


def test_trainer_progress_is_lifted_from_rank_zero():
    objects = _healthy_objects(nodes=2)
    objects = _replace_pod(
        objects,
        "demo-trainer-0-x",
        make_pod("demo-trainer-0-x", "trainer")
        .running()
        .annotated("batch.kubernetes.io/job-completion-index", "0")
        .annotated(
            "agentrl.dev/progress",
            {
                "step": 12,
                "lastCheckpointStep": 10,
                "weightVersion": "12",
                "meanReward": 0.25,
                "passAt1": 0.2,
                "trajectoriesPerHour": 1092.8517757196203,
            },
        )
        .obj(),
    )
    status = _compute(make_job().with_engines(2).with_trainer(nodes=2).obj(), objects).status
    assert (status.trainer.step, status.trainer.last_checkpoint_step) == (12, 10)
    assert (status.rollout.mean_reward, status.rollout.pass_at_1) == (0.25, 0.2)
    assert status.rollout.trajectories_per_hour == 1092.9  # rounded for the Traj/h column


def _with_progress(objects, progress):
    return _replace_pod(
        objects,
        "demo-trainer-0-x",
        make_pod("demo-trainer-0-x", "trainer")
        .running()
        .annotated("batch.kubernetes.io/job-completion-index", "0")
        .annotated("agentrl.dev/progress", progress)
        .obj(),
    )


TOOLS = {
    "episodes": 38,
    "replies": 152,
    "callsPerEpisode": 0.5,
    "parseFailureRate": 0.25,
    "noToolCallRate": 0.75,
    "submitRate": 0.125,
    "endReasons": {"submitted": 5, "turnCap": 33, "infraError": 2},
}


def test_tool_health_is_lifted_into_status_rollout_tools():
    job = make_job().with_engines(2).obj()
    objects = _with_progress(_healthy_objects(), {"step": 4, "truncatedRate": 0.8, "tools": TOOLS})
    tools = _compute(job, objects).status.rollout.tools
    assert tools is not None
    assert (tools.episodes, tools.replies, tools.calls_per_episode) == (38, 152, 0.5)
    assert (tools.parse_failure_rate, tools.no_tool_call_rate, tools.submit_rate) == (
        0.25,
        0.75,
        0.125,
    )
    assert tools.prefix_break_rate is None  # not reported: no token-level episodes
    assert tools.end_reasons.model_dump() == {
        "submitted": 5,
        "turn_cap": 33,
        "token_cap": 0,
        "wall_clock": 0,
        "infra_error": 2,
    }
    # as the API server receives it: camelCase, unset rates left out
    body = status_body(_compute(job, objects).status)["rollout"]["tools"]
    assert body["noToolCallRate"] == 0.75 and "prefixBreakRate" not in body


def test_a_report_without_tool_health_keeps_the_one_in_status():
    """A restarted trainer reports before its first step (an evaluation) without it; an older
    trainer never reports it (then it stays unset)."""
    first = _compute(
        make_job().with_engines(2).obj(),
        _with_progress(_healthy_objects(), {"step": 4, "tools": TOOLS}),
    )
    job = make_job().with_engines(2).with_status(first.status.to_manifest()).obj()
    kept = _compute(job, _with_progress(_healthy_objects(), {"step": 4, "passAt1": 0.5}))
    assert kept.status.rollout.tools == first.status.rollout.tools
    older = _compute(
        make_job().with_engines(2).obj(), _with_progress(_healthy_objects(), {"step": 4})
    )
    assert older.status.rollout.tools is None


def test_weights_synced_compares_ready_engines_with_the_trainers_version():
    def engine(name, version):
        return (
            make_pod(name, "engine")
            .running()
            .annotated("agentrl.dev/watchdog", {"state": "Ready", "weightVersion": version})
            .obj()
        )

    def trainer(version):
        return (
            make_pod("demo-trainer-0-x", "trainer")
            .running()
            .annotated("batch.kubernetes.io/job-completion-index", "0")
            .annotated("agentrl.dev/progress", {"step": 3, "weightVersion": version})
            .obj()
        )

    objects = _healthy_objects()
    objects["pods"] = [engine("demo-engine-0", "3"), engine("demo-engine-1", "2"), trainer("3")]
    objects["pods"].append(make_pod("demo-rollout-0", "rollout").running().obj())
    behind = _cond(_compute(make_job().with_engines(2).obj(), objects), "WeightsSynced")
    assert (behind.status, behind.reason) == ("False", "WeightsBehind")
    assert "demo-engine-1 (2)" in behind.message
    objects["pods"][1] = engine("demo-engine-1", "3")
    synced = _cond(_compute(make_job().with_engines(2).obj(), objects), "WeightsSynced")
    assert (synced.status, synced.reason) == ("True", "WeightsCurrent")
    assert synced.message == "2 ready engines serve weight version 3"


def test_weights_are_unknown_before_the_first_push():
    cond = _cond(_compute(make_job().obj(), _healthy_objects()), "WeightsSynced")
    assert (cond.status, cond.reason) == ("Unknown", "WeightVersionUnknown")


def test_a_suspended_job_says_so_and_clears_its_start_time():
    job = make_job().suspended().with_status({"startTime": "2026-03-01T10:00:00Z"}).obj()
    result = _compute(job, {"pods": []})
    assert (_cond(result, "Suspended").status, _cond(result, "Suspended").reason) == (
        "True",
        "JobSuspended",
    )
    assert (_cond(result, "Ready").status, _cond(result, "Ready").reason) == (
        "False",
        "JobSuspended",
    )
    assert _cond(result, "EnginesReady").reason == "JobSuspended"
    assert result.status.start_time is None
    assert result.status.sandbox.concurrency == 0
    assert [(e.type, e.reason) for e in result.events] == [("Normal", "JobSuspended")]


def test_suspended_lists_pods_still_terminating():
    # the trainer has stopped (no trainer pod): engines and the rollout worker terminate
    result = _compute(make_job().suspended().obj(), _healthy_objects(engines=2, nodes=0))
    assert "(3 pods still terminating)" in _cond(result, "Suspended").message


def test_a_suspending_job_keeps_its_engines_until_the_trainer_has_checkpointed():
    job = make_job().with_engines(2).suspended().obj()
    result = _compute(job, _healthy_objects(engines=2))  # the trainer pod still runs
    cond = _cond(result, "Suspended")
    assert (cond.status, cond.reason) == ("False", "Suspending")
    assert "1 trainer pods stopping, at most 1200s" in cond.message
    assert (_cond(result, "Ready").status, _cond(result, "Ready").reason) == (
        "False",
        "Suspending",
    )
    assert result.status.ready_reason == "Suspending"
    assert result.status.engines.replicas == 2  # its last step may still push weights
    assert (result.status.sandbox.concurrency, result.status.sandbox.limited_by) == (
        0,
        "spec.suspend",
    )
    assert ("Normal", "Suspending") in [(e.type, e.reason) for e in result.events]


def test_suspending_becomes_suspended_when_the_trainer_pods_are_gone_or_past_their_grace():
    job = make_job().with_engines(2).suspended()
    first = _compute(job.obj(), _healthy_objects(engines=2))
    after = job.with_status(status_body(first.status)).obj()
    stopping = make_pod("demo-trainer-0-x", "trainer").running().deleting("2026-03-01T12:10:00Z")
    within = _compute(after, {"pods": [stopping.obj()]})
    assert _cond(within, "Suspended").reason == "Suspending"
    later = NOW + timedelta(minutes=11)  # past its deletionTimestamp: the kubelet killed it
    for objects in ({"pods": []}, {"pods": [stopping.obj()]}):
        done = _compute(after, objects, now=later)
        cond = _cond(done, "Suspended")
        assert (cond.status, cond.reason) == ("True", "JobSuspended")
        assert done.status.engines.replicas == 0
        assert ("Normal", "JobSuspended") in [(e.type, e.reason) for e in done.events]


def test_resuming_posts_a_resumed_event_and_restarts_the_clock():
    suspended = _compute(make_job().suspended().obj(), {"pods": []})
    job = make_job().with_status(status_body(suspended.status)).obj()
    later = NOW + timedelta(hours=1)
    resumed = _compute(job, _healthy_objects(engines=1), now=later)
    cond = _cond(resumed, "Suspended")
    assert (cond.status, cond.reason) == ("False", "JobResumed")
    assert ("Normal", "JobResumed") in [(e.type, e.reason) for e in resumed.events]
    assert resumed.status.start_time == "2026-03-01T13:00:00Z"


def test_a_completed_trainer_completes_the_job():
    objects = _healthy_objects()
    objects["trainer_job"] = make_trainer_job(succeeded=1, condition=("Complete", "", ""))
    result = _compute(make_job().obj(), objects)
    assert result.finished
    assert (_cond(result, "Complete").status, _cond(result, "Complete").reason) == (
        "True",
        "TrainerSucceeded",
    )
    assert _cond(result, "Ready").reason == "TrainerSucceeded"
    assert _cond(result, "EnginesReady").reason == "JobFinished"
    assert result.status.completion_time == "2026-03-01T12:00:00Z"
    assert ("Normal", "TrainerSucceeded") in [(e.type, e.reason) for e in result.events]


def test_a_finished_job_stays_finished():
    objects = _healthy_objects()
    objects["trainer_job"] = make_trainer_job(succeeded=1, condition=("Complete", "", ""))
    done = _compute(make_job().obj(), objects)
    job = make_job().with_status(status_body(done.status)).obj()
    again = _compute(job, {"pods": []}, now=NOW + timedelta(hours=2))
    assert again.finished
    assert _cond(again, "Complete").status == "True"
    assert again.status.completion_time == "2026-03-01T12:00:00Z"
    assert again.events == []


def test_the_deadline_fails_the_job():
    job = make_job().with_deadline(600).with_status({"startTime": "2026-03-01T11:50:00Z"}).obj()
    result = _compute(job, _healthy_objects())  # 12:00 is 600 s after 11:50
    failed = _cond(result, "Failed")
    assert (failed.status, failed.reason) == ("True", "DeadlineExceeded")
    assert "activeDeadlineSeconds (600 s)" in failed.message
    assert ("Warning", "DeadlineExceeded") in [(e.type, e.reason) for e in result.events]


def test_a_failed_trainer_attempt_is_counted_as_a_restart_with_a_warning():
    objects = _healthy_objects()
    objects["trainer_job"] = make_trainer_job(
        failed=1, condition=("Failed", "PodFailurePolicy", "Container trainer exited with 1")
    )
    result = _compute(make_job().with_trainer(backoffLimit=2).obj(), objects)
    assert result.status.trainer.restarts == 1
    assert result.trainer.delete_failed_job
    trainer = _cond(result, "TrainerReady")
    assert (trainer.status, trainer.reason) == ("False", "TrainerRestarting")
    assert "restart 1 of 2" in trainer.message
    assert "Container trainer exited with 1" in trainer.message
    warnings = [e for e in result.events if e.reason == "TrainerRestarting"]
    assert len(warnings) == 1
    assert warnings[0].type == "Warning"


def test_a_failure_past_the_backoff_limit_fails_the_job():
    objects = _healthy_objects()
    objects["trainer_job"] = make_trainer_job(
        attempt=2, failed=1, condition=("Failed", "PodFailurePolicy", "exit 1")
    )
    job = make_job().with_trainer(backoffLimit=2).with_status({"trainer": {"restarts": 2}}).obj()
    result = _compute(job, objects)
    failed = _cond(result, "Failed")
    assert (failed.status, failed.reason) == ("True", "BackoffLimitExceeded")
    # Attempts 0, 1 and 2 failed: 3 failures, past backoffLimit 2.
    assert "failed 3 times, past backoffLimit 2" in failed.message
    assert result.finished


def test_an_unschedulable_engine_posts_one_warning_event_until_it_changes():
    objects = _replace_pod(
        _healthy_objects(),
        "demo-engine-1",
        make_pod("demo-engine-1", "engine").unschedulable(SCHEDULER).obj(),
    )
    job = make_job().with_engines(2)
    first = _compute(job.obj(), objects)
    warnings = [e for e in first.events if e.type == "Warning"]
    assert [(e.reason, SCHEDULER in e.message) for e in warnings] == [("Unschedulable", True)]
    second = _compute(job.with_status(status_body(first.status)).obj(), objects)
    assert second.events == []
