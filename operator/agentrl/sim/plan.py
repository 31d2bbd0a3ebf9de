"""``plan_job``: the static plan, a simulation and the verdict on what limits the job.

The bottleneck is decided from what the simulation measured, in this order (the first that
holds wins), each rule naming a resource a person can change:

1. ``trainer``: in the asynchronous loop the trainer never waits (< 10% of its time) while
   the staleness bound keeps free sandbox slots empty;
2. ``engine KV cache``: requests were retracted or timed out because the KV pool was full;
3. ``engines``: requests wait for admission at the engines for more than 10% of an LLM call,
   or engines decode more than 90% of ``maxRunningRequests``;
4. ``rollout workers``: LLM calls wait for a rollout worker process for more than 10% of a call;
5. ``sandbox creation rate``: episodes wait more than 10% of their time for the creation limit;
6. ``<cap>``: effective concurrency is below ``sandbox.concurrency`` (provider or hidden cap);
7. ``long tail``: batch-synchronous loops spending over 25% of rollout after 90% finished;
8. ``sandbox concurrency``: nothing above; throughput grows with concurrency.

Called by ``agentrl.sim.cli`` and tests.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from agentrl.api import AgentRLJob
from agentrl.api.trainer import TrainerBackend
from agentrl.sim.manifest_check import warnings_for
from agentrl.sim.memory import (
    CheckpointVolume,
    MemoryVerdict,
    TrainerMemoryCheck,
    check_trainer_memory,
    checkpoint_volume,
    checkpoint_volume_warning,
)
from agentrl.sim.params import LoopMode, SimOverrides, SimParams
from agentrl.sim.simulation import SimResult, simulate
from agentrl.sim.static_plan import StaticPlan, build_static_plan, resolve_architecture

#: Thresholds of the bottleneck rules above (shares).
WAIT_SHARE = 0.10
RUNNING_SHARE = 0.90
TAIL_SHARE = 0.25


class Plan(BaseModel):
    """Everything ``agentrl plan`` reports for one manifest."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    name: str
    """The job's name."""
    static: StaticPlan
    """Figures that follow by arithmetic."""
    simulation: SimResult
    """What the simulation measured."""
    bottleneck: str
    """What limits throughput."""
    bottleneck_reason: str
    """Why the planner thinks so."""
    trainer_memory: TrainerMemoryCheck
    """Peak memory per trainer GPU at ``rollout.maxTrajectoryTokens`` (:mod:`agentrl.sim.memory`),
    or why it was not estimated."""
    checkpoint_volume: CheckpointVolume | None
    """The checkpoint volume's steady and peak use (megatron backend; None for torch)."""
    warnings: list[str]
    """Manifest settings at odds with the plan (``check_manifest_against_plan``)."""

    def summary(self) -> dict[str, object]:
        """The flat figures of ``agentrl plan --json`` (the full plan is under ``plan``)."""
        sim = self.simulation
        return {
            "name": self.name,
            "kv_bytes_per_token": self.static.kv_bytes_per_token,
            "kv_pool_tokens_per_engine": self.static.kv_pool_tokens_per_engine,
            "full_context_trajectories_per_engine":
                self.static.full_context_trajectories_per_engine,
            "trajectories_per_hour": round(sim.trajectories_per_hour, 1),
            "step_seconds": None if sim.step_seconds is None else round(sim.step_seconds, 1),
            "bottleneck": self.bottleneck,
            "bottleneck_reason": self.bottleneck_reason,
            "gpu_idle_share": round(sim.engine_idle_share, 3),
            "rollout_tail_share": None if sim.rollout_tail_share is None
            else round(sim.rollout_tail_share, 3),
            "trainer_memory": self._trainer_memory_summary(),
            "checkpoint_volume_peak_gb": None if self.checkpoint_volume is None
            else round(self.checkpoint_volume.peak_bytes / 1e9, 1),
            "warnings": self.warnings,
        }

    def _trainer_memory_summary(self) -> dict[str, object]:
        check, est = self.trainer_memory, self.trainer_memory.estimate
        return {
            "verdict": check.verdict.value,
            "gib_per_gpu": None if est is None else round(est.total_bytes / 2**30, 1),
            "gpu": None if est is None else est.gpu,
            "gpu_gib": None if est is None else round(est.gpu_bytes / 2**30, 1),
            "max_trajectory_tokens": None if est is None else est.max_tokens,
            "field": check.field,
            "message": check.message,
        }


