"""Node manifests for kwok-managed simulated nodes (pure)."""

from __future__ import annotations

from typing import Any

from agentrl.devcluster.profile import ClusterProfile, NodeShape

#: kwok manages only nodes carrying this annotation (``--manage-nodes-with-annotation-selector``)
KWOK_ANNOTATION = "kwok.x-k8s.io/node"


def node_manifest(name: str, shape: NodeShape, pool: str) -> dict[str, Any]:
    """A Node object kwok will keep Ready, with capacity and labels from ``shape``."""
    capacity: dict[str, str] = {
        "cpu": shape.cpu,
        "memory": shape.memory,
        "pods": str(shape.pods),
        "ephemeral-storage": "2Ti",
    }
    if shape.gpus:
        capacity[shape.gpu_resource] = str(shape.gpus)
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        **shape.labels,
    }
    if shape.gpus:
        labels["amd.com/gpu.count"] = str(shape.gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {KWOK_ANNOTATION: "fake", "agentrl.dev/pool": pool},
        },
        "spec": {"taints": list(shape.taints)},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def nodes_for(profile: ClusterProfile) -> list[dict[str, Any]]:
    """Every node of the profile: gpu-0..N-1, then cpu-0..M-1."""
    out = [node_manifest(f"gpu-{i}", profile.gpu, "gpu") for i in range(profile.gpu.count)]
    out += [node_manifest(f"cpu-{i}", profile.cpu, "cpu") for i in range(profile.cpu.count)]
    return out
