"""Warm-start conversations (``spec.trainer.warmStart.dataset``): read them, refuse the bad
lines with their line numbers, and render the good ones as the rollout would have built them.

A warm-start file is JSONL, one conversation a line: ``{"messages": [...], "tools": [...]}``,
OpenAI chat messages (assistant messages may carry ``tool_calls`` and ``reasoning_content``;
``tool`` messages hold the results of the calls before them) and, optionally, OpenAI tool
definitions (``agentrl tasks traces`` writes such lines). Each line is parsed into
:class:`Conversation`; a line is refused, as a :class:`LineError` (line number and reason), when

- it is not JSON, or not the format (unknown roles or fields, a call without a name, arguments
  that are not a JSON object, a ``tool`` message with no call before it, a conversation that
  does not end in an assistant turn, ...);
- it calls, or lists, a tool the job does not offer (the job's tools are the tool definitions
  the rollout renders: the SWE tools of :func:`~agentrl.rollout.swe_tools.tool_schemas` when
  ``spec.model.toolCallParser`` is set, none otherwise);
- it renders to more tokens than ``tokensPerBatch``;
- its whole-conversation rendering is not the concatenation of its turns as the rollout builds
  them, or the job's parser does not read an assistant turn back to the calls it was written
  with (below).

Rendering (:func:`render_conversation`) uses the rollout's own
:class:`~agentrl.rollout.hf_tokenizer.HFTurnTokenizer` (same chat template, same tool
schemas, tool results in its observation role). The ids are the template's rendering of the
whole conversation; the loss mask is 1 on what the model generates in each assistant turn,
through its end-of-turn token (ChatML ``<|im_end|>``), and 0 on everything else: the system
and user turns, the tool results, every generation prompt (``<|im_start|>assistant\\n``) and
what the template writes after the end-of-turn token (the newline the engine never
generates). The mask comes from building the conversation turn by turn as the rollout does —
the first generation prompt from the messages before the first assistant turn, then, for each
assistant turn, its ids up to the end-of-turn token
(:attr:`~agentrl.rollout.hf_tokenizer.HFTurnTokenizer.stop_token_ids`), the closing ids
(:meth:`~agentrl.rollout.hf_tokenizer.HFTurnTokenizer.close_turn_ids`) and the following
messages with the next generation prompt
(:meth:`~agentrl.rollout.hf_tokenizer.HFTurnTokenizer.append_ids`) — and the conversation is
kept only when that concatenation equals the whole rendering, token for token. With a parser,
each assistant turn's ids must also read back (:meth:`~agentrl.rollout.hf_tokenizer.
HFTurnTokenizer.parse_reply`) to the calls of its message: what the model learns to write is
what the rollout will run.

Callers: ``agentrl tasks validate`` (a file checked before the job starts), the trainer's
warm-start stage (:mod:`agentrl.trainer.sft_batches` packs what :func:`read_warm_start`
returns).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agentrl.api.model import TOOL_CALL_PARSER_FIELD, ModelSpec
from agentrl.rollout.hf_tokenizer import HFTurnTokenizer, first_mismatch, load_hf_turn_tokenizer
from agentrl.rollout.toolcalls import ParsedToolCall

#: The manifest field of the warm-start file, for messages.
WARM_START_FIELD = "spec.trainer.warmStart"

# Tokens decoded each side of a mismatch in its reason.
_CONTEXT_TOKENS = 6
_ROLES = ("system", "user", "assistant", "tool")


class ConversationError(ValueError):
    """Why one conversation cannot be trained on (its line is reported with this reason)."""


# --- the line format ------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FunctionCall(_Strict):
    """The function of a tool call: a name and its arguments (a JSON object, or a string
    holding one, as the OpenAI API writes them)."""

    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)

    @field_validator("arguments", mode="before")
    @classmethod
    def _json_arguments(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else {}
            except json.JSONDecodeError as exc:
                raise ValueError(f"arguments are not JSON: {exc}") from exc
            if not isinstance(value, dict):
                raise ValueError("arguments must be a JSON object")
        return value


class ToolCall(_Strict):
    """One ``tool_calls`` entry of an assistant message."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class SystemMessage(_Strict):
    role: Literal["system"]
    content: str


class UserMessage(_Strict):
    role: Literal["user"]
    content: str


