"""The shape of the local cluster: how many simulated GPU and CPU nodes, and what they look like.

The default is 4 GPU nodes shaped like MI355X servers (8 GPUs each, labelled the way the AMD
node labeller labels them) and 2 CPU nodes for sandboxes. ``--gpu-nodes``/``--cpu-nodes`` or a
YAML profile (``--profile FILE``, the fields of :class:`ClusterProfile`) change it.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field


class NodeShape(BaseModel):
    """One kind of simulated node."""

    model_config = ConfigDict(extra="forbid")

    count: int = Field(ge=0, le=1000)
    """How many nodes of this shape."""
    cpu: str = "256"
    """CPU capacity (cores)."""
    memory: str = "3Ti"
    """Memory capacity."""
    pods: int = Field(default=250, ge=1, le=100_000)
    """Pod capacity."""
    gpus: int = Field(default=0, ge=0, le=64)
    """Capacity of the GPU extended resource."""
    gpu_resource: str = "amd.com/gpu"
    """Extended resource name of the GPUs."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Extra node labels (the AMD node labeller's for GPU nodes)."""
    taints: list[dict[str, str]] = Field(default_factory=list)
    """Node taints (key, value, effect)."""


#: Labels the AMD GPU operator's node labeller writes on an MI355X node (device ID 0x75a3;
#: 288 GB HBM3E per GPU; CDNA4 / gfx950).
MI355X_LABELS = {
    "amd.com/gpu.product-name": "AMD_Instinct_MI355X",
    "amd.com/gpu.family": "AI",
    "amd.com/gpu.device-id": "75a3",
    "amd.com/gpu.vram": "288G",
    "amd.com/gpu.simd-count": "1024",
    "amd.com/gpu.cu-count": "256",
    "amd.com/gpu.driver-version": "6.14.14",
    "amd.com/gpu.firmware": "rocm-7.2.2",
    "amd.com/gpu.compute-partitioning": "spx",
    "amd.com/gpu.memory-partitioning": "nps1",
    "node.kubernetes.io/instance-type": "mi355x-8gpu",
    "agentrl.dev/node-pool": "gpu",
}

CPU_NODE_LABELS = {
    "node.kubernetes.io/instance-type": "cpu-64",
    "agentrl.dev/node-pool": "sandbox",
}


def default_gpu_shape(count: int = 4) -> NodeShape:
    """An MI355X server: 8 GPUs, 2 × 64-core EPYC (256 threads), 3 TiB of memory."""
    return NodeShape(
        count=count, cpu="256", memory="3Ti", pods=250, gpus=8, labels=dict(MI355X_LABELS)
    )


def default_cpu_shape(count: int = 2) -> NodeShape:
    """A CPU node for sandboxes: 64 cores, 512 GiB."""
    return NodeShape(count=count, cpu="64", memory="512Gi", pods=500, labels=dict(CPU_NODE_LABELS))


class ClusterProfile(BaseModel):
    """A cluster shape: node pools by name."""

    model_config = ConfigDict(extra="forbid")

    gpu: NodeShape = Field(default_factory=default_gpu_shape)
    """GPU nodes (named gpu-0, gpu-1, ...)."""
    cpu: NodeShape = Field(default_factory=default_cpu_shape)
    """CPU nodes for sandboxes (named cpu-0, ...)."""

    @classmethod
    def load(cls, path: Path) -> ClusterProfile:
        """Read a YAML profile; errors name the field."""
        data = yaml.safe_load(path.read_text()) or {}
        return cls.model_validate(data)

    def with_counts(self, *, gpu_nodes: int | None, cpu_nodes: int | None) -> ClusterProfile:
        """This profile with node counts overridden from the command line."""
        out = self.model_copy(deep=True)
        if gpu_nodes is not None:
            out.gpu.count = gpu_nodes
        if cpu_nodes is not None:
            out.cpu.count = cpu_nodes
        return out
