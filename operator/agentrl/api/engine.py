"""``spec.inference``: the SGLang engines, their GPUs, caps and watchdog."""

from __future__ import annotations

from pydantic import Field

from agentrl.api.base import LabelStr, ManifestModel, ShortStr
from agentrl.api.quantities import Quantity
from agentrl.api.rules import Rule

#: Flags ``extraArgs`` may never carry: HIP graphs stay on, and the flags the operator derives
#: from typed fields must be set through those fields.
FORBIDDEN_EXTRA_ARGS = ("--disable-cuda-graph", "--disable-cuda-graph-padding")


class Toleration(ManifestModel):
    """A pod toleration (the subset of core/v1 Toleration GPU nodes need)."""

    key: str | None = Field(default=None, max_length=253)
    """Taint key to tolerate; empty with operator Exists tolerates everything."""
    operator: str = Field(default="Equal", pattern=r"^(Equal|Exists)$")
    """``Equal`` or ``Exists``."""
    value: str | None = Field(default=None, max_length=253)
    """Taint value for ``Equal``."""
    effect: str | None = Field(default=None, pattern=r"^(NoSchedule|PreferNoSchedule|NoExecute)$")
    """Taint effect to tolerate; unset tolerates all effects."""


class GraphSpec(ManifestModel):
    """HIP/CUDA graphs. They are always on: disabling them halves decode throughput."""

    max_batch_size: int | None = Field(default=None, ge=1, le=4096)
    """Largest batch captured in a graph (``--cuda-graph-max-bs``); unset captures up to
    ``maxRunningRequests``."""


class WatchdogSpec(ManifestModel):
    """The sidecar that restarts an engine on a GPU fault, with graphs still on."""

    enabled: bool = True
    """Run the watchdog sidecar next to each engine."""
    health_timeout_seconds: int = Field(default=60, ge=1, le=3600)
    """A ``/health_generate`` slower than this counts as a failed probe (seconds)."""
    health_interval_seconds: int = Field(default=15, ge=1, le=3600)
    """Seconds between ``/health_generate`` probes."""
    failed_probes_before_restart: int = Field(default=3, ge=1, le=100)
    """Consecutive failed probes before the engine is restarted."""
    stall_seconds: int = Field(default=120, ge=10, le=86400)
    """Running requests but no generated token for this long is a stall (seconds)."""
    max_restarts: int = Field(default=5, ge=1, le=100)
    """More restarts than this within ``restartWindowSeconds`` trips the crash-loop guard
    (Degraded condition and an Event; graphs stay on)."""
    restart_window_seconds: int = Field(default=3600, ge=60, le=604800)
    """The crash-loop guard's window (seconds)."""


class InferenceSpec(ManifestModel):
    """``spec.inference``: SGLang engines, one per pod."""

    engines: int = Field(default=1, ge=1, le=1024)
    """Number of engine replicas (pods)."""
    gpus_per_engine: int = Field(default=1, ge=1, le=8)
    """GPUs per engine = tensor-parallel size (``--tp-size``)."""
    context_length: int = Field(default=65536, ge=512, le=1_048_576)
    """Engine-side context cap in tokens (``--context-length``). Mandatory: without it runaway
    generations fill the KV cache and stall every other request on the engine."""
    max_running_requests: int = Field(default=64, ge=1, le=4096)
    """Requests an engine decodes at once (``--max-running-requests``)."""
    mem_fraction_static: float = Field(default=0.85, gt=0.1, lt=1.0)
    """Share of GPU memory for weights plus KV cache (``--mem-fraction-static``)."""
    chunked_prefill_size: int | None = Field(default=None, ge=256, le=1_048_576)
    """``--chunked-prefill-size`` in tokens; unset keeps SGLang's default."""
    kv_cache_dtype: str = Field(default="auto", pattern=r"^(auto|fp8_e4m3|fp8_e5m2|bfloat16)$")
    """``--kv-cache-dtype``."""
    graphs: GraphSpec = Field(default_factory=GraphSpec)
    """HIP graph capture settings (always enabled)."""
    gpu_resource: str = Field(
        default="amd.com/gpu", pattern=r"^([a-z0-9.-]+/)?[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$"
    )
    """Extended resource name the engines request (``amd.com/gpu``; ``nvidia.com/gpu``)."""
    node_selector: dict[LabelStr, LabelStr] = Field(default_factory=dict, max_length=32)
    """Node labels the engines require, e.g. ``amd.com/gpu.product-name: AMD_Instinct_MI355X``."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    """Tolerations for tainted GPU nodes."""
    image: str = Field(default="ghcr.io/agentrl/sglang-engine:0.1.0", min_length=1, max_length=512)
    """The engine image (``images/sglang-engine``)."""
    cpu: Quantity = "16"
    """CPU request per engine pod."""
    memory: Quantity = "256Gi"
    """Memory request per engine pod."""
    shm_size: Quantity = "64Gi"
    """Size of the memory-backed /dev/shm."""
    startup_timeout_seconds: int = Field(default=1800, ge=60, le=14400)
    """How long model load plus graph capture may take before the pod is restarted (s)."""
    watchdog: WatchdogSpec = Field(default_factory=WatchdogSpec)
    """The GPU fault watchdog sidecar."""
    extra_args: list[ShortStr] = Field(default_factory=list, max_length=64)
    """Extra ``sglang.launch_server`` flags, appended verbatim. Flags that disable graphs are
    refused."""

    cel_rules = (
        Rule(
            # refuses any graph-disabling flag in extraArgs (the API server and validate)
            cel="!self.extraArgs.exists(a, a.startsWith('--disable-cuda-graph'))",  # refused
            message_expression="'--disable-cuda-graph is refused: HIP graphs stay on "
            "(disabling them halves throughput); remove it from extraArgs'",
            field_path=".extraArgs",
            check=lambda s: (
                not any(
                    a.startswith("--disable-cuda-graph")  # refused
                    for a in s.extra_args
                )
            ),
            message=lambda s: (
                "--disable-cuda-graph is refused: HIP graphs stay on "
                "(disabling them halves throughput); remove it from extraArgs"
            ),
            reason="FieldValueForbidden",
        ),
        Rule(
            cel="!has(self.graphs.maxBatchSize) || "
            "self.graphs.maxBatchSize <= self.maxRunningRequests",
            message_expression="'graphs.maxBatchSize (%d) must not exceed maxRunningRequests "
            "(%d): a graph larger than the largest batch is never used'"
            ".format([self.graphs.maxBatchSize, self.maxRunningRequests])",
            field_path=".graphs.maxBatchSize",
            check=lambda s: (
                s.graphs.max_batch_size is None or s.graphs.max_batch_size <= s.max_running_requests
            ),
            message=lambda s: (
                f"graphs.maxBatchSize ({s.graphs.max_batch_size}) must not exceed "
                f"maxRunningRequests ({s.max_running_requests}): a graph larger than the largest "
                "batch is never used"
            ),
        ),
    )
