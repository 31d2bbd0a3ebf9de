"""Text actions are a call syntax of the one agent: each action reads into a call of the same
tools a native tool call names, an unreadable line is a counted error, an empty reply no call."""

from __future__ import annotations

import pytest

from agentrl.rollout.agent import TokenAgent, TrajectoryBuilder, WordTurnTokenizer
from agentrl.rollout.balancer import EnginePool
from agentrl.rollout.caps import EpisodeCaps
from agentrl.rollout.swe_tools import SWEToolRunner
from agentrl.rollout.text_actions import parse_text_action, task_message
from agentrl.rollout.toolcalls import ParseFailure
from agentrl.sandbox.fake import FakeProvider
from agentrl.sandbox.provider import SandboxRequest
from agentrl.tiny.tokenizer import ROLE_MARKERS
from tests.rollout.fakes import ScriptedEngine, pytest_handler, toy_task


@pytest.mark.parametrize(
    ("line", "name", "arguments"),
    [
        ("run_tests", "run_tests", {}),
        ("view app.py", "str_replace_editor", {"command": "view", "path": "app.py"}),
        ("bash cat <<'EOF' > a.py", "bash", {"command": "cat <<'EOF' > a.py"}),
        ("apply off_by_one", "apply_edit", {"name": "off_by_one"}),
        ("submit", "submit", {}),
        ("\n\n  apply fix  \nand then something", "apply_edit", {"name": "fix"}),
    ],
)
def test_each_action_reads_into_a_call_of_the_swe_tools(
    line: str, name: str, arguments: dict[str, str]
) -> None:
    reply = parse_text_action(line)
    assert reply.error is None
    assert [(c.name, c.arguments) for c in reply.calls] == [(name, arguments)]
    # What the model wrote is what goes back into the conversation: no call syntax added.
    assert reply.assistant_message() == {"role": "assistant", "content": line}


def test_a_line_that_names_no_action_is_an_unknown_tool_error_and_an_empty_reply_no_call() -> None:
    wrong = parse_text_action("I think the bug is in app.py\nrun_tests")
    assert wrong.calls == []
    assert wrong.error is not None and wrong.error.reason == ParseFailure.UNKNOWN_TOOL
    assert wrong.error.observation() == (
        "Your tool call could not be read (unknown_tool): 'I' is not an action; reply with one "
        "of: run_tests | view PATH | bash CMD | apply EDIT_NAME | submit"
    )
    empty = parse_text_action("  \n")
    assert (empty.calls, empty.error) == ([], None)


def test_the_first_message_lists_the_actions_and_the_tasks_candidate_edits() -> None:
    task = toy_task()
    assert task_message(task) == (
        f"{task.instruction}\n\nReply with exactly one action on the first line:\n"
        "run_tests | view PATH | bash CMD | apply EDIT_NAME | submit\ncandidate edits: fix decoy"
    )


async def test_the_tiny_policys_episode_runs_through_the_same_tools_and_counts_its_calls() -> None:
    provider = FakeProvider(pytest_handler)
    # The tiny policy writes only its vocabulary: the edits get names it has.
    toy = toy_task()
    renamed = {"fix": "off_by_one", "decoy": "wrong_constant"}
    task = toy.model_copy(
        update={
            "candidate_edits": [
                e.model_copy(update={"name": renamed[e.name]}) for e in toy.candidate_edits
            ]
        }
    )
    sandbox = await provider.create(SandboxRequest(episode_id="e"))
    for path, text in task.files.items():
        await sandbox.write_file(path, text)
    tools = SWEToolRunner(sandbox, task, timeout_seconds=5, output_max_bytes=4096)
    engine = ScriptedEngine(
        ["apply wrong_constant", "value wrong", "", "apply off_by_one", "submit"]
    )
    agent = TokenAgent(EnginePool([engine]), WordTurnTokenizer(), EpisodeCaps(max_turns=10))
    out = TrajectoryBuilder()
    await agent.run("e", task, tools, out)

    assert out.submitted
    assert [t.action for t in out.turns] == [
        "apply wrong_constant", "value wrong", "", "apply off_by_one", "submit",
    ]  # fmt: skip
    assert out.turns[0].observation == "applied wrong_constant to app.py\n[9 turns left]"
    assert out.turns[1].observation.startswith("Your tool call could not be read (unknown_tool)")
    assert out.turns[2].observation.startswith("Your reply called no tool.")
    assert (await sandbox.read_file("app.py")).decode() == "VALUE = 'OK'\nOTHER = 1\n"
    use = out.tool_use
    assert (use.calls, use.call_errors, use.turns_without_call, use.prefix_break) == (3, 1, 1, None)
    # The observations went back as the word template renders them: a tool message after a
    # call, a user message after a reply without a readable one.
    words = WordTurnTokenizer()._tok
    roles = [words.vocab[i] for i in out.token_ids if words.vocab[i] in ROLE_MARKERS.values()]
    assert roles == [
        "<|system|>", "<|user|>", "<|assistant|>",
        "<|tool|>", "<|assistant|>",  # applied wrong_constant
        "<|user|>", "<|assistant|>",  # value wrong: no action
        "<|user|>", "<|assistant|>",  # empty: no call
        "<|tool|>", "<|assistant|>",  # applied off_by_one
    ]  # fmt: skip
