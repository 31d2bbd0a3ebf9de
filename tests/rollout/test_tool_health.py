"""Tool health (:mod:`agentrl.rollout.tool_health`) of hand-built episodes, against figures
worked out here: infra errors are counted in ``endReasons`` and in no rate, a rate with no
denominator is unknown (None), not 0."""

from __future__ import annotations

import pytest

from agentrl.api.rollout import TerminalClass
from agentrl.api.status import EndReasonStatus
from agentrl.api.wire import EndReasonCounts, ToolHealth
from agentrl.rollout.tool_health import ToolTally, tool_health
from agentrl.rollout.trajectory import (
    EndReason,
    ToolUse,
    Trajectory,
    TruncationCap,
    TurnRecord,
)

_ENDS = {
    EndReason.SUBMITTED: (TerminalClass.COMPLETED, None, 1.0),
    EndReason.TURN_CAP: (TerminalClass.TRUNCATED, TruncationCap.TURNS, 0.0),
    EndReason.TOKEN_CAP: (TerminalClass.TRUNCATED, TruncationCap.TRAJECTORY_TOKENS, 0.0),
    EndReason.WALL_CLOCK: (TerminalClass.AGENT_TIMEOUT, None, 0.0),
    EndReason.INFRA_ERROR: (TerminalClass.INFRA_ERROR, None, None),
}


def _episode(
    reason: EndReason,
    *,
    turns: int,
    calls: int = 0,
    errors: int = 0,
    without: int = 0,
    prefix_break: int | None = None,
    token_level: bool = True,
) -> Trajectory:
    terminal, truncation, reward = _ENDS[reason]
    tokens = 6 if token_level else 0
    return Trajectory(
        episode_id=f"e-{reason.value}-{turns}",
        task_id="t",
        group_id="g",
        policy_version=0,
        terminal_class=terminal,
        truncation=truncation,
        reward=reward,
        token_ids=list(range(tokens)),
        logprobs=[0.0] * tokens,
        loss_mask=[0, 0, 1, 1, 1, 1][:tokens],
        token_level=token_level,
        turns=[TurnRecord(action="a", observation="o") for _ in range(turns)],
        tool_use=ToolUse(
            calls=calls,
            call_errors=errors,
            turns_without_call=without,
            prefix_checked=token_level,
            prefix_break=prefix_break,
        ),
    )


# A: submitted, 3 replies each with one call (the last is submit).
# B: turn cap, 4 replies: 1 call, 1 unreadable, 2 without a call; the prefix broke at token 4.
# C: token cap, 2 replies, neither with a call.
# D: wall clock, a chat-API episode (no tokens to check), 1 reply with 1 call.
# E: an infra error, 2 replies (2 calls, 1 unreadable): in endReasons only.
WINDOW = [
    _episode(EndReason.SUBMITTED, turns=3, calls=3),
    _episode(EndReason.TURN_CAP, turns=4, calls=1, errors=1, without=2, prefix_break=4),
    _episode(EndReason.TOKEN_CAP, turns=2, without=2),
    _episode(EndReason.WALL_CLOCK, turns=1, calls=1, token_level=False),
    _episode(EndReason.INFRA_ERROR, turns=2, calls=2, errors=1),
]


def test_the_figures_of_a_window_worked_out_by_hand() -> None:
    assert tool_health(WINDOW) == ToolHealth(
        episodes=4,  # A-D; E is an infra error
        replies=10,  # 3 + 4 + 2 + 1
        calls_per_episode=1.25,  # (3 + 1 + 0 + 1) calls / 4 episodes
        parse_failure_rate=0.1,  # 1 unreadable reply (B) / 10
        no_tool_call_rate=0.4,  # (2 + 2) replies without a call (B, C) / 10
        submit_rate=0.25,  # A / 4
        prefix_break_rate=1 / 3,  # B / the 3 token-level episodes A, B, C
        end_reasons=EndReasonCounts(
            submitted=1, turn_cap=1, token_cap=1, wall_clock=1, infra_error=1
        ),
    )


def test_the_silent_failure_an_agent_that_never_calls_a_tool() -> None:
    prose = [_episode(EndReason.TURN_CAP, turns=5, without=5) for _ in range(3)]
    health = tool_health(prose)
    assert health is not None
    assert (health.no_tool_call_rate, health.calls_per_episode, health.submit_rate) == (
        1.0,
        0.0,
        0.0,
    )
    assert health.end_reasons.turn_cap == 3


def test_infra_errors_alone_leave_every_rate_unknown() -> None:
    health = tool_health([_episode(EndReason.INFRA_ERROR, turns=2, calls=2)] * 2)
    assert health == ToolHealth(episodes=0, replies=0, end_reasons=EndReasonCounts(infra_error=2))
    assert health.submit_rate is None and health.no_tool_call_rate is None


def test_no_replies_and_no_token_level_episodes_leave_their_rates_unknown() -> None:
    # an episode stopped by the wall clock before the first reply, over the chat API
    health = tool_health([_episode(EndReason.WALL_CLOCK, turns=0, token_level=False)])
    assert health is not None
    assert (health.episodes, health.calls_per_episode, health.submit_rate) == (1, 0.0, 0.0)
    assert (health.parse_failure_rate, health.no_tool_call_rate) == (None, None)
    assert health.prefix_break_rate is None


def test_an_empty_window_has_no_figures() -> None:
    assert tool_health([]) is None
    assert ToolTally().health() is None


def test_tallies_add_up_so_a_window_can_be_split() -> None:
    whole = ToolTally.of(WINDOW)
    first = ToolTally.of(WINDOW[:2])
    for trajectory in WINDOW[2:]:
        first.add(trajectory)
    assert first == whole
    # and survive their JSON (the driver's checkpoint)
    assert ToolTally.model_validate_json(whole.model_dump_json()) == whole


@pytest.mark.parametrize("counts", [EndReasonCounts, EndReasonStatus])
def test_the_end_reason_counts_have_one_field_per_end_reason(counts: type) -> None:
    assert set(counts.model_fields) == {r.value for r in EndReason}
