"""Native tool calls through the model's own chat template, token for token.

For both call syntaxes (the bundled ``qwen3-instruct`` template with JSON calls, and
``qwen3-coder`` with XML calls) and the keep-reasoning ``qwen3-thinking`` template: the prompt
lists the tools, tool results render as the template groups them, the calls read back from the
engine's output ids are the ones written by hand, and an episode built turn by turn (initial
ids + generated ids + closing and observation ids) is exactly what
``transformers``' ``apply_chat_template(..., tools=...)`` tokenises for the whole conversation.
A template that drops earlier reasoning (as the stock Qwen3 one does) is refused at start,
naming ``spec.model.chatTemplate``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from agentrl.api.model import ChatTemplateSource
from agentrl.rollout.chat_templates import bundled_template
from agentrl.rollout.hf_model_files import build_tokenizer, write_tokenizer_files
from agentrl.rollout.hf_tokenizer import (
    HFTurnTokenizer,
    TokenizerConfigError,
    first_mismatch,
    load_hf_turn_tokenizer,
    mask_after_break,
)
from agentrl.rollout.toolcalls import ParsedToolCall
from tests.rollout.test_toolcalls import TOOLS

SYSTEM = "You are a software engineer fixing a bug in a repository."
USER = "Make tests/test_app.py pass, then submit."

# --- one 3-turn episode, written once as calls and per syntax as the model writes it ----------

CALLS: list[list[dict[str, Any]]] = [
    [
        {"name": "str_replace_editor", "arguments": {"command": "view", "path": "/repo/app.py"}},
        {"name": "bash", "arguments": {"command": "cd /repo && python -m pytest -q"}},
    ],
    [
        {
            "name": "str_replace_editor",
            "arguments": {
                "command": "str_replace",
                "path": "/repo/app.py",
                "old_str": "def f():\n    return 1",
                "new_str": "def f():\n    return 2",
            },
        },
        {
            "name": "bash",
            "arguments": {"command": "cat <<'EOF' > /repo/check.sh\npytest -q\nEOF\nsh check.sh"},
        },
    ],
    [{"name": "submit", "arguments": {}}],
]
CONTENTS = ["Let me look at the code and run the tests.", "", "The tests pass."]
RESULTS = [
    ["def f():\n    return 1\n", "FAILED tests/test_app.py::test_f - assert 1 == 2\n[exit 1]"],
    ["The file /repo/app.py has been edited.", "1 passed\n[exit 0]"],
]

JSON_REPLIES = [
    "Let me look at the code and run the tests.\n"
    "<tool_call>\n"
    '{"name": "str_replace_editor", "arguments": {"command": "view", "path": "/repo/app.py"}}\n'
    "</tool_call>\n"
    "<tool_call>\n"
    '{"name": "bash", "arguments": {"command": "cd /repo && python -m pytest -q"}}\n'
    "</tool_call>",
    "<tool_call>\n"
    '{"name": "str_replace_editor", "arguments": {"command": "str_replace", "path": '
    '"/repo/app.py", "old_str": "def f():\\n    return 1", "new_str": "def f():\\n    '
    'return 2"}}\n'
    "</tool_call>\n"
    "<tool_call>\n"
    '{"name": "bash", "arguments": {"command": "cat <<\'EOF\' > /repo/check.sh\\npytest -q\\n'
    'EOF\\nsh check.sh"}}\n'
    "</tool_call>",
    'The tests pass.\n<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call>',
]
XML_REPLIES = [
    "Let me look at the code and run the tests.\n"
    "<tool_call>\n<function=str_replace_editor>\n"
    "<parameter=command>\nview\n</parameter>\n"
    "<parameter=path>\n/repo/app.py\n</parameter>\n"
    "</function>\n</tool_call>\n"
    "<tool_call>\n<function=bash>\n"
    "<parameter=command>\ncd /repo && python -m pytest -q\n</parameter>\n"
    "</function>\n</tool_call>",
    "<tool_call>\n<function=str_replace_editor>\n"
    "<parameter=command>\nstr_replace\n</parameter>\n"
    "<parameter=path>\n/repo/app.py\n</parameter>\n"
    "<parameter=old_str>\ndef f():\n    return 1\n</parameter>\n"
    "<parameter=new_str>\ndef f():\n    return 2\n</parameter>\n"
    "</function>\n</tool_call>\n"
    "<tool_call>\n<function=bash>\n"
    "<parameter=command>\ncat <<'EOF' > /repo/check.sh\npytest -q\nEOF\nsh check.sh\n"
    "</parameter>\n</function>\n</tool_call>",
    "The tests pass.\n<tool_call>\n<function=submit>\n</function>\n</tool_call>",
]
FAMILIES = {
    "json": ("qwen3-instruct", "qwen25", JSON_REPLIES),
    "xml": ("qwen3-coder", "qwen3_coder", XML_REPLIES),
}


def encode(tok: PreTrainedTokenizerFast, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def im_end(tok: PreTrainedTokenizerFast) -> int:
    return cast(int, tok.convert_tokens_to_ids("<|im_end|>"))


def rendered(
    tok: PreTrainedTokenizerFast, messages: list[dict[str, Any]], **kwargs: Any
) -> list[int]:
    """``transformers``' own tokenised rendering of the conversation with the tools."""
    ids = tok.apply_chat_template(messages, tools=TOOLS, tokenize=True, return_dict=False, **kwargs)
    assert isinstance(ids, list)
    return cast(list[int], ids)


