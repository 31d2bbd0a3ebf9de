"""Tool calls read back from a model's generated ids in its own syntax (JSON in ``<tool_call>``
for ``qwen25``/``hermes``, Qwen3-Coder's XML for ``qwen3_coder``): several calls, multi-line
string arguments, and malformed calls as error values the agent can send back and count.

Each reply is written by hand as the model would write it, encoded with a real tokenizer made
here (:mod:`agentrl.rollout.hf_model_files`), decoded as the agent decodes engine output, and
parsed; the expected calls are written by hand too."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import REGISTRY
from transformers import PreTrainedTokenizerFast

from agentrl.api.sglang_parsers import TOOL_CALL_PARSERS
from agentrl.rollout.hf_model_files import MARKUP_TOKENS, build_tokenizer
from agentrl.rollout.hf_tokenizer import HFTurnTokenizer
from agentrl.rollout.toolcalls import (
    PARSERS,
    ParsedToolCall,
    ParseFailure,
    UnknownToolCallParser,
    get_parser,
    record_reply,
)


def function(name: str, params: dict[str, dict[str, Any]], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {"type": "object", "properties": params, "required": required},
        },
    }


TOOLS = [
    function("bash", {"command": {"type": "string", "description": "shell command"}}, ["command"]),
    function(
        "str_replace_editor",
        {
            "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert"]},
            "path": {"type": "string"},
            "old_str": {"type": "string"},
            "new_str": {"type": "string"},
            "insert_line": {"type": "integer"},
            "view_range": {"type": "array", "items": {"type": "integer"}},
        },
        ["command", "path"],
    ),
    function("submit", {}, []),
]


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    return build_tokenizer()


def generated(tok: PreTrainedTokenizerFast, reply: str) -> list[int]:
    """The engine's output ids for ``reply``: its tokens, then the end-of-turn token it stopped
    on."""
    return [*tok.encode(reply, add_special_tokens=False), tok.convert_tokens_to_ids("<|im_end|>")]


def decoded(tok: PreTrainedTokenizerFast, reply: str) -> str:
    # The agent's decoding of engine output (special tokens skipped, markup kept).
    return HFTurnTokenizer(tok).decode(generated(tok, reply))


def test_markup_tokens_are_single_ids_that_decoding_keeps(tok: PreTrainedTokenizerFast) -> None:
    for token in MARKUP_TOKENS:
        ids = tok.encode(token, add_special_tokens=False)
        assert len(ids) == 1 and tok.convert_ids_to_tokens(ids[0]) == token
    assert decoded(tok, "<tool_call>\nx\n</tool_call>") == "<tool_call>\nx\n</tool_call>"


# --- JSON (qwen25, hermes) -------------------------------------------------------------------

HEREDOC_JSON = (
    "I will write the fix to a file.\n"
    "<tool_call>\n"
    '{"name": "bash", "arguments": {"command": "cat <<\'EOF\' > /repo/fix.py\\n'
    'def value():\\n    return 2\\nEOF"}}\n'
    "</tool_call>\n"
    "<tool_call>\n"
    '{"name": "str_replace_editor", "arguments": {"command": "str_replace", "path": '
    '"/repo/app.py", "old_str": "def f():\\n    return 1\\n", "new_str": "def f():\\n'
    '    return 2\\n"}}\n'
    "</tool_call>"
)


@pytest.mark.parametrize("parser", ["qwen25", "hermes", "qwen"])
def test_json_calls_with_multiline_arguments(tok: PreTrainedTokenizerFast, parser: str) -> None:
    reply = get_parser(parser).parse(decoded(tok, HEREDOC_JSON), TOOLS)
    assert reply.error is None
    assert reply.content == "I will write the fix to a file."
    assert reply.calls == [
        ParsedToolCall(
            name="bash",
            arguments={"command": "cat <<'EOF' > /repo/fix.py\ndef value():\n    return 2\nEOF"},
        ),
        ParsedToolCall(
            name="str_replace_editor",
            arguments={
                "command": "str_replace",
                "path": "/repo/app.py",
                "old_str": "def f():\n    return 1\n",
                "new_str": "def f():\n    return 2\n",
            },
        ),
    ]


def test_a_reply_without_content_or_arguments(tok: PreTrainedTokenizerFast) -> None:
    reply = get_parser("qwen25").parse(
        decoded(tok, '<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call>'), TOOLS
    )
    assert (reply.content, reply.calls, reply.error) == ("", [ParsedToolCall(name="submit")], None)


def test_a_reply_without_a_call_is_content_and_no_error(tok: PreTrainedTokenizerFast) -> None:
    reply = get_parser("qwen25").parse(decoded(tok, "The tests pass now."), TOOLS)
    assert (reply.content, reply.calls, reply.error) == ("The tests pass now.", [], None)


@pytest.mark.parametrize(
    ("reply", "reason", "says"),
    [
        (
            '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}\n</tool_call>',
            ParseFailure.MALFORMED_JSON,
            "not JSON",
        ),
        (
            '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n',
            ParseFailure.UNCLOSED_TAG,
            "never closed",
        ),
        (
            '<tool_call>\n{"name": "python", "arguments": {"code": "1"}}\n</tool_call>',
            ParseFailure.UNKNOWN_TOOL,
            "there is no tool 'python'; the tools are bash, str_replace_editor, submit",
        ),
        (
            '<tool_call>\n{"name": "str_replace_editor", "arguments": {"command": "view"}}\n'
            "</tool_call>",
            ParseFailure.MISSING_ARGUMENT,
            "str_replace_editor needs the argument(s) path",
        ),
        (
            '<tool_call>\n{"name": "bash", "arguments": "ls"}\n</tool_call>',
            ParseFailure.BAD_STRUCTURE,
            "must be a JSON object",
        ),
        (
            '<tool_call>\n["bash", "ls"]\n</tool_call>',
            ParseFailure.BAD_STRUCTURE,
            '{"name": <tool>',
        ),
    ],
    ids=["bad-json", "unclosed", "unknown-tool", "missing-argument", "string-args", "list"],
)
def test_malformed_json_calls_are_error_values(
    tok: PreTrainedTokenizerFast, reply: str, reason: ParseFailure, says: str
) -> None:
    parsed = get_parser("hermes").parse(decoded(tok, "Running it.\n" + reply), TOOLS)
    assert parsed.calls == []
    assert parsed.error is not None
    assert parsed.error.reason == reason
    assert says in parsed.error.detail
    assert parsed.error.observation().startswith(f"Your tool call could not be read ({reason})")
    # The reply renders back as what the model wrote.
    assert parsed.assistant_message() == {"role": "assistant", "content": "Running it.\n" + reply}


def test_one_bad_call_among_several_fails_the_reply(tok: PreTrainedTokenizerFast) -> None:
    text = (
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>'
    )
    parsed = get_parser("qwen25").parse(decoded(tok, text), TOOLS)
    assert parsed.error is not None and parsed.error.reason == ParseFailure.UNKNOWN_TOOL
    assert parsed.calls == []


def test_reasoning_is_split_off_and_calls_inside_it_are_not_calls(
    tok: PreTrainedTokenizerFast,
) -> None:
    text = (
        '<think>\nMaybe <tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call> '
        "is too early.\n</think>\n\nLooking first.\n<tool_call>\n"
        '{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    )
    parsed = get_parser("qwen25").parse(decoded(tok, text), TOOLS, reasoning=True)
    assert parsed.reasoning == (
        'Maybe <tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call> is too early.'
    )
    assert parsed.content == "Looking first."
    assert parsed.calls == [ParsedToolCall(name="bash", arguments={"command": "ls"})]


def test_a_reply_cut_inside_its_reasoning_has_no_calls(tok: PreTrainedTokenizerFast) -> None:
    parsed = get_parser("qwen25").parse(decoded(tok, "<think>\nI should"), TOOLS, reasoning=True)
    assert (parsed.reasoning, parsed.content, parsed.calls, parsed.error) == (
        "I should",
        "",
        [],
        None,
    )


# --- XML (qwen3_coder) -----------------------------------------------------------------------

XML_REPLY = (
    "Let me fix it.\n"
    "<tool_call>\n<function=bash>\n<parameter=command>\n"
    "cat <<'EOF' > /repo/fix.py\ndef value():\n    return 2\nEOF\n"
    "</parameter>\n</function>\n</tool_call>\n"
    "<tool_call>\n<function=str_replace_editor>\n"
    "<parameter=command>\nstr_replace\n</parameter>\n"
    "<parameter=path>\n/repo/app.py\n</parameter>\n"
    "<parameter=old_str>\ndef f():\n    return 1\n\n</parameter>\n"
    "<parameter=new_str>\ndef f():\n    return 2\n\n</parameter>\n"
    "</function>\n</tool_call>\n"
    "<tool_call>\n<function=str_replace_editor>\n"
    "<parameter=command>\nview\n</parameter>\n"
    "<parameter=path>\n/repo/app.py\n</parameter>\n"
    "<parameter=view_range>\n[1, 20]\n</parameter>\n"
    "</function>\n</tool_call>"
)


def test_xml_calls_with_multiline_and_typed_values(tok: PreTrainedTokenizerFast) -> None:
    reply = get_parser("qwen3_coder").parse(decoded(tok, XML_REPLY), TOOLS)
    assert reply.error is None
    assert reply.content == "Let me fix it."
    assert reply.calls == [
        ParsedToolCall(
            name="bash",
            arguments={"command": "cat <<'EOF' > /repo/fix.py\ndef value():\n    return 2\nEOF"},
        ),
        ParsedToolCall(
            name="str_replace_editor",
            arguments={
                "command": "str_replace",
                "path": "/repo/app.py",
                "old_str": "def f():\n    return 1\n",
                "new_str": "def f():\n    return 2\n",
            },
        ),
        ParsedToolCall(
            name="str_replace_editor",
            arguments={"command": "view", "path": "/repo/app.py", "view_range": [1, 20]},
        ),
    ]


def test_an_xml_value_that_does_not_fit_its_type_stays_a_string(
    tok: PreTrainedTokenizerFast,
) -> None:
    text = (
        "<tool_call>\n<function=str_replace_editor>\n<parameter=command>\ninsert\n</parameter>\n"
        "<parameter=path>\na.py\n</parameter>\n<parameter=insert_line>\nten\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    reply = get_parser("qwen3_coder").parse(decoded(tok, text), TOOLS)
    assert reply.calls[0].arguments["insert_line"] == "ten"
    text = text.replace("ten", "10")
    reply = get_parser("qwen3_coder").parse(decoded(tok, text), TOOLS)
    assert reply.calls[0].arguments["insert_line"] == 10


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        ("<tool_call>\n<function=bash>\n<parameter=command>\nls\n</function>\n</tool_call>",
         ParseFailure.UNCLOSED_TAG),
        ("<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n</tool_call>",
         ParseFailure.UNCLOSED_TAG),
        ("<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n</function>\n",
         ParseFailure.UNCLOSED_TAG),
        ("<tool_call>\n<function=python>\n<parameter=code>\n1\n</parameter>\n</function>\n"
         "</tool_call>", ParseFailure.UNKNOWN_TOOL),
        ("<tool_call>\n<function=bash>\n</function>\n</tool_call>",
         ParseFailure.MISSING_ARGUMENT),
        ('<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>',
         ParseFailure.BAD_STRUCTURE),
    ],
    ids=["unclosed-parameter", "unclosed-function", "unclosed-call", "unknown-tool",
         "missing-argument", "json-in-xml"],
)  # fmt: skip
def test_malformed_xml_calls_are_error_values(
    tok: PreTrainedTokenizerFast, reply: str, reason: ParseFailure
) -> None:
    parsed = get_parser("qwen3_coder").parse(decoded(tok, reply), TOOLS)
    assert parsed.calls == []
    assert parsed.error is not None and parsed.error.reason == reason


# --- the registry and its counters ------------------------------------------------------------


def test_the_registry_is_keyed_by_sglang_parser_names() -> None:
    assert {"qwen25", "hermes", "qwen3_coder"} <= set(PARSERS)
    assert set(PARSERS) <= set(TOOL_CALL_PARSERS)
    assert get_parser("qwen3_coder").name == "qwen3_coder"
    with pytest.raises(UnknownToolCallParser, match=r"spec\.model\.toolCallParser 'llama3'"):
        get_parser("llama3")


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_replies_are_counted_by_call_failure_and_no_call(tok: PreTrainedTokenizerFast) -> None:
    parser = get_parser("qwen25")
    calls = "agentrl_rollout_tool_calls_parsed_total"
    failures = "agentrl_rollout_tool_call_parse_failures_total"
    idle = "agentrl_rollout_turns_without_tool_call_total"
    before = (
        _sample(calls, tool="bash"),
        _sample(calls, tool="str_replace_editor"),
        _sample(failures, reason="malformed_json"),
        _sample(idle),
    )
    record_reply(parser.parse(decoded(tok, HEREDOC_JSON), TOOLS))
    record_reply(parser.parse("<tool_call>\n{oops}\n</tool_call>", TOOLS))
    record_reply(parser.parse("nothing to call", TOOLS))
    after = (
        _sample(calls, tool="bash"),
        _sample(calls, tool="str_replace_editor"),
        _sample(failures, reason="malformed_json"),
        _sample(idle),
    )
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1, 1, 1]
