"""The one type that crosses from the rollout tier to the trainer: :class:`Trajectory`.

A trajectory carries the exact token ids the engine saw and produced (no re-tokenisation), the
engine's logprob of every generated token, a loss mask (1 on generated tokens, 0 on prompt and
tool observations), the verifier's reward, exactly one terminal class, which cap truncated it
(together: one :class:`EndReason` per way an episode ends),
timings, and the policy version it started under (for staleness accounting and off-policy
correction). ``training_action`` says what the failure policy does with it; infra errors are
always ``drop`` and never carry a reward.

Callers: :mod:`agentrl.rollout.episode` builds trajectories; the scheduler yields them; the
trainer consumes them (:mod:`agentrl.trainer.buffer`, :mod:`agentrl.trainer.batching`,
:mod:`agentrl.trainer.loop`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from agentrl.api.rollout import ClassAction, FailurePolicy, TerminalClass


class TruncationCap(StrEnum):
    """Which cap truncated an episode."""

    TURNS = "turns"
    """``rollout.maxTurns`` LLM calls without a submit."""
    TRAJECTORY_TOKENS = "trajectory_tokens"
    """``rollout.maxTrajectoryTokens`` (or the engine's ``contextLength``, whichever is lower)."""


class EndReason(StrEnum):
    """Why an episode ended: one value per way out, finer than the terminal class (whose
    ``truncated`` covers two caps)."""

    SUBMITTED = "submitted"
    """The agent called ``submit`` (terminal class ``completed``)."""
    TURN_CAP = "turn_cap"
    """``rollout.maxTurns`` reached without a submit (``truncated``)."""
    TOKEN_CAP = "token_cap"
    """The trajectory token budget ran out (``truncated``)."""
    WALL_CLOCK = "wall_clock"
    """The episode's wall clock ran out (``agent_timeout``)."""
    INFRA_ERROR = "infra_error"
    """The sandbox, engine or verifier failed (``infra_error``)."""


def end_reason(terminal: TerminalClass, truncation: TruncationCap | None) -> EndReason:
    """The end reason of an episode with this terminal class and cap."""
    if terminal == TerminalClass.TRUNCATED:
        return EndReason.TURN_CAP if truncation == TruncationCap.TURNS else EndReason.TOKEN_CAP
    return {
        TerminalClass.COMPLETED: EndReason.SUBMITTED,
        TerminalClass.AGENT_TIMEOUT: EndReason.WALL_CLOCK,
        TerminalClass.INFRA_ERROR: EndReason.INFRA_ERROR,
    }[terminal]


class Timings(BaseModel):
    """Where an episode's wall time went (seconds; ``started_at``/``finished_at`` are Unix)."""

    started_at: float = 0.0
    finished_at: float = 0.0
    sandbox_startup_seconds: float = 0.0
    llm_seconds: float = 0.0
    tool_seconds: float = 0.0
    verifier_seconds: float = 0.0

    @property
    def total_seconds(self) -> float:
        return max(0.0, self.finished_at - self.started_at)


class ToolUse(BaseModel):
    """How an episode's agent used its tools (native tool calls; text actions count the same
    way): what the tool-health metrics and ``status.rollout.tools`` are computed from."""

    calls: int = Field(default=0, ge=0)
    """Tool calls read from the model's replies (``submit`` included)."""
    call_errors: int = Field(default=0, ge=0)
    """Replies whose calls could not be read (malformed, unknown tool, bad arguments)."""
    turns_without_call: int = Field(default=0, ge=0)
    """Replies that called no tool at all."""
    prefix_checked: bool = False
    """The trajectory was checked against the chat template's rendering of the conversation
    (native tool calls; text actions have no template to check against)."""
    prefix_break: int | None = Field(default=None, ge=0)
    """The token index where the trajectory stopped being the template's rendering of the
    conversation (the loss is off from there); None: it never broke."""


class TurnRecord(BaseModel):
    """One agent turn, for logs and debugging (not used by the loss)."""

    action: str
    """The tool call as the agent wrote it (first line, or name + JSON arguments)."""
    observation: str
    """What the agent was shown back (after the tool output cap)."""
    generated_tokens: int = 0
    finish_reason: str = ""
    engine: str = ""
    weight_version: str | None = None


class Trajectory(BaseModel):
    """One finished episode attempt, ready for the trainer (or for the drop log)."""

    episode_id: str
    task_id: str
    group_id: str
    """Episodes of one task started together form a GRPO group."""
    attempt: int = 0
    """Infra-error retries before this attempt (0 = first try)."""
    policy_version: int
    """Trainer step whose weights the engines served when the episode was admitted."""
    terminal_class: TerminalClass
    truncation: TruncationCap | None = None
    """Set exactly when ``terminal_class`` is ``truncated``."""
    reward: float | None = None
    """Verifier reward; ``None`` for infra errors (never scored)."""
    training_action: ClassAction = ClassAction.TRAIN
    """What the failure policy does with this trajectory."""
    infra_reason: str | None = None
    """Why an infra error happened (logged when it is dropped)."""
    grade_status: Literal["resolved", "unresolved", "patch_failed", "empty_patch"] | None = None
    """How grading the agent's patch in a fresh sandbox ended
    (:class:`~agentrl.rollout.verifier.GradeStatus`); ``None`` when the task is scored in the
    agent's own sandbox (toy and Harbor tasks) or the episode was an infra error."""
    token_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    """Engine logprob per token; 0.0 where ``loss_mask`` is 0."""
    loss_mask: list[int] = Field(default_factory=list)
    prompt_length: int = 0
    """Tokens before the first generated token."""
    token_level: bool = True
    """False for chat-API episodes, which carry messages but no token ids to train on."""
    weight_versions: list[str] = Field(default_factory=list)
    """Weight versions the engines reported, one per turn (several after a mid-episode sync)."""
    turns: list[TurnRecord] = Field(default_factory=list)
    tool_use: ToolUse = Field(default_factory=ToolUse)
    timings: Timings = Field(default_factory=Timings)

    @model_validator(mode="after")
    def _consistent(self) -> Trajectory:
        if not (len(self.token_ids) == len(self.logprobs) == len(self.loss_mask)):
            raise ValueError("token_ids, logprobs and loss_mask must have the same length")
        if (self.truncation is not None) != (self.terminal_class == TerminalClass.TRUNCATED):
            raise ValueError("truncation is set exactly for truncated trajectories")
        if self.terminal_class == TerminalClass.INFRA_ERROR and self.reward is not None:
            raise ValueError("an infra error never carries a reward")
        return self

    @property
    def end_reason(self) -> EndReason:
        """How the episode ended (:class:`EndReason`)."""
        return end_reason(self.terminal_class, self.truncation)

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def generated_tokens(self) -> int:
        return sum(self.loss_mask)


def training_action(terminal: TerminalClass, policy: FailurePolicy) -> ClassAction:
    """What the failure policy does with an episode that ended in ``terminal``."""
    if terminal == TerminalClass.COMPLETED:
        return ClassAction.TRAIN
    if terminal == TerminalClass.TRUNCATED:
        return policy.truncated
    if terminal == TerminalClass.AGENT_TIMEOUT:
        return policy.agent_timeout
    return ClassAction.DROP  # infra errors are never trained on