def assistant(content: str, calls: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [{"type": "function", "function": c} for c in calls],
        **extra,
    }


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest) -> tuple[PreTrainedTokenizerFast, str, list[str]]:
    template, parser, replies = FAMILIES[request.param]
    return build_tokenizer(template=template), parser, replies


def test_the_prompt_lists_every_tool_with_its_schema() -> None:
    tok = build_tokenizer(template="qwen3-instruct")
    text = tok.decode(HFTurnTokenizer(tok, tools=TOOLS).initial_ids(SYSTEM, USER))
    assert text.startswith(f"<|im_start|>system\n{SYSTEM}\n\n# Tools\n")
    assert text.endswith(f"<|im_start|>user\n{USER}<|im_end|>\n<|im_start|>assistant\n")
    for tool in TOOLS:
        assert "\n" + json.dumps(tool, ensure_ascii=False) + "\n" in text


def test_the_coder_prompt_lists_every_tool_parameter_as_xml() -> None:
    tok = build_tokenizer(template="qwen3-coder")
    text = tok.decode(HFTurnTokenizer(tok, tools=TOOLS).initial_ids(SYSTEM, USER))
    assert "<function=function_name>" in text  # how to call, in the tools block
    for tool in TOOLS:
        fn = tool["function"]
        assert f"<function>\n<name>{fn['name']}</name>\n<description>{fn['description']}" in text
        for name, schema in fn["parameters"]["properties"].items():
            assert f"<parameter>\n<name>{name}</name>\n<type>{schema['type']}</type>" in text
        if fn["parameters"]["required"]:
            assert f"<required>{json.dumps(fn['parameters']['required'])}</required>" in text
    assert '<enum>["view", "create", "str_replace", "insert"]</enum>' in text


def test_tool_results_of_one_turn_render_as_one_user_turn(
    family: tuple[PreTrainedTokenizerFast, str, list[str]],
) -> None:
    tok, parser, _ = family
    hf = HFTurnTokenizer(tok, tools=TOOLS, tool_call_parser=parser)
    assert hf.observation_role == "tool"
    assert hf.tool_results_ids(["a.py\nb.py", "[exit 0]"]) == encode(
        tok,
        "<|im_start|>user\n<tool_response>\na.py\nb.py\n</tool_response>\n"
        "<tool_response>\n[exit 0]\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    )
    assert hf.observation_ids("done") == encode(
        tok,
        "<|im_start|>user\n<tool_response>\ndone\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n",
    )
    # The newline after <|im_end|> the engine never generates is the whole closing delta.
    assert hf.close_turn_ids([*encode(tok, "x"), im_end(tok)]) == encode(tok, "\n")


def test_a_three_turn_episode_with_several_calls_is_the_whole_rendering(
    family: tuple[PreTrainedTokenizerFast, str, list[str]],
) -> None:
    tok, parser, replies = family
    hf = HFTurnTokenizer(tok, tools=TOOLS, tool_call_parser=parser)
    checker = hf.prefix_checker()
    ids = hf.initial_ids(SYSTEM, USER)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": USER},
    ]
    for turn, reply in enumerate(replies):
        assert hf.prefix_mismatch(ids, messages) is None  # what the engine is sent
        assert checker.mismatch(ids, messages) is None
        out = [*encode(tok, reply), im_end(tok)]  # the engine's output ids
        parsed = hf.parse_reply(out)
        assert parsed.error is None
        assert parsed.content == CONTENTS[turn]
        assert parsed.calls == [ParsedToolCall(**c) for c in CALLS[turn]]
        message = assistant(CONTENTS[turn], CALLS[turn])
        assert parsed.assistant_message() == message
        ids += [*out, *hf.close_turn_ids(out)]
        messages.append(message)
        if turn < len(RESULTS):
            ids += hf.tool_results_ids(RESULTS[turn])
            messages += [{"role": "tool", "content": r} for r in RESULTS[turn]]

    assert ids == rendered(tok, messages)
    assert hf.prefix_mismatch(ids, messages) is None
    assert checker.mismatch(ids, messages) is None
    # A trajectory that lost a token is caught by both, where it differs.
    cut = len(hf.initial_ids(SYSTEM, USER)) + 3
    broken = ids[:cut] + ids[cut + 1 :]
    at = first_mismatch(broken, ids)
    assert at is not None and at <= cut
    assert hf.prefix_mismatch(broken, messages) == at
    assert checker.mismatch(broken, messages) == at


