"""Tool calls in a model's own syntax: the parser registry.

A model trained on its chat template writes tool calls in that template's syntax; this module
reads them back from the text decoded from the engine's output ids. Parsers are registered
under SGLang's ``--tool-call-parser`` names, as ``spec.model.toolCallParser`` spells them
(:data:`PARSERS`; the syntax of each is :data:`agentrl.api.model.PARSER_CALL_SYNTAX`):

- ``qwen25``, ``qwen``, ``hermes``: a JSON object ``{"name": ..., "arguments": {...}}`` inside
  ``<tool_call></tool_call>`` (Qwen2.5 / Qwen3 Instruct, Hermes);
- ``qwen3_coder``: ``<tool_call><function=NAME><parameter=ARG>value</parameter></function>
  </tool_call>`` with string values as written (one newline each side stripped) and other
  values read as JSON when the tool's schema types them (Qwen3-Coder).

:meth:`ToolCallParser.parse` returns a :class:`ParsedReply`: the content text, the reasoning
(``<think>`` block, when asked for), the calls, and a :class:`ToolCallError` value when the
reply is malformed (bad JSON, an unclosed tag, an unknown tool, a missing required argument).
Errors are values, never exceptions: the agent sends :meth:`ToolCallError.observation` back to
the model and counts it (:func:`record_reply`). :meth:`ParsedReply.assistant_message` is the
message the chat template renders back to the same text, for the whole-conversation check of
:meth:`agentrl.rollout.hf_tokenizer.HFTurnTokenizer.prefix_mismatch`.

Callers: :mod:`agentrl.rollout.hf_tokenizer`, the token-level agent.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from agentrl.api.model import PARSER_CALL_SYNTAX, TOOL_CALL_PARSER_FIELD, ToolCallSyntax
from agentrl.rollout import metrics

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

#: An OpenAI tool definition (``{"type": "function", "function": {...}}``) or its function.
ToolSchema = Mapping[str, Any]


class ParseFailure(StrEnum):
    """Why a reply's tool calls could not be read (the ``reason`` label of
    ``agentrl_rollout_tool_call_parse_failures_total``)."""

    MALFORMED_JSON = "malformed_json"
    UNCLOSED_TAG = "unclosed_tag"
    BAD_STRUCTURE = "bad_structure"
    UNKNOWN_TOOL = "unknown_tool"
    MISSING_ARGUMENT = "missing_argument"


class ToolCallError(BaseModel):
    """A reply whose tool calls cannot be run."""

    reason: ParseFailure
    detail: str
    """What was wrong, for the model and the logs."""

    def observation(self) -> str:
        """The text sent back to the model in place of a tool result."""
        return f"Your tool call could not be read ({self.reason.value}): {self.detail}"


class ParsedToolCall(BaseModel):
    """One call: a tool name and its arguments."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)

    def openai(self) -> dict[str, Any]:
        """The call as a chat message's ``tool_calls`` entry (arguments as a mapping, which the
        templates serialise in the model's syntax)."""
        return {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}


class ParsedReply(BaseModel):
    """What a model's reply says: text, reasoning, calls, or why its calls are unreadable."""

    text: str
    """The decoded reply as the parser received it."""
    content: str
    """The reply outside the reasoning and the tool calls."""
    reasoning: str | None = None
    """The ``<think>`` block's text, when the parser was asked to split it off."""
    calls: list[ParsedToolCall] = Field(default_factory=list)
    """The calls, in order; empty on an error."""
    error: ToolCallError | None = None
    text_action: bool = False
    """The calls were read from a one-line text action (:mod:`agentrl.rollout.text_actions`),
    not from a template's call syntax: the assistant message is the reply's text."""

    def assistant_message(self) -> dict[str, Any]:
        """The assistant message for this reply, as the chat template renders it back: content
        and calls, or, when the calls were unreadable or written as a text action, the reply
        text as content."""
        message: dict[str, Any] = {"role": "assistant"}
        if self.reasoning is not None:
            message["reasoning_content"] = self.reasoning
        if self.error is not None or self.text_action:
            message["content"] = self._body()
            return message
        message["content"] = self.content
        if self.calls:
            message["tool_calls"] = [c.openai() for c in self.calls]
        return message

    def _body(self) -> str:
        if self.reasoning is None:
            return self.text
        return _split_reasoning(self.text)[1]


