"""Warm-start conversations: every bad line reported with its number and reason, good ones
rendered as the rollout would build them, with loss on the assistant turns only.

The ids are checked against ``transformers``' own ``apply_chat_template`` of the conversation
with the job's tools, and the mask against one made here from the rendered text (a token is
trained on when its characters lie inside an assistant turn: after ``<|im_start|>assistant\\n``,
through ``<|im_end|>``), and against the assistant replies written out by hand, for the JSON
and the XML call syntax."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from transformers import PreTrainedTokenizerFast

from agentrl.api.model import ChatTemplateSource, ModelSource, ModelSpec
from agentrl.rollout.conversations import (
    Conversation,
    ConversationError,
    job_tools,
    job_turn_tokenizer,
    parse_line,
    read_conversations,
    read_warm_start,
    render_conversation,
)
from agentrl.rollout.hf_model_files import build_tokenizer, write_tokenizer_files
from agentrl.rollout.hf_tokenizer import HFTurnTokenizer
from agentrl.rollout.swe_tools import tool_schemas

SWE_TOOLS = ["bash", "str_replace_editor", "submit"]
TURN_HEAD = "<|im_start|>assistant\n"
TURN_END = "<|im_end|>"


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


# A conversation whose first turn makes two tool calls (two results follow), then an edit, then
# the submission.
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You fix bugs."},
    {"role": "user", "content": "Make the tests pass."},
    {
        "role": "assistant",
        "content": "Let me look at the code and run the tests.",
        "tool_calls": [
            call("str_replace_editor", command="view", path="/repo/app.py"),
            # OpenAI writes arguments as a JSON string: read as the same mapping
            {
                "id": "call_2",
                "type": "function",
                "function": {
                    "name": "bash",
                    "arguments": json.dumps({"command": "cd /repo && python -m pytest -q"}),
                },
            },
        ],
    },
    {"role": "tool", "content": "def f():\n    return 1\n"},
    {"role": "tool", "tool_call_id": "call_2", "content": "FAILED tests/test_app.py\n[exit 1]"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            call(
                "str_replace_editor",
                command="str_replace",
                path="/repo/app.py",
                old_str="return 1",
                new_str="return 2",
            )
        ],
    },
    {"role": "tool", "content": "The file /repo/app.py has been edited."},
    {"role": "assistant", "content": "Fixed.", "tool_calls": [call("submit")]},
]

# What the model writes in each assistant turn, by hand, per call syntax.
JSON_TURNS = [
    "Let me look at the code and run the tests.\n<tool_call>\n"
    '{"name": "str_replace_editor", "arguments": {"command": "view", "path": "/repo/app.py"}}\n'
    "</tool_call>\n<tool_call>\n"
    '{"name": "bash", "arguments": {"command": "cd /repo && python -m pytest -q"}}\n'
    "</tool_call><|im_end|>",
    "<tool_call>\n"
    '{"name": "str_replace_editor", "arguments": {"command": "str_replace", "path": '
    '"/repo/app.py", "old_str": "return 1", "new_str": "return 2"}}\n'
    "</tool_call><|im_end|>",
    'Fixed.\n<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call><|im_end|>',
]
XML_TURNS = [
    "Let me look at the code and run the tests.\n<tool_call>\n<function=str_replace_editor>\n"
    "<parameter=command>\nview\n</parameter>\n<parameter=path>\n/repo/app.py\n</parameter>\n"
    "</function>\n</tool_call>\n<tool_call>\n<function=bash>\n"
    "<parameter=command>\ncd /repo && python -m pytest -q\n</parameter>\n"
    "</function>\n</tool_call><|im_end|>",
    "<tool_call>\n<function=str_replace_editor>\n"
    "<parameter=command>\nstr_replace\n</parameter>\n<parameter=path>\n/repo/app.py\n"
    "</parameter>\n<parameter=old_str>\nreturn 1\n</parameter>\n<parameter=new_str>\nreturn 2\n"
    "</parameter>\n</function>\n</tool_call><|im_end|>",
    "Fixed.\n<tool_call>\n<function=submit>\n</function>\n</tool_call><|im_end|>",
]
FAMILIES = {
    "json": ("qwen3-instruct", "qwen25", JSON_TURNS),
    "xml": ("qwen3-coder", "qwen3_coder", XML_TURNS),
}


def line(messages: list[dict[str, Any]], **extra: Any) -> str:
    return json.dumps({"messages": messages, **extra})


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(
    request: pytest.FixtureRequest,
) -> tuple[PreTrainedTokenizerFast, HFTurnTokenizer, list[str]]:
    template, parser, turns = FAMILIES[request.param]
    tok = build_tokenizer(template=template)
    return tok, HFTurnTokenizer(tok, tools=tool_schemas(), tool_call_parser=parser), turns


@pytest.fixture(scope="module")
def json_turns() -> HFTurnTokenizer:
    return HFTurnTokenizer(
        build_tokenizer(template="qwen3-instruct"), tools=tool_schemas(), tool_call_parser="qwen25"
    )


def template_view(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as written by hand for the template: arguments as mappings, no ids."""
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if k != "tool_call_id"}
        if m.get("content") is None:
            m["content"] = ""
        if "tool_calls" in m:
            m["tool_calls"] = [
                call(
                    c["function"]["name"],
                    **(
                        json.loads(c["function"]["arguments"])
                        if isinstance(c["function"]["arguments"], str)
                        else c["function"]["arguments"]
                    ),
                )
                for c in m["tool_calls"]
            ]
        out.append(m)
    return out


