"""Scheduling that protects the expensive pods: every kind of pod of a job carries its
PriorityClass (the job's own ``priorityClassName``, else the operator's default, else none),
the quota arithmetic counts sandboxes by their class as the API server does, and /dev/shm is
memory-backed where Ray and RCCL need it. Pure: builders and the operator's option parsing."""

from __future__ import annotations

from typing import Any

import click
import pytest

from agentrl.api import AgentRLJob
from agentrl.controller.cli import priority_classes
from agentrl.reconcile import engine, rollout, sandbox, trainer
from agentrl.reconcile.children import desired_children
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.priority import PriorityClasses, with_priority_classes
from agentrl.reconcile.quotas import applies_to_sandboxes, quota_from_object, sandbox_room
from tests.factories import make_job, sandbox_pods_of

#: What the chart passes for a release named "rel" (``<fullname>-<kind>``).
CHART = PriorityClasses(
    trainer="rel-agentrl-trainer",
    engines="rel-agentrl-engines",
    rollout="rel-agentrl-rollout",
    sandboxes="rel-agentrl-sandboxes",
)


def _pods(job: AgentRLJob) -> dict[str, dict[str, Any]]:
    """The pod spec of each kind of pod the operator builds for ``job``."""
    ctx = BuildContext.for_job(job)
    return {
        "engine": engine.statefulset(job, ctx, replicas=1)["spec"]["template"]["spec"],
        "trainer": trainer.trainer_job(job, ctx)["spec"]["template"]["spec"],
        "rollout": rollout.deployment(job, ctx, replicas=1)["spec"]["template"]["spec"],
        "sandbox": sandbox.sandbox_pod(job, ctx, pod_name="demo-sbx-1")["spec"],
    }


def _classes(job: AgentRLJob) -> dict[str, str | None]:
    return {kind: pod.get("priorityClassName") for kind, pod in _pods(job).items()}


def test_without_any_class_no_pod_names_one() -> None:
    job = with_priority_classes(make_job().obj(), PriorityClasses())
    assert _classes(job) == dict.fromkeys(("engine", "trainer", "rollout", "sandbox"))


def test_the_operators_classes_reach_each_kind_of_pod() -> None:
    job = with_priority_classes(make_job().obj(), CHART)
    assert _classes(job) == {
        "engine": "rel-agentrl-engines",
        "trainer": "rel-agentrl-trainer",
        "rollout": "rel-agentrl-rollout",
        "sandbox": "rel-agentrl-sandboxes",
    }


def test_a_job_that_names_its_own_class_keeps_it_and_the_others_take_the_operators() -> None:
    job = (
        make_job()
        .with_trainer(priorityClassName="team-critical")
        .with_sandbox(priorityClassName="team-batch")
        .obj()
    )
    resolved = with_priority_classes(job, CHART)
    assert _classes(resolved) == {
        "engine": "rel-agentrl-engines",
        "trainer": "team-critical",
        "rollout": "rel-agentrl-rollout",
        "sandbox": "team-batch",
    }
    # the job as read is left as it was
    assert job.spec.inference.priority_class_name is None


def test_an_operator_with_only_some_classes_leaves_the_other_pods_without() -> None:
    job = with_priority_classes(make_job().obj(), PriorityClasses(trainer="gold"))
    assert _classes(job) == {"engine": None, "trainer": "gold", "rollout": None, "sandbox": None}


def test_every_child_the_operator_applies_carries_the_class_and_so_does_the_sandbox_template() -> (
    None
):
    job = with_priority_classes(make_job("swe", "rl").obj(), CHART)
    children = desired_children(job, BuildContext.for_job(job))
    templates = {
        c["kind"]: c["spec"]["template"]["spec"].get("priorityClassName")
        for c in children
        if c["kind"] in ("StatefulSet", "Job", "Deployment")
    }
    assert templates == {
        "StatefulSet": "rel-agentrl-engines",
        "Job": "rel-agentrl-trainer",
        "Deployment": "rel-agentrl-rollout",
    }
    # the rollout workers create sandboxes from runtime.yaml's template
    template = sandbox_pods_of(job).template
    assert template["spec"]["priorityClassName"] == "rel-agentrl-sandboxes"
    # and the resolved manifest the workloads read says which classes are in effect
    assert f"priorityClassName: {CHART.trainer}" in children[0]["data"]["job.yaml"]


@pytest.mark.parametrize("name", ["Gold", "gold_class", "-gold", "a" * 254])
def test_a_class_name_kubernetes_refuses_is_refused_by_the_spec(name: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"priority_class_name|priorityClassName"):
        make_job().with_rollout(priorityClassName=name).obj()


