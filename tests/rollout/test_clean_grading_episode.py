"""An episode of a task graded by its eval script (SWE-bench, SWE-smith) grades the agent's patch
in a fresh sandbox, after the agent's is released: nothing the agent left in its own sandbox but
the patch counts; a patch that applies nowhere is reward 0, a grading sandbox that cannot start
an infra error.

The task is the synthetic SWE-bench instance of :mod:`tests.rollout.test_swebench_local` (a
real git repository in local sandboxes, its eval script run and graded as the harness does).
Agents are scripted: one calls the native tools (:class:`~agentrl.rollout.swe_tools.
SWEToolRunner`) as a tool-calling model's replies would, the other is the token-level agent
driven by a scripted engine's text actions (a chat tokenizer without a tool-call parser).
"""

from __future__ import annotations

import functools
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from transformers import PreTrainedTokenizerFast

from agentrl.api.rollout import FailurePolicy, TerminalClass
from agentrl.rollout.agent import TokenAgent, TrajectoryBuilder
from agentrl.rollout.balancer import EnginePool
from agentrl.rollout.caps import EpisodeCaps
from agentrl.rollout.episode import Agent, EpisodeRunner, grades_patch
from agentrl.rollout.hf_model_files import build_tokenizer
from agentrl.rollout.hf_tokenizer import HFTurnTokenizer
from agentrl.rollout.swe_tools import SWEToolRunner
from agentrl.rollout.tasks.model import Task
from agentrl.rollout.trajectory import Trajectory, TruncationCap
from agentrl.rollout.verifier import GradeStatus, verify
from agentrl.sandbox.errors import SandboxCreateError
from agentrl.sandbox.fake import FakeProvider
from agentrl.sandbox.local import LocalProvider
from agentrl.sandbox.provider import Sandbox, SandboxRequest
from tests.rollout.fakes import ScriptedEngine, pytest_handler, toy_task
from tests.rollout.test_swebench_local import (
    FIX,
    GIT_ENV,
    as_local_task,
    base_commit,
    instance,
)

SUBMIT = ("submit", {})
#: The fix as a shell command (line 2 of calc.py is ``add``'s body).
SED_FIX = "sed -i '2s/a - b/a + b/' calc.py"


class LeaseLog:
    """A local provider that logs each lease and release, and can refuse given leases."""

    name = "local"

    def __init__(self, inner: LocalProvider, *, refuse: Sequence[int] = ()) -> None:
        self.inner = inner
        self.refuse = set(refuse)
        """Numbers (0-based, in order of request) of the creates that fail."""
        self.creates = 0
        self.events: list[tuple[str, str]] = []

    async def create(self, request: SandboxRequest) -> Sandbox:
        number = self.creates
        self.creates += 1
        self.events.append(("create", request.episode_id))
        if number in self.refuse:
            raise SandboxCreateError("no capacity", provider="local")
        sandbox = await self.inner.create(request)
        close = sandbox.close

        async def logged_close() -> None:
            self.events.append(("close", request.episode_id))
            await close()

        sandbox.close = logged_close  # type: ignore[method-assign]
        return sandbox

    async def aclose(self) -> None:
        await self.inner.aclose()


class CallingAgent:
    """Calls the native tools in order, as a tool-calling model's replies would, then stops
    (submitted when its last call was ``submit``; else cut by the turn cap)."""

    def __init__(self, calls: Sequence[tuple[str, dict[str, Any]]]) -> None:
        self.calls = list(calls)

    async def run(
        self, episode_id: str, task: Task, tools: SWEToolRunner, out: TrajectoryBuilder
    ) -> None:
        for name, arguments in self.calls:
            result = await tools.call(name, arguments)
            if result.submitted:
                out.submitted = True
                return
        out.truncation = TruncationCap.TURNS


def runner(
    provider: LeaseLog | FakeProvider, agent: Agent, *, retries: int = 0, **caps: Any
) -> EpisodeRunner:
    async def no_sleep(_: float) -> None:
        return None

    return EpisodeRunner(
        provider=provider,  # type: ignore[arg-type]
        agent=agent,
        caps=EpisodeCaps(
            **{"max_turns": 10, "tool_timeout_seconds": 60, "verifier_timeout_seconds": 120} | caps
        ),
        failure_policy=FailurePolicy(infra_retries=retries),
        sleep=no_sleep,
    )


@functools.cache
def _tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer(template="qwen3-instruct")