class AssistantMessage(_Strict):
    role: Literal["assistant"]
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)

    @model_validator(mode="after")
    def _says_something(self) -> AssistantMessage:
        if not self.content and not self.tool_calls and not self.reasoning_content:
            raise ValueError("an assistant message needs content or tool_calls")
        return self


class ToolMessage(_Strict):
    role: Literal["tool"]
    content: str
    tool_call_id: str | None = None
    name: str | None = None


Message = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")
]


class FunctionDefinition(BaseModel):
    """A tool definition's function; only its name is read (the job's definition is what is
    rendered)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = Field(min_length=1)


class ToolDefinition(_Strict):
    """An OpenAI tool definition."""

    type: Literal["function"] = "function"
    function: FunctionDefinition


class Conversation(_Strict):
    """One warm-start line: the messages in the order the rollout would have produced them."""

    messages: list[Message] = Field(min_length=2)
    tools: list[ToolDefinition] | None = None

    @model_validator(mode="after")
    def _in_rollout_order(self) -> Conversation:
        problem = _order_problem(self.messages)
        if problem is not None:
            raise ValueError(problem)
        return self

    def called_tools(self) -> list[str]:
        """Names of every tool called, in order."""
        return [
            c.function.name
            for m in self.messages
            if isinstance(m, AssistantMessage)
            for c in m.tool_calls
        ]


def _order_problem(messages: Sequence[BaseModel]) -> str | None:
    """What makes ``messages`` a conversation the rollout could not have produced, or None."""
    roles = [getattr(m, "role", "") for m in messages]
    if "assistant" not in roles:
        return "no assistant message: there is nothing to train on"
    first = roles.index("assistant")
    if "user" not in roles[:first]:
        return "no user message before the first assistant message"
    if roles[-1] != "assistant":
        return (
            f"the last message is a {roles[-1]} message: a conversation ends with the assistant "
            "turn that is trained on"
        )
    calls: list[ToolCall] = []
    answered = 0
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if isinstance(message, SystemMessage) and i != 0:
            return f"{where} is a system message; only the first message may be one"
        if isinstance(message, AssistantMessage):
            if i > 0 and roles[i - 1] == "assistant":
                return f"{where} is a second assistant message in a row"
            calls, answered = list(message.tool_calls), 0
        elif isinstance(message, ToolMessage):
            if answered >= len(calls):
                return (
                    f"{where} is a tool result with no tool call before it to answer"
                    if not calls
                    else f"{where} is tool result {answered + 1} after an assistant message "
                    f"with {len(calls)} tool call(s)"
                )
            ids = {c.id for c in calls if c.id is not None}
            if message.tool_call_id is not None and ids and message.tool_call_id not in ids:
                return (
                    f"{where} answers tool_call_id {message.tool_call_id!r}, which no call of "
                    f"the assistant message before it has ({', '.join(sorted(ids))})"
                )
            answered += 1
        else:
            calls, answered = [], 0
    return None


# --- reading a file ---------------------------------------------------------------------------


class LineError(BaseModel):
    """A refused line: its number (from 1) and why."""

    line: int
    reason: str

    def render(self, path: str | Path) -> str:
        """``FILE:LINE: reason``, as compilers write it."""
        return f"{path}:{self.line}: {self.reason}"


class MaskedTokens(BaseModel):
    """Token ids with their loss mask (1: trained on): a conversation, or a packed batch of
    them (:class:`agentrl.trainer.sft_batches.SFTBatch`)."""

    token_ids: list[int]
    loss_mask: list[int]

    @property
    def tokens(self) -> int:
        return len(self.token_ids)

    @property
    def trained_tokens(self) -> int:
        """Tokens the loss is taken over (its denominator)."""
        return sum(self.loss_mask)


class RenderedConversation(MaskedTokens):
    """One conversation as token ids with its loss mask."""

    line: int
    """Its line in the warm-start file (from 1)."""


class WarmStartReport(BaseModel):
    """What :func:`read_warm_start` made of a file: the conversations to train on, and the
    refused lines."""

    conversations: list[RenderedConversation]
    errors: list[LineError]

    @property
    def tokens(self) -> int:
        return sum(c.tokens for c in self.conversations)

    @property
    def trained_tokens(self) -> int:
        return sum(c.trained_tokens for c in self.conversations)


def job_tools(turns: HFTurnTokenizer) -> list[str]:
    """Names of the tools the job offers: those ``turns`` renders (the rollout's)."""
    return [str(_function_name(t)) for t in turns.tools or ()]


def _function_name(tool: dict[str, Any]) -> Any:
    inner = tool.get("function")
    return inner.get("name") if isinstance(inner, dict) else tool.get("name")


def parse_line(text: str, *, tools: Sequence[str]) -> Conversation:
    """The conversation of one line; :class:`ConversationError` when it is not JSON, not the
    format, or names a tool outside ``tools`` (the job's)."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConversationError(f"not JSON: {exc}") from exc
    try:
        conversation = Conversation.model_validate(raw)
    except ValidationError as exc:
        raise ConversationError(_validation_reason(exc)) from exc
    offered = set(tools)
    listed = [t.function.name for t in conversation.tools or ()]
    for name in [*listed, *conversation.called_tools()]:
        if name not in offered:
            raise ConversationError(_unknown_tool(name, tools, called=name not in listed))
    return conversation


def _unknown_tool(name: str, tools: Sequence[str], *, called: bool) -> str:
    what = "calls" if called else "lists"
    if not tools:
        return (
            f"{what} tool {name!r}, and the job offers no tools: without "
            f"{TOOL_CALL_PARSER_FIELD} the rollout acts in plain text"
        )
    return f"{what} tool {name!r}, which the job does not offer (its tools: {', '.join(tools)})"


def _validation_reason(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False):
        where = _location(error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)


def _location(loc: Sequence[int | str]) -> str:
    """``messages[3].tool_calls[0].function.name`` from pydantic's location, without the role
    tag pydantic puts after a message's index."""
    out = ""
    for i, part in enumerate(loc):
        if i == 2 and loc[0] == "messages" and part in _ROLES:
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


def template_messages(conversation: Conversation, turns: HFTurnTokenizer) -> list[dict[str, Any]]:
    """The messages as the rollout hands them to the chat template: assistant messages as
    :meth:`~agentrl.rollout.toolcalls.ParsedReply.assistant_message` writes them (content a
    string, calls with arguments as a mapping, no call ids), tool results in the tokenizer's
    observation role."""
    out: list[dict[str, Any]] = []
    for message in conversation.messages:
        if isinstance(message, AssistantMessage):
            rendered: dict[str, Any] = {"role": "assistant"}
            if message.reasoning_content is not None:
                rendered["reasoning_content"] = message.reasoning_content
            rendered["content"] = message.content or ""
            if message.tool_calls:
                rendered["tool_calls"] = [_call(c).openai() for c in message.tool_calls]
            out.append(rendered)
        elif isinstance(message, ToolMessage):
            out.append({"role": turns.observation_role, "content": message.content})
        else:
            out.append({"role": message.role, "content": message.content})
    return out


def _call(call: ToolCall) -> ParsedToolCall:
    return ParsedToolCall(name=call.function.name, arguments=call.function.arguments)


def render_conversation(
    conversation: Conversation, turns: HFTurnTokenizer, *, max_tokens: int | None = None
) -> tuple[list[int], list[int]]:
    """Ids and loss mask of ``conversation`` (see the module docstring);
    :class:`ConversationError` when it is longer than ``max_tokens``, renders differently whole
    than turn by turn, or an assistant turn does not read back to its calls."""
    messages = template_messages(conversation, turns)
    whole = turns.render_ids(messages, generation_prompt=False)
    if max_tokens is not None and len(whole) > max_tokens:
        raise ConversationError(
            f"{len(whole)} tokens, more than {WARM_START_FIELD}.tokensPerBatch ({max_tokens})"
        )
    end = turns.stop_token_ids[0]
    assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    ids = turns.render_ids(messages[: assistants[0]], generation_prompt=True)
    mask = [0] * len(ids)
    _same_so_far(whole, ids, turns, f"the messages before messages[{assistants[0]}]")
    for n, at in enumerate(assistants):
        start = len(ids)
        try:
            stop = whole.index(end, start)
        except ValueError:
            raise ConversationError(
                f"the assistant message messages[{at}] does not end with the end-of-turn token "
                f"{turns.decode([end])!r} in the whole rendering"
            ) from None
        generated = whole[start : stop + 1]
        _reads_back(generated, conversation.messages[at], at, turns)
        ids += generated
        mask += [1] * len(generated)
        ids += turns.close_turn_ids(generated)
        following = messages[at + 1 : assistants[n + 1] if n + 1 < len(assistants) else None]
        if following:
            ids += turns.append_ids(following)
        mask += [0] * (len(ids) - len(mask))
        _same_so_far(whole, ids, turns, f"messages[{at}] (assistant) and what follows it")
    if len(ids) != len(whole):
        _mismatch(whole, ids, turns, "the end of the conversation")
    return ids, mask


def _same_so_far(whole: list[int], ids: list[int], turns: HFTurnTokenizer, what: str) -> None:
    if whole[: len(ids)] != ids:
        _mismatch(whole, ids, turns, what)


def _mismatch(whole: list[int], ids: list[int], turns: HFTurnTokenizer, what: str) -> None:
    at = first_mismatch(whole, ids) or 0

    def around(seq: list[int]) -> str:
        return repr(turns.decode(seq[max(0, at - _CONTEXT_TOKENS) : at + _CONTEXT_TOKENS]))

    raise ConversationError(
        f"renders differently whole than turn by turn (as the rollout builds it) at token "
        f"{at}, in {what}: whole {around(whole)}, turn by turn {around(ids)}; the chat template "
        "is not append-only for this conversation, or a message starts or ends with text the "
        "template's own markup merges with"
    )


def _reads_back(
    generated: list[int], message: BaseModel, index: int, turns: HFTurnTokenizer
) -> None:
    if turns.parser is None or not isinstance(message, AssistantMessage):
        return
    reply = turns.parse_reply(generated)
    expected = [_call(c) for c in message.tool_calls]
    if reply.error is not None:
        raise ConversationError(
            f"the assistant message messages[{index}] does not read back with the job's "
            f"tool-call parser {turns.parser.name}: {reply.error.detail}"
        )
    if reply.calls != expected:
        raise ConversationError(
            f"the assistant message messages[{index}] reads back with the job's tool-call "
            f"parser {turns.parser.name} as calls {_calls_text(reply.calls)}, not as written "
            f"({_calls_text(expected)}): the rollout would run other calls than the model "
            "learns to write"
        )


def _calls_text(calls: Sequence[ParsedToolCall]) -> str:
    return "[" + ", ".join(f"{c.name}({json.dumps(c.arguments)})" for c in calls) + "]"


def read_conversations(
    lines: Iterable[str], turns: HFTurnTokenizer, *, tokens_per_batch: int
) -> WarmStartReport:
    """Parse and render every line (numbered from 1; blank lines are skipped)."""
    tools = job_tools(turns)
    conversations: list[RenderedConversation] = []
    errors: list[LineError] = []
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            conversation = parse_line(text, tools=tools)
            ids, mask = render_conversation(conversation, turns, max_tokens=tokens_per_batch)
        except ConversationError as exc:
            errors.append(LineError(line=number, reason=str(exc)))
            continue
        conversations.append(RenderedConversation(line=number, token_ids=ids, loss_mask=mask))
    return WarmStartReport(conversations=conversations, errors=errors)


def read_warm_start(
    path: str | Path, turns: HFTurnTokenizer, *, tokens_per_batch: int
) -> WarmStartReport:
    """:func:`read_conversations` over the file at ``path`` (UTF-8 JSONL)."""
    with Path(path).open(encoding="utf-8") as lines:
        return read_conversations(lines, turns, tokens_per_batch=tokens_per_batch)


def job_turn_tokenizer(
    model: ModelSpec,
    *,
    model_dir: str | None = None,
    config_map_dir: str | None = None,
    edits: Sequence[str] = (),
) -> HFTurnTokenizer:
    """The turn tokenizer the rollout of a job with ``model`` (``spec.model``) renders
    episodes with: the model's tokenizer, ``chatTemplate``, and, when ``toolCallParser`` is
    set, that parser and the SWE tools (``edits``: the dataset's candidate edits,
    :func:`agentrl.rollout.tasks.offered_edits`, add ``apply_edit``). ``model_dir``: where the
    model directory is on this machine, default ``spec.model.source.path``. Every caller
    (the rollout, the warm start, ``agentrl tasks validate``) renders through this."""
    from agentrl.rollout.swe_tools import tool_schemas

    parser = model.tool_call_parser
    return load_hf_turn_tokenizer(
        model_dir or model.source.path,
        chat_template=model.chat_template,
        config_map_dir=config_map_dir,
        tools=tool_schemas(edits) if parser else None,
        tool_call_parser=parser,
    )
