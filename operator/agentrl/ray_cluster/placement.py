"""Where a job's processes run on Ray: the trainer ranks, the driver and the rollout workers.

The plan is a pure function of the spec (:func:`plan_placement`); the Ray part creates its
placement groups, waits for them with a timeout the caller gives, and starts actors in their
bundles. ``agentrl trainer`` (the trainer pods, Ray head on pod 0) and ``agentrl run`` (a local
Ray on this machine) place their processes with the same code.

The plan:

* **trainer group** ``NAME-trainer`` — one bundle per rank, then the driver's own bundle (the
  last one). A rank with a GPU gets ``{"GPU": 1, "CPU": k}``, ``k`` its share of the pod's CPU
  request once the driver has its own: ⌊(``trainer.cpu`` − :data:`DRIVER_CPUS`) /
  ``gpusPerNode``⌋. A CPU-only rank (``gpusPerNode: 0``, the torch backend, as in ``agentrl
  run``) gets ``{"CPU": 1}``: that backend steps on one thread. The driver gets
  ``{"CPU": 1}``: one asyncio loop (admission, batching, checkpoints, and the rollout tier
  while it runs in the driver's process).
* **rollout group** ``NAME-rollout`` — ``rollout.workers`` bundles of ``{"CPU": 1}``, one per
  rollout worker actor (:mod:`agentrl.rollout.ray_workers`): a worker is one asyncio loop.

Every trainer-group bundle also asks for one unit of :data:`TRAINER_NODE_RESOURCE`, which only
the trainer pods' Ray nodes offer (:func:`trainer_node_resources`; ``agentrl run``'s local Ray:
:func:`local_resources`): the rollout worker pods join the same Ray cluster, and without it a
CPU-only rank or the driver could be placed on one of them, away from the checkpoint volume.
Likewise every rollout bundle asks for one unit of ``ROLLOUT_NODE_RESOURCE``, which only the
rollout worker pods offer: a worker on a trainer node would have no rights to create sandbox
pods and would take CPU the trainer pod reserved for itself.

Strategies, and why:

* one trainer node: ``STRICT_PACK``. Every rank on one node (intra-node links for the
  collectives) with the driver beside rank 0, which it calls every step. A node that cannot
  hold them leaves the group pending and :func:`create_group` says so, instead of Ray quietly
  spreading the ranks over nodes.
* several trainer nodes: ``PACK``. ``STRICT_SPREAD`` would put every bundle on its own node —
  with one bundle per rank, one node per GPU — and ``SPREAD`` would scatter ranks for no
  reason. ``PACK`` fills as few nodes as it can; each trainer node offers Ray exactly
  ``gpusPerNode`` GPUs, so each ends up with ``gpusPerNode`` rank bundles. The ranks are then
  numbered node by node (:func:`assign_ranks`), the driver's node first, so tensor-parallel
  groups (consecutive ranks) stay inside a node; an uneven spread is refused.
* rollout workers: ``SPREAD`` (soft): over the rollout pods when there are several, sharing the
  one machine under ``agentrl run``.

``ray`` is imported only inside the functions that talk to it. Callers:
:mod:`agentrl.trainer.pod`, :mod:`agentrl.local.cli`, tests.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from agentrl.api.job import AgentRLJob, AgentRLJobSpec
from agentrl.api.quantities import parse_quantity
from agentrl.api.wire import ROLLOUT_NODE_RESOURCE
from agentrl.ray_cluster.node import NodeOffer

#: CPUs of the driver's bundle: one asyncio loop.
DRIVER_CPUS: Final = 1.0
#: CPUs of a CPU-only rank's bundle: the torch backend steps on one thread
#: (:func:`agentrl.tiny.policy.single_thread`).
CPU_RANK_CPUS: Final = 1.0
#: CPUs of a rollout worker's bundle: one asyncio loop (what the worker actor reserves).
ROLLOUT_WORKER_CPUS: Final = 1.0
#: Ray custom resource only trainer nodes offer; each trainer-group bundle takes one unit.
TRAINER_NODE_RESOURCE: Final = "agentrl_trainer_node"


class PlacementError(RuntimeError):
    """A placement that cannot be made; the message names the spec field and the fix."""


class Strategy(StrEnum):
    """Ray's placement strategies."""

    STRICT_PACK = "STRICT_PACK"
    PACK = "PACK"
    SPREAD = "SPREAD"
    STRICT_SPREAD = "STRICT_SPREAD"


