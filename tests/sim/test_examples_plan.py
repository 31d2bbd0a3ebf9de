"""Every shipped manifest in examples/ plans without error (parametrized over whatever
examples exist, so a new example is covered the day it is added)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agentrl.api import AgentRLJob
from agentrl.sim.params import SimControl, SimParams
from agentrl.sim.plan import plan_job
from agentrl.sim.static_plan import PlanInputError

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
QUICK = SimParams(sim=SimControl(warmup_seconds=300, measure_seconds=900, measure_steps=1,
                                  measure_steps_async=1))


def test_there_are_examples_to_plan() -> None:
    assert EXAMPLES, "examples/*.yaml is empty"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_plans_without_error(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == "AgentRLJob"]
    for doc in docs:
        job = AgentRLJob.model_validate(doc)
        if job.spec.inference.gpus_per_engine == 0:  # server tiny: CPU engines, no GPU plan
            with pytest.raises(PlanInputError, match="server tiny runs its engines on CPU"):
                plan_job(job, QUICK)
            continue
        plan = plan_job(job, QUICK)
        assert plan.static.kv_pool_tokens_per_engine > 0
        assert plan.simulation.trajectories_per_hour > 0
        assert plan.bottleneck


def test_the_report_example_uses_96_kib_of_kv_per_token() -> None:
    path = next((p for p in EXAMPLES if p.name == "mi355x-report.yaml"), None)
    if path is None:
        pytest.fail("examples/mi355x-report.yaml is missing")
    plan = plan_job(AgentRLJob.model_validate(yaml.safe_load(path.read_text())), QUICK)
    assert plan.static.kv_bytes_per_token == 98_304  # 2 × 48 × 4 × 128 × 2
    assert plan.static.gpu == "MI355X"
