"""The engine tests' base job, kept only for ``tests/engine/test_engine_flags.py`` until that
test moves with ``agentrl/api/engine_flags.py``: a thin wrapper over the one job factory,
:func:`tests.factories.make_job`. New tests use that factory directly."""

from __future__ import annotations

from typing import Any

from agentrl.api import AgentRLJob
from tests.factories import make_job as _make_job


def make_job(**inference: Any) -> AgentRLJob:
    """A job whose ``spec.inference`` carries ``inference`` (camelCase keys), defaults elsewhere."""
    return (
        _make_job("swe")
        .with_served_model("/models/qwen3-30b-a3b", "policy")
        .with_inference(**inference)
        .obj()
    )
