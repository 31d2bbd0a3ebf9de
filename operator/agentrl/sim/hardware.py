"""GPU products the planner knows: memory, bandwidth, and how their node label reads.

The GPU is chosen from ``spec.inference.nodeSelector`` (``amd.com/gpu.product-name``, written by
AMD's node labeller, or ``nvidia.com/gpu.product``); without one the planner assumes the default
product of the parameter file and says so. Memory is in GiB because that is what HBM stacks hold
and what the node labeller reports (``amd.com/gpu.vram=288G`` is 288 GiB ≈ 309 GB).

Called by ``agentrl.sim.static_plan`` and the engine model of ``agentrl.sim.simulation``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

GIB = 2**30

#: Node-selector keys naming a GPU product, in the order they are consulted.
PRODUCT_LABELS = ("amd.com/gpu.product-name", "nvidia.com/gpu.product")


class GPUProduct(BaseModel):
    """One accelerator model."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    name: str
    """Short name (``MI355X``); matched as a substring of the node label."""
    memory_gib: float = Field(gt=0)
    """HBM per GPU in GiB."""
    hbm_tb_per_s: float = Field(gt=0)
    """Peak HBM bandwidth (TB/s, decimal)."""
    source: str
    """Where the figures come from."""

    @property
    def memory_bytes(self) -> float:
        """HBM per GPU in bytes."""
        return self.memory_gib * GIB


#: Products by short name. Longer names first so ``MI355X`` is not taken for ``MI35``.
GPU_PRODUCTS: dict[str, GPUProduct] = {
    p.name: p
    for p in (
        GPUProduct(name="MI355X", memory_gib=288, hbm_tb_per_s=8.0,
                   source="seed report (288 GB HBM3E); AMD datasheet 8 TB/s"),
        GPUProduct(name="MI350X", memory_gib=288, hbm_tb_per_s=8.0, source="AMD datasheet"),
        GPUProduct(name="MI325X", memory_gib=256, hbm_tb_per_s=6.0, source="AMD datasheet"),
        GPUProduct(name="MI300X", memory_gib=192, hbm_tb_per_s=5.3,
                   source="lmsys.org/blog/2026-02-11-Qwen-latency (192 GB HBM3, 5.3 TB/s)"),
        GPUProduct(name="H200", memory_gib=141, hbm_tb_per_s=4.8, source="NVIDIA datasheet"),
        GPUProduct(name="H100", memory_gib=80, hbm_tb_per_s=3.35, source="NVIDIA datasheet"),
    )
}


class UnknownGPUError(ValueError):
    """A product label that matches no known GPU."""


def gpu_by_name(name: str) -> GPUProduct:
    """A product by its short name or any label that contains it (``AMD_Instinct_MI355X``)."""
    upper = name.upper()
    for key in sorted(GPU_PRODUCTS, key=len, reverse=True):
        if key in upper:
            return GPU_PRODUCTS[key]
    raise UnknownGPUError(
        f"GPU product {name!r} is not in the planner's table ({', '.join(GPU_PRODUCTS)})"
    )


def gpu_from_node_selector(selector: dict[str, str]) -> GPUProduct | None:
    """The product a node selector pins engines to, or None when it names none."""
    for label in PRODUCT_LABELS:
        if label in selector:
            return gpu_by_name(selector[label])
    return None