def mask_from_text(tok: PreTrainedTokenizerFast, text: str) -> tuple[list[int], list[int]]:
    """Ids of ``text`` and a mask that is 1 on the tokens inside an assistant turn's text."""
    spans = []
    at = text.find(TURN_HEAD)
    while at >= 0:
        start = at + len(TURN_HEAD)
        end = text.index(TURN_END, start) + len(TURN_END)
        spans.append((start, end))
        at = text.find(TURN_HEAD, end)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(s <= a and b <= e for s, e in spans)) for a, b in enc["offset_mapping"]]
    return list(enc["input_ids"]), mask


def trained_runs(tok: PreTrainedTokenizerFast, ids: list[int], mask: list[int]) -> list[str]:
    """The decoded text of each run of trained tokens."""
    runs: list[list[int]] = []
    for i, (token, m) in enumerate(zip(ids, mask, strict=True)):
        if m and (i == 0 or not mask[i - 1]):
            runs.append([])
        if m:
            runs[-1].append(token)
    return [tok.decode(r, skip_special_tokens=False) for r in runs]


# --- rendering and masks ----------------------------------------------------------------------


def test_a_tool_conversation_renders_as_transformers_does_with_loss_on_assistant_turns_only(
    family: tuple[PreTrainedTokenizerFast, HFTurnTokenizer, list[str]],
) -> None:
    tok, turns, written = family
    conversation = parse_line(line(MESSAGES), tools=SWE_TOOLS)
    ids, mask = render_conversation(conversation, turns)

    text = tok.apply_chat_template(template_view(MESSAGES), tools=tool_schemas(), tokenize=False)
    assert isinstance(text, str)
    expected_ids, expected_mask = mask_from_text(tok, text)
    assert ids == expected_ids
    assert mask == expected_mask
    assert trained_runs(tok, ids, mask) == written
    # What is not trained on: the prompt with the tools, the results, every generation prompt
    # and the newline after each <|im_end|>.
    untrained = tok.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    assert untrained.count(TURN_HEAD) == 3
    assert "<tool_response>\ndef f():\n    return 1\n\n</tool_response>" in untrained
    assert untrained.endswith("<|im_end|>\n" + TURN_HEAD + "\n")  # the last turn's newline


def test_reasoning_is_trained_on_as_part_of_the_turn_with_the_keep_reasoning_template() -> None:
    tok = build_tokenizer(template="qwen3-thinking")
    turns = HFTurnTokenizer(tok, tools=tool_schemas(), tool_call_parser="qwen25")
    messages = [
        MESSAGES[1],
        {"role": "assistant", "reasoning_content": "Run them first.", **MESSAGES[7]},
    ]
    ids, mask = render_conversation(parse_line(line(messages), tools=SWE_TOOLS), turns)
    assert trained_runs(tok, ids, mask) == [
        "<think>\nRun them first.\n</think>\n\n" + JSON_TURNS[2]
    ]
    text = tok.apply_chat_template(template_view(messages), tools=tool_schemas(), tokenize=False)
    assert isinstance(text, str)
    assert (ids, mask) == mask_from_text(tok, text)


def test_the_turn_tokenizer_of_a_job_is_the_rollouts_and_offers_the_swe_tools(
    tmp_path: Path,
) -> None:
    write_tokenizer_files(tmp_path)
    model = ModelSpec(
        source=ModelSource(path="/elsewhere"),
        toolCallParser="qwen3_coder",
        chatTemplate=ChatTemplateSource(bundled="qwen3-coder"),
    )
    turns = job_turn_tokenizer(model, model_dir=str(tmp_path))
    assert job_tools(turns) == SWE_TOOLS
    assert turns.parser is not None and turns.parser.name == "qwen3_coder"
    ids, mask = render_conversation(parse_line(line(MESSAGES), tools=SWE_TOOLS), turns)
    tok = build_tokenizer(template="qwen3-coder")
    assert trained_runs(tok, ids, mask) == XML_TURNS

    plain = job_turn_tokenizer(ModelSpec(source=ModelSource(path=str(tmp_path))))
    assert job_tools(plain) == [] and plain.parser is None


