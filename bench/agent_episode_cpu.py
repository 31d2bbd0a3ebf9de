"""CPU per episode of the agent on the rollout tier: native tool calls beside text actions.

At 2,048 concurrent episodes the rollout tier's CPU is what scales, and the real-model path
adds work to every turn that the tiny policy's text actions do not have: the chat template is
rendered with the tool schemas, each reply is decoded and its calls parsed, and before every
generation the conversation is rendered whole and checked against the trajectory. This runs
the same episode through :class:`~agentrl.rollout.agent.TokenAgent` in both call syntaxes, side
by side in one process, and reports process CPU per episode and per turn:

- ``text``: the tiny policy's word tokenizer and its one-line text actions (what every episode
  of the tiny quickstart does);
- ``native``: the project's Qwen3 tokenizer and ``qwen3-instruct`` template
  (:mod:`agentrl.rollout.hf_model_files`, nothing downloaded), calls in ``<tool_call>`` JSON read
  by the ``qwen25`` parser, the SWE tool schemas in the template, the prefix check on;
- ``native_xml``: the same with ``qwen3-coder`` and ``qwen3_coder``.

Each episode runs the same calls in turn (run the tests, view the file, apply the wrong
edit, run the tests, apply the right one, run the tests, submit: seven turns; the text actions
run the tests with ``run_tests``, the native calls with ``bash``) against an
in-process engine that answers from ids encoded beforehand and a fake sandbox that answers each
command at once, so what is timed is the agent: rendering, parsing, the prefix check, the tool
runner and the trajectory. Ray, the engine client's HTTP and real sandboxes are not in it; they
are the same for both syntaxes (``bench/rollout_concurrency.py`` measures them).

    python bench/agent_episode_cpu.py [--episodes 200] [--rounds 3]

Prints one JSON object: per syntax, the median round's CPU per episode and per turn (ms), and
the ratios to ``text``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Sequence
from typing import Any

from agentrl.engine_client.client import FinishReason, GenerateResponse, MetaInfo, SamplingParams
from agentrl.rollout.agent import TokenAgent, TrajectoryBuilder, TurnTokenizer, WordTurnTokenizer
from agentrl.rollout.balancer import EnginePool
from agentrl.rollout.caps import EpisodeCaps
from agentrl.rollout.hf_model_files import build_tokenizer
from agentrl.rollout.hf_tokenizer import HFTurnTokenizer
from agentrl.rollout.swe_tools import tool_schemas
from agentrl.rollout.tasks.model import CandidateEdit, NamedTestsVerification, Task
from agentrl.rollout.toolcalls import ParsedToolCall, get_parser
from agentrl.sandbox.fake import FakeProvider, FakeSandbox
from agentrl.sandbox.provider import ExecResult, SandboxRequest
from agentrl.tiny.tokenizer import get_tokenizer

TEST_COMMAND = "python -m pytest -q tests"
FAILING_LOG = (
    "F.                                                                       [100%]\n"
    "FAILED tests/test_core.py::test_mean - AssertionError: mean([1, 2, 3]) is too large\n"
    "1 failed, 1 passed in 0.03s"
)

TASK = Task(
    id="bench-stats",
    source="toy",
    instruction=(
        "The repository has a bug: the test tests/test_core.py::test_mean fails. `mean` in "
        "core.py should return the average of the values. Fix it without breaking the other "
        "tests."
    ),
    files={
        "core.py": "def mean(values):\n    return sum(values) / (len(values) - 1)\n",
        "tests/test_core.py": "from core import mean\n\ndef test_mean():\n    "
        "assert mean([1, 2, 3]) == 2\n",
    },
    visible_test_command=TEST_COMMAND,
    verification=NamedTestsVerification(
        test_command=TEST_COMMAND, fail_to_pass=["tests/test_core.py::test_mean"]
    ),
    candidate_edits=[
        CandidateEdit(
            name="off_by_one", path="core.py", old="(len(values) - 1)", new="len(values)"
        ),
        CandidateEdit(
            name="wrong_operator", path="core.py", old="sum(values) /", new="sum(values) *"
        ),
    ],
)

#: The episode's calls: (text action, native call).
CALLS: list[tuple[str, tuple[str, dict[str, Any]]]] = [
    ("run_tests", ("bash", {"command": TEST_COMMAND})),
    ("view core.py", ("str_replace_editor", {"command": "view", "path": "core.py"})),
    ("apply wrong_operator", ("apply_edit", {"name": "wrong_operator"})),
    ("run_tests", ("bash", {"command": TEST_COMMAND})),
    ("apply off_by_one", ("apply_edit", {"name": "off_by_one"})),
    ("run_tests", ("bash", {"command": TEST_COMMAND})),
    ("submit", ("submit", {})),
]


def handler(sandbox: FakeSandbox, command: str) -> ExecResult:
    """Answers at once: the test log, a file's kind, git's questions."""
    if "pytest" in command:
        return ExecResult(exit_code=1, stdout=FAILING_LOG)
    if command.startswith("if [ -d"):
        return ExecResult(exit_code=0, stdout="file\n")
    return ExecResult(exit_code=1, stdout="")


class ReplayEngine:
    """Answers turn k of an episode with reply k's ids, encoded beforehand."""

    base_url = "http://bench-engine"
    healthy = True

    def __init__(self, replies: Sequence[list[int]]) -> None:
        self.replies = replies
        self.turn = 0
        """The next reply's index (episodes run one after the other; reset for each)."""

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: SamplingParams,
        *,
        rid: str | None = None,
        timeout: float | None = None,
    ) -> GenerateResponse:
        ids = self.replies[min(self.turn, len(self.replies) - 1)]
        self.turn += 1
        return GenerateResponse(
            text="",
            output_ids=ids,
            meta_info=MetaInfo(
                finish_reason=FinishReason(type="stop"),
                output_token_logprobs=[(-0.5, i, None) for i in ids],
                weight_version="0",
            ),
        )

    async def health(self, *, timeout: float = 10.0) -> bool:
        return True


