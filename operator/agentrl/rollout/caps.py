"""The caps that bound an episode, read from the spec in one place.

Callers: :mod:`agentrl.rollout.episode` and the scaffolds in :mod:`agentrl.rollout.agent`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from agentrl.api.job import AgentRLJobSpec


class EpisodeCaps(BaseModel):
    """Every limit of one episode (seconds, tokens, bytes)."""

    model_config = ConfigDict(frozen=True)

    max_turns: int = 50
    max_trajectory_tokens: int = 65536
    """``min(rollout.maxTrajectoryTokens, inference.contextLength)``: the engine's context cap
    always wins."""
    max_tokens_per_turn: int = 8192
    episode_timeout_seconds: float = 3600.0
    llm_timeout_seconds: float = 600.0
    tool_timeout_seconds: float = 180.0
    verifier_timeout_seconds: float = 1800.0
    tool_output_max_bytes: int = 16384
    show_remaining_turns: bool = True
    """End each turn's last tool observation with the turns left (native tool calls)."""
    sandbox_startup_timeout_seconds: float = 300.0
    temperature: float = 1.0
    top_p: float = 1.0

    @classmethod
    def from_spec(cls, spec: AgentRLJobSpec) -> EpisodeCaps:
        rollout = spec.rollout
        return cls(
            max_turns=rollout.max_turns,
            max_trajectory_tokens=min(rollout.max_trajectory_tokens, spec.inference.context_length),
            max_tokens_per_turn=rollout.max_tokens_per_turn,
            episode_timeout_seconds=rollout.episode_timeout_seconds,
            llm_timeout_seconds=rollout.llm_timeout_seconds,
            tool_timeout_seconds=rollout.tool_timeout_seconds,
            verifier_timeout_seconds=rollout.verifier_timeout_seconds,
            tool_output_max_bytes=rollout.tool_output_max_bytes,
            show_remaining_turns=rollout.show_remaining_turns,
            sandbox_startup_timeout_seconds=spec.sandbox.startup_timeout_seconds,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
        )
