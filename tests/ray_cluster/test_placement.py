"""The placement plan, worked out by hand for the shipped examples and a small cluster: bundles
per rank, the driver's bundle, rollout bundles, strategies, and the numbering of ranks over the
nodes Ray chose."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.api import AgentRLJob
from agentrl.api.validation import load_job
from agentrl.ray_cluster.placement import (
    TRAINER_NODE_RESOURCE,
    Bundle,
    PlacementError,
    Strategy,
    assign_ranks,
    plan_placement,
    trainer_node_resources,
)
from tests.api.cases import BASE
from tests.factories import from_manifest, make_job

EXAMPLES = Path(__file__).parents[2] / "examples"
#: Every trainer-group bundle takes one unit of the resource only trainer nodes offer.
ON_TRAINER_NODE = {TRAINER_NODE_RESOURCE: 1.0}
ROLLOUT = "agentrl_rollout_node"  # what the rollout pods offer (reconcile.rollout)


#: The validation corpus's base job: one node of 8 GPUs, 32 trajectories per step.
CORPUS = from_manifest(BASE)


def test_the_quickstart_gets_a_cpu_rank_and_the_driver_on_one_node_and_one_rollout_worker() -> None:
    plan = plan_placement(load_job((EXAMPLES / "quickstart.yaml").read_text()))
    # nodes 1, gpusPerNode 0 (torch backend): one CPU-only rank, then the driver
    assert plan.trainer.name == "quickstart-trainer"
    assert plan.trainer.strategy == Strategy.STRICT_PACK
    assert [b.resources() for b in plan.trainer.bundles] == [
        {"CPU": 1.0, **ON_TRAINER_NODE},
        {"CPU": 1.0, **ON_TRAINER_NODE},
    ]
    assert (plan.world_size, plan.ranks_per_node, plan.driver_bundle) == (1, 1, 1)
    # rollout.workers defaults to 1
    assert plan.rollout.name == "quickstart-rollout"
    assert plan.rollout.strategy == Strategy.SPREAD
    assert [b.resources() for b in plan.rollout.bundles] == [{"CPU": 1.0, ROLLOUT: 1.0}]


def test_the_mi355x_report_gets_eight_gpu_ranks_packed_on_one_node() -> None:
    job = load_job((EXAMPLES / "mi355x-report.yaml").read_text())
    plan = plan_placement(job)
    # trainer.cpu "32" (default), 8 GPUs: (32 − 1 for the driver) / 8 = 3.875 → 3 CPUs per rank
    rank = {"GPU": 1.0, "CPU": 3.0, **ON_TRAINER_NODE}
    assert plan.trainer.strategy == Strategy.STRICT_PACK
    driver = {"CPU": 1.0, **ON_TRAINER_NODE}
    assert [b.resources() for b in plan.trainer.bundles] == [rank] * 8 + [driver]
    assert plan.world_size == 8 and plan.driver_bundle == 8
    assert plan.trainer.total() == {"CPU": 25.0, "GPU": 8.0, TRAINER_NODE_RESOURCE: 9.0}
    # rollout.workers: 8
    assert [b.resources() for b in plan.rollout.bundles] == [{"CPU": 1.0, ROLLOUT: 1.0}] * 8
    # the trainer pod offers its CPU request, its GPUs, and room for 8 ranks and the driver
    assert trainer_node_resources(job.spec) == Bundle(cpu=32, gpu=8, trainer_node=9)


def test_a_small_two_node_cluster_is_packed_not_strictly() -> None:
    plan = plan_placement(
        CORPUS.copy()
        .with_trainer(
            nodes=2,
            gpusPerNode=4,
            cpu="12500m",
            parallelism={"tensor": 2},
            trajectoriesPerStep=32,
        )
        .with_workers(3)
        .obj()
    )
    # (12.5 − 1) / 4 = 2.875 → 2 CPUs per rank; 2 × 4 ranks
    assert plan.trainer.strategy == Strategy.PACK
    assert [b.resources() for b in plan.trainer.bundles] == [
        {"GPU": 1.0, "CPU": 2.0, **ON_TRAINER_NODE}
    ] * 8 + [{"CPU": 1.0, **ON_TRAINER_NODE}]
    assert (plan.world_size, plan.ranks_per_node, plan.driver_bundle) == (8, 4, 8)
    assert len(plan.rollout.bundles) == 3


def test_a_cpu_request_too_small_for_the_ranks_and_the_driver_names_the_field_and_the_fix() -> None:
    with pytest.raises(PlacementError, match=r"spec\.trainer\.cpu \(8\).*at least 9"):
        plan_placement(CORPUS.copy().with_trainer(gpusPerNode=8, cpu="8").obj())


def test_ranks_are_numbered_node_by_node_starting_on_the_drivers_node() -> None:
    plan = plan_placement(CORPUS.copy().with_trainer(nodes=2, gpusPerNode=4).obj())
    # Ray interleaved the bundles over nodes a and b and put the driver (bundle 8) on b.
    nodes = {i: "ab"[i % 2] for i in range(8)} | {8: "b"}
    assert assign_ranks(plan, nodes) == [1, 3, 5, 7, 0, 2, 4, 6]
    nodes[8] = "a"
    assert assign_ranks(plan, nodes) == [0, 2, 4, 6, 1, 3, 5, 7]


def test_gpu_ranks_spread_unevenly_over_nodes_are_refused() -> None:
    plan = plan_placement(CORPUS.copy().with_trainer(nodes=2, gpusPerNode=4).obj())
    nodes = {i: ("a" if i < 5 else "b") for i in range(9)}
    with pytest.raises(PlacementError, match=r"unevenly.*gpusPerNode = 4"):
        assign_ranks(plan, nodes)


def test_a_cpu_only_trainer_pod_of_a_fraction_of_a_cpu_still_fits_its_rank_and_driver() -> None:
    """``trainer.cpu: 500m`` (a CPU cluster, the local real node): the pod offers Ray the two
    CPUs its placement group asks for (a rank and the driver), or that group never fits."""
    job = AgentRLJob.model_validate(
        make_job("cpu")
        .with_spec("trainer.backend", "torch")
        .with_spec("trainer.gpusPerNode", 0)
        .with_spec("trainer.cpu", "500m")
        .manifest()
    )
    offer = trainer_node_resources(job.spec)
    asked = plan_placement(job).trainer.bundles
    assert sum(b.cpu for b in asked) == 2.0
    assert offer.cpu == 2.0 and offer.gpu == 0
    assert offer.trainer_node == sum(b.trainer_node for b in asked) == 2
