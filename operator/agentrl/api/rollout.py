"""``spec.rollout``: how episodes run, what caps end them, and what each ending does to
training."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from agentrl.api.base import DNS_SUBDOMAIN_PATTERN, LabelStr, ManifestModel
from agentrl.api.engine import Toleration, node_selector_rule
from agentrl.api.quantities import Quantity
from agentrl.api.rules import Rule


class TerminalClass(StrEnum):
    """Every episode ends in exactly one of these."""

    COMPLETED = "completed"
    TRUNCATED = "truncated"
    AGENT_TIMEOUT = "agent_timeout"
    INFRA_ERROR = "infra_error"


class ClassAction(StrEnum):
    """What an ending does to training."""

    TRAIN = "train"
    """Train on the trajectory with its verifier reward."""
    MASK = "mask"
    """Keep it in its group's advantage statistics but give it no loss."""
    DROP = "drop"
    """Leave it out entirely; the group is refilled."""


class FailurePolicy(ManifestModel):
    """What each terminal class does to training. Infra errors are never trained on."""

    truncated: ClassAction = ClassAction.TRAIN
    """Episodes that hit the turn or token cap (their tests still run)."""
    agent_timeout: ClassAction = ClassAction.MASK
    """Episodes that ran out of wall-clock time."""
    infra_retries: int = Field(default=2, ge=0, le=20)
    """Retries of an episode that ended in ``infra_error`` before it is dropped with its
    reason logged (never scored 0)."""
    infra_retry_backoff_seconds: float = Field(default=1.0, ge=0.0, le=600.0)
    """Base of the exponential backoff between infra retries (seconds)."""


class RolloutSpec(ManifestModel):
    """``spec.rollout``: episodes, caps and the rollout workers."""

    group_size: int = Field(default=8, ge=2, le=256)
    """Attempts per task forming one GRPO group (≥ 2: advantages are relative to the group)."""
    max_turns: int = Field(default=50, ge=1, le=1000)
    """Agent turns (LLM calls) before the episode is truncated."""
    max_trajectory_tokens: int = Field(default=65536, ge=256, le=1_048_576)
    """Prompt plus generated tokens of a whole episode before it is truncated; must fit the
    engine's ``contextLength``."""
    max_tokens_per_turn: int = Field(default=8192, ge=1, le=262_144)
    """``max_new_tokens`` of one LLM call."""
    episode_timeout_seconds: int = Field(default=3600, ge=1, le=172_800)
    """Wall-clock limit of an episode (agent turns plus tools); past it: ``agent_timeout``."""
    llm_timeout_seconds: int = Field(default=600, ge=1, le=7200)
    """Client-side limit of one LLM call; a timeout is an infra error."""
    tool_timeout_seconds: int = Field(default=180, ge=1, le=7200)
    """Limit of one tool (shell command) in the sandbox; the agent sees the timeout."""
    verifier_timeout_seconds: int = Field(default=1800, ge=1, le=14400)
    """Limit of the task's tests after submit."""
    tool_output_max_bytes: int = Field(default=16384, ge=256, le=10_485_760)
    """Tool output beyond this is cut (head and tail kept) before the agent sees it."""
    show_remaining_turns: bool = True
    """End each tool observation with the turns the agent has left (``[N turns left]``), so it
    learns to submit before ``maxTurns``."""
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    """Sampling temperature of agent turns."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling of agent turns."""
    workers: int = Field(default=1, ge=1, le=1024)
    """Rollout worker processes (pods on a cluster, Ray actors locally); episodes are spread
    over them so one core never serializes all LLM calls."""
    cpu: Quantity = "2"
    """CPU request of a rollout worker pod; it offers Ray this many whole CPUs (at least 1)."""
    memory: Quantity = "4Gi"
    """Memory request of a rollout worker pod."""
    node_selector: dict[LabelStr, LabelStr] = Field(default_factory=dict, max_length=32)
    """Node labels rollout worker pods require (CPU nodes; they need no GPU)."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    """Tolerations of rollout worker pods, for tainted CPU node pools."""
    priority_class_name: str | None = Field(
        default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN
    )
    """PriorityClass of the rollout worker pods. Unset: the operator's
    ``--rollout-priority-class`` (the Helm chart's ``priorityClasses``), else none. The class
    must exist: the API server refuses a pod naming a missing one."""
    failure_policy: FailurePolicy = Field(default_factory=FailurePolicy)
    """What each terminal class does to training."""

    cel_rules = (
        node_selector_rule("nodeSelector", "node_selector"),
        Rule(
            cel="self.maxTokensPerTurn <= self.maxTrajectoryTokens",
            message_expression="'maxTokensPerTurn (%d) must not exceed maxTrajectoryTokens (%d)'"
            ".format([self.maxTokensPerTurn, self.maxTrajectoryTokens])",
            field_path=".maxTokensPerTurn",
            check=lambda r: r.max_tokens_per_turn <= r.max_trajectory_tokens,
            message=lambda r: (
                f"maxTokensPerTurn ({r.max_tokens_per_turn}) must not exceed "
                f"maxTrajectoryTokens ({r.max_trajectory_tokens})"
            ),
        ),
        Rule(
            cel="self.llmTimeoutSeconds <= self.episodeTimeoutSeconds",
            message_expression="'llmTimeoutSeconds (%d) must not exceed episodeTimeoutSeconds "
            "(%d)'.format([self.llmTimeoutSeconds, self.episodeTimeoutSeconds])",
            field_path=".llmTimeoutSeconds",
            check=lambda r: r.llm_timeout_seconds <= r.episode_timeout_seconds,
            message=lambda r: (
                f"llmTimeoutSeconds ({r.llm_timeout_seconds}) must not exceed "
                f"episodeTimeoutSeconds ({r.episode_timeout_seconds})"
            ),
        ),
    )
