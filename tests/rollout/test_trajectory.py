"""The trajectory type holds its invariants at construction."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agentrl.api.rollout import ClassAction, FailurePolicy, TerminalClass
from agentrl.rollout.trajectory import Trajectory, TruncationCap, training_action

BASE = {"episode_id": "e", "task_id": "t", "group_id": "g", "policy_version": 0}


def test_token_ids_logprobs_and_loss_mask_must_align() -> None:
    with pytest.raises(ValidationError, match="same length"):
        Trajectory(
            **BASE,
            terminal_class=TerminalClass.COMPLETED,
            reward=1.0,
            token_ids=[1, 2],
            logprobs=[0.0],
            loss_mask=[0, 1],
        )


def test_an_infra_error_cannot_carry_a_reward() -> None:
    with pytest.raises(ValidationError, match="never carries a reward"):
        Trajectory(**BASE, terminal_class=TerminalClass.INFRA_ERROR, reward=0.0)


def test_truncation_names_its_cap_exactly_when_truncated() -> None:
    with pytest.raises(ValidationError, match="truncation"):
        Trajectory(**BASE, terminal_class=TerminalClass.TRUNCATED, reward=0.0)
    with pytest.raises(ValidationError, match="truncation"):
        Trajectory(
            **BASE,
            terminal_class=TerminalClass.COMPLETED,
            reward=0.0,
            truncation=TruncationCap.TURNS,
        )


@pytest.mark.parametrize(
    ("terminal", "expected"),
    [
        (TerminalClass.COMPLETED, ClassAction.TRAIN),
        (TerminalClass.TRUNCATED, ClassAction.DROP),  # the policy below says drop
        (TerminalClass.AGENT_TIMEOUT, ClassAction.MASK),
        (TerminalClass.INFRA_ERROR, ClassAction.DROP),
    ],
)
def test_each_terminal_class_maps_to_the_failure_policys_action(
    terminal: TerminalClass, expected: ClassAction
) -> None:
    policy = FailurePolicy(truncated=ClassAction.DROP, agent_timeout=ClassAction.MASK)
    assert training_action(terminal, policy) == expected
