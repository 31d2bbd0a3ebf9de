"""``check_manifest_against_plan`` and the static warnings it is built on."""

from __future__ import annotations

from agentrl.api import AgentRLJob
from agentrl.sim.manifest_check import static_warnings
from agentrl.sim.params import SimControl, SimParams
from agentrl.sim.plan import check_manifest_against_plan
from agentrl.sim.static_plan import build_static_plan
from tests.factories import make_job

QUICK = SimParams(sim=SimControl(warmup_seconds=300, measure_seconds=900, measure_steps=1,
                                  measure_steps_async=1))


def mi355x_job() -> AgentRLJob:
    return (make_job("check")
            .with_spec("model.architecture", "Qwen3-30B-A3B")
            .with_spec("inference.nodeSelector",
                       {"amd.com/gpu.product-name": "AMD_Instinct_MI355X"})
            .with_spec("inference.engines", 4)
            .with_spec("inference.maxRunningRequests", 16)
            .with_spec("inference.memFractionStatic", 0.7)
            .with_spec("rollout.maxTurns", 20)
            .with_spec("rollout.workers", 4)
            .with_spec("sandbox.concurrency", 32)
            .with_spec("trainer.async", {"maxStaleness": 64})
            .obj())


def warnings_of(job: AgentRLJob) -> list[str]:
    return static_warnings(job, build_static_plan(job, QUICK), QUICK)


def test_a_manifest_sized_within_its_plan_gets_no_static_warning() -> None:
    # Pool 1,580,836 tokens / 65,536 = 24 full trajectories ≥ maxRunningRequests 16;
    # 32 × 0.77 / 4 engines = 6.2 calls per engine ≤ 16.
    assert warnings_of(mi355x_job()) == []


def test_autoscale_max_beyond_what_engines_run_is_reported() -> None:
    job = mi355x_job()
    job.spec.sandbox.autoscale.enabled = True
    job.spec.sandbox.autoscale.max = 200
    # 200 × 0.77 / 4 = 38.5 calls per engine > 0.9 × 16 = 14.4; reachable ≈ 14.4 × 4 / 0.77 = 74.
    [warning] = warnings_of(job)
    assert "sandbox.autoscale.max (200)" in warning
    assert "~74" in warning


def test_max_running_requests_above_what_the_pool_holds_is_reported() -> None:
    job = mi355x_job()
    job.spec.inference.max_running_requests = 64  # the pool holds 24 full 64K trajectories
    assert any("maxRunningRequests (64) exceeds the 24 full-context" in w
               for w in warnings_of(job))


def test_e2b_plan_limit_below_concurrency_is_reported() -> None:
    job = (make_job("e2b").with_spec("model.architecture", "Qwen3-30B-A3B")
           .with_spec("sandbox.provider", "e2b").with_spec("sandbox.concurrency", 384)
           .with_spec("sandbox.e2b", {"apiKeySecretRef": {"name": "k"}, "maxConcurrent": 100})
           .with_spec("inference.engines", 24).obj())
    assert any("exceeds sandbox.e2b.maxConcurrent (100)" in w for w in warnings_of(job))


def test_check_manifest_against_plan_includes_simulated_findings() -> None:
    job = mi355x_job()
    job.spec.rollout.workers = 1
    slow = QUICK.model_copy(update={"rollout": QUICK.rollout.model_copy(
        update={"seconds_per_llm_call": 0.5})})
    # 32 agents through one worker at 0.5 s per call: the worker saturates.
    assert any("rollout.workers (1) is too few" in w
               for w in check_manifest_against_plan(job, slow))
