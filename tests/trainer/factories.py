"""Trajectory factories for the trainer tests."""

from __future__ import annotations

from agentrl.api.rollout import ClassAction, TerminalClass
from agentrl.rollout.trajectory import Trajectory, TruncationCap


def make_trajectory(
    group: str,
    reward: float | None,
    *,
    terminal: TerminalClass = TerminalClass.COMPLETED,
    action: ClassAction | None = None,
    version: int = 0,
    tokens: tuple[list[int], list[float], list[int]] | None = None,
    n: int = 0,
) -> Trajectory:
    ids, logprobs, mask = tokens or ([1, 2, 3], [0.0, -0.5, -0.7], [0, 1, 1])
    if action is None:
        action = {
            TerminalClass.COMPLETED: ClassAction.TRAIN,
            TerminalClass.TRUNCATED: ClassAction.TRAIN,
            TerminalClass.AGENT_TIMEOUT: ClassAction.MASK,
            TerminalClass.INFRA_ERROR: ClassAction.DROP,
        }[terminal]
    return Trajectory(
        episode_id=f"{group}-{n}-{reward}",
        task_id=group.split("#")[0],
        group_id=group,
        policy_version=version,
        terminal_class=terminal,
        truncation=TruncationCap.TURNS if terminal == TerminalClass.TRUNCATED else None,
        reward=reward,
        training_action=action,
        token_ids=ids,
        logprobs=logprobs,
        loss_mask=mask,
    )
