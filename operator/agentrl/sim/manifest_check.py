"""Manifest settings that contradict the plan: autoscale bounds and targets, engine sizes,
rollout workers, sandbox footprint.

:func:`warnings_for` is what :func:`agentrl.sim.plan.plan_job` calls with the plan's figures;
it returns warnings as sentences that name the field and the way out, and an empty list when
the manifest agrees with its plan. The rest of the project calls
:func:`agentrl.sim.plan.check_manifest_against_plan` (``agentrl plan`` prints it; example
manifests are checked with it), which plans the job and returns these warnings; it lives in
:mod:`agentrl.sim.plan` so that this module sits below the plan (no import circle).
"""

from __future__ import annotations

from agentrl.api import AgentRLJob
from agentrl.sim.params import SimParams
from agentrl.sim.simulation import SimResult
from agentrl.sim.static_plan import StaticPlan


def static_warnings(job: AgentRLJob, static: StaticPlan, params: SimParams) -> list[str]:
    """Warnings that need only arithmetic."""
    spec = job.spec
    inf, sandbox, roll = spec.inference, spec.sandbox, spec.rollout
    out: list[str] = []
    if static.kv_pool_tokens_per_engine < inf.context_length:
        out.append(
            f"inference.contextLength ({inf.context_length}) exceeds one engine's KV pool "
            f"({static.kv_pool_tokens_per_engine} tokens): a single full-length trajectory "
            "cannot be held; raise memFractionStatic or gpusPerEngine, or lower contextLength")
    elif inf.max_running_requests > static.full_context_trajectories_per_engine:
        out.append(
            f"inference.maxRunningRequests ({inf.max_running_requests}) exceeds the "
            f"{static.full_context_trajectories_per_engine} full-context trajectories one KV pool "
            f"holds ({static.kv_pool_tokens_per_engine} tokens / {inf.context_length}): long "
            "trajectories will be retracted under load (fine while prefixes are shared and "
            "most trajectories are short)")
    calls = static.concurrent_llm_calls_per_engine
    if calls > inf.max_running_requests:
        out.append(
            f"sandbox.concurrency {static.effective_concurrency} means ~{calls:.0f} LLM calls "
            f"in flight per engine, above inference.maxRunningRequests "
            f"({inf.max_running_requests}): calls will queue; add inference.engines")
    if inf.graphs.max_batch_size is not None and calls > inf.graphs.max_batch_size:
        out.append(
            f"inference.graphs.maxBatchSize ({inf.graphs.max_batch_size}) is below the ~"
            f"{calls:.0f} requests each engine decodes at this concurrency: larger batches run "
            "without HIP graphs")
    auto = sandbox.autoscale
    if auto.enabled:
        per_engine_at_max = auto.max * params.cluster.llm_busy_share / inf.engines
        limit = auto.targets.running_requests_share * inf.max_running_requests
        if per_engine_at_max > limit:
            reachable = int(limit * inf.engines / params.cluster.llm_busy_share)
            out.append(
                f"sandbox.autoscale.max ({auto.max}) would put ~{per_engine_at_max:.0f} calls "
                f"per engine, above the running-requests target ({limit:.0f} = "
                f"{auto.targets.running_requests_share:g} × maxRunningRequests); the "
                f"autoscaler cannot go past ~{reachable} with {inf.engines} engines")
        if sandbox.provider == "e2b" and sandbox.e2b is not None and \
                auto.max > sandbox.e2b.max_concurrent:
            out.append(
                f"sandbox.autoscale.max ({auto.max}) exceeds sandbox.e2b.maxConcurrent "
                f"({sandbox.e2b.max_concurrent}): the plan's limit caps it")
    if static.concurrency_limited_by == "sandbox.e2b.maxConcurrent":
        out.append(
            f"sandbox.concurrency ({sandbox.concurrency}) exceeds sandbox.e2b.maxConcurrent "
            f"({static.effective_concurrency}): only {static.effective_concurrency} sandboxes "
            "run at once")
    if roll.max_trajectory_tokens > roll.max_turns * (roll.max_tokens_per_turn +
                                                      roll.tool_output_max_bytes):
        pass  # the token cap is unreachable; harmless
    if static.sandbox_nodes_needed > 1 and sandbox.provider == "local":
        out.append(
            f"sandbox.provider local runs every sandbox on one machine but "
            f"{static.sandbox_cpu_cores:g} cores are requested")
    return out


def warnings_for(job: AgentRLJob, static: StaticPlan, sim: SimResult,
                 params: SimParams) -> list[str]:
    """Static warnings plus those that need the simulation's figures."""
    spec = job.spec
    out = static_warnings(job, static, params)
    auto = spec.sandbox.autoscale
    if auto.enabled and sim.kv_usage_peak > 0:
        # KV usage grows about linearly with concurrency while engines are not saturated.
        conc = max(1, static.effective_concurrency)
        at_target = conc * auto.targets.kv_cache_usage / sim.kv_usage_peak
        if at_target < auto.max:
            out.append(
                f"sandbox.autoscale.max ({auto.max}) is above the ~{at_target:.0f} concurrent "
                f"episodes at which KV usage reaches targets.kvCacheUsage "
                f"({auto.targets.kv_cache_usage:g}); the upper part of the range is unreachable")
        if sim.kv_usage_peak > auto.targets.kv_cache_usage:
            out.append(
                f"at sandbox.concurrency {conc} the simulated KV peak ({sim.kv_usage_peak:.0%}) "
                f"is above targets.kvCacheUsage ({auto.targets.kv_cache_usage:.0%}): the "
                "autoscaler will scale down from the starting point")
    if (sim.step_breakdown is not None and sim.trainer_idle_share < 0.1
            and sim.admission_blocked_share > 0.1):
        out.append(
            f"the trainer ({static.trainer_gpus} GPUs) trains "
            f"{spec.trainer.trajectories_per_step} trajectories every {sim.step_seconds:.0f} s "
            f"so only {sim.concurrency_mean:.0f} of {static.effective_concurrency} sandbox slots "
            f"are in use on average under trainer.async.maxStaleness "
            f"({spec.trainer.async_.max_staleness}): add trainer.nodes, or more "
            "sandbox.concurrency buys nothing")
    latency = max(sim.llm_latency_mean, 1e-9)
    if sim.proxy_wait_mean > 0.1 * latency:
        out.append(
            f"rollout.workers ({static.proxy_processes}) is too few: LLM calls wait "
            f"{sim.proxy_wait_mean:.2f} s of {latency:.2f} s for a worker process")
    if sim.llm_timeouts:
        out.append(
            f"{sim.llm_timeouts} LLM calls hit rollout.llmTimeoutSeconds in the simulation: "
            "lower inference.contextLength or rollout.maxTokensPerTurn")
    return out
