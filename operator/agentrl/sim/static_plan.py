"""The static plan: what a manifest implies before anything runs.

KV bytes per token, the KV pool of each engine, how many full-context trajectories fit, the
decode step cost the simulator uses, the concurrency that is really in effect after provider
limits, and the sandbox tier's CPU/memory footprint against node capacity. Arithmetic only; the
dynamic questions (throughput, step time, tails) are ``agentrl.sim.simulation``'s.

Called by ``agentrl.sim.plan`` and ``agentrl.sim.manifest_check``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from agentrl.api import AgentRLJob
from agentrl.api.quantities import parse_quantity
from agentrl.reconcile import concurrency
from agentrl.sim import architectures, hardware, kvcache
from agentrl.sim.architectures import ModelArchitecture
from agentrl.sim.hardware import GIB, GPUProduct
from agentrl.sim.params import SimOverrides, SimParams


class StaticPlan(BaseModel):
    """Figures that follow from the manifest by arithmetic."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    architecture: str
    """Model architecture used."""
    architecture_source: str
    """``builtin`` or the config.json path it was read from."""
    gpu: str
    """GPU product of the engines."""
    gpu_source: str
    """``nodeSelector`` or ``default`` (the parameter file's assumption)."""
    total_params: int
    """Parameters of the model (all experts)."""
    active_params: int
    """Parameters one token reads."""
    kv_bytes_per_token: float
    """KV bytes per token on one GPU of an engine."""
    weight_bytes_per_gpu: float
    """Weight bytes per engine GPU."""
    kv_pool_tokens_per_engine: int
    """KV pool of one engine (tokens)."""
    kv_pool_bytes_per_engine: float
    """KV pool of one engine (bytes, per GPU)."""
    full_context_trajectories_per_engine: int
    """Trajectories at ``inference.contextLength`` that fit in one pool at once."""
    kv_bytes_per_max_trajectory: float
    """KV of one trajectory at ``rollout.maxTrajectoryTokens``."""
    decode_overhead_seconds: float
    """Fixed part of a decode step (overhead plus reading the active weights)."""
    decode_per_sequence_seconds: float
    """Per running sequence part of a decode step."""
    decode_kv_seconds_per_token: float
    """Time to read one resident KV token per decode step."""
    requested_concurrency: int
    """``sandbox.concurrency``."""
    effective_concurrency: int
    """Concurrency in effect after provider and hidden caps."""
    concurrency_limited_by: str | None
    """What lowers the effective concurrency, if anything."""
    sandbox_creates_per_second: float
    """Creation rate limit in effect."""
    sandbox_cpu_cores: float
    """CPU the sandbox tier requests at full concurrency."""
    sandbox_memory_gib: float
    """Memory the sandbox tier requests at full concurrency (GiB)."""
    sandbox_nodes_needed: int
    """Sandbox nodes of the assumed size needed (0 for E2B: not our nodes)."""
    engine_gpus: int
    """GPUs the engines use."""
    trainer_gpus: int
    """GPUs the trainer uses."""
    concurrent_llm_calls_per_engine: float
    """Expected LLM calls in flight per engine at full concurrency."""
    proxy_processes: int
    """Processes serving LLM calls (``rollout.workers``)."""
    proxy_calls_per_second_capacity: float
    """LLM calls per second those processes can serve."""
    notes: list[str]
    """Assumptions this plan had to make (default GPU, architecture source)."""


class PlanInputError(ValueError):
    """The manifest cannot be planned (unknown architecture or GPU, weights do not fit)."""


def resolve_architecture(job: AgentRLJob, config_path: str | Path | None = None
                         ) -> tuple[ModelArchitecture, str]:
    """The architecture from ``--config``, ``spec.model.architecture``, or a readable
    ``config.json`` at ``spec.model.source.path``, in that order."""
    if config_path is not None:
        return architectures.load_hf_config(config_path), str(config_path)
    model = job.spec.model
    if model.architecture:
        return architectures.builtin(model.architecture), "builtin"
    if model.source.path == "tiny":
        return architectures.builtin("agentrl-tiny"), "builtin"
    candidate = Path(model.source.path) / "config.json"
    if model.source.pvc is None and candidate.is_file():
        return architectures.load_hf_config(candidate), str(candidate)
    try:
        return architectures.builtin(Path(model.source.path).name), "builtin"
    except architectures.UnsupportedArchitectureError as exc:
        raise PlanInputError(
            "cannot tell the model architecture: set spec.model.architecture (e.g. "
            "Qwen3-30B-A3B) or pass --config PATH/config.json"
        ) from exc


def resolve_gpu(job: AgentRLJob, params: SimParams) -> tuple[GPUProduct, str]:
    """The engines' GPU product from their node selector, else the parameter file's default."""
    product = hardware.gpu_from_node_selector(job.spec.inference.node_selector)
    if product is not None:
        return product, "nodeSelector"
    return hardware.gpu_by_name(params.cluster.default_gpu), "default"


