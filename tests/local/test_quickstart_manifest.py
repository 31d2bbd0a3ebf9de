"""The shipped quickstart manifest is a valid local job."""

from __future__ import annotations

from pathlib import Path

import yaml

from agentrl.api import AgentRLJob
from agentrl.api.validation import load_job

QUICKSTART = Path(__file__).parents[2] / "examples" / "quickstart.yaml"


def test_quickstart_passes_the_schema_and_the_cross_field_rules() -> None:
    job = AgentRLJob.model_validate(yaml.safe_load(QUICKSTART.read_text()))
    assert load_job(QUICKSTART.read_text()) == job
    spec = job.spec
    assert (spec.sandbox.provider, spec.trainer.backend, spec.model.source.path) == (
        "local",
        "torch",
        "tiny",
    )
    assert spec.trainer.trajectories_per_step % spec.rollout.group_size == 0
