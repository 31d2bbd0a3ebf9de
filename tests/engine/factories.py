"""Job factories for the engine tests: a minimal valid AgentRLJob, adjusted per test."""

from __future__ import annotations

from typing import Any

from agentrl.api import AgentRLJob


def make_job(**inference: Any) -> AgentRLJob:
    """A job whose ``spec.inference`` carries ``inference`` (camelCase keys), defaults elsewhere."""
    return AgentRLJob.model_validate(
        {
            "apiVersion": "agentrl.dev/v1alpha1",
            "kind": "AgentRLJob",
            "metadata": {"name": "swe", "namespace": "team"},
            "spec": {
                "model": {"source": {"path": "/models/qwen3-30b-a3b"}, "servedName": "policy"},
                "inference": inference,
            },
        }
    )