def effective_concurrency(job: AgentRLJob, overrides: SimOverrides) -> tuple[int, str | None]:
    """Episodes that can really be in flight, and the cap that lowers it: the operator's rule
    (``reconcile.concurrency.capped_concurrency``, the job running, no quotas) with the hidden
    cap of ``overrides`` after the provider's; the cap named as in the manifest
    (``sandbox.e2b.maxConcurrent``)."""
    hidden = overrides.hidden_concurrency_cap
    found = concurrency.capped_concurrency(
        job, caps=[(hidden, "hidden concurrency cap")] if hidden is not None else []
    )
    limited_by = found.limited_by
    return found.value, limited_by.removeprefix("spec.") if limited_by is not None else None


def build_static_plan(job: AgentRLJob, params: SimParams, overrides: SimOverrides | None = None,
                      config_path: str | Path | None = None) -> StaticPlan:
    """Compute the static plan of ``job``."""
    overrides = overrides or SimOverrides()
    spec = job.spec
    inf = spec.inference
    if inf.gpus_per_engine == 0:  # before the model: a CPU engine's is often not on this machine
        raise PlanInputError(
            "inference.server tiny runs its engines on CPU: the capacity plan models GPU "
            "engines (SGLang's KV cache and HBM); there is nothing to plan"
        )
    arch, arch_source = resolve_architecture(job, config_path)
    gpu, gpu_source = resolve_gpu(job, params)
    notes: list[str] = []
    if gpu_source == "default":
        notes.append(f"no amd.com/gpu.product-name in inference.nodeSelector: assumed "
                     f"{gpu.name} ({gpu.memory_gib:g} GiB)")
    tp = inf.gpus_per_engine
    kv_dtype = "bfloat16" if inf.kv_cache_dtype == "auto" else inf.kv_cache_dtype
    bpt = kvcache.kv_bytes_per_token(arch, kv_dtype, tp)
    weights = kvcache.weight_bytes_per_gpu(arch, spec.model.dtype, tp)
    pool = kvcache.kv_pool_tokens(gpu.memory_bytes, inf.mem_fraction_static, weights, bpt)
    if pool <= 0:
        raise PlanInputError(
            f"{arch.name} weights ({weights / 1e9:.1f} GB per GPU at gpusPerEngine={tp}) do not "
            f"fit in memFractionStatic={inf.mem_fraction_static} of a {gpu.name} "
            f"({gpu.memory_gib:g} GiB): raise inference.gpusPerEngine or memFractionStatic"
        )
    eff_bw = gpu.hbm_tb_per_s * 1e12 * params.engine.hbm_efficiency
    active_weight_bytes = arch.active_params * kvcache.WEIGHT_DTYPE_BYTES[spec.model.dtype] / tp
    conc, limited_by = effective_concurrency(job, overrides)
    sandbox = spec.sandbox
    rate = sandbox.max_creates_per_second
    if sandbox.provider == "e2b" and sandbox.e2b is not None:
        rate = min(rate, sandbox.e2b.max_creates_per_second)
    cpu = conc * parse_quantity(sandbox.cpu)
    mem_gib = conc * parse_quantity(sandbox.memory) / GIB
    cluster = params.cluster
    if sandbox.provider == "e2b":
        nodes = 0
    else:
        nodes = max(
            kvcache.ceil_div(cpu, cluster.sandbox_node_cpus * cluster.allocatable_share),
            kvcache.ceil_div(mem_gib, cluster.sandbox_node_memory_gib * cluster.allocatable_share),
        ) if conc else 0
    workers = overrides.proxy_processes or spec.rollout.workers
    per_call = params.rollout.seconds_per_llm_call
    return StaticPlan(
        architecture=arch.name,
        architecture_source=arch_source,
        gpu=gpu.name,
        gpu_source=gpu_source,
        total_params=arch.total_params,
        active_params=arch.active_params,
        kv_bytes_per_token=bpt,
        weight_bytes_per_gpu=weights,
        kv_pool_tokens_per_engine=pool,
        kv_pool_bytes_per_engine=pool * bpt,
        full_context_trajectories_per_engine=kvcache.full_context_trajectories(
            pool, inf.context_length),
        kv_bytes_per_max_trajectory=spec.rollout.max_trajectory_tokens * bpt,
        decode_overhead_seconds=params.engine.decode_overhead_ms / 1e3
        + active_weight_bytes / eff_bw,
        decode_per_sequence_seconds=params.engine.per_sequence_ms / 1e3,
        decode_kv_seconds_per_token=bpt / eff_bw,
        requested_concurrency=sandbox.concurrency,
        effective_concurrency=conc,
        concurrency_limited_by=limited_by,
        sandbox_creates_per_second=rate,
        sandbox_cpu_cores=cpu,
        sandbox_memory_gib=mem_gib,
        sandbox_nodes_needed=nodes,
        engine_gpus=inf.engines * tp,
        trainer_gpus=spec.trainer.nodes * spec.trainer.gpus_per_node,
        concurrent_llm_calls_per_engine=conc * cluster.llm_busy_share / inf.engines,
        proxy_processes=workers,
        proxy_calls_per_second_capacity=workers / per_call if per_call > 0 else float("inf"),
        notes=notes,
    )
