"""The training scaffold acting through native tool calls: real ``transformers`` tokenizers with
agentrl's templates of both call syntaxes (JSON in ``<tool_call>``, Qwen3-Coder XML), a scripted
engine answering with the ids a model would generate, the SWE tools over a local sandbox holding
a small real git repository.

Expected values are written by hand: the calls in each syntax, the conversation as chat
messages (rendered by ``apply_chat_template`` with the tools, then tokenised), the diff lines of
the fix, the turns left on each observation."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from agentrl.api.job import AgentRLJobSpec
from agentrl.engine_client.client import ModelInfo
from agentrl.rollout.agent import (
    NO_TOOL_CALL_OBSERVATION,
    SYSTEM_PROMPT,
    TokenAgent,
    TrajectoryBuilder,
    native_tool_calls,
)
from agentrl.rollout.balancer import EnginePool
from agentrl.rollout.caps import EpisodeCaps
from agentrl.rollout.hf_model_files import build_tokenizer, write_tokenizer_files
from agentrl.rollout.hf_tokenizer import HFTurnTokenizer
from agentrl.rollout.runtime import turn_tokenizer_for
from agentrl.rollout.swe_tools import SWEToolRunner, tool_schemas
from agentrl.rollout.tasks.model import NamedTestsVerification, Task
from agentrl.rollout.tools import ToolResult
from agentrl.sandbox.local import LocalProvider
from agentrl.sandbox.provider import Sandbox, SandboxRequest
from tests.rollout.fakes import LOGPROB, ScriptedEngine

APP = (
    "def total(xs):\n"
    '    """The sum of xs."""\n'
    "    result = 0\n"
    "    for x in xs[1:]:\n"
    "        result += x\n"
    "    return result\n"
)
GIT = "git -c user.name=a -c user.email=a@example.com commit -q --no-verify"
RUN_TESTS = (
    "python3 - <<'EOF'\n"
    "from app import total\n"
    "assert total([1, 2, 3]) == 6, total([1, 2, 3])\n"
    "print('tests pass')\n"
    "EOF"
)
OLD = "    for x in xs[1:]:\n        result += x"
NEW = "    for x in xs:\n        result = result + x"
MAX_TURNS = 10


@dataclass(frozen=True)
class Syntax:
    template: str
    parser: str
    malformed: str
    """A reply whose call cannot be read, and the parse failure it is."""
    reason: str

    def call(self, name: str, arguments: Mapping[str, str]) -> str:
        """A call as the model writes it in this syntax (by hand, not by the template)."""
        if self.parser == "qwen3_coder":
            params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in arguments.items())
            return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"
        body = f'{{"name": {json.dumps(name)}, "arguments": {json.dumps(dict(arguments))}}}'
        return f"<tool_call>\n{body}\n</tool_call>"


JSON_SYNTAX = Syntax(
    template="qwen3-instruct",
    parser="qwen25",
    malformed='<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}\n</tool_call>',
    reason="malformed_json",
)
XML_SYNTAX = Syntax(
    template="qwen3-coder",
    parser="qwen3_coder",
    malformed="<tool_call>\n<function=bash>\n<parameter=command>\nls\n</function>\n</tool_call>",
    reason="unclosed_tag",
)


@dataclass
class Turn:
    """One scripted reply: its content and calls (name, arguments), or raw text."""

    content: str = ""
    calls: tuple[tuple[str, dict[str, str]], ...] = ()
    raw: str | None = None

    def text(self, syntax: Syntax) -> str:
        if self.raw is not None:
            return self.raw
        calls = [syntax.call(name, args) for name, args in self.calls]
        return "\n".join([self.content, *calls] if self.content else calls)

    def message(self) -> dict[str, Any]:
        """The assistant message a chat client would hold for this reply."""
        if self.raw is not None:
            return {"role": "assistant", "content": self.raw}
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.calls:
            message["tool_calls"] = [
                {"type": "function", "function": {"name": n, "arguments": a}} for n, a in self.calls
            ]
        return message


class RecordingRunner(SWEToolRunner):
    """The SWE tools, keeping what each call returned (the test's view of the observations)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.results: list[tuple[str, ToolResult]] = []

    async def call(self, name: str, arguments: Mapping[str, Any] | None = None) -> ToolResult:
        result = await super().call(name, arguments)
        self.results.append((name, result))
        return result


def counter(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def encode(tok: PreTrainedTokenizerFast, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def rendered(tok: PreTrainedTokenizerFast, messages: list[dict[str, Any]]) -> list[int]:
    """The whole conversation as ``transformers`` renders it with the tools, tokenised."""
    text = tok.apply_chat_template(messages, tools=tool_schemas(), tokenize=False)
    assert isinstance(text, str)
    return encode(tok, text)


def task() -> Task:
    return Task(
        id="total",
        source="toy",
        instruction="total([1, 2, 3]) returns 5 instead of 6. Fix app.py.",
        files={"app.py": APP},
        verification=NamedTestsVerification(fail_to_pass=["t"]),
    )


@pytest.fixture
async def sandbox(tmp_path: Path) -> AsyncIterator[Sandbox]:
    provider = LocalProvider(base_dir=str(tmp_path))
    async with await provider.create(SandboxRequest(episode_id="native-tools")) as box:
        await box.write_file("app.py", APP)
        setup = f"git init -q -b main . && git add -A && {GIT} -m base"
        assert (await box.exec(setup, timeout=30)).ok
        yield box


def turns_left(observation: str, left: int) -> str:
    return f"{observation}\n[{left} {'turn' if left == 1 else 'turns'} left]"


@pytest.mark.parametrize("syntax", [JSON_SYNTAX, XML_SYNTAX], ids=lambda s: s.parser)
async def test_an_episode_in_native_tool_calls_is_the_templates_rendering_of_it(
    syntax: Syntax, sandbox: Sandbox
) -> None:
    tok = build_tokenizer(template=syntax.template)
    turns = HFTurnTokenizer(tok, tools=tool_schemas(), tool_call_parser=syntax.parser)
    assert native_tool_calls(turns)
    script = [
        Turn("Let me run the tests first.", (("bash", {"command": RUN_TESTS}),)),
        Turn(raw=syntax.malformed),
        Turn(raw="The loop skips the first element."),
        Turn(
            "",
            (
                (
                    "str_replace_editor",
                    {"command": "str_replace", "path": "app.py", "old_str": OLD, "new_str": NEW},
                ),
            ),
        ),
        Turn(
            "Run the tests again and look at the file.",
            (
                ("bash", {"command": RUN_TESTS}),
                ("str_replace_editor", {"command": "view", "path": "app.py"}),
            ),
        ),
        Turn("", (("submit", {}),)),
    ]
    texts = [t.text(syntax) for t in script]
    end = tok.convert_tokens_to_ids("<|im_end|>")
    engine = ScriptedEngine(texts, encode=lambda text: encode(tok, text), end_id=end)
    caps = EpisodeCaps(max_turns=MAX_TURNS, max_trajectory_tokens=32768, max_tokens_per_turn=512)
    agent = TokenAgent(EnginePool([engine]), turns, caps)
    the_task = task()
    runner = RecordingRunner(sandbox, the_task, timeout_seconds=60, output_max_bytes=8192)
    failures = {"reason": syntax.reason}
    before = {
        "parse": counter("agentrl_rollout_tool_call_parse_failures_total", failures),
        "no_call": counter("agentrl_rollout_turns_without_tool_call_total"),
        "bash": counter("agentrl_rollout_tool_calls_parsed_total", {"tool": "bash"}),
        "match": counter("agentrl_rollout_tito_prefix_checks_total", {"result": "match"}),
        "break": counter("agentrl_rollout_tito_prefix_checks_total", {"result": "break"}),
    }
    out = TrajectoryBuilder()

    await agent.run("e1", the_task, runner, out)

    # The episode: six turns, submitted, with the patch of the multi-line fix.
    assert out.submitted and out.truncation is None
    assert len(out.turns) == 6
    assert out.patch is not None
    assert "--- a/app.py\n+++ b/app.py\n" in out.patch
    assert "-    for x in xs[1:]:\n-        result += x\n+    for x in xs:\n" in out.patch
    assert "+        result = result + x\n" in out.patch
    # Each call ran, in order, in the repository.
    names = [name for name, _ in runner.results]
    assert names == ["bash", "str_replace_editor", "bash", "str_replace_editor", "submit"]
    first_run = runner.results[0][1].observation
    assert "AssertionError: 5" in first_run and first_run.endswith("[exit code 1]")
    assert runner.results[2][1].observation == "tests pass\n[exit code 0]"
    view = runner.results[3][1].observation
    assert "     4\t    for x in xs:\n     5\t        result = result + x" in view
    # The turn records: the calls as name + JSON arguments, what the model wrote otherwise.
    assert out.turns[0].action == f"bash {json.dumps({'command': RUN_TESTS})}"
    assert out.turns[1].action == syntax.malformed
    assert out.turns[1].observation.startswith(
        f"Your tool call could not be read ({syntax.reason}): "
    )
    assert out.turns[1].observation.endswith("\n[8 turns left]")
    assert out.turns[2].observation == turns_left(NO_TOOL_CALL_OBSERVATION, 7)
    assert out.turns[4].action.splitlines()[-1] == (
        'str_replace_editor {"command": "view", "path": "app.py"}'
    )
    error_observation = out.turns[1].observation

    # The trajectory is the whole conversation as the template renders it, tools included.
    observations = [r.observation for _, r in runner.results]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": the_task.instruction},
        script[0].message(),
        {"role": "tool", "content": turns_left(observations[0], 9)},
        script[1].message(),
        {"role": "user", "content": error_observation},
        script[2].message(),
        {"role": "user", "content": turns_left(NO_TOOL_CALL_OBSERVATION, 7)},
        script[3].message(),
        {"role": "tool", "content": turns_left(observations[1], 6)},
        script[4].message(),
        {"role": "tool", "content": observations[2]},
        {"role": "tool", "content": turns_left(observations[3], 5)},
        script[5].message(),
    ]
    whole = rendered(tok, messages)
    newline = encode(tok, "\n")
    # The episode ended on submit, before the newline the template writes after <|im_end|>.
    assert [*out.token_ids, *newline] == whole
    prompt_text = tok.apply_chat_template(
        messages[:2], tools=tool_schemas(), tokenize=False, add_generation_prompt=True
    )
    assert isinstance(prompt_text, str)
    prompt = encode(tok, prompt_text)
    assert out.prompt_length == len(prompt) and out.token_ids[: len(prompt)] == prompt

    # The engine saw the trajectory so far each turn; loss mask 1 exactly on what it generated.
    replies = [[*encode(tok, t), end] for t in texts]
    assert len(engine.inputs) == len(replies)
    expected_mask = [0] * len(out.token_ids)
    for sent, reply in zip(engine.inputs, replies, strict=True):
        at = len(sent)
        assert out.token_ids[:at] == sent
        assert out.token_ids[at : at + len(reply)] == reply
        expected_mask[at : at + len(reply)] = [1] * len(reply)
    assert out.loss_mask == expected_mask
    assert [lp for lp, m in zip(out.logprobs, out.loss_mask, strict=True) if m] == (
        [LOGPROB] * sum(len(r) for r in replies)
    )
    assert out.tool_use.prefix_break is None
    # The episode's own count: five calls (bash; str_replace; bash and view; submit), one
    # unreadable reply, one reply without a call.
    use = out.tool_use
    assert (use.calls, use.call_errors, use.turns_without_call) == (5, 1, 1)

    # Counted: one malformed call, one turn without a call, two bash calls; seven prefix checks
    # (before each of six generations and at the end), all matching.
    assert counter("agentrl_rollout_tool_call_parse_failures_total", failures) == (
        before["parse"] + 1
    )
    assert counter("agentrl_rollout_turns_without_tool_call_total") == before["no_call"] + 1
    assert counter("agentrl_rollout_tool_calls_parsed_total", {"tool": "bash"}) == (
        before["bash"] + 2
    )
    match = counter("agentrl_rollout_tito_prefix_checks_total", {"result": "match"})
    assert match == before["match"] + 7
    assert (
        counter("agentrl_rollout_tito_prefix_checks_total", {"result": "break"})
        == (before["break"])
    )


def first_difference(left: list[int], right: list[int]) -> int:
    for i, (a, b) in enumerate(zip(left, right, strict=False)):
        if a != b:
            return i
    raise AssertionError("no difference")


@pytest.mark.parametrize("syntax", [JSON_SYNTAX, XML_SYNTAX], ids=lambda s: s.parser)
async def test_a_reply_tokenised_off_the_canonical_ids_is_a_break_masked_from_there_on(
    syntax: Syntax, sandbox: Sandbox
) -> None:
    tok = build_tokenizer(template=syntax.template)
    turns = HFTurnTokenizer(tok, tools=tool_schemas(), tool_call_parser=syntax.parser)
    first = Turn("Let me run the tests first.", (("bash", {"command": "ls"}),)).text(syntax)
    last = Turn("", (("submit", {}),)).text(syntax)
    # The same text as the engine could sample it: "tests" in two tokens, "te" + "sts".
    head, tail = first.split("tests", 1)
    split = [*encode(tok, head + "te"), *encode(tok, "sts" + tail)]
    canonical = encode(tok, first)
    assert tok.decode(split) == first and split != canonical

    def model_ids(text: str) -> list[int]:
        return split if text == first else encode(tok, text)

    end = tok.convert_tokens_to_ids("<|im_end|>")
    engine = ScriptedEngine([first, last], encode=model_ids, end_id=end)
    caps = EpisodeCaps(
        max_turns=4, max_trajectory_tokens=8192, max_tokens_per_turn=256, show_remaining_turns=False
    )
    agent = TokenAgent(EnginePool([engine]), turns, caps)
    the_task = task()
    runner = SWEToolRunner(sandbox, the_task, timeout_seconds=60, output_max_bytes=8192)
    labels = {"result": "break"}
    breaks = counter("agentrl_rollout_tito_prefix_checks_total", labels)
    matches = counter("agentrl_rollout_tito_prefix_checks_total", {"result": "match"})
    out = TrajectoryBuilder()

    await agent.run("e2", the_task, runner, out)

    assert out.submitted and out.patch == ""  # nothing changed
    # No turns-left line when the spec turns it off.
    assert out.turns[0].observation == "app.py\n[exit code 0]"
    reply1 = [*split, end]
    reply2 = [*encode(tok, last), end]
    start1, start2 = len(engine.inputs[0]), len(engine.inputs[1])
    assert out.token_ids[start1 : start1 + len(reply1)] == reply1
    broken_at = start1 + first_difference(split, canonical)
    assert out.tool_use.prefix_break == broken_at
    # The loss: on the first reply up to the break, nowhere after it (the second reply too).
    expected = [0] * len(out.token_ids)
    expected[start1:broken_at] = [1] * (broken_at - start1)
    assert out.loss_mask == expected
    assert out.token_ids[start2:] == reply2
    # Counted once: the check before the first generation matched, the next one broke, and a
    # broken episode is not checked again.
    assert counter("agentrl_rollout_tito_prefix_checks_total", labels) == breaks + 1
    assert counter("agentrl_rollout_tito_prefix_checks_total", {"result": "match"}) == (matches + 1)


async def test_a_turn_cap_ends_a_native_episode_after_the_last_observation(
    sandbox: Sandbox,
) -> None:
    tok = build_tokenizer(template="qwen3-instruct")
    turns = HFTurnTokenizer(tok, tools=tool_schemas(), tool_call_parser="hermes")
    reply = JSON_SYNTAX.call("bash", {"command": "git status --short"})
    end = tok.convert_tokens_to_ids("<|im_end|>")
    engine = ScriptedEngine([reply], encode=lambda text: encode(tok, text), end_id=end)
    caps = EpisodeCaps(max_turns=2, max_trajectory_tokens=8192, max_tokens_per_turn=256)
    agent = TokenAgent(EnginePool([engine]), turns, caps)
    the_task = task()
    runner = SWEToolRunner(sandbox, the_task, timeout_seconds=60, output_max_bytes=8192)
    out = TrajectoryBuilder()

    await agent.run("e3", the_task, runner, out)

    assert not out.submitted and out.patch is None
    assert out.truncation is not None and out.truncation.value == "turns"
    assert [t.observation for t in out.turns] == [
        "[exit code 0]\n[1 turn left]",
        ("[exit code 0]\n[0 turns left]"),
    ]
    call = {
        "type": "function",
        "function": {"name": "bash", "arguments": {"command": "git status --short"}},
    }
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": the_task.instruction},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "[exit code 0]\n[1 turn left]"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "[exit code 0]\n[0 turns left]"},
    ]
    text = tok.apply_chat_template(
        messages, tools=tool_schemas(), tokenize=False, add_generation_prompt=True
    )
    assert isinstance(text, str)
    assert out.token_ids == encode(tok, text)
    assert out.tool_use.prefix_break is None


def test_a_tokenizer_without_a_parser_keeps_the_text_actions() -> None:
    tok = build_tokenizer(template="qwen3-instruct")
    assert not native_tool_calls(HFTurnTokenizer(tok))
    with pytest.raises(ValueError, match="tool schemas"):
        TokenAgent(
            EnginePool([ScriptedEngine(["unused"])]),
            HFTurnTokenizer(tok, tool_call_parser="qwen25"),
            EpisodeCaps(),
        )


class _InfoClient:
    """Answers ``/get_model_info`` only: what ``turn_tokenizer_for`` reads of an engine."""

    def __init__(self, tokenizer_path: str) -> None:
        self.tokenizer_path = tokenizer_path

    async def get_model_info(self) -> ModelInfo:
        return ModelInfo(model_path="/models/m", tokenizer_path=self.tokenizer_path)


async def test_the_runtime_gives_the_tokenizer_the_specs_template_parser_and_tools(
    tmp_path: Path,
) -> None:
    # The model directory's own template is the JSON one; the spec picks the XML one.
    write_tokenizer_files(tmp_path, template="qwen3-instruct")
    spec = AgentRLJobSpec.model_validate(
        {
            "model": {
                "source": {"path": str(tmp_path)},
                "chatTemplate": {"bundled": "qwen3-coder"},
                "toolCallParser": "qwen3_coder",
            },
            "sandbox": {"provider": "local", "concurrency": 1},
        }
    )
    client = _InfoClient(str(tmp_path))
    picked = await turn_tokenizer_for(client, spec)  # type: ignore[arg-type]
    assert isinstance(picked, HFTurnTokenizer) and native_tool_calls(picked)
    # the default dataset is the toy tasks: their candidate edits come as apply_edit too
    assert spec.dataset.format == "toy"
    edits = ["off_by_one", "swap_comparison", "wrong_operator", "negate_condition",
             "wrong_constant", "missing_return"]  # fmt: skip
    assert picked.tools == tool_schemas(edits)
    prompt = picked.decode(picked.initial_ids("s", "u"))
    assert "<function>\n<name>str_replace_editor</name>" in prompt
    assert "<function>\n<name>apply_edit</name>" in prompt
    call = XML_SYNTAX.call("bash", {"command": "ls"})
    parsed = picked.parse_reply(
        list(AutoTokenizer.from_pretrained(tmp_path).encode(call, add_special_tokens=False))
    )
    assert [(c.name, c.arguments) for c in parsed.calls] == [("bash", {"command": "ls"})]
    # Without the spec (or without a parser in it) the agent keeps its text actions.
    plain = await turn_tokenizer_for(client)  # type: ignore[arg-type]
    assert isinstance(plain, HFTurnTokenizer) and not native_tool_calls(plain)