def find_bottleneck(static: StaticPlan, sim: SimResult, job: AgentRLJob) -> tuple[str, str]:
    """The limiting resource and a one-line reason (rules in the module docstring)."""
    latency = max(sim.llm_latency_mean, 1e-9)
    if (sim.loop_mode == LoopMode.FULL_ASYNC and sim.step_breakdown is not None
            and sim.trainer_idle_share < WAIT_SHARE and sim.admission_blocked_share > WAIT_SHARE):
        return "trainer", (f"the trainer waits {sim.trainer_idle_share:.0%} of its time and "
                           f"only {sim.concurrency_mean:.0f} of {static.effective_concurrency} "
                           "sandbox slots are in use on average: trainer.async.maxStaleness "
                           "holds episodes back until the trainer catches up")
    if sim.kv_retractions > 0 or sim.llm_timeouts > 0:
        return "engine KV cache", (f"{sim.kv_retractions} retractions and {sim.llm_timeouts} LLM "
                                   "timeouts: the KV pool filled (cap inference.contextLength)")
    max_running = job.spec.inference.max_running_requests
    if (sim.engine_queue_wait_mean > WAIT_SHARE * latency
            or sim.running_per_engine_mean > RUNNING_SHARE * max_running):
        return "engines", (f"requests wait {sim.engine_queue_wait_mean:.2f} s for admission and "
                           f"{sim.running_per_engine_mean:.1f} run per engine "
                           f"(maxRunningRequests {max_running}): add inference.engines")
    if sim.proxy_wait_mean > WAIT_SHARE * latency:
        return "rollout workers", (f"LLM calls wait {sim.proxy_wait_mean:.2f} s of "
                                   f"{latency:.2f} s for one of {static.proxy_processes} rollout "
                                   "worker processes: raise rollout.workers")
    if sim.sandbox_startup_wait_mean > WAIT_SHARE * max(sim.episode_seconds_mean, 1e-9):
        return "sandbox creation rate", (
            f"episodes wait {sim.sandbox_startup_wait_mean:.1f} s for the creation limit of "
            f"{static.sandbox_creates_per_second:g}/s")
    if static.concurrency_limited_by is not None:
        return static.concurrency_limited_by, (
            f"only {static.effective_concurrency} of {static.requested_concurrency} episodes "
            f"can be in flight ({static.concurrency_limited_by})")
    if (sim.loop_mode != LoopMode.FULL_ASYNC and sim.rollout_tail_share is not None
            and sim.rollout_tail_share > TAIL_SHARE):
        return "long tail", (f"{sim.rollout_tail_share:.0%} of each batch's rollout comes after "
                             "90% of it finished: use the asynchronous loop (maxStaleness ≥ 1)")
    return "sandbox concurrency", (
        f"engines have headroom (KV peak {sim.kv_usage_peak:.0%}, "
        f"{sim.engine_queue_mean:.2f} queued per engine): raise sandbox.concurrency")


def plan_job(job: AgentRLJob, params: SimParams | None = None,
             overrides: SimOverrides | None = None,
             config_path: str | Path | None = None) -> Plan:
    """Plan ``job``: static figures, a simulation, the bottleneck and manifest warnings."""
    params = params or SimParams()
    static = build_static_plan(job, params, overrides, config_path)
    sim = simulate(job, static, params, overrides)
    bottleneck, reason = find_bottleneck(static, sim, job)
    arch, _ = resolve_architecture(job, config_path)
    memory = check_trainer_memory(job, params, arch=arch)
    warnings = warnings_for(job, static, sim, params)
    if memory.verdict == MemoryVerdict.TOO_LARGE:
        warnings.append(f"{memory.field}: {memory.message}")
    volume = None
    if job.spec.trainer.backend == TrainerBackend.MEGATRON:
        volume = checkpoint_volume(job, arch)
        if (warning := checkpoint_volume_warning(job, volume)) is not None:
            warnings.append(warning)
    return Plan(name=job.metadata.name, static=static, simulation=sim, bottleneck=bottleneck,
                bottleneck_reason=reason, trainer_memory=memory, checkpoint_volume=volume,
                warnings=warnings)


def check_manifest_against_plan(job: AgentRLJob, params: SimParams | None = None) -> list[str]:
    """Warnings for ``job``: plans it (static figures and a simulation) and compares
    (:func:`agentrl.sim.manifest_check.warnings_for`)."""
    return plan_job(job, params).warnings