def syntaxes() -> dict[str, tuple[TurnTokenizer, list[list[int]]]]:
    """Per syntax: the turn tokenizer and the episode's replies as the engine's output ids."""
    edits = [e.name for e in TASK.candidate_edits]
    words = get_tokenizer()
    text = [[*words.encode(action), words.eos_id] for action, _ in CALLS]
    out: dict[str, tuple[TurnTokenizer, list[list[int]]]] = {"text": (WordTurnTokenizer(), text)}
    for name, template, parser in (
        ("native", "qwen3-instruct", "qwen25"),
        ("native_xml", "qwen3-coder", "qwen3_coder"),
    ):
        tok = build_tokenizer(template=template)
        end = tok.convert_tokens_to_ids("<|im_end|>")
        syntax = get_parser(parser)
        replies = [
            [
                *tok.encode(
                    syntax.format_call(ParsedToolCall(name=call, arguments=args)),
                    add_special_tokens=False,
                ),
                end,
            ]
            for _, (call, args) in CALLS
        ]
        turns = HFTurnTokenizer(tok, tools=tool_schemas(edits), tool_call_parser=parser)
        out[name] = (turns, replies)
    return out


async def one_round(turns: TurnTokenizer, replies: list[list[int]], episodes: int) -> float:
    """CPU seconds of ``episodes`` episodes, one after the other."""
    from agentrl.rollout.swe_tools import SWEToolRunner

    engine = ReplayEngine(replies)
    agent = TokenAgent(
        EnginePool([engine]),  # type: ignore[list-item]
        turns,
        EpisodeCaps(max_turns=len(CALLS) + 2, max_trajectory_tokens=16_384),
    )
    provider = FakeProvider(handler)
    start = time.process_time()
    for n in range(episodes):
        sandbox = await provider.create(SandboxRequest(episode_id=f"e{n}"))
        for path, content in TASK.files.items():
            await sandbox.write_file(path, content)
        tools = SWEToolRunner(sandbox, TASK, timeout_seconds=30, output_max_bytes=10_000)
        out = TrajectoryBuilder()
        engine.turn = 0
        await agent.run(f"e{n}", TASK, tools, out)
        assert out.submitted and len(out.turns) == len(CALLS), [t.action for t in out.turns]
        assert out.tool_use.call_errors == 0 and out.tool_use.prefix_break is None
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    report: dict[str, Any] = {"episodes": args.episodes, "turns_per_episode": len(CALLS)}
    per_episode: dict[str, float] = {}
    for name, (turns, replies) in syntaxes().items():
        asyncio.run(one_round(turns, replies, 5))  # warm up
        rounds = [asyncio.run(one_round(turns, replies, args.episodes)) for _ in range(args.rounds)]
        ms = statistics.median(rounds) / args.episodes * 1000
        per_episode[name] = ms
        report[name] = {
            "cpu_ms_per_episode": round(ms, 3),
            "cpu_ms_per_turn": round(ms / len(CALLS), 3),
            "rounds_cpu_ms_per_episode": [round(r / args.episodes * 1000, 3) for r in rounds],
        }
    for name in per_episode:
        if name != "text":
            report[f"{name}_over_text"] = round(per_episode[name] / per_episode["text"], 2)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
