"""The GPU preflight: which nodes match, whether the job's GPU pods fit them, the shortfall in
the message, and the GPUsAvailable verdict over a job's life. Every expected figure is worked
out by hand in the comment beside it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrl.api import AgentRLJob
from agentrl.reconcile import preflight
from agentrl.reconcile.nodes import NodesSeen, node_from_object, nodes_seen
from agentrl.reconcile.observed import observe
from agentrl.reconcile.preflight import GPUDemand, PodGroup, check, fits, nodes_needed
from agentrl.reconcile.status import compute_status
from tests.factories import make_job, make_pod, make_statefulset, make_trainer_job

REPORT = AgentRLJob.model_validate(
    yaml.safe_load(Path("examples/mi355x-report.yaml").read_text())
)
MI355X = {"amd.com/gpu.product-name": "AMD_Instinct_MI355X", "agentrl.dev/node-pool": "gpu"}
SANDBOX = {"agentrl.dev/node-pool": "sandbox"}
LABEL = "amd.com/gpu.product-name=AMD_Instinct_MI355X"
# The report: 1 trainer pod × 8 GPUs + 24 engines × 1 GPU = 32 GPUs.
REPORT_DEMAND = "1 trainer pod with 8 amd.com/gpu and 24 engines with 1 amd.com/gpu (32 in all)"


def node(
    name: str,
    gpus: int | None = 8,
    labels: dict[str, str] | None = None,
    *,
    taints: list[dict[str, str]] | None = None,
    cordoned: bool = False,
    resource: str = "amd.com/gpu",
) -> dict[str, Any]:
    """A Node as the API server returns it."""
    allocatable = {"cpu": "256", "memory": "3Ti", "pods": "250"}
    if gpus is not None:
        allocatable[resource] = str(gpus)
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = taints
    if cordoned:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": dict(MI355X if labels is None else labels)},
        "spec": spec,
        "status": {"allocatable": allocatable},
    }


def gpu_nodes(count: int, gpus: int = 8) -> list[dict[str, Any]]:
    return [node(f"gpu-{i}", gpus) for i in range(count)]


def cpu_nodes(count: int = 2) -> list[dict[str, Any]]:
    return [node(f"cpu-{i}", None, SANDBOX) for i in range(count)]


def demand(trainers: int, a: int, engines: int, b: int) -> GPUDemand:
    return GPUDemand(
        resource="amd.com/gpu",
        node_selector={},
        tolerations=(),
        trainer=PodGroup("trainer pod", trainers, a),
        engines=PodGroup("engine", engines, b),
    )


# ---- the node snapshot -----------------------------------------------------------------------


def test_a_node_keeps_its_labels_taints_cordon_and_extended_resources_only():
    seen = node_from_object(
        node(
            "gpu-9",
            8,
            taints=[{"key": "amd.com/gpu", "value": "present", "effect": "NoSchedule"}],
            cordoned=True,
        )
    )
    assert seen.name == "gpu-9"
    assert seen.labels == MI355X
    assert [str(t) for t in seen.taints] == ["amd.com/gpu=present:NoSchedule"]
    assert seen.unschedulable is True
    # cpu, memory and pods are not devices
    assert seen.allocatable == {"amd.com/gpu": 8}


# ---- packing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capacities", "want", "expected"),
    [
        # the report on four 8-GPU nodes: trainer takes one node, 24 engines the other three
        ([8, 8, 8, 8], demand(1, 8, 24, 1), True),
        # one engine more: 33 GPUs on 32
        ([8, 8, 8, 8], demand(1, 8, 25, 1), False),
        # two 8-GPU trainer pods take two nodes; 16 one-GPU engines fill the other two
        ([8, 8, 8, 8], demand(2, 8, 16, 1), True),
        ([8, 8, 8, 8], demand(2, 8, 17, 1), False),
        # 32 GPUs in all, but on 4-GPU nodes no node holds the 8-GPU trainer pod
        ([4] * 8, demand(1, 8, 24, 1), False),
        # a 16-GPU node holds the trainer and 8 engines; the 8-GPU node the other 8
        ([16, 8], demand(1, 8, 16, 1), True),
        # trainer pods only: two 4-GPU pods share the 8-GPU node; two 8-GPU pods do not fit
        ([8, 4], demand(2, 4, 0, 1), True),
        ([8, 4], demand(2, 8, 0, 1), False),
        # 2-GPU engines on 7-GPU nodes: 3 per node (1 GPU left over on each)
        ([7, 7], demand(0, 8, 6, 2), True),
        ([7, 7], demand(0, 8, 7, 2), False),
        # engines of 3 beside a trainer pod of 4 (3 does not divide 4): on nodes of 4 and 6 the
        # trainer must take the 4 (the 6 then holds 2 engines); on the 6 it would leave 2 GPUs,
        # no engine, and the 4 one engine: 1 of 2
        ([4, 6], demand(1, 4, 2, 3), True),
        ([6, 4], demand(1, 4, 2, 3), True),
        # 10 GPUs for 4 + 3 + 3, but on two 5-GPU nodes the trainer leaves 1 GPU beside it and
        # the other node holds one engine of 3
        ([5, 5], demand(1, 4, 2, 3), False),
        # GPU-free pods do not count: a CPU trainer beside 8 one-GPU engines on one node
        ([8], demand(1, 0, 8, 1), True),
    ],
)
def test_gpu_pods_fit_the_nodes_only_whole_on_one_node(capacities, want, expected):
    assert fits(capacities, want) is expected


@pytest.mark.parametrize(
    ("capacity", "want", "expected"),
    [
        # 32 GPUs on 8-GPU nodes: 4, the trainer's node full, the engines 8 per node
        (8, demand(1, 8, 24, 1), 4),
        # 16 + 24 = 40 GPUs: 5 nodes of 8
        (8, demand(2, 8, 24, 1), 5),
        # 4 + 3 + 3 on 5-GPU nodes: nothing shares a node, so 3
        (5, demand(1, 4, 2, 3), 3),
        # 1 trainer pod of 8 and 24 engines of 1 on 16-GPU nodes: 32 / 16 = 2
        (16, demand(1, 8, 24, 1), 2),
    ],
)
def test_the_nodes_needed_are_the_fewest_that_hold_every_gpu_pod(capacity, want, expected):
    assert nodes_needed(capacity, want) == expected


# ---- matching and the message ----------------------------------------------------------------


def test_the_report_fits_four_mi355x_nodes_and_the_sandbox_nodes_do_not_count():
    verdict = check(REPORT, nodes_seen([*gpu_nodes(4), *cpu_nodes()]))
    assert verdict.status == "True"
    assert verdict.reason == "GPUCapacitySufficient"
    assert verdict.message == (
        "the cluster has 4 matching nodes with 32 amd.com/gpu (at most 8 on one node): "
        f"room for {REPORT_DEMAND}"
    )


def test_three_mi355x_nodes_are_one_short_and_the_message_names_it():
    verdict = check(REPORT, nodes_seen([*gpu_nodes(3), *cpu_nodes()]))
    assert verdict.status == "False"
    assert verdict.reason == "GPUCapacityInsufficient"
    assert verdict.message == (
        f"needs 4 nodes with 8 amd.com/gpu labelled {LABEL} for {REPORT_DEMAND}; "
        "the cluster has 3 matching nodes with 24 amd.com/gpu (at most 8 on one node); "
        f"not matching: 2 nodes not labelled {LABEL} (cpu-0, cpu-1)"
    )


def test_a_cluster_of_other_gpus_has_no_matching_node():
    mi300x = {"amd.com/gpu.product-name": "AMD_Instinct_MI300X"}
    nodes = [node(f"mi300x-{i}", 8, mi300x) for i in range(5)]
    verdict = check(REPORT, nodes_seen(nodes))
    assert verdict.status == "False"
    # no matching node: the size asked for is the largest pod's, 8
    assert verdict.message == (
        f"needs 4 nodes with 8 amd.com/gpu labelled {LABEL} for {REPORT_DEMAND}; "
        "the cluster has 0 matching nodes; "
        f"not matching: 5 nodes not labelled {LABEL} (mi300x-0, mi300x-1, mi300x-2, 2 more)"
    )


def test_enough_gpus_in_all_but_no_node_with_eight_free_for_the_trainer():
    verdict = check(REPORT, nodes_seen([node(f"gpu-{i}", 4) for i in range(8)]))
    assert verdict.status == "False"
    # 8 × 4 = 32 GPUs, as many as asked; 4 nodes of 8 would do
    assert verdict.message == (
        f"needs 4 nodes with 8 amd.com/gpu labelled {LABEL} for {REPORT_DEMAND}; "
        "the cluster has 8 matching nodes with 32 amd.com/gpu (at most 4 on one node)"
    )


def test_cordoned_tainted_and_gpu_less_nodes_do_not_match_and_say_why():
    nodes = [
        *gpu_nodes(3),
        node("gpu-3", 8, cordoned=True),
        node("gpu-4", 8, taints=[{"key": "amd.com/gpu", "value": "present",
                                  "effect": "NoSchedule"}]),
        node("gpu-5", 0),  # labelled, but its device plugin advertises nothing
        node("gpu-6", None),
    ]
    verdict = check(REPORT, nodes_seen(nodes))
    assert verdict.status == "False"
    assert verdict.message.endswith(
        "not matching: 1 node cordoned (gpu-3); "
        "1 node taint amd.com/gpu=present:NoSchedule not tolerated (gpu-4); "
        "2 nodes no allocatable amd.com/gpu (gpu-5, gpu-6)"
    )


@pytest.mark.parametrize(
    ("toleration", "matches"),
    [
        ({"key": "amd.com/gpu", "operator": "Exists"}, True),
        ({"key": "amd.com/gpu", "operator": "Equal", "value": "present"}, True),
        ({"key": "amd.com/gpu", "operator": "Equal", "value": "absent"}, False),
        ({"key": "amd.com/gpu", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}, True),
        ({"operator": "Exists"}, True),  # an empty key with Exists tolerates every taint
        ({"key": "other", "operator": "Exists"}, False),
    ],
)
def test_a_tainted_node_matches_only_a_job_that_tolerates_the_taint(toleration, matches):
    taint = {"key": "amd.com/gpu", "value": "present", "effect": "NoSchedule"}
    job = make_job().with_tolerations(toleration).with_engines(1).with_trainer(gpusPerNode=1).obj()
    verdict = check(job, nodes_seen([node("gpu-0", 8, taints=[taint])]))
    assert (verdict.status == "True") is matches


def test_a_prefer_no_schedule_taint_keeps_no_pod_off():
    taint = {"key": "busy", "value": "yes", "effect": "PreferNoSchedule"}
    verdict = check(REPORT, nodes_seen([node(f"gpu-{i}", 8, taints=[taint]) for i in range(4)]))
    assert verdict.status == "True"


def test_another_gpu_resource_is_counted_by_its_own_name():
    job = make_job().with_spec("inference.gpuResource", "nvidia.com/gpu").with_engines(2).obj()
    amd = check(job, nodes_seen([node("gpu-0", 8, {})]))
    assert amd.status == "False"
    assert amd.message.endswith("not matching: 1 node no allocatable nvidia.com/gpu (gpu-0)")
    nvidia = check(job, nodes_seen([node("gpu-0", 8, {}, resource="nvidia.com/gpu")]))
    # default trainer: 1 pod × 8; 2 engines × 1: 10 GPUs on a 8-GPU node do not fit
    assert nvidia.message == (
        "needs 2 nodes with 8 nvidia.com/gpu for 1 trainer pod with 8 nvidia.com/gpu and "
        "2 engines with 1 nvidia.com/gpu (10 in all); the cluster has 1 matching node with "
        "8 nvidia.com/gpu (at most 8 on one node)"
    )


def test_unreadable_nodes_give_unknown_naming_the_refusal():
    verdict = check(REPORT, NodesSeen(error="403 Forbidden: nodes is forbidden"))
    assert verdict.status == "Unknown"
    assert verdict.reason == "NodesUnreadable"
    assert "403 Forbidden: nodes is forbidden" in verdict.message
    assert "grant the operator list on nodes" in verdict.message


# ---- over the job's life ---------------------------------------------------------------------


#: Two tiny CPU engines and a torch trainer without GPUs: a job that needs no GPU node.
TINY = (
    make_job()
    .with_inference(server="tiny")
    .with_engines(2, gpus_per_engine=0)
    .with_trainer(backend="torch", gpusPerNode=0)
)


def _scheduled_report_pods() -> list[dict[str, Any]]:
    pods = [make_pod("r-trainer-0-x", "trainer").running().obj()]
    pods += [make_pod(f"r-engine-{i}", "engine").running().obj() for i in range(24)]
    return pods


def test_nodes_are_read_while_a_gpu_pod_is_not_scheduled_and_not_after():
    assert preflight.needs_nodes(REPORT, observe()) is True
    pods = _scheduled_report_pods()
    assert preflight.needs_nodes(REPORT, observe(pods=pods)) is False
    # one engine pending again (its node went away)
    pending = [*pods[:-1], make_pod("r-engine-23", "engine").unschedulable("0/6 nodes").obj()]
    assert preflight.needs_nodes(REPORT, observe(pods=pending)) is True


def test_nodes_are_not_read_for_a_suspended_job_or_one_without_gpus():
    suspended = REPORT.model_copy(
        update={"spec": REPORT.spec.model_copy(update={"suspend": True})}
    )
    assert preflight.needs_nodes(suspended, observe()) is False
    assert preflight.needs_nodes(TINY.obj(), observe()) is False


def test_the_verdict_over_a_jobs_life():
    no_nodes = observe()
    assert preflight.verdict(REPORT, no_nodes, suspended=True, finished=False).reason == (
        "JobSuspended"
    )
    assert preflight.verdict(REPORT, no_nodes, suspended=False, finished=True).reason == (
        "JobFinished"
    )
    unread = preflight.verdict(REPORT, no_nodes, suspended=False, finished=False)
    assert (unread.status, unread.reason) == ("Unknown", "CapacityNotChecked")
    tiny = preflight.verdict(TINY.obj(), no_nodes, suspended=False, finished=False)
    assert (tiny.status, tiny.reason, tiny.message) == (
        "True",
        "NoGPUsRequested",
        "the job requests no amd.com/gpu",
    )
    placed = preflight.verdict(
        REPORT, observe(pods=_scheduled_report_pods()), suspended=False, finished=False
    )
    assert (placed.status, placed.reason, placed.message) == (
        "True",
        "GPUCapacitySufficient",
        f"all 25 GPU pods are scheduled: {REPORT_DEMAND}",
    )
    short = preflight.verdict(
        REPORT,
        observe(
            statefulset=make_statefulset(0),
            trainer_job=make_trainer_job(),
            nodes=nodes_seen(gpu_nodes(3)),
        ),
        suspended=False,
        finished=False,
    )
    assert (short.status, short.reason) == ("False", "GPUCapacityInsufficient")


def test_the_shortfall_becomes_the_gpus_available_condition_and_a_warning_event():
    observed = observe(nodes=nodes_seen([*gpu_nodes(3), *cpu_nodes()]))
    result = compute_status(REPORT, observed, generation=1, now=datetime(2026, 3, 1, tzinfo=UTC))
    (cond,) = [c for c in result.status.conditions if c.type == "GPUsAvailable"]
    assert (cond.status, cond.reason) == ("False", "GPUCapacityInsufficient")
    assert cond.message.startswith(f"needs 4 nodes with 8 amd.com/gpu labelled {LABEL} for ")
    warnings = [e for e in result.events if e.reason == "GPUCapacityInsufficient"]
    assert [e.type for e in warnings] == ["Warning"]
    assert warnings[0].message == f"GPUsAvailable: {cond.message}"