class Bundle(BaseModel):
    """One bundle of a placement group."""

    model_config = ConfigDict(frozen=True)

    cpu: float = Field(gt=0)
    gpu: int = Field(default=0, ge=0)
    trainer_node: int = Field(default=0, ge=0)
    """Units of :data:`TRAINER_NODE_RESOURCE` (1 in a trainer-group bundle; what a trainer
    node offers in :func:`trainer_node_resources`)."""
    rollout_node: int = Field(default=0, ge=0)
    """Units of :data:`~agentrl.api.wire.ROLLOUT_NODE_RESOURCE` (1 in a rollout
    worker's bundle; the rollout pods offer one per CPU, ``reconcile.rollout``)."""

    def resources(self) -> dict[str, float]:
        """The bundle as Ray spells it (only the keys it asks for)."""
        out = {"CPU": self.cpu}
        if self.gpu:
            out["GPU"] = float(self.gpu)
        if self.trainer_node:
            out[TRAINER_NODE_RESOURCE] = float(self.trainer_node)
        if self.rollout_node:
            out[ROLLOUT_NODE_RESOURCE] = float(self.rollout_node)
        return out

    def node_offer(self) -> NodeOffer:
        """A Ray node offering exactly this bundle (``ray start`` takes whole CPUs)."""
        custom = {k: v for k, v in self.resources().items() if k not in ("CPU", "GPU")}
        return NodeOffer(cpu=int(self.cpu), gpu=self.gpu, custom=custom)


class GroupPlan(BaseModel):
    """One placement group: its bundles, its strategy, and what a user changes when it does
    not fit."""

    name: str
    strategy: Strategy
    bundles: list[Bundle] = Field(min_length=1)
    sized_by: str
    """The spec fields that size the group (named when it cannot be placed)."""
    fix: str
    """What to change when it cannot be placed."""

    def total(self) -> dict[str, float]:
        """The group's resources summed over its bundles."""
        out: dict[str, float] = {}
        for bundle in self.bundles:
            for key, value in bundle.resources().items():
                out[key] = out.get(key, 0.0) + value
        return out


class PlacementPlan(BaseModel):
    """Where a job's processes go (:func:`plan_placement`)."""

    trainer: GroupPlan
    """Bundles ``0 … world_size − 1``: the ranks; bundle ``world_size``: the driver."""
    rollout: GroupPlan
    """One bundle per rollout worker."""
    nodes: int
    ranks_per_node: int

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def driver_bundle(self) -> int:
        """Index of the driver's bundle in the trainer group (the last one)."""
        return self.world_size


def rank_cpus(spec: AgentRLJobSpec) -> float:
    """CPUs of one rank's bundle (see the module docstring).

    Raises:
        PlacementError: ``trainer.cpu`` cannot give every GPU's rank and the driver a CPU.
    """
    trainer = spec.trainer
    if trainer.gpus_per_node == 0:
        return CPU_RANK_CPUS
    pod_cpus = parse_quantity(trainer.cpu)
    share = math.floor((pod_cpus - DRIVER_CPUS) / trainer.gpus_per_node)
    if share < 1:
        need = trainer.gpus_per_node + DRIVER_CPUS
        raise PlacementError(
            f"spec.trainer.cpu ({trainer.cpu}) cannot give each of the {trainer.gpus_per_node} "
            f"ranks of a trainer pod a CPU and the driver its {DRIVER_CPUS:g}: raise "
            f"spec.trainer.cpu to at least {need:g}"
        )
    return float(share)


