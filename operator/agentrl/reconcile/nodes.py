"""What the controller saw of the cluster's Nodes: a typed snapshot, the input of the GPU
preflight (:mod:`agentrl.reconcile.preflight`).

The controller lists the Nodes (cluster-scoped: the chart's ClusterRole grants ``list`` in both
install modes) only while some GPU pod of a job is not yet scheduled, and hands the raw objects
to :func:`nodes_seen`. When the list is refused (an operator bound to a Role without ``nodes``,
as a hand-made namespaced install may be), it hands the API server's words to
:func:`nodes_unreadable` instead: the preflight then says it could not look, and the reconcile
goes on.

Only what the scheduler's node filters need is kept: labels, taints, ``spec.unschedulable`` and
the allocatable extended resources.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentrl.api.quantities import parse_quantity

#: Taint effects that keep a pod off a node at scheduling time (PreferNoSchedule only scores).
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


class NodeTaint(BaseModel):
    """A node taint."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    value: str = ""
    effect: str

    def __str__(self) -> str:
        pair = f"{self.key}={self.value}" if self.value else self.key
        return f"{pair}:{self.effect}"


class ObservedNode(BaseModel):
    """A Node, as far as GPU placement is concerned."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    taints: tuple[NodeTaint, ...] = ()
    unschedulable: bool = False
    """``spec.unschedulable`` (cordoned)."""
    allocatable: dict[str, int] = Field(default_factory=dict)
    """Allocatable whole units of each resource that is not cpu, memory, pods or storage (the
    extended resources, ``amd.com/gpu`` among them)."""

    def gpus(self, resource: str) -> int:
        """Allocatable units of ``resource`` (0 when the node does not advertise it)."""
        return self.allocatable.get(resource, 0)


class NodesSeen(BaseModel):
    """The result of listing the Nodes: the nodes, or why they could not be read."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    nodes: tuple[ObservedNode, ...] = ()
    error: str | None = None
    """The API server's refusal (e.g. 403 Forbidden) when the list failed; ``nodes`` is then
    empty and means nothing."""


#: Resources every node has that are not devices.
_CORE_RESOURCES = frozenset({"cpu", "memory", "pods", "ephemeral-storage", "storage"})


def _whole_units(value: Any) -> int:
    try:
        return int(parse_quantity(value if isinstance(value, int | float) else str(value)))
    except ValueError:
        return 0


def node_from_object(obj: Mapping[str, Any]) -> ObservedNode:
    """A Node as the API server returns it → :class:`ObservedNode`."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    allocatable = (obj.get("status") or {}).get("allocatable") or {}
    return ObservedNode(
        name=str(meta.get("name", "")),
        labels=dict(meta.get("labels") or {}),
        taints=tuple(
            NodeTaint(
                key=str(t.get("key", "")),
                value=str(t.get("value") or ""),
                effect=str(t.get("effect", "")),
            )
            for t in spec.get("taints") or ()
        ),
        unschedulable=bool(spec.get("unschedulable", False)),
        allocatable={
            name: _whole_units(value)
            for name, value in allocatable.items()
            if name not in _CORE_RESOURCES and not name.startswith("hugepages-")
        },
    )


def nodes_seen(objects: Iterable[Mapping[str, Any]]) -> NodesSeen:
    """The snapshot of every Node listed."""
    return NodesSeen(nodes=tuple(node_from_object(o) for o in objects))


def nodes_unreadable(error: str) -> NodesSeen:
    """The snapshot when listing Nodes was refused."""
    return NodesSeen(error=error)
