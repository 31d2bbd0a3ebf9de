"""GPU preflight: can the cluster's nodes ever hold the job's GPU pods? The ``GPUsAvailable``
condition.

Pure: :func:`check` takes the job and the Nodes the controller listed
(:class:`agentrl.reconcile.nodes.NodesSeen`) and says whether the nodes that match the job's GPU
placement (``spec.inference.nodeSelector``, ``tolerations``, not cordoned, advertising
``spec.inference.gpuResource``) have the *allocatable* GPUs for every trainer pod
(``trainer.nodes`` × ``trainer.gpusPerNode``) and every engine (``inference.engines`` ×
``gpusPerEngine``) at once, each pod on one node. When they do not, the message names the
shortfall the way a cluster administrator sizes a node pool: "needs 4 nodes with 8 amd.com/gpu
labelled amd.com/gpu.product-name=AMD_Instinct_MI355X ..., the cluster has 3 matching nodes ...",
followed by the nodes that do not match and why.

It is a capacity check, not a schedule: it asks whether the job fits the matching nodes if it
had them to itself. What other workloads hold right now, CPU and memory, is the scheduler's to
judge, and the scheduler's own words reach the status through the pods (``Unschedulable``). The
operator creates the children whatever the verdict, so a cluster autoscaler sees pending pods
and can add nodes.

Called by ``status.compute_status`` (the condition) and by the controller
(:func:`needs_nodes`: it lists Nodes only while some GPU pod of the job is not yet scheduled).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

from agentrl.api import AgentRLJob, ConditionType, Reason
from agentrl.api.engine import Toleration
from agentrl.reconcile.constants import Component, ExtraReason
from agentrl.reconcile.nodes import BLOCKING_EFFECTS, NodesSeen, NodeTaint, ObservedNode
from agentrl.reconcile.observed import Observed

#: Nodes named per cause in a message; more are counted, not named.
NAMED_NODES = 3


class Preflight(BaseModel):
    """The ``GPUsAvailable`` verdict."""

    model_config = ConfigDict(frozen=True)

    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str


@dataclass(frozen=True)
class PodGroup:
    """Pods of one kind that request GPUs: ``count`` pods of ``gpus`` each."""

    what: str
    """``trainer pod`` or ``engine``."""
    count: int
    gpus: int

    def describe(self, resource: str) -> str:
        plural = "" if self.count == 1 else "s"
        return f"{self.count} {self.what}{plural} with {self.gpus} {resource}"


@dataclass(frozen=True)
class GPUDemand:
    """What the job asks of GPU nodes."""

    resource: str
    node_selector: dict[str, str]
    tolerations: tuple[Toleration, ...]
    trainer: PodGroup
    engines: PodGroup

    @property
    def groups(self) -> tuple[PodGroup, ...]:
        """The groups that request GPUs (a CPU-only trainer or tiny engines drop out)."""
        return tuple(g for g in (self.trainer, self.engines) if g.count and g.gpus)

    @property
    def total(self) -> int:
        return sum(g.count * g.gpus for g in self.groups)

    def describe(self) -> str:
        """``1 trainer pod with 8 amd.com/gpu and 24 engines with 1 amd.com/gpu (32 in all)``."""
        parts = " and ".join(g.describe(self.resource) for g in self.groups)
        return f"{parts} ({self.total} in all)" if len(self.groups) > 1 else parts

    def placement(self) -> str:
        """`` labelled k=v, ...`` (empty without a node selector)."""
        if not self.node_selector:
            return ""
        labels = ", ".join(f"{k}={v}" for k, v in sorted(self.node_selector.items()))
        return f" labelled {labels}"


def gpu_demand(job: AgentRLJob) -> GPUDemand:
    """The job's GPU pods. Engines and trainer pods share ``spec.inference``'s GPU resource,
    node selector and tolerations (``engine.gpu_node_placement``)."""
    inference, trainer = job.spec.inference, job.spec.trainer
    return GPUDemand(
        resource=inference.gpu_resource,
        node_selector=dict(inference.node_selector),
        tolerations=tuple(inference.tolerations),
        trainer=PodGroup("trainer pod", trainer.nodes, trainer.gpus_per_node),
        engines=PodGroup("engine", inference.engines, inference.gpus_per_engine),
    )


# ---- which nodes match -----------------------------------------------------------------------


def tolerates(toleration: Toleration, taint: NodeTaint) -> bool:
    """core/v1 ``Toleration.ToleratesTaint``: effects match (an unset effect matches all), an
    empty key with ``Exists`` matches every key, ``Exists`` any value, ``Equal`` the value."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if not toleration.key:
        return toleration.operator == "Exists"
    if toleration.key != taint.key:
        return False
    return toleration.operator == "Exists" or (toleration.value or "") == taint.value


