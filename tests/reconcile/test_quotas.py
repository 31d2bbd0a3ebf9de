"""Namespace ResourceQuotas cap the sandbox concurrency in effect, and the status names the
quota and resource that bind. A default sandbox charges cpu 2, memory 4Gi, ephemeral-storage
10Gi and one pod."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import yaml

from agentrl.reconcile.concurrency import EffectiveConcurrency, effective_concurrency
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.observed import observe, sandboxes_charged
from agentrl.reconcile.plan import plan
from agentrl.reconcile.quotas import (
    QuotaRoom,
    ResourceQuotaUsage,
    applies_to_sandboxes,
    quota_from_object,
    sandbox_room,
)
from tests.factories import make_job, make_pod

GI = 2.0**30


def quota_object(
    name: str, hard: dict[str, str], used: dict[str, str], **spec: Any
) -> dict[str, Any]:
    """A ResourceQuota as the API server returns it (the quota controller fills status)."""
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": "team"},
        "spec": {"hard": dict(hard), **spec},
        "status": {"hard": dict(hard), "used": dict(used)},
    }


def test_a_cpu_quota_admits_what_is_free_plus_the_sandboxes_already_running() -> None:
    job = make_job().with_concurrency(16).obj()
    # 3 sandboxes run (6 CPUs used): 20 − 6 = 14 free → 7 more, plus the 3 = 10.
    quota = quota_from_object(quota_object("team", {"requests.cpu": "20"},
                                           {"requests.cpu": "6"}))
    assert effective_concurrency(job, quotas=[quota], sandboxes_in_use=3) == EffectiveConcurrency(
        value=10, desired=16, limited_by="ResourceQuota/team requests.cpu"
    )


def test_the_tightest_key_of_all_quotas_binds() -> None:
    job = make_job().with_concurrency(64).obj()
    quotas = [
        quota_from_object(quota_object(
            "compute",
            # cpu: (40 − 6) / 2 = 17 → 20; memory: (64Gi − 12Gi) / 4Gi = 13 → 16
            {"cpu": "40", "requests.memory": "64Gi"},
            {"cpu": "6", "requests.memory": "12Gi"},
        )),
        # pods: 12 − 4 = 8 free → 8 + 3 = 11; one of the 4 used is someone else's pod
        quota_from_object(quota_object("objects", {"pods": "12"}, {"pods": "4"})),
    ]
    assert sandbox_room(job, quotas, sandboxes_in_use=3) == QuotaRoom(
        sandboxes=11, limited_by="ResourceQuota/objects pods"
    )


def test_quota_keys_a_sandbox_does_not_use_never_bind() -> None:
    job = make_job().with_concurrency(64).obj()
    quota = quota_from_object(quota_object(
        "gpus", {"requests.amd.com/gpu": "0", "services": "1"}, {"services": "1"}
    ))
    assert sandbox_room(job, [quota]) is None
    assert effective_concurrency(job, quotas=[quota]).limited_by is None


def test_fractional_cpus_divide_exactly() -> None:
    job = make_job().with_concurrency(8).with_sandbox(cpu="100m").obj()
    # 300m / 100m = 3 exactly; as floats 0.3 / 0.1 is 2.9999999999999996, which floors to 2
    quota = quota_from_object(quota_object("q", {"limits.cpu": "300m"}, {}))
    assert effective_concurrency(job, quotas=[quota]).value == 3


def test_an_exhausted_quota_admits_only_what_runs_and_never_less_than_zero() -> None:
    job = make_job().with_concurrency(8).obj()
    # used above hard (the quota was lowered under running pods): free −6 CPUs → −3 sandboxes.
    over = quota_from_object(quota_object("q", {"cpu": "4"}, {"cpu": "10"}))
    assert effective_concurrency(job, quotas=[over], sandboxes_in_use=0).value == 0
    assert effective_concurrency(job, quotas=[over], sandboxes_in_use=5).value == 2  # −3 + 5


def test_a_quota_with_room_for_more_than_desired_limits_nothing() -> None:
    job = make_job().with_concurrency(8).obj()
    quota = quota_from_object(quota_object("q", {"pods": "100"}, {"pods": "0"}))
    assert effective_concurrency(job, quotas=[quota]) == EffectiveConcurrency(
        value=8, desired=8, limited_by=None
    )


def test_quotas_do_not_limit_e2b_sandboxes_but_the_plan_does() -> None:
    job = make_job().with_concurrency(384).with_e2b(max_concurrent=100).obj()
    quota = quota_from_object(quota_object("q", {"pods": "10"}, {"pods": "0"}))
    assert effective_concurrency(job, quotas=[quota]) == EffectiveConcurrency(
        value=100, desired=384, limited_by="spec.sandbox.e2b.maxConcurrent"
    )


def test_suspend_still_wins_over_any_quota() -> None:
    job = make_job().with_concurrency(8).suspended().obj()
    quota = quota_from_object(quota_object("q", {"pods": "2"}, {}))
    assert effective_concurrency(job, quotas=[quota]).limited_by == "spec.suspend"


def test_scoped_quotas_apply_only_when_sandbox_pods_are_in_scope() -> None:
    def scoped(**spec: Any) -> ResourceQuotaUsage:
        return quota_from_object(quota_object("q", {"pods": "1"}, {}, **spec))

    # sandbox pods have activeDeadlineSeconds (Terminating) and requests (NotBestEffort)
    assert applies_to_sandboxes(scoped(scopes=["Terminating", "NotBestEffort"]))
    assert not applies_to_sandboxes(scoped(scopes=["NotTerminating"]))
    assert not applies_to_sandboxes(scoped(scopes=["BestEffort"]))

    def selector(scope: str, operator: str, *values: str) -> ResourceQuotaUsage:
        expr: dict[str, Any] = {"scopeName": scope, "operator": operator}
        if values:
            expr["values"] = list(values)
        return scoped(scopeSelector={"matchExpressions": [expr]})

    assert not applies_to_sandboxes(selector("PriorityClass", "In", "high"))
    assert applies_to_sandboxes(selector("PriorityClass", "NotIn", "high"))
    assert not applies_to_sandboxes(selector("PriorityClass", "Exists"))
    assert applies_to_sandboxes(selector("Terminating", "Exists"))
    assert not applies_to_sandboxes(selector("BestEffort", "Exists"))


def test_a_quota_object_is_read_with_its_quantities_parsed() -> None:
    quota = quota_from_object(quota_object(
        "team", {"requests.memory": "64Gi", "requests.cpu": "500m"},
        {"requests.memory": "12Gi"},
    ))
    assert quota.name == "team"
    assert quota.hard == {"requests.memory": 64 * GI, "requests.cpu": 0.5}
    assert quota.used == {"requests.memory": 12 * GI}


def test_the_sandboxes_a_quota_charges_are_the_live_unfinished_ones() -> None:
    finished = make_pod("demo-sbx-c", "sandbox").obj()
    finished["status"]["phase"] = "Succeeded"
    observed = observe(pods=[
        make_pod("demo-sbx-a", "sandbox").running().obj(),
        make_pod("demo-sbx-b", "sandbox").obj(),  # Pending: charged from creation
        finished,
        make_pod("demo-sbx-d", "sandbox").running().deleting().obj(),
        make_pod("demo-engine-0", "engine").running().obj(),
    ])
    # a and b; c finished, d is being deleted, the engine pod is not a sandbox
    assert sandboxes_charged(observed) == 2


def test_a_quota_seen_by_the_controller_caps_the_rollout_config_and_the_status() -> None:
    job = make_job().with_concurrency(8).obj()
    # 2 sandboxes run; the Terminating-scoped quota allows 5 pods, 2 used → 3 more, 5 in all
    running = [make_pod(f"demo-sbx-{i}", "sandbox").running().obj() for i in range(2)]
    quota = quota_object("sandboxes", {"pods": "5"}, {"pods": "2"}, scopes=["Terminating"])
    decided = plan(job, BuildContext.for_job(job), observe(pods=running, resource_quotas=[quota]),
                   generation=1, now=datetime(2026, 3, 1, tzinfo=UTC))
    config = next(c for c in decided.children if c["kind"] == "ConfigMap")
    runtime = yaml.safe_load(config["data"]["runtime.yaml"])
    assert runtime["sandbox"]["concurrency"] == 5
    assert runtime["sandbox"]["limitedBy"] == "ResourceQuota/sandboxes pods"
    assert decided.status.sandbox.concurrency == 5
    assert decided.status.sandbox.desired == 8
    assert decided.status.sandbox.limited_by == "ResourceQuota/sandboxes pods"
