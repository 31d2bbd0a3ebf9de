"""Mechanisms of the simulator, each shown by a side-by-side pair of runs."""

from __future__ import annotations

from typing import Any

import pytest

from agentrl.api import AgentRLJob
from agentrl.sim.params import LoopMode, SimControl, SimOverrides, SimParams
from agentrl.sim.plan import plan_job
from tests.factories import make_job

QUICK = SimParams(sim=SimControl(warmup_seconds=300, measure_seconds=1200, measure_steps=3,
                                  measure_steps_async=2))


def swe_job(**spec: Any) -> AgentRLJob:
    factory = (make_job("sim")
               .with_spec("model.architecture", "Qwen3-30B-A3B")
               .with_spec("inference.nodeSelector",
                          {"amd.com/gpu.product-name": "AMD_Instinct_MI355X"})
               .with_spec("inference.engines", 2)
               .with_spec("inference.memFractionStatic", 0.7)
               .with_spec("rollout.maxTurns", 30)
               .with_spec("rollout.workers", 4)
               .with_spec("sandbox.concurrency", 16)
               .with_spec("trainer.trajectoriesPerStep", 16)
               .with_spec("trainer.async", {"maxStaleness": 64}))
    for path, val in spec.items():
        factory = factory.with_spec(path.replace("__", "."), val)
    return factory.obj()


def test_same_inputs_give_the_same_plan() -> None:
    a = plan_job(swe_job(), QUICK).simulation
    b = plan_job(swe_job(), QUICK).simulation
    assert a.trajectories_per_hour == b.trajectories_per_hour
    assert a.completion_times == b.completion_times


def test_more_concurrency_gives_more_throughput_while_engines_have_headroom() -> None:
    low = plan_job(swe_job(sandbox__concurrency=8), QUICK)
    high = plan_job(swe_job(sandbox__concurrency=32), QUICK)
    # 4× the episodes on engines far from full: well over 2× the throughput (not 4×: a larger
    # decode batch and more resident KV make every step of every call slower).
    assert high.simulation.trajectories_per_hour > 2 * low.simulation.trajectories_per_hour
    assert high.bottleneck == "sandbox concurrency"


def test_one_rollout_worker_becomes_the_bottleneck_when_calls_are_expensive() -> None:
    slow_proxy = QUICK.model_copy(update={"rollout": QUICK.rollout.model_copy(
        update={"seconds_per_llm_call": 1.0})})
    plan = plan_job(swe_job(rollout__workers=1), slow_proxy)
    # 16 agents, each call holding the single worker 1 s: calls queue for the worker.
    assert plan.bottleneck == "rollout workers"
    assert plan.simulation.proxy_wait_mean > 1.0
    assert any("rollout.workers" in w for w in plan.warnings)


def test_an_e2b_plan_limit_caps_concurrency_and_is_named() -> None:
    job = swe_job(sandbox__provider="e2b", sandbox__concurrency=64,
                  sandbox__e2b={"apiKeySecretRef": {"name": "e2b"}, "maxConcurrent": 20})
    plan = plan_job(job, QUICK)
    assert plan.static.effective_concurrency == 20
    assert plan.bottleneck == "sandbox.e2b.maxConcurrent"
    assert plan.simulation.concurrency_mean <= 20.0 + 1e-9


def test_async_never_waits_for_the_slowest_member_of_a_batch() -> None:
    job = swe_job(trainer__async={"maxStaleness": 2})
    sync = plan_job(job, QUICK, SimOverrides(loop_mode=LoopMode.SYNC)).simulation
    full = plan_job(job, QUICK, SimOverrides(loop_mode=LoopMode.FULL_ASYNC)).simulation
    assert sync.rollout_tail_share is not None and sync.rollout_tail_share > 0.1
    assert full.rollout_tail_share is None
    assert full.step_seconds is not None and sync.step_seconds is not None
    assert full.step_seconds < sync.step_seconds


def test_a_staleness_of_zero_plans_the_synchronous_loop() -> None:
    plan = plan_job(swe_job(trainer__async={"maxStaleness": 0}), QUICK)
    assert plan.simulation.loop_mode == LoopMode.SYNC


@pytest.mark.slow
def test_runaway_generations_without_a_context_cap_stall_the_engine() -> None:
    params = QUICK.model_copy(update={"episode": QUICK.episode.model_copy(
        update={"runaway_probability": 0.02})})
    common = {"inference__engines": 1, "sandbox__concurrency": 12,
              "rollout__maxTokensPerTurn": 262_144, "rollout__llmTimeoutSeconds": 3600,
              "rollout__episodeTimeoutSeconds": 7200}
    uncapped = plan_job(swe_job(inference__contextLength=1_048_576,
                                rollout__maxTrajectoryTokens=1_048_576, **common), params)
    capped = plan_job(swe_job(inference__contextLength=65_536,
                              rollout__maxTrajectoryTokens=65_536, **common), params)
    assert uncapped.simulation.kv_usage_peak > 0.95
    assert uncapped.simulation.kv_retractions + uncapped.simulation.llm_timeouts > 0
    assert uncapped.bottleneck == "engine KV cache"
    assert capped.simulation.kv_retractions == 0 and capped.simulation.llm_timeouts == 0
    assert capped.simulation.trajectories_per_hour > uncapped.simulation.trajectories_per_hour
