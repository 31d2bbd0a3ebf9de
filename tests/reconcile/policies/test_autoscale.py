"""The built-in concurrency autoscaler: each case gives the engines' load and the expected move,
worked out by hand from the rule in the module docstring.

Defaults the cases rely on (``agentrl.api.sandbox``/``engine``): targets kvCacheUsage 0.7,
queueDepthPerEngine 4, runningRequestsShare 0.9; maxRunningRequests 64, so the running target is
0.9 × 64 = 57.6 per engine; maxStepUp 64, maxStepDown 32, cooldown 60 s, [min, max] = [1, 1024].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agentrl.api import AgentRLJobStatus
from agentrl.reconcile.observed import observe
from agentrl.reconcile.policies.autoscale import (
    REASON_LOWERED,
    REASON_RAISED,
    EngineMetrics,
    EngineSample,
    ScaleDecision,
    ScaleDirection,
    count_waiting_sandboxes,
    decide,
    move_event,
    record_move,
)
from agentrl.reconcile.status import Event
from tests.factories import make_job, make_pod

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def engines(*loads: tuple[float, float, float], unschedulable: int = 0) -> EngineMetrics:
    """One sample per ``(running, queued, token_usage)``."""
    return EngineMetrics(
        engines=tuple(
            EngineSample(pod=f"demo-engine-{i}", running_requests=r, queued_requests=q,
                         token_usage=u)
            for i, (r, q, u) in enumerate(loads)
        ),
        sandboxes_pending=unschedulable,
        sandboxes_unschedulable=unschedulable,
    )


@dataclass
class Case:
    name: str
    current: int
    metrics: EngineMetrics
    expected: int | None
    """The concurrency written, None for a hold."""
    says: list[str]
    """Fragments the reason must contain."""
    autoscale: dict[str, Any] = field(default_factory=dict)


CASES = [
    Case(
        "idle engines raise concurrency by at most one step",
        # KV ratio 0.7 / 0.2 = 3.5, running ratio 57.6 / 10 = 5.76; the tighter is 3.5:
        # ceil(100 × 3.5) = 350, capped at 100 + 64 = 164.
        current=100,
        metrics=engines((10, 0, 0.2), (10, 0, 0.2)),
        expected=164,
        says=["raised sandbox concurrency 100 → 164 (+64) (limited to maxStepUp 64)",
              "KV-cache usage 0.2 < target 0.7",
              "10 running requests per engine < target 0.9 × maxRunningRequests 64 = 57.6",
              "0 queued per engine ≤ target 4", "targets reached at about 350"],
    ),
    Case(
        "a busy pool is raised proportionally towards its tighter target",
        # KV ratio 0.7 / 0.6 = 1.1667 → ceil(116.67) = 117; running 57.6 / 40 = 1.44 → 144.
        current=100,
        metrics=engines((40, 0, 0.6)),
        expected=117,
        says=["raised sandbox concurrency 100 → 117 (+17): engines have headroom",
              "targets reached at about 117"],
    ),
    Case(
        "running requests can be the tighter target",
        # KV 0.7 / 0.1 = 7; running 57.6 / 48 = 1.2 → ceil(120) = 120.
        current=100,
        metrics=engines((48, 0, 0.1)),
        expected=120,
        says=["100 → 120 (+20)", "48 running requests per engine < target"],
    ),
    Case(
        "a raise stops at autoscale.max",
        # 350 wanted, step allows 164, max 120.
        current=100,
        metrics=engines((10, 0, 0.2)),
        expected=120,
        says=["100 → 120 (+20) (limited by autoscale.max 120)"],
        autoscale={"max": 120},
    ),
    Case(
        "at autoscale.max the autoscaler holds and says so",
        current=120,
        metrics=engines((10, 0, 0.2)),
        expected=None,
        says=["holding sandbox concurrency at 120, the autoscale maximum",
              "engines have headroom"],
        autoscale={"max": 120},
    ),
    Case(
        "KV usage at its target holds",
        current=100,
        metrics=engines((10, 0, 0.7)),
        expected=None,
        says=["holding sandbox concurrency at 100: engines are at target: "
              "KV-cache usage 0.7 ≥ target 0.7"],
    ),
    Case(
        "running requests at their share of maxRunningRequests hold",
        current=100,
        metrics=engines((57.6, 0, 0.3)),
        expected=None,
        says=["57.6 running requests per engine ≥ target 0.9 × maxRunningRequests 64 = 57.6"],
    ),
    Case(
        "a queue above target lowers by one full step",
        # mean queue (4 + 8) / 2 = 6 > 4: 100 − 32 = 68.
        current=100,
        metrics=engines((57.6, 4, 0.5), (57.6, 8, 0.5)),
        expected=68,
        says=["lowered sandbox concurrency 100 → 68 (-32): "
              "6 requests queued per engine > target 4"],
    ),
    Case(
        "KV usage above target lowers proportionally",
        # floor(100 × 0.7 / 0.875) = floor(80) = 80.
        current=100,
        metrics=engines((30, 0, 0.875)),
        expected=80,
        says=["100 → 80 (-20): KV-cache usage 0.88 > target 0.7 (back to target at about 80)"],
    ),
    Case(
        "float noise never costs a sandbox on the way down",
        # 6 × 0.7 / 0.84 = 4.2 / 0.84 = 5 exactly; in floats it is 4.999999999999999.
        current=6,
        metrics=engines((30, 0, 0.84)),
        expected=5,
        says=["6 → 5 (-1)"],
    ),
    Case(
        "float noise never adds a sandbox on the way up",
        # 1 × 0.9 / 0.06 = 15 exactly; in floats it is 15.000000000000002.
        current=1,
        metrics=engines((0, 0, 0.06)),
        expected=15,
        says=["1 → 15 (+14)", "targets reached at about 15"],
        autoscale={"targets": {"kvCacheUsage": 0.9}},
    ),
    Case(
        "a large KV overshoot is lowered by at most one step",
        # floor(200 × 0.7 / 0.98) = floor(142.86) = 142; step allows 200 − 32 = 168.
        current=200,
        metrics=engines((30, 0, 0.98)),
        expected=168,
        says=["200 → 168 (-32) (limited to maxStepDown 32)", "KV-cache usage 0.98 > target 0.7"],
    ),
    Case(
        "unschedulable sandboxes lower concurrency by their number",
        # engines idle, but 5 sandbox pods cannot be placed: 100 − 5 = 95.
        current=100,
        metrics=engines((10, 0, 0.2), unschedulable=5),
        expected=95,
        says=["100 → 95 (-5): 5 sandbox pods cannot be scheduled"],
    ),
    Case(
        "several signals: the lowest proposal wins, within the step",
        # queue → 100 − 32 = 68; 40 unschedulable → 60; step floor 68.
        current=100,
        metrics=engines((57.6, 9, 0.5), unschedulable=40),
        expected=68,
        says=["(limited to maxStepDown 32)", "9 requests queued per engine > target 4",
              "40 sandbox pods cannot be scheduled"],
    ),
    Case(
        "a move down stops at autoscale.min",
        current=100,
        metrics=engines((57.6, 9, 0.5)),
        expected=90,
        says=["100 → 90 (-10) (limited by autoscale.min 90)"],
        autoscale={"min": 90},
    ),
    Case(
        "at autoscale.min a saturated pool holds and says so",
        current=90,
        metrics=engines((57.6, 9, 0.5)),
        expected=None,
        says=["holding concurrency at 90, the autoscale minimum",
              "9 requests queued per engine > target 4"],
        autoscale={"min": 90},
    ),
    Case(
        "from zero, an idle pool starts with one full step",
        # no load: no ratio limits the target, so 0 + 64.
        current=0,
        metrics=engines((0, 0, 0.0)),
        expected=64,
        says=["raised sandbox concurrency 0 → 64 (+64) (limited to maxStepUp 64)"],
        autoscale={"min": 0},
    ),
    Case(
        "targets set in the spec replace the defaults",
        # kvCacheUsage 0.5, maxStepUp 10: KV ratio 0.5 / 0.25 = 2 → 80, step → 40 + 10 = 50.
        current=40,
        metrics=engines((5, 0, 0.25)),
        expected=50,
        says=["40 → 50 (+10) (limited to maxStepUp 10)", "KV-cache usage 0.25 < target 0.5"],
        autoscale={"maxStepUp": 10, "targets": {"kvCacheUsage": 0.5}},
    ),
    Case(
        "without engine metrics the autoscaler holds",
        current=100,
        metrics=EngineMetrics(),
        expected=None,
        says=["no engine metrics yet"],
    ),
]


#: ``spec.sandbox.autoscale`` on over the widest range; tests adjust it: ``{**AUTOSCALE, ...}``.
AUTOSCALE: dict[str, Any] = {"enabled": True, "min": 1, "max": 1024}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_autoscaler_moves_as_worked_out_by_hand(case: Case) -> None:
    job = (
        make_job()
        .with_sandbox(concurrency=case.current, autoscale={**AUTOSCALE, **case.autoscale})
        .obj()
    )
    decision = decide(job, case.metrics, current=case.current, last_scale_time=None, now=NOW)
    assert decision.concurrency == case.expected, decision.reason
    for fragment in case.says:
        assert fragment in decision.reason, decision.reason


def test_no_move_happens_within_the_cooldown_and_it_says_when_it_ends() -> None:
    job = make_job().with_sandbox(concurrency=100, autoscale=AUTOSCALE).obj()
    decision = decide(job, engines((10, 0, 0.2)), current=100,
                      last_scale_time=NOW - timedelta(seconds=45), now=NOW)
    assert decision == ScaleDecision(
        concurrency=None,
        direction=ScaleDirection.HOLD,
        reason="holding sandbox concurrency at 100: cooling down, the last move was 45 s ago "
        "and cooldownSeconds is 60",
        recheck_after_seconds=15.0,  # 60 − 45
    )


def test_a_move_is_allowed_again_once_the_cooldown_has_passed() -> None:
    job = make_job().with_sandbox(concurrency=100, autoscale=AUTOSCALE).obj()
    decision = decide(job, engines((10, 0, 0.2)), current=100,
                      last_scale_time=NOW - timedelta(seconds=60), now=NOW)
    assert decision.concurrency == 164
    assert decision.recheck_after_seconds == 60.0


def test_a_disabled_autoscaler_never_moves_so_an_hpa_or_a_person_owns_the_field() -> None:
    job = make_job().with_sandbox(concurrency=100, autoscale={**AUTOSCALE, "enabled": False}).obj()
    decision = decide(job, engines((0, 0, 0.0)), current=100, last_scale_time=None, now=NOW)
    assert decision.concurrency is None
    assert decision.recheck_after_seconds is None
    assert "disabled" in decision.reason and "HPA" in decision.reason


def test_a_suspended_job_is_not_scaled() -> None:
    job = make_job().with_sandbox(autoscale={"enabled": True}).suspended().obj()
    decision = decide(job, engines((0, 0, 0.0)), current=16, last_scale_time=None, now=NOW)
    assert decision.concurrency is None and "suspended" in decision.reason


def test_a_concurrency_outside_the_bounds_is_brought_back_without_waiting() -> None:
    # The API server refuses this while autoscale is on; a job from before the bounds has it.
    autoscale = {**AUTOSCALE, "min": 16, "max": 64}
    job = make_job().with_sandbox(concurrency=5, autoscale=autoscale).obj()
    decision = decide(job, engines((0, 0, 0.0)), current=5,
                      last_scale_time=NOW - timedelta(seconds=1), now=NOW)
    assert decision.concurrency == 16
    assert decision.reason == "set sandbox concurrency 5 → 16: outside autoscale [min, max] = " \
        "[16, 64]"


def test_a_move_is_recorded_in_status_and_announced_by_an_event() -> None:
    job = make_job().with_sandbox(concurrency=100, autoscale=AUTOSCALE).obj()
    decision = decide(job, engines((57.6, 9, 0.5)), current=100, last_scale_time=None, now=NOW)
    status = record_move(AgentRLJobStatus(), decision, NOW)
    assert status.sandbox.desired == 68
    assert status.sandbox.last_scale_time == "2026-03-01T12:00:00Z"
    assert status.sandbox.last_scale_reason == (
        "lowered sandbox concurrency 100 → 68 (-32): 9 requests queued per engine > target 4"
    )
    assert move_event(decision) == Event(
        type="Normal", reason=REASON_LOWERED, message=status.sandbox.last_scale_reason
    )


def test_a_raise_is_announced_as_such() -> None:
    job = make_job().with_sandbox(concurrency=100, autoscale=AUTOSCALE).obj()
    decision = decide(job, engines((10, 0, 0.2)), current=100, last_scale_time=None, now=NOW)
    event = move_event(decision)
    assert event is not None and event.reason == REASON_RAISED


def test_a_hold_changes_no_status_and_posts_no_event() -> None:
    job = make_job().with_sandbox(concurrency=100, autoscale=AUTOSCALE).obj()
    decision = decide(job, engines((10, 0, 0.7)), current=100, last_scale_time=None, now=NOW)
    before = AgentRLJobStatus()
    assert record_move(before, decision, NOW) == before
    assert move_event(decision) is None


def test_pending_and_unschedulable_sandbox_pods_are_counted_from_what_was_observed() -> None:
    observed = observe(pods=[
        make_pod("demo-sbx-a", "sandbox").running().obj(),
        make_pod("demo-sbx-b", "sandbox").obj(),  # Pending, scheduled soon (no condition yet)
        make_pod("demo-sbx-c", "sandbox").unschedulable("0/6 nodes are available").obj(),
        make_pod("demo-sbx-d", "sandbox").unschedulable("0/6 nodes are available").obj(),
        make_pod("demo-engine-0", "engine").unschedulable("Insufficient amd.com/gpu").obj(),
    ])
    # b, c, d are Pending sandbox pods; c and d are unschedulable; the engine pod is not ours.
    assert count_waiting_sandboxes(observed) == (3, 2)


def test_synthetic_metrics_are_read_from_camel_case_json() -> None:
    metrics = EngineMetrics.model_validate({
        "engines": [{"pod": "e-0", "runningRequests": 3, "queuedRequests": 1,
                     "tokenUsage": 0.5}],
        "sandboxesUnschedulable": 2,
    })
    assert metrics.mean_running == 3 and metrics.mean_queued == 1
    assert metrics.sandboxes_unschedulable == 2