# ---- /dev/shm --------------------------------------------------------------------------------


def _shm(pod: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes = [v for v in pod.get("volumes", []) if v["name"] == "dshm"]
    mounts = [
        m for c in pod["containers"] for m in c.get("volumeMounts", []) if m["name"] == "dshm"
    ]
    return volumes, mounts


def test_dev_shm_is_memory_backed_on_engines_trainer_and_rollout_workers_not_sandboxes() -> None:
    # engines: spec.inference.shmSize; trainer: bounded by the pod's memory (Ray's head and
    # RCCL); rollout workers: 1.1 × Ray's store, the store 30% of rollout.memory 8Gi, so
    # 2.4 GiB × 1.1 = 2703.36 MiB → 2704Mi
    job = make_job().with_inference(shmSize="48Gi").with_rollout(memory="8Gi").obj()
    pods = _pods(job)
    expected = {
        "engine": {"medium": "Memory", "sizeLimit": "48Gi"},
        "trainer": {"medium": "Memory"},
        "rollout": {"medium": "Memory", "sizeLimit": "2704Mi"},
    }
    for kind, empty_dir in expected.items():
        volumes, mounts = _shm(pods[kind])
        assert volumes == [{"name": "dshm", "emptyDir": empty_dir}], kind
        assert {"name": "dshm", "mountPath": "/dev/shm"} in mounts, kind
    assert _shm(pods["sandbox"]) == ([], [])
    env = {e["name"]: e.get("value") for e in pods["rollout"]["containers"][0]["env"]}
    # 8 GiB × 0.3 = 2576980377.6 bytes: the cap ray start sizes its store with
    assert env["RAY_DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES"] == "2576980377"


# ---- quotas scoped by PriorityClass ----------------------------------------------------------


def _scoped_quota(operator: str, *values: str) -> Any:
    expression: dict[str, Any] = {"scopeName": "PriorityClass", "operator": operator}
    if values:
        expression["values"] = list(values)
    return quota_from_object(
        {
            "metadata": {"name": "by-class"},
            "spec": {"hard": {"pods": "3"}, "scopeSelector": {"matchExpressions": [expression]}},
            "status": {"hard": {"pods": "3"}, "used": {"pods": "0"}},
        }
    )


@pytest.mark.parametrize(
    ("operator", "values", "with_class", "without_class"),
    [
        # the API server matches a pod's class as a label value; no class is the empty name
        ("In", ("rel-agentrl-sandboxes",), True, False),
        ("In", ("",), False, True),
        ("NotIn", ("rel-agentrl-sandboxes",), False, True),
        ("NotIn", ("gold",), True, True),
        ("Exists", (), True, False),
        ("DoesNotExist", (), False, False),
    ],
)
def test_a_priority_class_scope_counts_sandboxes_by_their_class(
    operator: str, values: tuple[str, ...], with_class: bool, without_class: bool
) -> None:
    quota = _scoped_quota(operator, *values)
    assert applies_to_sandboxes(quota, priority_class="rel-agentrl-sandboxes") is with_class
    assert applies_to_sandboxes(quota, priority_class=None) is without_class


def test_a_quota_on_the_sandbox_class_caps_the_concurrency_of_a_job_using_it() -> None:
    quota = _scoped_quota("In", "rel-agentrl-sandboxes")
    classed = with_priority_classes(make_job().with_concurrency(16).obj(), CHART)
    room = sandbox_room(classed, [quota])
    assert room is not None and (room.sandboxes, room.limited_by) == (
        3,
        "ResourceQuota/by-class pods",
    )
    # the same job without classes is not in that quota's scope
    assert sandbox_room(make_job().with_concurrency(16).obj(), [quota]) is None


# ---- the operator's options ------------------------------------------------------------------


def test_the_operators_options_become_its_priority_classes_an_empty_one_none() -> None:
    assert priority_classes(
        trainer="rel-agentrl-trainer", engines="", rollout=None, sandboxes="sbx"
    ) == PriorityClasses(trainer="rel-agentrl-trainer", sandboxes="sbx")


def test_a_bad_class_option_is_refused_naming_the_option() -> None:
    with pytest.raises(click.BadParameter) as caught:
        priority_classes(trainer="ok", engines="Not_A_Name", rollout=None, sandboxes=None)
    assert caught.value.param_hint == "--engine-priority-class"
    assert "'Not_A_Name' is not a PriorityClass name" in caught.value.message