def plan_placement(job: AgentRLJob) -> PlacementPlan:
    """The placement plan of a job (pure: its name and spec are the only inputs)."""
    spec, job_name = job.spec, job.metadata.name
    trainer = spec.trainer
    ranks_per_node = max(trainer.gpus_per_node, 1)
    gpu = 1 if trainer.gpus_per_node else 0
    rank = Bundle(cpu=rank_cpus(spec), gpu=gpu, trainer_node=1)
    world = trainer.nodes * ranks_per_node
    if trainer.gpus_per_node:
        sizing = (
            f"spec.trainer.nodes ({trainer.nodes}) × gpusPerNode ({trainer.gpus_per_node}) ranks "
            f"of {rank.cpu:g} CPUs (from spec.trainer.cpu {trainer.cpu}) and a GPU each, plus "
            f"the driver's {DRIVER_CPUS:g} CPU"
        )
        fix = (
            "every trainer pod must join Ray offering spec.trainer.gpusPerNode GPUs and "
            "spec.trainer.cpu CPUs: check that the trainer pods are scheduled and running, or "
            "lower spec.trainer.nodes or gpusPerNode"
        )
    else:
        sizing = (
            f"spec.trainer.nodes ({trainer.nodes}) CPU-only ranks (gpusPerNode 0) of "
            f"{rank.cpu:g} CPU each, plus the driver's {DRIVER_CPUS:g} CPU"
        )
        fix = (
            "give Ray more CPUs (agentrl run --num-cpus; on a cluster, every trainer pod must "
            "join) or lower spec.trainer.nodes"
        )
    return PlacementPlan(
        trainer=GroupPlan(
            name=f"{job_name}-trainer",
            strategy=Strategy.STRICT_PACK if trainer.nodes == 1 else Strategy.PACK,
            bundles=[rank] * world + [Bundle(cpu=DRIVER_CPUS, trainer_node=1)],
            sized_by=sizing,
            fix=fix,
        ),
        rollout=GroupPlan(
            name=f"{job_name}-rollout",
            strategy=Strategy.SPREAD,
            bundles=[Bundle(cpu=ROLLOUT_WORKER_CPUS, rollout_node=1)] * spec.rollout.workers,
            sized_by=(
                f"spec.rollout.workers ({spec.rollout.workers}) workers of "
                f"{ROLLOUT_WORKER_CPUS:g} CPU each"
            ),
            fix=(
                "lower spec.rollout.workers, or give Ray more CPUs (agentrl run --num-cpus; on "
                "a cluster, the rollout worker pods must be running and joined)"
            ),
        ),
        nodes=trainer.nodes,
        ranks_per_node=ranks_per_node,
    )


def trainer_node_resources(spec: AgentRLJobSpec) -> Bundle:
    """What one trainer pod offers Ray (``ray start --num-cpus/--num-gpus/--resources``): its
    CPU request in whole CPUs, its GPUs, and room for its ranks and the driver in
    :data:`TRAINER_NODE_RESOURCE`.

    A CPU-only pod (``gpusPerNode: 0``, the torch backend) offers at least the CPUs of its
    bundles (one rank and the driver): a pod that requests less (a CPU cluster sized in
    millicores) would otherwise never fit its own placement group and wait out the placement
    timeout. Only the trainer's bundles can land there (:data:`TRAINER_NODE_RESOURCE`), so the
    extra logical CPU lets no other work in."""
    offered = max(float(math.floor(parse_quantity(spec.trainer.cpu))), 1.0)
    if spec.trainer.gpus_per_node == 0:
        offered = max(offered, CPU_RANK_CPUS + DRIVER_CPUS)
    return Bundle(
        cpu=offered,
        gpu=spec.trainer.gpus_per_node,
        trainer_node=max(spec.trainer.gpus_per_node, 1) + 1,
    )


def local_resources(plan: PlacementPlan) -> dict[str, float]:
    """The custom resources a one-machine Ray offers (``ray.init(resources=...)``): the
    machine is the only trainer node and the only rollout node, so it holds every bundle."""
    return {
        TRAINER_NODE_RESOURCE: float(len(plan.trainer.bundles)),
        ROLLOUT_NODE_RESOURCE: float(len(plan.rollout.bundles)),
    }