def test_a_reply_spelled_otherwise_breaks_the_prefix_inside_the_reply() -> None:
    tok = build_tokenizer(template="qwen3-instruct")
    hf = HFTurnTokenizer(tok, tools=TOOLS, tool_call_parser="qwen25")
    prompt = hf.initial_ids(SYSTEM, USER)
    # Compact JSON: the same call, but not how the template writes it.
    out = [*encode(tok, '<tool_call>\n{"name":"submit","arguments":{}}\n</tool_call>'), 2]
    assert out[-1] == im_end(tok)
    parsed = hf.parse_reply(out)
    assert parsed.calls == [ParsedToolCall(name="submit")]
    ids = [*prompt, *out, *hf.close_turn_ids(out)]
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": USER},
        parsed.assistant_message(),
    ]
    whole = rendered(tok, messages)
    at = hf.prefix_mismatch(ids, messages)
    checker = hf.prefix_checker()
    assert checker.mismatch(prompt, messages[:2]) is None
    assert checker.mismatch(ids, messages) == at
    assert at is not None and len(prompt) < at < len(prompt) + len(out)
    assert ids[:at] == whole[:at] and ids[at] != whole[at]
    mask = [0] * len(prompt) + [1] * len(out) + [0]
    masked = mask_after_break(mask, at)
    assert masked == [0] * len(prompt) + [1] * (at - len(prompt)) + [0] * (len(ids) - at)


def test_first_mismatch() -> None:
    assert first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert first_mismatch([1, 2, 3], [1, 5, 3]) == 1
    assert first_mismatch([1, 2], [1, 2, 3]) == 2
    assert first_mismatch([], [7]) == 0


def test_a_parser_of_the_other_syntax_is_refused_naming_both_fields() -> None:
    for template, parser in (("qwen3-instruct", "qwen3_coder"), ("qwen3-coder", "hermes")):
        with pytest.raises(TokenizerConfigError, match=r"spec\.model\.toolCallParser") as raised:
            HFTurnTokenizer(
                build_tokenizer(template=template), tools=TOOLS, tool_call_parser=parser
            )
        assert "spec.model.chatTemplate" in str(raised.value)
    with pytest.raises(TokenizerConfigError, match="'llama3' has no parser"):
        HFTurnTokenizer(build_tokenizer(), tool_call_parser="llama3")


# --- thinking ---------------------------------------------------------------------------------

# As the stock Qwen3 hybrid template behaves: reasoning is rendered only for assistant turns after
# the last user message, and the empty think block only for the last turn.
STOCK_STYLE_THINKING = (
    bundled_template("qwen3-thinking")
    .replace(
        "{%- set no_thinking",
        "{%- set ns = namespace(last_user=-1) -%}"
        "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}"
        "{%- endif -%}{%- endfor -%}\n{%- set no_thinking",
    )
    .replace(
        "{%- if message.reasoning_content is string -%}\n"
        "{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' -}}\n"
        "{%- elif no_thinking -%}",
        "{%- if loop.index0 > ns.last_user and (loop.last or message.reasoning_content) -%}\n"
        "{{- '<think>\\n' + (message.reasoning_content or '') + '\\n</think>\\n\\n' -}}\n"
        "{%- elif false -%}",
    )
)