def token_agent(script: list[str], **caps: Any) -> TokenAgent:
    """The token-level agent in text actions (a chat model's tokenizer without a tool-call
    parser, so a scripted shell command reaches the sandbox as written)."""
    tok = _tokenizer()
    engine = ScriptedEngine(
        script,
        encode=lambda text: list(tok.encode(text, add_special_tokens=False)),
        end_id=tok.convert_tokens_to_ids("<|im_end|>"),
    )
    return TokenAgent(
        EnginePool([engine]),
        HFTurnTokenizer(tok),
        EpisodeCaps(**{"max_turns": 10, "max_tokens_per_turn": 256} | caps),
    )


async def episode(runner: EpisodeRunner, task: Task) -> Trajectory:
    return await runner.run(task, group_id="g", policy_version=1)


def grades(status: str) -> float:
    return REGISTRY.get_sample_value("agentrl_rollout_grades_total", {"status": status}) or 0.0


@pytest.fixture
def task(tmp_path: Path) -> Task:
    return as_local_task(instance(base_commit(tmp_path)))


@pytest.fixture
def local(tmp_path: Path) -> LocalProvider:
    return LocalProvider(base_dir=str(tmp_path / "boxes"))


def test_eval_script_tasks_are_graded_on_their_patch_toy_tasks_in_their_sandbox(
    task: Task,
) -> None:
    assert grades_patch(task) is True
    assert grades_patch(toy_task()) is False


async def test_a_submitted_fix_is_resolved_in_a_fresh_sandbox_after_the_agents_is_released(
    task: Task, local: LocalProvider
) -> None:
    provider = LeaseLog(local)
    resolved0 = grades("resolved")
    trajectory = await episode(runner(provider, CallingAgent([FIX, SUBMIT])), task)
    assert (trajectory.terminal_class, trajectory.reward, trajectory.grade_status) == (
        TerminalClass.COMPLETED,
        1.0,
        GradeStatus.RESOLVED,
    )
    agent_box = trajectory.episode_id
    grade_box = f"{agent_box}-grade"
    # two leases: the agent's, released before the grader's is created
    assert provider.events == [
        ("create", agent_box),
        ("close", agent_box),
        ("create", grade_box),
        ("close", grade_box),
    ]
    assert trajectory.timings.verifier_seconds > 0
    assert grades("resolved") - resolved0 == 1
    # the grade status is part of what crosses to the trainer
    again = Trajectory.model_validate_json(trajectory.model_dump_json())
    assert again.grade_status == "resolved"


async def test_an_episode_that_edits_the_tests_instead_of_the_code_is_not_resolved(
    task: Task, local: LocalProvider
) -> None:
    weakened = "def test_sub():\n    pass\n\n\ndef test_add():\n    pass\n"
    cheat = ("bash", {"command": f"printf '%s' {shlex.quote(weakened)} > tests/test_calc.py"})
    trajectory = await episode(runner(LeaseLog(local), CallingAgent([cheat, SUBMIT])), task)
    assert (trajectory.terminal_class, trajectory.reward, trajectory.grade_status) == (
        TerminalClass.COMPLETED,
        0.0,
        GradeStatus.UNRESOLVED,
    )


#: A pytest plugin at the repository's root that makes ``add`` right at test time, kept out of
#: the patch by the sandbox's own git excludes: only the agent's sandbox has it.
ROOT_CONFTEST = "import calc\n\ncalc.add = lambda a, b: a + b\n"
HIDDEN_CHEAT = (
    "bash",
    {
        "command": f"printf '%s' {shlex.quote(ROOT_CONFTEST)} > conftest.py && "
        "echo conftest.py >> .git/info/exclude"
    },
)


async def test_what_the_agent_leaves_in_its_sandbox_outside_the_patch_does_not_count(
    task: Task, local: LocalProvider
) -> None:
    # the cheat works where the agent ran: graded in its own sandbox, the task is resolved
    async with await local.create(SandboxRequest(episode_id="own", workdir=task.workdir)) as box:
        for path, content in task.files.items():
            await box.write_file(path, content)
        for command in task.setup_commands:
            assert (await box.exec(command, timeout=60)).ok
        tools = SWEToolRunner(box, task, timeout_seconds=60, output_max_bytes=10_000)
        await tools.call(*HIDDEN_CHEAT)
        assert (await tools.call(*SUBMIT)).patch == ""
        assert (await verify(box, task, timeout=120)).reward == 1.0
    # graded on its (empty) patch in a fresh sandbox, it is not
    trajectory = await episode(runner(LeaseLog(local), CallingAgent([HIDDEN_CHEAT, SUBMIT])), task)
    assert (trajectory.terminal_class, trajectory.reward, trajectory.grade_status) == (
        TerminalClass.COMPLETED,
        0.0,
        GradeStatus.EMPTY_PATCH,
    )