def assign_ranks(plan: PlacementPlan, bundle_nodes: Mapping[int, str]) -> list[int]:
    """Rank → bundle index, from the node Ray put each bundle on: the ranks of a node are
    consecutive, the driver's node first, then nodes in the order of their lowest bundle.

    Raises:
        PlacementError: GPU ranks landed unevenly (a node holds other than ``gpusPerNode`` of
            them), which would split tensor-parallel groups over nodes.
    """
    by_node: dict[str, list[int]] = {}
    for index in range(plan.world_size):
        by_node.setdefault(bundle_nodes[index], []).append(index)
    gpu_ranks = plan.trainer.bundles[0].gpu > 0
    uneven = {n: len(b) for n, b in by_node.items() if len(b) != plan.ranks_per_node}
    if gpu_ranks and uneven:
        counts = ", ".join(f"{node[:12]}: {n}" for node, n in sorted(uneven.items()))
        raise PlacementError(
            f"trainer ranks landed unevenly over Ray nodes ({counts}; each node must hold "
            f"spec.trainer.gpusPerNode = {plan.ranks_per_node}): every trainer pod must offer "
            "Ray exactly gpusPerNode GPUs and nothing else on the Ray cluster may hold GPUs"
        )
    driver_node = bundle_nodes[plan.driver_bundle]
    order = sorted(by_node, key=lambda node: (node != driver_node, min(by_node[node])))
    return [index for node in order for index in by_node[node]]


# -- on a running Ray ------------------------------------------------------------------------


def _cluster_offer() -> tuple[dict[str, float], dict[str, float]]:
    """What the Ray cluster offers in all, and on its largest node (by CPUs)."""
    import ray

    keys = ("CPU", "GPU", TRAINER_NODE_RESOURCE)
    nodes: list[dict[str, Any]] = [
        n.get("Resources", {})
        for n in ray.nodes()  # type: ignore[no-untyped-call]
        if n.get("Alive")
    ]
    total: dict[str, float] = {}
    for resources in nodes:
        for key in keys:
            if key in resources:
                total[key] = total.get(key, 0.0) + float(resources[key])
    largest: dict[str, Any] = max(nodes, key=lambda r: float(r.get("CPU", 0.0)), default={})
    return total, {k: float(largest[k]) for k in keys if k in largest}


