"""The AgentRLJob API (``agentrl.dev/v1alpha1``): pydantic models that are the single source of
truth for the CRD, offline validation and the manifest reference.

This package imports nothing else of agentrl (an import-linter contract holds it to that).
"""

from agentrl.api.conditions import ConditionType, Reason
from agentrl.api.engine import InferenceSpec
from agentrl.api.job import (
    API_VERSION,
    GROUP,
    KIND,
    MAX_NAME_LENGTH,
    PLURAL,
    VERSION,
    AgentRLJob,
    AgentRLJobSpec,
)
from agentrl.api.model import DatasetFormat, DatasetSpec, ModelSpec
from agentrl.api.rollout import ClassAction, RolloutSpec, TerminalClass
from agentrl.api.sandbox import SandboxProvider, SandboxSpec
from agentrl.api.status import AgentRLJobStatus, Condition
from agentrl.api.trainer import TrainerBackend, TrainerSpec

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "MAX_NAME_LENGTH",
    "PLURAL",
    "VERSION",
    "AgentRLJob",
    "AgentRLJobSpec",
    "AgentRLJobStatus",
    "ClassAction",
    "Condition",
    "ConditionType",
    "DatasetFormat",
    "DatasetSpec",
    "InferenceSpec",
    "ModelSpec",
    "Reason",
    "RolloutSpec",
    "SandboxProvider",
    "SandboxSpec",
    "TerminalClass",
    "TrainerBackend",
    "TrainerSpec",
]