async def test_a_patch_that_does_not_apply_is_reward_0_and_completed_not_an_infra_error(
    task: Task, local: LocalProvider
) -> None:
    # an image that is not reproducible: each sandbox commits a stamp of its own, so the
    # agent's edit of it matches no fresh copy of the task
    commit = " ".join(f"{k}={v}" for k, v in GIT_ENV.items())
    stamp = (
        "head -c 16 /dev/urandom | od -An -tx1 > stamp.txt && git add stamp.txt && "
        f"{commit} git commit -q -m stamp"
    )
    drifting = task.model_copy(update={"setup_commands": [*task.setup_commands, stamp]})
    edit = ("bash", {"command": "echo agent > stamp.txt"})
    failed0 = grades("patch_failed")
    provider = LeaseLog(local)
    trajectory = await episode(runner(provider, CallingAgent([FIX, edit, SUBMIT])), drifting)
    assert (trajectory.terminal_class, trajectory.reward, trajectory.grade_status) == (
        TerminalClass.COMPLETED,
        0.0,
        GradeStatus.PATCH_FAILED,
    )
    assert trajectory.infra_reason is None
    assert [kind for kind, _ in provider.events] == ["create", "close", "create", "close"]
    assert grades("patch_failed") - failed0 == 1


async def test_a_grading_sandbox_that_fails_to_start_is_an_infra_error_never_a_reward(
    task: Task, local: LocalProvider
) -> None:
    provider = LeaseLog(local, refuse=[1])
    trajectory = await episode(runner(provider, CallingAgent([FIX, SUBMIT])), task)
    assert trajectory.terminal_class == TerminalClass.INFRA_ERROR
    assert (trajectory.reward, trajectory.grade_status) == (None, None)
    assert trajectory.infra_reason is not None
    assert trajectory.infra_reason.startswith("sandbox_create")
    assert [e[1].endswith("-grade") for e in provider.events if e[0] == "create"] == [
        False,
        True,
    ]


async def test_a_failed_grading_sandbox_is_retried_within_the_infra_budget(
    task: Task, local: LocalProvider
) -> None:
    provider = LeaseLog(local, refuse=[1])
    trajectory = await episode(runner(provider, CallingAgent([FIX, SUBMIT]), retries=1), task)
    assert (trajectory.terminal_class, trajectory.reward, trajectory.attempt) == (
        TerminalClass.COMPLETED,
        1.0,
        1,
    )
    # attempt 0: agent, grader refused; attempt 1: agent, grader
    assert provider.creates == 4


async def test_a_turn_capped_episode_is_graded_on_its_changes_so_far(
    task: Task, local: LocalProvider
) -> None:
    agent = token_agent([f"bash {SED_FIX}", "run_tests"], max_turns=2)
    provider = LeaseLog(local)
    trajectory = await episode(runner(provider, agent, max_turns=2), task)
    assert trajectory.terminal_class == TerminalClass.TRUNCATED
    assert trajectory.truncation == TruncationCap.TURNS
    assert (trajectory.reward, trajectory.grade_status) == (1.0, GradeStatus.RESOLVED)
    assert provider.creates == 2


async def test_a_text_action_agent_that_commits_its_fix_keeps_it_in_the_patch(
    task: Task, local: LocalProvider
) -> None:
    commit = "git -c user.name=a -c user.email=a@example.com commit -qam fix"
    agent = token_agent([f"bash {SED_FIX} && {commit}", "submit"])
    trajectory = await episode(runner(LeaseLog(local), agent), task)
    assert (trajectory.terminal_class, trajectory.reward, trajectory.grade_status) == (
        TerminalClass.COMPLETED,
        1.0,
        GradeStatus.RESOLVED,
    )


async def test_a_toy_task_is_still_scored_in_the_agents_own_sandbox() -> None:
    provider = FakeProvider(pytest_handler)
    trajectory = await episode(runner(provider, token_agent(["apply fix", "submit"])), toy_task())
    assert (trajectory.terminal_class, trajectory.reward, trajectory.grade_status) == (
        TerminalClass.COMPLETED,
        1.0,
        None,
    )
    assert len(provider.sandboxes) == 1
