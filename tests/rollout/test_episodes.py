"""One episode ends in exactly one terminal class, keeps the engine's exact tokens, and never
turns an infrastructure failure into a reward."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from agentrl.api.rollout import ClassAction, FailurePolicy, TerminalClass
from agentrl.rollout.agent import TokenAgent, WordTurnTokenizer
from agentrl.rollout.balancer import EnginePool
from agentrl.rollout.caps import EpisodeCaps
from agentrl.rollout.episode import EpisodeRunner
from agentrl.rollout.tasks.model import RewardFileVerification, Task
from agentrl.rollout.trajectory import Trajectory, TruncationCap
from agentrl.sandbox.fake import FakeProvider
from agentrl.tiny.tokenizer import get_tokenizer
from tests.rollout.fakes import LOGPROB, ScriptedEngine, pytest_handler, toy_task


class Runner:
    def __init__(
        self,
        engine: ScriptedEngine,
        provider: FakeProvider | None = None,
        policy: FailurePolicy | None = None,
        **caps: float | bool,
    ) -> None:
        self.engine = engine
        self.provider = provider or FakeProvider(pytest_handler)
        self.sleeps: list[float] = []
        pool = EnginePool([engine])
        self.caps = EpisodeCaps(
            **{"max_turns": 10, "max_trajectory_tokens": 4096, "max_tokens_per_turn": 64, **caps}
        )

        async def sleep(seconds: float) -> None:
            self.sleeps.append(seconds)

        self.runner = EpisodeRunner(
            provider=self.provider,
            agent=TokenAgent(pool, WordTurnTokenizer(), self.caps),
            caps=self.caps,
            failure_policy=policy or FailurePolicy(),
            sleep=sleep,
            on_release=pool.release,
        )

    async def run(self, task: Task | None = None) -> Trajectory:
        return await self.runner.run(task or toy_task(), group_id="g", policy_version=3)


def counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_a_submitted_fix_completes_with_reward_one_and_the_engines_exact_tokens() -> None:
    engine = ScriptedEngine(["apply fix", "submit"])
    trajectory = await Runner(engine).run()
    assert trajectory.terminal_class == TerminalClass.COMPLETED
    assert trajectory.reward == 1.0
    assert trajectory.training_action == ClassAction.TRAIN
    assert trajectory.policy_version == 3
    assert [t.action for t in trajectory.turns] == ["apply fix", "submit"]
    # TITO: the second call's input is exactly the trajectory so far, and the trajectory is
    # prompt + reply 1 + observation + reply 2.
    first_input, second_input = engine.inputs
    assert trajectory.prompt_length == len(first_input)
    assert trajectory.token_ids[: len(second_input)] == second_input
    tok = get_tokenizer()
    reply1 = [*tok.encode("apply fix"), tok.eos_id]
    reply2 = [*tok.encode("submit"), tok.eos_id]
    assert second_input[len(first_input) : len(first_input) + len(reply1)] == reply1
    assert trajectory.token_ids[len(second_input) :] == reply2
    assert trajectory.generated_tokens == len(reply1) + len(reply2)
    generated = [lp for lp, m in zip(trajectory.logprobs, trajectory.loss_mask, strict=True) if m]
    assert generated == [LOGPROB] * (len(reply1) + len(reply2))
    assert trajectory.weight_versions == ["7", "7"]


async def test_a_wrong_fix_completes_with_reward_zero() -> None:
    trajectory = await Runner(ScriptedEngine(["apply decoy", "submit"])).run()
    assert (trajectory.terminal_class, trajectory.reward) == (TerminalClass.COMPLETED, 0.0)


async def test_the_turn_cap_truncates_and_the_tests_still_score_it() -> None:
    trajectory = await Runner(ScriptedEngine(["run_tests"]), max_turns=3).run()
    assert trajectory.terminal_class == TerminalClass.TRUNCATED
    assert trajectory.truncation == TruncationCap.TURNS
    assert len(trajectory.turns) == 3
    assert trajectory.reward == 0.0
    assert trajectory.training_action == ClassAction.TRAIN  # the default failure policy


async def test_the_token_cap_bounds_each_call_and_truncates_the_trajectory() -> None:
    engine = ScriptedEngine(["run_tests"])
    probe = Runner(ScriptedEngine(["submit"]))
    prompt = (await probe.run()).prompt_length
    cap = prompt + 10
    trajectory = await Runner(engine, max_trajectory_tokens=cap, max_tokens_per_turn=64).run()
    # The first call may only generate what is left of the budget: cap - prompt = 10 tokens.
    assert engine.sampling[0].max_new_tokens == 10
    assert trajectory.truncation == TruncationCap.TRAJECTORY_TOKENS
    assert len(trajectory.token_ids) <= cap


async def test_running_out_of_wall_clock_is_an_agent_timeout_masked_by_default() -> None:
    engine = ScriptedEngine(["run_tests"], latency=0.2)
    trajectory = await Runner(engine, episode_timeout_seconds=0.5).run()
    assert trajectory.terminal_class == TerminalClass.AGENT_TIMEOUT
    assert trajectory.training_action == ClassAction.MASK
    assert trajectory.reward == 0.0  # the verifier still ran
    assert 1 <= len(trajectory.turns) <= 3


async def test_a_sandbox_creation_failure_is_retried_after_a_backoff() -> None:
    retries0 = counter("agentrl_rollout_infra_retries_total", reason="sandbox_create")
    runner = Runner(
        ScriptedEngine(["apply fix", "submit"]), FakeProvider(pytest_handler, fail_creates=1)
    )
    trajectory = await runner.run()
    assert (trajectory.terminal_class, trajectory.reward, trajectory.attempt) == (
        TerminalClass.COMPLETED,
        1.0,
        1,
    )
    assert runner.sleeps == [1.0]
    assert counter("agentrl_rollout_infra_retries_total", reason="sandbox_create") - retries0 == 1


async def test_infra_errors_past_the_budget_are_dropped_never_scored() -> None:
    dropped0 = counter("agentrl_rollout_infra_dropped_total", reason="sandbox_create")
    policy = FailurePolicy(infra_retries=2, infra_retry_backoff_seconds=0.5)
    runner = Runner(
        ScriptedEngine(["submit"]), FakeProvider(pytest_handler, fail_creates=9), policy=policy
    )
    trajectory = await runner.run()
    assert trajectory.terminal_class == TerminalClass.INFRA_ERROR
    assert trajectory.reward is None
    assert trajectory.training_action == ClassAction.DROP
    assert trajectory.attempt == 2
    assert trajectory.infra_reason is not None
    assert trajectory.infra_reason.startswith("sandbox_create")
    assert runner.sleeps == [0.5, 1.0]  # 0.5 · 2^0, 0.5 · 2^1
    assert counter("agentrl_rollout_infra_dropped_total", reason="sandbox_create") - dropped0 == 1


async def test_an_unreachable_engine_is_an_infra_error() -> None:
    policy = FailurePolicy(infra_retries=0)
    trajectory = await Runner(ScriptedEngine(["submit"], fail_calls=5), policy=policy).run()
    assert trajectory.terminal_class == TerminalClass.INFRA_ERROR
    assert trajectory.infra_reason is not None
    assert trajectory.infra_reason.startswith("engine_unavailable")
    assert trajectory.reward is None


async def test_a_verifier_that_writes_no_reward_is_an_infra_error_not_a_zero() -> None:
    task = toy_task().model_copy(
        update={"verification": RewardFileVerification(files={"/tests/test.sh": "exit 0"})}
    )
    trajectory = await Runner(
        ScriptedEngine(["submit"]), policy=FailurePolicy(infra_retries=0)
    ).run(task)
    assert trajectory.terminal_class == TerminalClass.INFRA_ERROR
    assert trajectory.infra_reason is not None
    assert trajectory.infra_reason.startswith("verifier")
    assert trajectory.reward is None


async def test_tool_output_is_cut_to_the_cap_keeping_head_and_tail() -> None:
    def loud(sandbox: object, command: str) -> object:
        from agentrl.sandbox.provider import ExecResult

        return ExecResult(exit_code=0, stdout="H" * 1000 + "T" * 1000)

    runner = Runner(
        ScriptedEngine(["bash noisy", "submit"]),
        FakeProvider(loud),  # type: ignore[arg-type]
        tool_output_max_bytes=300,
        policy=FailurePolicy(infra_retries=0),
        show_remaining_turns=False,  # the scaffold's line after the cut output
    )
    trajectory = await runner.run()
    observation = trajectory.turns[0].observation
    assert len(observation.encode()) <= 300
    assert observation.startswith("H")
    assert "bytes truncated" in observation
    assert observation.endswith("[exit code 0]")


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (FailurePolicy(truncated=ClassAction.MASK), ClassAction.MASK),
        (FailurePolicy(truncated=ClassAction.DROP), ClassAction.DROP),
    ],
)
async def test_the_failure_policy_decides_what_truncation_does_to_training(
    policy: FailurePolicy, expected: ClassAction
) -> None:
    trajectory = await Runner(ScriptedEngine(["run_tests"]), policy=policy, max_turns=1).run()
    assert trajectory.training_action == expected