def _split_reasoning(text: str) -> tuple[str | None, str]:
    """``(reasoning, rest)``: the text up to ``</think>`` (an opening ``<think>`` and one
    newline each side dropped) and what follows it (its leading newlines dropped). A reply
    cut inside its reasoning is all reasoning."""
    end = text.find(THINK_CLOSE)
    start = text.find(THINK_OPEN)
    if end < 0:
        if start < 0:
            return None, text
        return _trim_newline(text[start + len(THINK_OPEN) :]), ""
    inner = text[start + len(THINK_OPEN) : end] if 0 <= start < end else text[:end]
    return _trim_newline(inner), text[end + len(THINK_CLOSE) :].lstrip("\n")


def _trim_newline(value: str) -> str:
    """``value`` without one leading and one trailing newline: what a template writes around
    a value on lines of its own."""
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def _function(tool: ToolSchema) -> Mapping[str, Any]:
    inner = tool.get("function")
    return inner if isinstance(inner, Mapping) else tool


def _tool_index(tools: Sequence[ToolSchema] | None) -> dict[str, Mapping[str, Any]] | None:
    if not tools:
        return None
    return {str(_function(t)["name"]): _function(t) for t in tools}


class ToolCallParser:
    """Reads the tool calls of one syntax. Subclasses implement :meth:`_calls`."""

    syntax: ClassVar[ToolCallSyntax]

    def __init__(self, name: str) -> None:
        self.name = name

    def parse(
        self, text: str, tools: Sequence[ToolSchema] | None = None, *, reasoning: bool = False
    ) -> ParsedReply:
        """Content, calls and error of ``text``. ``tools`` (OpenAI definitions) are what calls
        are checked against: unknown names and missing required arguments are errors; without
        them any call is taken. ``reasoning`` splits a leading ``<think>`` block off first
        (calls inside it are not calls)."""
        thought: str | None = None
        body = text
        if reasoning:
            thought, body = _split_reasoning(text)
        at = body.find(CALL_OPEN)
        if at < 0:
            if CALL_CLOSE in body:
                return self._failed(
                    text,
                    thought,
                    ParseFailure.UNCLOSED_TAG,
                    body,
                    f"a {CALL_CLOSE} without its {CALL_OPEN}",
                )
            return ParsedReply(text=text, content=body, reasoning=thought)
        content = body[:at]
        if content.endswith("\n"):
            content = content[:-1]
        calls: list[ParsedToolCall] = []
        index = _tool_index(tools)
        rest = body[at:]
        while True:
            start = rest.find(CALL_OPEN)
            if start < 0:
                break
            end = rest.find(CALL_CLOSE, start)
            if end < 0:
                return self._failed(
                    text,
                    thought,
                    ParseFailure.UNCLOSED_TAG,
                    body,
                    f"{CALL_OPEN} is never closed with {CALL_CLOSE}",
                )
            found = self._calls(rest[start + len(CALL_OPEN) : end], index)
            if isinstance(found, ToolCallError):
                return self._failed(text, thought, found.reason, body, found.detail)
            problem = _check_call(found, index)
            if problem is not None:
                return self._failed(text, thought, problem.reason, body, problem.detail)
            calls.append(found)
            rest = rest[end + len(CALL_CLOSE) :]
        return ParsedReply(text=text, content=content, reasoning=thought, calls=calls)

    def _calls(
        self, block: str, tools: Mapping[str, Mapping[str, Any]] | None
    ) -> ParsedToolCall | ToolCallError:
        raise NotImplementedError

    def format_call(self, call: ParsedToolCall) -> str:
        """``call`` written in this syntax, tags included: what a model trained on the template
        writes, and what :meth:`parse` reads back to ``call`` (scripted solvers write their
        turns with it, :mod:`agentrl.rollout.tasks.traces`)."""
        raise NotImplementedError

    @staticmethod
    def _failed(
        text: str, thought: str | None, reason: ParseFailure, body: str, detail: str
    ) -> ParsedReply:
        return ParsedReply(
            text=text,
            content=body,
            reasoning=thought,
            error=ToolCallError(reason=reason, detail=detail),
        )


def _check_call(
    call: ParsedToolCall, tools: Mapping[str, Mapping[str, Any]] | None
) -> ToolCallError | None:
    if tools is None:
        return None
    function = tools.get(call.name)
    if function is None:
        return ToolCallError(
            reason=ParseFailure.UNKNOWN_TOOL,
            detail=f"there is no tool {call.name!r}; the tools are {', '.join(tools)}",
        )
    parameters = function.get("parameters") or {}
    missing = [p for p in parameters.get("required") or () if p not in call.arguments]
    if missing:
        return ToolCallError(
            reason=ParseFailure.MISSING_ARGUMENT,
            detail=f"{call.name} needs the argument(s) {', '.join(missing)}",
        )
    return None


