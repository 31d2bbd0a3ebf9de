"""Each way an episode ends has its own end reason, read off real episodes (scripted engine,
fake sandbox), on top of the four terminal classes."""

from __future__ import annotations

from agentrl.api.rollout import FailurePolicy, TerminalClass
from agentrl.rollout.trajectory import EndReason, TruncationCap, end_reason
from agentrl.sandbox.fake import FakeProvider
from tests.rollout.fakes import ScriptedEngine, pytest_handler
from tests.rollout.test_episodes import Runner


async def test_a_submit_ends_as_submitted() -> None:
    trajectory = await Runner(ScriptedEngine(["apply fix", "submit"])).run()
    assert (trajectory.terminal_class, trajectory.end_reason) == (
        TerminalClass.COMPLETED,
        EndReason.SUBMITTED,
    )


async def test_the_turn_and_token_caps_are_told_apart() -> None:
    turns = await Runner(ScriptedEngine(["run_tests"]), max_turns=2).run()
    prompt = (await Runner(ScriptedEngine(["submit"])).run()).prompt_length
    tokens = await Runner(ScriptedEngine(["run_tests"]), max_trajectory_tokens=prompt + 10).run()
    assert (turns.terminal_class, turns.end_reason) == (
        TerminalClass.TRUNCATED,
        EndReason.TURN_CAP,
    )
    assert (tokens.terminal_class, tokens.end_reason) == (
        TerminalClass.TRUNCATED,
        EndReason.TOKEN_CAP,
    )


async def test_the_wall_clock_and_infra_errors_have_their_own_reasons() -> None:
    clock = await Runner(
        ScriptedEngine(["run_tests"], latency=0.2), episode_timeout_seconds=0.5
    ).run()
    assert (clock.terminal_class, clock.end_reason) == (
        TerminalClass.AGENT_TIMEOUT,
        EndReason.WALL_CLOCK,
    )
    infra = await Runner(
        ScriptedEngine(["submit"]),
        FakeProvider(pytest_handler, fail_creates=9),
        policy=FailurePolicy(infra_retries=0),
    ).run()
    assert (infra.terminal_class, infra.end_reason) == (
        TerminalClass.INFRA_ERROR,
        EndReason.INFRA_ERROR,
    )


def test_every_terminal_class_and_cap_maps_to_one_reason() -> None:
    pairs = [
        (TerminalClass.COMPLETED, None),
        (TerminalClass.TRUNCATED, TruncationCap.TURNS),
        (TerminalClass.TRUNCATED, TruncationCap.TRAJECTORY_TOKENS),
        (TerminalClass.AGENT_TIMEOUT, None),
        (TerminalClass.INFRA_ERROR, None),
    ]
    assert sorted(end_reason(t, c) for t, c in pairs) == sorted(EndReason)