THINKING_REPLIES = [
    "<think>\nFirst read the code.\n</think>\n\n" + JSON_REPLIES[0],
    "<think>\nThe function returns 1; it must return 2.\nEdit, then check.\n</think>\n\n"
    + JSON_REPLIES[1],
    "<think>\nDone.\n</think>\n\n" + JSON_REPLIES[2],
]
REASONING = ["First read the code.", "The function returns 1; it must return 2.\nEdit, then check.",
             "Done."]  # fmt: skip


def test_the_stock_style_template_drops_earlier_reasoning() -> None:
    # The premise of the next test, shown with transformers alone: once a user message follows,
    # an earlier turn loses its <think> block.
    tok = build_tokenizer(chat_template=STOCK_STYLE_THINKING)
    head = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": USER},
        assistant("", CALLS[2], reasoning_content="Done."),
    ]
    first = rendered(tok, head)
    later = rendered(tok, [*head, {"role": "user", "content": "Again."}])
    assert "<think>\nDone.\n</think>" in tok.decode(first)
    assert "<think>" not in tok.decode(later)


def test_a_template_that_drops_earlier_reasoning_is_refused_naming_chat_template() -> None:
    with pytest.raises(TokenizerConfigError, match="not prefix-stable") as raised:
        HFTurnTokenizer(build_tokenizer(chat_template=STOCK_STYLE_THINKING), tools=TOOLS)
    assert "changes the ids of earlier turns" in str(raised.value)
    assert "spec.model.chatTemplate" in str(raised.value)
    assert "qwen3-thinking" in str(raised.value)


@pytest.mark.parametrize("feedback_as_user", [False, True], ids=["tool-only", "with-user-turn"])
def test_the_keep_reasoning_template_renders_a_thinking_episode_turn_by_turn(
    feedback_as_user: bool,
) -> None:
    tok = build_tokenizer(template="qwen3-thinking")
    hf = HFTurnTokenizer(tok, tools=TOOLS, tool_call_parser="qwen25")
    assert hf.reasoning
    ids = hf.initial_ids(SYSTEM, USER)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": USER},
    ]
    for turn, reply in enumerate(THINKING_REPLIES):
        out = [*encode(tok, reply), im_end(tok)]
        parsed = hf.parse_reply(out)
        assert (parsed.reasoning, parsed.content) == (REASONING[turn], CONTENTS[turn])
        assert parsed.calls == [ParsedToolCall(**c) for c in CALLS[turn]]
        message = assistant(CONTENTS[turn], CALLS[turn], reasoning_content=REASONING[turn])
        assert parsed.assistant_message() == message
        ids += [*out, *hf.close_turn_ids(out)]
        messages.append(message)
        if turn < len(RESULTS):
            following = [{"role": "tool", "content": r} for r in RESULTS[turn]]
            if turn == 0 and feedback_as_user:
                # A user message in between: the stock template would drop the reasoning above.
                following.append({"role": "user", "content": "Keep going."})
            ids += hf.append_ids(following)
            messages += following
        assert hf.prefix_mismatch(ids, messages) is None

    assert ids == rendered(tok, messages)


def test_with_thinking_off_the_empty_think_block_is_in_every_turn() -> None:
    tok = build_tokenizer(template="qwen3-thinking")
    off = {"enable_thinking": False}
    hf = HFTurnTokenizer(tok, tools=TOOLS, tool_call_parser="qwen25", template_kwargs=off)
    ids = hf.initial_ids(SYSTEM, USER)
    assert tok.decode(ids).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": USER},
    ]
    for turn, reply in enumerate(JSON_REPLIES):  # no reasoning generated
        out = [*encode(tok, reply), im_end(tok)]
        parsed = hf.parse_reply(out)
        assert parsed.calls == [ParsedToolCall(**c) for c in CALLS[turn]]
        ids += [*out, *hf.close_turn_ids(out)]
        messages.append(assistant(CONTENTS[turn], CALLS[turn]))
        if turn < len(RESULTS):
            ids += hf.tool_results_ids(RESULTS[turn])
            messages += [{"role": "tool", "content": r} for r in RESULTS[turn]]
    assert ids == rendered(tok, messages, enable_thinking=False)