class JsonToolCallParser(ToolCallParser):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes, Qwen2.5/3)."""

    syntax = ToolCallSyntax.JSON

    def _calls(
        self, block: str, tools: Mapping[str, Mapping[str, Any]] | None
    ) -> ParsedToolCall | ToolCallError:
        try:
            value = json.loads(block)
        except json.JSONDecodeError as exc:
            return ToolCallError(
                reason=ParseFailure.MALFORMED_JSON,
                detail=f"the text inside {CALL_OPEN} is not JSON: {exc}",
            )
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return ToolCallError(
                reason=ParseFailure.BAD_STRUCTURE,
                detail=f'{CALL_OPEN} must hold {{"name": <tool>, "arguments": {{...}}}}',
            )
        arguments = value.get("arguments", {})
        if not isinstance(arguments, dict):
            return ToolCallError(
                reason=ParseFailure.BAD_STRUCTURE,
                detail=f"the arguments of {value['name']} must be a JSON object",
            )
        return ParsedToolCall(name=value["name"], arguments=arguments)

    def format_call(self, call: ParsedToolCall) -> str:
        body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
        return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"


_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


class XmlToolCallParser(ToolCallParser):
    """``<tool_call><function=NAME><parameter=ARG>value</parameter></function></tool_call>``
    (Qwen3-Coder). A value stays a string unless the tool's schema gives the parameter another
    type and the value reads as JSON of it."""

    syntax = ToolCallSyntax.XML

    def _calls(
        self, block: str, tools: Mapping[str, Mapping[str, Any]] | None
    ) -> ParsedToolCall | ToolCallError:
        function = _FUNCTION.search(block)
        if function is None:
            if "<function=" in block:
                return ToolCallError(
                    reason=ParseFailure.UNCLOSED_TAG,
                    detail="<function=...> is never closed with </function>",
                )
            return ToolCallError(
                reason=ParseFailure.BAD_STRUCTURE,
                detail=f"{CALL_OPEN} must hold <function=NAME> with <parameter=ARG> elements",
            )
        name, inner = function.group(1).strip(), function.group(2)
        properties = ((tools or {}).get(name, {}).get("parameters") or {}).get("properties") or {}
        arguments: dict[str, Any] = {}
        for match in _PARAMETER.finditer(inner):
            key = match.group(1).strip()
            arguments[key] = _typed(_trim_newline(match.group(2)), properties.get(key))
        if inner.count("<parameter=") > inner.count("</parameter>"):
            return ToolCallError(
                reason=ParseFailure.UNCLOSED_TAG,
                detail="a <parameter=...> is never closed with </parameter>",
            )
        return ParsedToolCall(name=name, arguments=arguments)

    def format_call(self, call: ParsedToolCall) -> str:
        parts = [f"{CALL_OPEN}\n<function={call.name}>"]
        for key, value in call.arguments.items():
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            parts.append(f"<parameter={key}>\n{text}\n</parameter>")
        parts.append(f"</function>\n{CALL_CLOSE}")
        return "\n".join(parts)


def _typed(value: str, schema: Any) -> Any:
    kind = schema.get("type") if isinstance(schema, Mapping) else None
    if kind in (None, "string") or not isinstance(kind, str):
        return value
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        return value
    fits = {
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "null": lambda v: v is None,
    }.get(kind)
    return parsed if fits is not None and fits(parsed) else value


#: Parser classes by SGLang ``--tool-call-parser`` name.
PARSERS: dict[str, type[ToolCallParser]] = {
    name: JsonToolCallParser if syntax == ToolCallSyntax.JSON else XmlToolCallParser
    for name, syntax in PARSER_CALL_SYNTAX.items()
}


class UnknownToolCallParser(ValueError):
    """``spec.model.toolCallParser`` names a parser the rollout tier cannot run itself."""


def get_parser(name: str) -> ToolCallParser:
    """The parser registered as ``name``; :class:`UnknownToolCallParser` naming the field and
    the names there are otherwise."""
    cls = PARSERS.get(name)
    if cls is None:
        raise UnknownToolCallParser(
            f"{TOOL_CALL_PARSER_FIELD} {name!r} has no parser in the rollout tier, which reads "
            f"tool calls itself for token-level episodes; use one of {', '.join(PARSERS)}"
        )
    return cls(name)


def record_reply(reply: ParsedReply) -> None:
    """Count a parsed reply: its calls by tool, its parse failure by reason, or a turn without
    a tool call."""
    if reply.error is not None:
        metrics.TOOL_CALL_PARSE_FAILURES.labels(reason=reply.error.reason.value).inc()
    elif not reply.calls:
        metrics.TURNS_WITHOUT_TOOL_CALL.inc()
    for call in reply.calls:
        metrics.TOOL_CALLS_PARSED.labels(tool=call.name).inc()