# --- refused lines ------------------------------------------------------------------------------

USER = {"role": "user", "content": "Fix it."}
DONE = {"role": "assistant", "content": "Done."}

REFUSED: list[tuple[str, str, str]] = [
    ("not JSON", '{"messages": [', "not JSON: "),
    ("not an object", "[1, 2]", "Input should be a valid dictionary"),
    ("no messages", "{}", "messages: Field required"),
    ("an unknown field", line([USER, DONE], extra=1), "extra: Extra inputs are not permitted"),
    (
        "an unknown role",
        line([USER, {"role": "bot", "content": "x"}]),
        "messages[1]: Input tag 'bot' found using 'role' does not match",
    ),
    (
        "user content that is not a string",
        line([{"role": "user", "content": 3}, DONE]),
        "messages[0].content: Input should be a valid string",
    ),
    (
        "a call without a name",
        line([USER, {"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}]),
        "messages[1].tool_calls[0].function.name: Field required",
    ),
    (
        "arguments that are not JSON",
        line(
            [
                USER,
                {
                    "role": "assistant",
                    "tool_calls": [{"function": {"name": "bash", "arguments": "{command: ls}"}}],
                },
            ]
        ),
        "messages[1].tool_calls[0].function.arguments: arguments are not JSON",
    ),
    (
        "arguments that are not an object",
        line(
            [
                USER,
                {
                    "role": "assistant",
                    "tool_calls": [{"function": {"name": "bash", "arguments": "[1]"}}],
                },
            ]
        ),
        "arguments must be a JSON object",
    ),
    (
        "an empty assistant message",
        line([USER, {"role": "assistant", "content": ""}]),
        "messages[1]: an assistant message needs content or tool_calls",
    ),
    ("no assistant message", line([USER, USER]), "no assistant message"),
    (
        "no user message first",
        line([{"role": "system", "content": "s"}, DONE]),
        "no user message before the first assistant message",
    ),
    (
        "a trailing tool result",
        line(
            [
                USER,
                {"role": "assistant", "tool_calls": [call("bash", command="ls")]},
                {"role": "tool", "content": "a.py"},
            ]
        ),
        "the last message is a tool message",
    ),
    (
        "a tool result with no call before it",
        line([USER, {"role": "tool", "content": "x"}, DONE]),
        "messages[1] is a tool result with no tool call before it to answer",
    ),
    (
        "more results than calls",
        line(
            [
                USER,
                {"role": "assistant", "tool_calls": [call("bash", command="ls")]},
                {"role": "tool", "content": "a"},
                {"role": "tool", "content": "b"},
                DONE,
            ]
        ),
        "messages[3] is tool result 2 after an assistant message with 1 tool call(s)",
    ),
    (
        "a result for a call id that is not there",
        line(
            [
                USER,
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c1", "function": {"name": "bash", "arguments": {"command": "ls"}}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c9", "content": "a"},
                DONE,
            ]
        ),
        "messages[2] answers tool_call_id 'c9', which no call of the assistant message before "
        "it has (c1)",
    ),
    (
        "two assistant messages in a row",
        line([USER, DONE, DONE]),
        "messages[2] is a second assistant message in a row",
    ),
    (
        "a system message later on",
        line([USER, DONE, {"role": "system", "content": "s"}, DONE]),
        "messages[2] is a system message; only the first message may be one",
    ),
    (
        "a call to a tool the job does not offer",
        line([USER, {"role": "assistant", "tool_calls": [call("rm_rf", path="/")]}]),
        "calls tool 'rm_rf', which the job does not offer (its tools: bash, "
        "str_replace_editor, submit)",
    ),
    (
        "a tool list naming a tool the job does not offer",
        line([USER, DONE], tools=[{"type": "function", "function": {"name": "browser"}}]),
        "lists tool 'browser', which the job does not offer",
    ),
]


@pytest.mark.parametrize(("text", "reason"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_a_bad_line_is_refused_with_its_reason(text: str, reason: str) -> None:
    with pytest.raises(ConversationError) as raised:
        parse_line(text, tools=SWE_TOOLS)
    assert reason in str(raised.value)


def test_the_job_tools_listed_on_a_line_are_accepted_and_the_jobs_own_are_rendered(
    json_turns: HFTurnTokenizer,
) -> None:
    short = [{"type": "function", "function": {"name": "submit", "description": "other"}}]
    conversation = parse_line(line(MESSAGES[:2] + MESSAGES[7:], tools=short), tools=SWE_TOOLS)
    assert isinstance(conversation, Conversation)
    ids, _ = render_conversation(conversation, json_turns)
    text = json_turns.decode(ids)
    assert '"description": "other"' not in text
    assert all(f'"name": "{name}"' in text for name in SWE_TOOLS)


def test_a_job_without_a_parser_offers_no_tools_and_says_why() -> None:
    plain = HFTurnTokenizer(build_tokenizer(template="qwen3-instruct"))
    report = read_conversations([line(MESSAGES), line([USER, DONE])], plain, tokens_per_batch=4096)
    assert [(e.line, e.reason) for e in report.errors] == [
        (
            1,
            "calls tool 'str_replace_editor', and the job offers no tools: without "
            "spec.model.toolCallParser the rollout acts in plain text",
        )
    ]
    assert [c.line for c in report.conversations] == [2]


def test_a_conversation_longer_than_the_batch_budget_is_refused_with_its_length(
    json_turns: HFTurnTokenizer,
) -> None:
    ids, _ = render_conversation(parse_line(line(MESSAGES), tools=SWE_TOOLS), json_turns)
    n = len(ids)
    kept = read_conversations([line(MESSAGES)], json_turns, tokens_per_batch=n)
    assert [c.tokens for c in kept.conversations] == [n] and not kept.errors
    refused = read_conversations([line(MESSAGES)], json_turns, tokens_per_batch=n - 1)
    assert [(e.line, e.reason) for e in refused.errors] == [
        (1, f"{n} tokens, more than spec.trainer.warmStart.tokensPerBatch ({n - 1})")
    ]
    assert not refused.conversations


def test_a_reply_the_parser_reads_back_otherwise_is_refused(json_turns: HFTurnTokenizer) -> None:
    # Content holding a call tag: the rollout would read this turn as a broken call.
    tagged = [USER, {"role": "assistant", "content": "I write </tool_call> here."}]
    with pytest.raises(ConversationError, match=r"messages\[1\] does not read back"):
        render_conversation(parse_line(line(tagged), tools=SWE_TOOLS), json_turns)


def test_an_xml_argument_whose_schema_type_differs_is_refused() -> None:
    turns = HFTurnTokenizer(
        build_tokenizer(template="qwen3-coder"),
        tools=tool_schemas(),
        tool_call_parser="qwen3_coder",
    )
    # view_range is an array in the tool's schema: written as a string, it reads back as a list
    view = call("str_replace_editor", command="view", path="a.py", view_range="[1, 2]")
    messages = [USER, {"role": "assistant", "tool_calls": [view]}]
    with pytest.raises(ConversationError) as raised:
        render_conversation(parse_line(line(messages), tools=SWE_TOOLS), turns)
    assert (
        "reads back with the job's tool-call parser qwen3_coder as calls [str_replace_editor("
        '{"command": "view", "path": "a.py", "view_range": [1, 2]})], not as written '
        '([str_replace_editor({"command": "view", "path": "a.py", "view_range": "[1, 2]"})])'
    ) in str(raised.value)


def test_a_turn_whose_text_merges_with_the_template_markup_is_refused(
    json_turns: HFTurnTokenizer,
) -> None:
    # A reply starting with a newline: whole, the generation prompt's newline and the reply's
    # tokenise as one "\n\n"; the rollout's generation prompt ends in a "\n" token of its own.
    messages = [USER, {"role": "assistant", "content": "\nDone."}]
    with pytest.raises(ConversationError) as raised:
        render_conversation(parse_line(line(messages), tools=SWE_TOOLS), json_turns)
    assert "renders differently whole than turn by turn" in str(raised.value)
    assert "in the messages before messages[1]" in str(raised.value)


def test_a_file_reports_each_bad_line_by_number_and_keeps_the_good_ones(
    tmp_path: Path, json_turns: HFTurnTokenizer
) -> None:
    path = tmp_path / "warm.jsonl"
    lines = [
        line(MESSAGES),
        "not json",
        "",
        line([USER, {"role": "assistant", "tool_calls": [call("rm_rf")]}]),
        line([USER, DONE]),
    ]
    path.write_text("\n".join(lines) + "\n")
    report = read_warm_start(path, json_turns, tokens_per_batch=4096)
    assert [e.line for e in report.errors] == [2, 4]
    assert report.errors[0].render(path).startswith(f"{path}:2: not JSON: ")
    assert [c.line for c in report.conversations] == [1, 5]
    assert report.tokens == sum(len(c.token_ids) for c in report.conversations)
    assert report.trained_tokens == sum(sum(c.loss_mask) for c in report.conversations)
    assert 0 < report.trained_tokens < report.tokens