# --- model directories ------------------------------------------------------------------------


def test_written_tokenizer_files_reload_with_auto_tokenizer(tmp_path: Path) -> None:
    write_tokenizer_files(tmp_path, template="qwen3-coder")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in tmp_path.iterdir()}
    loaded = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    made = build_tokenizer(template="qwen3-coder")
    assert loaded.chat_template == bundled_template("qwen3-coder")
    assert loaded.eos_token == "<|im_end|>" and loaded.pad_token == "<|endoftext|>"
    for reply in XML_REPLIES:
        assert encode(loaded, reply) == encode(made, reply)
    hf = load_hf_turn_tokenizer(str(tmp_path), tools=TOOLS, tool_call_parser="qwen3_coder")
    out = [*encode(loaded, XML_REPLIES[0]), im_end(loaded)]
    assert hf.parse_reply(out).calls == [ParsedToolCall(**c) for c in CALLS[0]]


def test_the_manifests_chat_template_replaces_the_models_own(tmp_path: Path) -> None:
    # The model directory ships a template that drops earlier reasoning.
    write_tokenizer_files(tmp_path, chat_template=STOCK_STYLE_THINKING)
    with pytest.raises(TokenizerConfigError, match=r"spec\.model\.chatTemplate"):
        load_hf_turn_tokenizer(str(tmp_path), tools=TOOLS)

    bundled = ChatTemplateSource(bundled="qwen3-thinking")  # type: ignore[arg-type]
    hf = load_hf_turn_tokenizer(str(tmp_path), chat_template=bundled, tools=TOOLS)
    tok = build_tokenizer(template="qwen3-thinking")
    assert hf.initial_ids(SYSTEM, USER) == rendered(
        tok,
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}],
        add_generation_prompt=True,
    )

    (tmp_path / "keep.jinja").write_text(bundled_template("qwen3-thinking"))
    in_dir = ChatTemplateSource(path="keep.jinja")
    assert load_hf_turn_tokenizer(str(tmp_path), chat_template=in_dir, tools=TOOLS).initial_ids(
        SYSTEM, USER
    ) == hf.initial_ids(SYSTEM, USER)

    mounted = tmp_path / "mounted"
    mounted.mkdir()
    (mounted / "chat.jinja").write_text(bundled_template("qwen3-thinking"))
    ref = ChatTemplateSource.model_validate(
        {"configMapKeyRef": {"name": "templates", "key": "chat.jinja"}}
    )
    assert load_hf_turn_tokenizer(
        str(tmp_path), chat_template=ref, config_map_dir=str(mounted), tools=TOOLS
    ).initial_ids(SYSTEM, USER) == hf.initial_ids(SYSTEM, USER)

    missing = ChatTemplateSource(path="absent.jinja")
    with pytest.raises(TokenizerConfigError, match=r"spec\.model\.chatTemplate\.path 'absent"):
        load_hf_turn_tokenizer(str(tmp_path), chat_template=missing)

    # A template from the manifest that is not append-only names the field too.
    (tmp_path / "stock.jinja").write_text(STOCK_STYLE_THINKING)
    with pytest.raises(TokenizerConfigError, match="not prefix-stable") as raised:
        load_hf_turn_tokenizer(
            str(tmp_path), chat_template=ChatTemplateSource(path="stock.jinja"), tools=TOOLS
        )
    assert str(raised.value).startswith("spec.model.chatTemplate.path 'stock.jinja'")


def test_a_template_whose_tool_results_depend_on_the_tools_gets_them_in_every_delta() -> None:
    # Writes how many tools exist in every tool response: deltas need the tool list too.
    counting = bundled_template("qwen3-instruct").replace(
        "'\\n<tool_response>\\n' + message.content",
        "'\\n<tool_response>\\n' + (tools | length | string) + ' ' + message.content",
    )
    assert counting != bundled_template("qwen3-instruct")
    tok = build_tokenizer(chat_template=counting)
    hf = HFTurnTokenizer(tok, tools=TOOLS)
    assert hf.tool_results_ids(["ok"]) == encode(
        tok,
        "<|im_start|>user\n<tool_response>\n3 ok\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n",
    )
