"""``spec.model.chatTemplate`` and the parser/template rule: ``agentrl validate`` refuses a
tool-call parser that cannot read the calls of the bundled template it is paired with, and a
chat template source that names zero or several templates or leaves the model directory,
naming the field."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from agentrl.api import validation
from agentrl.api.model import (
    BundledChatTemplate,
    ChatTemplateSource,
    ToolCallSyntax,
    tool_call_format_mismatch,
)
from agentrl.api.sglang_parsers import TOOL_CALL_PARSERS
from tests.api.cases import BASE, merge


def errors_of(model: dict[str, Any]) -> list[validation.FieldError]:
    manifest = merge(BASE, {"spec": {"model": model}})
    return validation.validate_text(yaml.safe_dump(manifest))[1]


@pytest.mark.parametrize(
    ("parser", "template"),
    [
        ("qwen3_coder", "qwen3-instruct"),
        ("qwen3_coder", "qwen3-thinking"),
        ("qwen25", "qwen3-coder"),
        ("hermes", "qwen3-coder"),
        ("llama3", "qwen3-instruct"),  # a parser of another syntax altogether
    ],
)
def test_a_parser_that_cannot_read_the_bundled_templates_calls_is_refused(
    parser: str, template: str
) -> None:
    errors = errors_of({"toolCallParser": parser, "chatTemplate": {"bundled": template}})
    # llama3 is also refused as a parser the training rollout does not have (one more error).
    assert {e.path for e in errors} == {"spec.model.toolCallParser"}
    message = errors[0].message
    assert f"toolCallParser {parser}" in message
    assert f"bundled chat template {template}" in message
    assert "spec.model.chatTemplate" in message


@pytest.mark.parametrize(
    ("parser", "template"),
    [
        ("qwen25", "qwen3-instruct"),
        ("hermes", "qwen3-instruct"),
        ("qwen", "qwen3-thinking"),
        ("qwen25", "qwen3-thinking"),
        ("qwen3_coder", "qwen3-coder"),
    ],
)
def test_a_parser_of_the_templates_syntax_is_accepted(parser: str, template: str) -> None:
    assert errors_of({"toolCallParser": parser, "chatTemplate": {"bundled": template}}) == []


def test_the_pair_is_not_judged_when_either_side_is_unknown() -> None:
    # A template file's syntax is only known once the rollout workers read it.
    assert errors_of({"toolCallParser": "qwen25", "chatTemplate": {"path": "t.jinja"}}) == []
    assert errors_of({"chatTemplate": {"bundled": "qwen3-coder"}}) == []
    assert errors_of({"toolCallParser": "qwen3_coder"}) == []


@pytest.mark.parametrize(
    "source",
    [
        {},
        {"bundled": "qwen3-instruct", "path": "t.jinja"},
        {"path": "t.jinja", "configMapKeyRef": {"name": "templates", "key": "chat.jinja"}},
    ],
    ids=["none", "bundled-and-path", "path-and-configmap"],
)
def test_a_chat_template_source_names_exactly_one_template(source: dict[str, Any]) -> None:
    errors = errors_of({"chatTemplate": source})
    assert [e.path for e in errors] == ["spec.model.chatTemplate"]
    assert "exactly one of bundled, path and configMapKeyRef" in errors[0].message


@pytest.mark.parametrize("path", ["/etc/t.jinja", "../other/t.jinja", "a/../../t.jinja", ".."])
def test_a_template_path_stays_inside_the_model_directory(path: str) -> None:
    errors = errors_of({"chatTemplate": {"path": path}})
    assert [e.path for e in errors] == ["spec.model.chatTemplate.path"]


@pytest.mark.parametrize("path", ["t.jinja", "templates/keep..thinking.jinja", "a/b/c.jinja"])
def test_a_relative_template_path_is_accepted(path: str) -> None:
    assert errors_of({"chatTemplate": {"path": path}}) == []


def test_a_config_map_reference_is_modelled_like_the_other_references() -> None:
    errors = errors_of({"chatTemplate": {"configMapKeyRef": {"name": "tpl", "key": "a b"}}})
    assert [e.path for e in errors] == ["spec.model.chatTemplate.configMapKeyRef.key"]
    source = ChatTemplateSource.model_validate(
        {"configMapKeyRef": {"name": "tpl", "key": "chat.jinja"}}
    )
    assert source.to_manifest() == {"configMapKeyRef": {"name": "tpl", "key": "chat.jinja"}}


def test_an_unknown_bundled_template_is_refused_with_the_names_allowed() -> None:
    errors = errors_of({"chatTemplate": {"bundled": "llama3"}})
    assert [e.path for e in errors] == ["spec.model.chatTemplate.bundled"]
    assert "qwen3-thinking" in errors[0].message


def test_the_pure_rule() -> None:
    assert tool_call_format_mismatch(None, ToolCallSyntax.XML) is None
    assert tool_call_format_mismatch("qwen3_coder", None) is None
    assert tool_call_format_mismatch("auto", ToolCallSyntax.JSON) is not None
    assert tool_call_format_mismatch("hermes", ToolCallSyntax.JSON) is None
    message = tool_call_format_mismatch("hermes", ToolCallSyntax.XML, template="my.jinja")
    assert message is not None
    assert "cannot read the tool calls of my.jinja" in message
    assert "spec.model.toolCallParser to one of qwen3_coder, or spec.model.chatTemplate" in message


def test_every_parser_the_rule_knows_is_one_sglang_accepts() -> None:
    from agentrl.api.model import PARSER_CALL_SYNTAX, TEMPLATE_CALL_SYNTAX

    assert set(PARSER_CALL_SYNTAX) <= set(TOOL_CALL_PARSERS)
    assert set(TEMPLATE_CALL_SYNTAX) == set(BundledChatTemplate)


@pytest.mark.parametrize("parser", ["auto", "llama3", "deepseekv3"])
def test_a_parser_the_training_rollout_lacks_is_refused_for_a_real_model(parser: str) -> None:
    # auto fits the bundled template's syntax for SGLang, but the rollout reads calls itself.
    errors = errors_of({"toolCallParser": parser, "chatTemplate": {"path": "t.jinja"}})
    assert [e.path for e in errors] == ["spec.model.toolCallParser"]
    assert errors[0].message == (
        f"toolCallParser {parser} has no parser in the training rollout, which reads the tool "
        "calls from the generated tokens itself: set spec.model.toolCallParser to one of qwen, "
        "qwen25, hermes, qwen3_coder"
    )
    assert errors_of({"toolCallParser": "auto", "chatTemplate": {"bundled": "qwen3-coder"}}) != []


@pytest.mark.parametrize("parser", ["auto", "llama3"])
def test_the_tiny_policy_takes_any_sglang_parser(parser: str) -> None:
    # It acts in text; the parser only reaches an engine's OpenAI endpoint.
    assert errors_of({"source": {"path": "tiny"}, "toolCallParser": parser}) == []