def mismatch(node: ObservedNode, demand: GPUDemand) -> str | None:
    """Why ``node`` cannot take the job's GPU pods, or None when it can."""
    if node.unschedulable:
        return "cordoned"
    for key, value in sorted(demand.node_selector.items()):
        if node.labels.get(key) != value:
            return f"not labelled {key}={value}"
    for taint in node.taints:
        if taint.effect in BLOCKING_EFFECTS and not any(
            tolerates(t, taint) for t in demand.tolerations
        ):
            return f"taint {taint} not tolerated"
    if node.gpus(demand.resource) <= 0:
        return f"no allocatable {demand.resource}"
    return None


# ---- does it fit -----------------------------------------------------------------------------


def fits(capacities: Sequence[int], demand: GPUDemand) -> bool:
    """Whether ``count`` pods of each GPU group can be placed on nodes with these allocatable
    GPUs, each pod whole on one node.

    With ``a`` GPUs per trainer pod and ``b`` per engine: when ``b`` divides ``a`` (1, 2, 4 or 8
    GPUs per engine beside 8-GPU trainer pods), a trainer pod costs exactly ``a / b`` engine
    slots wherever it goes (``(c - t·a) // b == c // b - t·a/b``), so counting suffices.
    Otherwise a dynamic programme over nodes finds the placement of the trainer pods that leaves
    the most engine slots: nodes × trainer pods × trainer pods per node steps (about 2 s for an
    absurd 1024 trainer pods of 3 GPUs on 2000 nodes; milliseconds for real layouts).
    """
    trainer, engines = demand.trainer, demand.engines
    t_count = trainer.count if trainer.gpus else 0
    e_count = engines.count if engines.gpus else 0
    a, b = trainer.gpus, engines.gpus
    if t_count and sum(c // a for c in capacities) < t_count:
        return False
    if not e_count:
        return True
    slots = sum(c // b for c in capacities)
    if not t_count:
        return slots >= e_count
    if a % b == 0:
        return slots - t_count * (a // b) >= e_count
    return _most_slots(capacities, t_count, a, b) >= e_count


def _most_slots(capacities: Sequence[int], trainers: int, a: int, b: int) -> int:
    """The most ``b``-GPU slots left once ``trainers`` pods of ``a`` GPUs are placed (-1 when
    they cannot be)."""
    best: list[int] = [0] + [-1] * trainers  # best[k]: most slots with k trainer pods placed
    for c in capacities:
        new = [-1] * (trainers + 1)
        for k, slots in enumerate(best):
            if slots < 0:
                continue
            for t in range(min(c // a, trainers - k) + 1):
                new[k + t] = max(new[k + t], slots + (c - t * a) // b)
        best = new
    return best[trainers]


def nodes_needed(capacity: int, demand: GPUDemand) -> int:
    """The fewest nodes of ``capacity`` GPUs that hold every GPU pod (``capacity`` is at least
    the largest pod's GPUs, so one node per pod always does)."""
    low = max(1, -(-demand.total // capacity))
    high = sum(g.count for g in demand.groups)
    while low < high:
        mid = (low + high) // 2
        if fits([capacity] * mid, demand):
            high = mid
        else:
            low = mid + 1
    return low


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _mismatches(others: list[tuple[ObservedNode, str]]) -> str:
    """``2 nodes not labelled k=v (cpu-0, cpu-1); 1 node cordoned (gpu-3)``."""
    by_cause: dict[str, list[str]] = {}
    for node, cause in others:
        by_cause.setdefault(cause, []).append(node.name)
    parts = []
    for cause, names in by_cause.items():
        shown = ", ".join(sorted(names)[:NAMED_NODES])
        more = f", {len(names) - NAMED_NODES} more" if len(names) > NAMED_NODES else ""
        parts.append(f"{_plural(len(names), 'node')} {cause} ({shown}{more})")
    return "; ".join(parts)


def check(job: AgentRLJob, seen: NodesSeen) -> Preflight:
    """Whether the listed nodes can hold the job's GPU pods, naming the shortfall when not."""
    demand = gpu_demand(job)
    if not demand.groups:
        return no_gpus(job)
    if seen.error is not None:
        return unreadable(seen.error)
    matching: list[ObservedNode] = []
    others: list[tuple[ObservedNode, str]] = []
    for node in sorted(seen.nodes, key=lambda n: n.name):
        cause = mismatch(node, demand)
        if cause is None:
            matching.append(node)
        else:
            others.append((node, cause))
    capacities = [n.gpus(demand.resource) for n in matching]
    resource = demand.resource
    have = f"{_plural(len(matching), 'matching node')}"
    if matching:
        have += f" with {sum(capacities)} {resource} (at most {max(capacities)} on one node)"
    if fits(capacities, demand):
        return Preflight(
            status="True",
            reason=Reason.GPU_CAPACITY_SUFFICIENT,
            message=f"the cluster has {have}: room for {demand.describe()}",
        )
    largest_pod = max(g.gpus for g in demand.groups)
    size = max([largest_pod, *capacities])
    needed = nodes_needed(size, demand)
    message = (
        f"needs {_plural(needed, 'node')} with {size} {resource}{demand.placement()} for "
        f"{demand.describe()}; the cluster has {have}"
    )
    if others:
        message += f"; not matching: {_mismatches(others)}"
    return Preflight(status="False", reason=Reason.GPU_CAPACITY_INSUFFICIENT, message=message)


# ---- the condition over a job's life ---------------------------------------------------------


def no_gpus(job: AgentRLJob) -> Preflight:
    """The verdict of a job that requests no GPUs (tiny engines and the torch trainer)."""
    return Preflight(
        status="True",
        reason=Reason.NO_GPUS_REQUESTED,
        message=f"the job requests no {job.spec.inference.gpu_resource}",
    )


def unreadable(error: str) -> Preflight:
    """The verdict when the operator may not list Nodes."""
    return Preflight(
        status="Unknown",
        reason=Reason.NODES_UNREADABLE,
        message=f"could not list the cluster's nodes to check GPU capacity ({error}); grant "
        "the operator list on nodes (the chart's ClusterRole does) for this check",
    )


def _scheduled(observed: Observed, component: Component) -> int:
    return sum(
        1
        for p in observed.pods_of(component)
        if (c := p.condition("PodScheduled")) is not None and c.status == "True"
    )


def gpu_pods_scheduled(job: AgentRLJob, observed: Observed) -> tuple[int, int]:
    """(scheduled, wanted) GPU pods of the job: trainer pods and engines that request GPUs."""
    demand = gpu_demand(job)
    scheduled = wanted = 0
    pairs = ((demand.trainer, Component.TRAINER), (demand.engines, Component.ENGINE))
    for group, component in pairs:
        if group.count and group.gpus:
            wanted += group.count
            scheduled += min(group.count, _scheduled(observed, component))
    return scheduled, wanted


def _finished(job: AgentRLJob) -> bool:
    conditions = job.status.conditions if job.status else []
    return any(
        c.type in (ConditionType.COMPLETE.value, ConditionType.FAILED.value) and c.status == "True"
        for c in conditions
    )


def needs_nodes(job: AgentRLJob, observed: Observed) -> bool:
    """Whether the controller should list Nodes for this reconcile: the job runs, requests
    GPUs, and some of its GPU pods are not scheduled yet (once they all are, the nodes have
    shown they can hold them, and a large cluster's Node list is not read for nothing)."""
    if job.spec.suspend or _finished(job):
        return False
    scheduled, wanted = gpu_pods_scheduled(job, observed)
    return scheduled < wanted


def verdict(job: AgentRLJob, observed: Observed, *, suspended: bool, finished: bool) -> Preflight:
    """``GPUsAvailable`` for this reconcile."""
    if finished:
        return Preflight(
            status="Unknown",
            reason=ExtraReason.JOB_FINISHED,
            message="not checked: the job has finished",
        )
    if suspended:
        return Preflight(
            status="Unknown",
            reason=Reason.SUSPENDED,
            message="not checked while the job is suspended",
        )
    demand = gpu_demand(job)
    if not demand.groups:
        return no_gpus(job)
    scheduled, wanted = gpu_pods_scheduled(job, observed)
    if scheduled >= wanted:
        return Preflight(
            status="True",
            reason=Reason.GPU_CAPACITY_SUFFICIENT,
            message=f"all {wanted} GPU pods are scheduled: {demand.describe()}",
        )
    if observed.nodes is None:
        return Preflight(
            status="Unknown",
            reason=Reason.CAPACITY_NOT_CHECKED,
            message="the cluster's nodes were not read",
        )
    return check(job, observed.nodes)