def create_group(group: GroupPlan, *, timeout_s: float) -> Any:
    """Create the placement group of ``group`` and wait until Ray has reserved every bundle.

    Raises:
        PlacementError: not ready within ``timeout_s``; the group is removed and the message
            names what it needs, what the cluster offers, the spec fields and the fix.
    """
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group(
        [b.resources() for b in group.bundles], strategy=group.strategy.value, name=group.name
    )
    try:
        ray.get(pg.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(pg)
        total, largest = _cluster_offer()
        where = (
            f"on one node (its largest offers {_fmt(largest)})"
            if group.strategy == Strategy.STRICT_PACK
            else f"(the cluster offers {_fmt(total)} in all)"
        )
        raise PlacementError(
            f"placement group {group.name} was not ready within {timeout_s:g}s: it needs "
            f"{_fmt(group.total())} in {len(group.bundles)} bundles {where}. It is sized by "
            f"{group.sized_by}. Fix: {group.fix}."
        ) from None
    return pg


def _fmt(resources: Mapping[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in sorted(resources.items())) or "nothing"


def bundle_nodes(pg: Any) -> dict[int, str]:
    """Bundle index → the Ray node holding it (of a ready group)."""
    from ray.util.placement_group import placement_group_table

    return {int(k): str(v) for k, v in placement_group_table(pg)["bundles_to_node_id"].items()}


def in_bundle(pg: Any, index: int) -> Any:
    """The scheduling strategy that puts an actor in bundle ``index`` of ``pg`` (tasks it
    starts stay in the group)."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(
        placement_group=pg,
        placement_group_bundle_index=index,
        placement_group_capture_child_tasks=True,
    )


@dataclass
class Placement:
    """A plan's placement groups on a running Ray (:func:`place`)."""

    plan: PlacementPlan
    trainer: Any
    """The trainer group (ranks and driver)."""
    rank_bundles: list[int]
    """Rank → bundle index in the trainer group (:func:`assign_ranks`)."""
    rollout: Any | None = None
    """The rollout group; None when the rollout tier runs in the driver's process."""
    actors: list[Any] = field(default_factory=list)
    """Actors started in the groups (killed by :meth:`remove`)."""

    def remove(self) -> None:
        """Kill the actors started here and remove the groups (idempotent)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor in self.actors:
            ray.kill(actor)
        self.actors.clear()
        for pg in (self.trainer, self.rollout):
            if pg is not None:
                remove_placement_group(pg)
        self.trainer = self.rollout = None


def place(plan: PlacementPlan, *, timeout_s: float, rollout: bool = True) -> Placement:
    """Create the plan's groups (the rollout group only when ``rollout``), each given
    ``timeout_s`` to become ready, and number the ranks.

    Raises:
        PlacementError: a group was not ready in time, or the ranks landed unevenly; nothing
            is left behind.
    """
    from ray.util.placement_group import remove_placement_group

    trainer = create_group(plan.trainer, timeout_s=timeout_s)
    try:
        if plan.trainer.strategy == Strategy.STRICT_PACK:
            ranks = list(range(plan.world_size))  # one node: bundle r is rank r
        else:
            ranks = assign_ranks(plan, bundle_nodes(trainer))
        group = create_group(plan.rollout, timeout_s=timeout_s) if rollout else None
    except BaseException:
        remove_placement_group(trainer)
        raise
    return Placement(plan=plan, trainer=trainer, rank_bundles=ranks, rollout=group)


def _start(
    cls: type, bundle: Bundle, strategy: Any, args: Sequence[Any], *, max_concurrency: int = 1
) -> Any:
    import ray

    return (
        ray.remote(cls)
        .options(
            num_cpus=bundle.cpu,
            num_gpus=bundle.gpu,
            scheduling_strategy=strategy,
            max_concurrency=max_concurrency,
        )
        .remote(*args)
    )


def start_trainer_ranks(placement: Placement, cls: type, *args: Any) -> list[Any]:
    """One ``cls`` actor per rank in its bundle, constructed as ``cls(rank, world_size,
    ranks_per_node, *args)``; handles in rank order."""
    plan = placement.plan
    handles = []
    for rank, index in enumerate(placement.rank_bundles):
        handle = _start(
            cls,
            plan.trainer.bundles[index],
            in_bundle(placement.trainer, index),
            (rank, plan.world_size, plan.ranks_per_node, *args),
        )
        placement.actors.append(handle)
        handles.append(handle)
    return handles


def start_driver(placement: Placement, cls: type, *args: Any) -> Any:
    """The driver, a ``cls(*args)`` actor, in its own bundle of the trainer group; two calls
    may run at once (its ``run`` and a ``request_stop`` that pod 0's SIGTERM sends it)."""
    index = placement.plan.driver_bundle
    handle = _start(
        cls,
        placement.plan.trainer.bundles[index],
        in_bundle(placement.trainer, index),
        args,
        max_concurrency=2,
    )
    placement.actors.append(handle)
    return handle


def rollout_strategies(placement: Placement) -> list[Any]:
    """One scheduling strategy per rollout worker: worker ``i`` in bundle ``i``."""
    if placement.rollout is None:
        raise ValueError("this placement has no rollout group (place(..., rollout=True))")
    return [in_bundle(placement.rollout, i) for i in range(len(placement.plan.rollout.bundles))]


class ActorPlacement(BaseModel):
    """Where an actor runs, as Ray's raylet granted it (:func:`current_placement`)."""

    placement_group_id: str | None
    bundle_index: int | None
    """From the names of the resources Ray granted the worker (``CPU_group_<i>_<pg>``)."""
    node_id: str
    pid: int
    gpu_ids: list[str] = Field(default_factory=list)


_GROUP_RESOURCE = re.compile(r"^[A-Za-z]+_group_(\d+)_([0-9a-f]+)$")


def current_placement() -> ActorPlacement:
    """Where the calling actor runs: its placement group and bundle as the raylet granted
    them (not as the caller asked), its node, its process and its GPUs."""
    import ray

    context = ray.get_runtime_context()
    bundle: int | None = None
    # The raylet grants a bundle's resources under names carrying the bundle's index.
    for name in context.worker.core_worker.resource_ids():
        match = _GROUP_RESOURCE.match(name)
        if match:
            bundle = int(match.group(1))
            break
    return ActorPlacement(
        placement_group_id=context.get_placement_group_id(),
        bundle_index=bundle,
        node_id=context.get_node_id(),
        pid=os.getpid(),
        gpu_ids=[str(g) for g in context.get_accelerator_ids().get("GPU", [])],
    )
