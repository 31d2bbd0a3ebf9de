"""``agentrl tasks convert-traces``: public SWE agent trajectory sets as warm-start lines.

Each converter reads one dataset row (a JSON object) and returns a
:class:`~agentrl.rollout.conversations.Conversation` that calls only the job's SWE tools
(:mod:`agentrl.rollout.swe_tools`: ``bash`` {command}, ``str_replace_editor`` {command, path,
file_text, old_str, new_str, insert_line, view_range}, ``submit`` {}), or raises
:class:`TraceConversionError` with the reason the row cannot be converted faithfully:

- ``openhands`` (:func:`convert_openhands`): OpenHands native function calling
  (``nebius/SWE-rebench-openhands-trajectories``: the ``trajectory`` column, ``resolved`` 0/1;
  ``SWE-Gym/OpenHands-Sampled-Trajectories``: ``messages``, ``resolved`` true/false). Assistant
  ``tool_calls`` (arguments a JSON string or an object) are renamed: ``execute_bash`` → ``bash``,
  ``str_replace_editor`` → ``str_replace_editor``, ``finish`` → ``submit`` (its ``message``
  becomes text of the turn); a ``think`` call becomes text of the assistant turn (its logged
  result is dropped). Any other tool (browser, IPython, task tracker, ...) has no counterpart.
- ``swe-smith`` (:func:`convert_xml_text`): function calls written as text blocks
  ``<function=NAME>\\n<parameter=P>V</parameter>\\n</function>`` in the assistant content, results
  as the ``user`` message after a call (``SWE-bench/SWE-smith-trajectories``, ``xml`` split, as
  swesmith's ``transform_traj_xml`` writes it: ``old_str``/``new_str``/``file_text`` values with
  a newline each side, other values as Python's ``str()``); the blocks become structured calls
  and the result message a ``tool`` message. R2E-Gym's SFT trajectories
  (``R2E-Gym/R2EGym-SFT-Trajectories``) use the same text syntax with R2E-Gym's tools, mapped
  too: ``execute_bash`` {cmd} → ``bash``, ``file_editor`` → ``str_replace_editor`` (its
  ``concise`` view flag dropped), ``finish`` → ``submit``; R2E-Gym's ``search`` has none.
- ``swe-agent-text`` (:func:`convert_swe_agent_text`): ``nebius/SWE-agent-trajectories``
  (``trajectory: [{role: system|user|ai, text, mask, system_prompt}]``, ``target``): the last
  fenced block of an ``ai`` turn is its action; ``submit`` → ``submit``, a shell command →
  ``bash``. SWE-agent's own interface commands (``open``, ``goto``, ``scroll_up``,
  ``scroll_down``, ``create``, ``edit``, ``search_dir``, ``search_file``, ``find_file``) act on
  the agent's open-file window: none maps faithfully onto the job's tools (``edit 10:12`` replaces
  lines of the file that is open, ``str_replace`` needs the old text), so a trajectory that uses
  one is refused, naming it.

Everywhere: a row whose source says it is unresolved (``resolved`` false/0, ``target`` false) is
skipped unless asked for; the conversation ends with the first ``submit`` call (the rollout ends
the episode there: the results and turns after it are dropped), and one that never submits is
refused; a call whose only effect is shell state (``cd DIR``, ``export X=1``) is refused, since
each ``bash`` call of the job runs in a fresh shell and the calls after it would run elsewhere
than the source's; the source's system prompt (which describes the source's tools) is replaced by
the rollout's (:data:`agentrl.rollout.agent.SYSTEM_PROMPT`) unless asked to keep it. Lines carry
the job's tool definitions (:func:`~agentrl.rollout.swe_tools.tool_schemas`).

:func:`convert` runs one converter over the rows of a file (JSONL, or the entries of a JSON
array) and returns a :class:`ConvertReport`: the conversations and every skipped row with its
number and reason. ``agentrl tasks validate --warm-start`` then renders them with the job's
template and parser.

Callers: ``agentrl tasks convert-traces``; tests.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentrl.rollout.agent import SYSTEM_PROMPT
from agentrl.rollout.conversations import Conversation, LineError
from agentrl.rollout.swe_tools import BASH, EDITOR, SUBMIT, tool_schemas

_M = TypeVar("_M", bound=BaseModel)
Source = Literal["openhands", "swe-smith", "swe-agent-text"]
SOURCES: Final[tuple[Source, ...]] = ("openhands", "swe-smith", "swe-agent-text")

#: The arguments ``str_replace_editor`` takes (:func:`~agentrl.rollout.swe_tools.tool_schemas`).
EDITOR_ARGUMENTS: Final = frozenset(
    {"command", "path", "file_text", "old_str", "new_str", "insert_line", "view_range"}
)
EDITOR_COMMANDS: Final = frozenset({"view", "create", "str_replace", "insert", "undo_edit"})
#: Arguments dropped because they do not change what the call does in the job (OpenHands'
#: ``security_risk`` annotation, its per-command ``timeout``, a false ``is_input``; R2E-Gym's
#: ``concise`` view flag).
_DROPPED: Final = frozenset({"security_risk", "timeout", "is_input", "concise"})
#: SWE-agent's interface commands (its open-file window), which have no faithful counterpart.
SWE_AGENT_COMMANDS: Final = frozenset(
    {
        "open",
        "goto",
        "scroll_up",
        "scroll_down",
        "create",
        "edit",
        "search_dir",
        "search_file",
        "find_file",
    }
)
# Shell builtins whose only effect is the shell's state.
_STATE_ONLY: Final = frozenset(
    {"cd", "pushd", "popd", "export", "unset", "source", ".", "alias", "set", "conda"}
)
_TEXT_VALUE_ARGUMENTS: Final = frozenset({"old_str", "new_str", "file_text"})
_FUNCTION_BLOCK = re.compile(r"<function=([^>\s]+)>(.*?)</function>", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\s]+)>(.*?)</parameter>", re.DOTALL)
_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)


class TraceConversionError(ValueError):
    """Why one row cannot be converted faithfully (it is skipped with this reason)."""


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")


# --- the source rows ----------------------------------------------------------------------


class SourceFunction(_Lenient):
    """A call's function as OpenAI/OpenHands write it: arguments a JSON string or an object."""

    name: str
    arguments: str | dict[str, Any] | None = None


class SourceToolCall(_Lenient):
    id: str | None = None
    type: str | None = "function"
    function: SourceFunction


class SourceMessage(_Lenient):
    """One chat message of a source; ``content`` a string or a list of ``{type, text}`` parts
    (the parquet columns give every message every field, null where unused)."""

    role: str
    content: str | list[Any] | None = None
    tool_calls: list[SourceToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class ChatRow(_Lenient):
    """A row of a chat-message source: ``messages`` (SWE-Gym, SWE-smith, R2E-Gym; SWE-smith
    stores it as a JSON string), else ``trajectory`` (nebius SWE-rebench-openhands), and the
    outcome when the source records one."""

    messages: list[SourceMessage] | str | None = None
    trajectory: list[SourceMessage] | str | None = None
    resolved: bool | int | None = None

    def chat(self) -> list[SourceMessage]:
        found = self.messages if self.messages is not None else self.trajectory
        if found is None:
            raise TraceConversionError("no 'messages' or 'trajectory' field")
        if isinstance(found, str):
            try:
                found = [SourceMessage.model_validate(m) for m in json.loads(found)]
            except (json.JSONDecodeError, TypeError, ValidationError) as exc:
                raise TraceConversionError(
                    f"messages are not a JSON list of messages: {exc}"
                ) from exc
        return found


class TextStep(_Lenient):
    """One step of ``nebius/SWE-agent-trajectories``."""

    role: str
    text: str | None = None
    mask: bool | None = None
    system_prompt: str | None = None


class SweAgentTextRow(_Lenient):
    trajectory: list[TextStep] | str
    target: bool | None = None

    def steps(self) -> list[TextStep]:
        if isinstance(self.trajectory, str):
            try:
                return [TextStep.model_validate(s) for s in json.loads(self.trajectory)]
            except (json.JSONDecodeError, TypeError, ValidationError) as exc:
                raise TraceConversionError(
                    f"trajectory is not a JSON list of steps: {exc}"
                ) from exc
        return self.trajectory


# --- the output -----------------------------------------------------------------------------


class ConvertOptions(BaseModel):
    """How rows are converted."""

    include_unresolved: bool = False
    """Keep rows their source marks unresolved (default: skip them)."""
    keep_system_prompt: bool = False
    """Keep the source's system prompt instead of the rollout's."""


class ConvertedLine(BaseModel):
    """One converted row: its number in the input and its conversation."""

    line: int
    conversation: Conversation

    def jsonl(self) -> str:
        """The warm-start line (``messages`` and ``tools``)."""
        raw = self.conversation.model_dump(mode="json", exclude_none=True)
        for message in raw["messages"]:
            if not message.get("tool_calls"):
                message.pop("tool_calls", None)
        return json.dumps(raw, ensure_ascii=False)


class ConvertReport(BaseModel):
    """What :func:`convert` made of the rows."""

    source: Source
    conversations: list[ConvertedLine] = Field(default_factory=list)
    skipped: list[LineError] = Field(default_factory=list)
    """Rows that could not be converted (number and reason; unresolved rows are counted in
    :attr:`unresolved` instead)."""
    unresolved: int = 0
    """Rows skipped because their source marks them unresolved."""

    @property
    def rows(self) -> int:
        return len(self.conversations) + len(self.skipped) + self.unresolved


class _Unresolved(Exception):
    """The row's source marks it unresolved."""


# --- shared pieces --------------------------------------------------------------------------


def _text(content: str | list[Any] | None) -> str:
    """A message's text: a string, or its text parts joined (an image is refused)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, dict) and part.get("type", "text") == "text":
            parts.append(str(part.get("text") or ""))
        else:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise TraceConversionError(f"a message has a {kind} part: only text converts")
    return "\n".join(parts)


def _joined(*texts: str | None) -> str:
    return "\n\n".join(t.strip() for t in texts if t and t.strip())


def _state_only(command: str) -> bool:
    """Whether every part of ``command`` only changes shell state (``cd x``, ``export A=1``)."""
    parts = [p.strip() for p in re.split(r"&&|\|\||;|\n", command) if p.strip()]
    return bool(parts) and all(p.split()[0] in _STATE_ONLY for p in parts)


def _bash(command: Any) -> dict[str, Any]:
    if not isinstance(command, str) or not command.strip():
        raise TraceConversionError(
            "a bash call with an empty command (OpenHands: read more output of a running "
            "process) has no counterpart: each bash call of the job runs to completion"
        )
    if _state_only(command):
        raise TraceConversionError(
            f"the bash call {command.strip()!r} only changes shell state, which does not carry "
            "over to the next call in the job (each bash call is a fresh shell)"
        )
    return {"command": command}


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise TraceConversionError(f"str_replace_editor {what} is {value!r}, not an integer")
    try:
        return int(str(value).strip())
    except ValueError:
        raise TraceConversionError(
            f"str_replace_editor {what} is {value!r}, not an integer"
        ) from None


def _editor(arguments: dict[str, Any]) -> dict[str, Any]:
    """``str_replace_editor`` arguments as the job's editor takes them: the known ones kept
    (``insert_line`` an integer, ``view_range`` a list of two), dropped ones left out, any other
    refused."""
    unknown = sorted(set(arguments) - EDITOR_ARGUMENTS - _DROPPED)
    if unknown:
        raise TraceConversionError(
            f"str_replace_editor argument(s) {', '.join(unknown)} have no counterpart in the "
            f"job's editor (its arguments: {', '.join(sorted(EDITOR_ARGUMENTS))})"
        )
    command = arguments.get("command")
    if command not in EDITOR_COMMANDS:
        raise TraceConversionError(
            f"str_replace_editor command {command!r} has no counterpart (the job's editor: "
            f"{', '.join(sorted(EDITOR_COMMANDS))})"
        )
    out = {k: v for k, v in arguments.items() if k in EDITOR_ARGUMENTS and v is not None}
    if "insert_line" in out:
        out["insert_line"] = _int(out["insert_line"], "insert_line")
    if "view_range" in out:
        view = out["view_range"]
        if isinstance(view, str):
            try:
                view = json.loads(view)
            except json.JSONDecodeError:
                view = None
        if not isinstance(view, list) or len(view) != 2:
            raise TraceConversionError(
                f"str_replace_editor view_range {out['view_range']!r} is not [start, end]"
            )
        out["view_range"] = [_int(v, "view_range") for v in view]
    return out


class _Call(BaseModel):
    """A call mapped onto the job's tools: the call (None: it became text) and text to add to
    the assistant turn."""

    name: str | None
    arguments: dict[str, Any] = Field(default_factory=dict)
    text: str = ""


def _boolean(value: Any) -> bool:
    return value is True or str(value).strip().lower() == "true"


def _openhands_call(name: str, arguments: dict[str, Any]) -> _Call:
    """An OpenHands (or SWE-agent) function call on the job's tools."""
    if name in ("execute_bash", BASH):
        if _boolean(arguments.get("is_input")):
            raise TraceConversionError(
                "execute_bash with is_input (keys sent to a running process) has no counterpart"
            )
        return _Call(name=BASH, arguments=_bash(arguments.get("command")))
    if name == EDITOR:
        return _Call(name=EDITOR, arguments=_editor(arguments))
    if name in ("finish", SUBMIT):
        return _Call(name=SUBMIT, text=str(arguments.get("message") or ""))
    if name == "think":
        return _Call(name=None, text=str(arguments.get("thought") or ""))
    raise TraceConversionError(
        f"calls tool {name!r}, which has no counterpart among the job's tools "
        f"({BASH}, {EDITOR}, {SUBMIT})"
    )


def _r2e_call(name: str, arguments: dict[str, Any]) -> _Call:
    """An R2E-Gym function call (text blocks) on the job's tools."""
    if name == "execute_bash":
        return _Call(name=BASH, arguments=_bash(arguments.get("cmd", arguments.get("command"))))
    if name == "file_editor":
        return _Call(name=EDITOR, arguments=_editor(arguments))
    if name == "finish":
        return _Call(name=SUBMIT, text=str(arguments.get("result") or ""))
    return _openhands_call(name, arguments)


def _arguments(function: SourceFunction) -> dict[str, Any]:
    raw = function.arguments
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    if isinstance(raw, dict):
        return raw
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise TraceConversionError(
            f"the arguments of a {function.name} call are not JSON: {exc}"
        ) from exc
    if not isinstance(parsed, dict):
        raise TraceConversionError(f"the arguments of a {function.name} call are not an object")
    return parsed


def _system(text: str, options: ConvertOptions) -> dict[str, Any]:
    return {"role": "system", "content": text if options.keep_system_prompt else SYSTEM_PROMPT}


def _assistant(
    content: str,
    calls: Sequence[_Call],
    reasoning: str | None = None,
    ids: Sequence[str | None] = (),
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if reasoning:
        message["reasoning_content"] = reasoning
    made = [
        {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        | ({"id": ids[n]} if n < len(ids) and ids[n] is not None else {})
        for n, c in enumerate(calls)
        if c.name is not None
    ]
    if made:
        message["tool_calls"] = made
    return message


def _finish(messages: list[dict[str, Any]], submitted: bool) -> Conversation:
    """The conversation, consecutive assistant turns merged (a dropped ``think`` call leaves
    its text to the next turn), and validated as a warm-start line."""
    if not submitted:
        raise TraceConversionError(
            "never calls submit (finish): the rollout's episode ends with a submit call"
        )
    merged: list[dict[str, Any]] = []
    for message in messages:
        previous = merged[-1] if merged else None
        if (
            previous is not None
            and previous["role"] == message["role"] == "assistant"
            and not previous.get("tool_calls")
        ):
            message = {
                **message,
                "content": _joined(previous.get("content"), message.get("content")) or None,
            }
            merged[-1] = message
        else:
            merged.append(message)
    try:
        return Conversation.model_validate({"messages": merged, "tools": tool_schemas()})
    except ValidationError as exc:
        detail = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise TraceConversionError(
            f"not a conversation the rollout could produce: {detail}"
        ) from exc


def _check_resolved(value: bool | int | None, options: ConvertOptions) -> None:
    if value is not None and not value and not options.include_unresolved:
        raise _Unresolved


# --- the converters -------------------------------------------------------------------------


def convert_openhands(row: dict[str, Any], options: ConvertOptions | None = None) -> Conversation:
    """An OpenHands native function-calling trajectory (see the module docstring)."""
    options = options or ConvertOptions()
    parsed = _row(ChatRow, row)
    _check_resolved(parsed.resolved, options)
    out: list[dict[str, Any]] = []
    # the calls of the last assistant turn not answered yet: (source call id, what it became;
    # None: dropped, its result too)
    pending: list[tuple[str | None, str | None]] = []
    submitted = False
    for message in parsed.chat():
        if message.role == "system":
            out.append(_system(_text(message.content), options))
        elif message.role == "user":
            out.append({"role": "user", "content": _text(message.content)})
        elif message.role == "assistant":
            calls: list[_Call] = []
            ids: list[str | None] = []
            for call in message.tool_calls or []:
                mapped = _openhands_call(call.function.name, _arguments(call.function))
                calls.append(mapped)
                ids.append(call.id)
                if mapped.name == SUBMIT:
                    submitted = True
                    break
            pending = [(i, c.name) for i, c in zip(ids, calls, strict=True)]
            text = _joined(_text(message.content), *(c.text for c in calls))
            if text or any(c.name for c in calls):
                out.append(_assistant(text, calls, message.reasoning_content, ids))
            if submitted:
                break
        elif message.role == "tool":
            at = next((n for n, (i, _) in enumerate(pending) if i == message.tool_call_id), 0)
            became = pending.pop(at)[1] if pending else BASH
            if became is None:
                continue
            result: dict[str, Any] = {"role": "tool", "content": _text(message.content)}
            if message.tool_call_id is not None:
                result["tool_call_id"] = message.tool_call_id
            out.append(result)
        else:
            raise TraceConversionError(f"a message has role {message.role!r}")
    return _finish(out, submitted)


def _block_arguments(body: str) -> dict[str, Any]:
    """The parameters of one ``<function=...>`` block: text values lose the one newline each
    side that swesmith's converter writes; others are stripped."""
    arguments: dict[str, Any] = {}
    for match in _PARAMETER.finditer(body):
        name, value = match.group(1), match.group(2)
        if name in _TEXT_VALUE_ARGUMENTS:
            value = value.removeprefix("\n").removesuffix("\n")
        else:
            value = value.strip()
        arguments[name] = value
    leftover = _PARAMETER.sub("", body).strip()
    if leftover:
        raise TraceConversionError(
            f"a function block holds text outside its parameters: {leftover!r}"
        )
    return arguments


def convert_xml_text(row: dict[str, Any], options: ConvertOptions | None = None) -> Conversation:
    """A trajectory whose calls are ``<function=...>`` text blocks (SWE-smith's ``xml`` split,
    R2E-Gym's SFT set; see the module docstring)."""
    options = options or ConvertOptions()
    parsed = _row(ChatRow, row)
    _check_resolved(parsed.resolved, options)
    out: list[dict[str, Any]] = []
    answered = True
    submitted = False
    for message in parsed.chat():
        text = _text(message.content)
        if message.role == "system":
            out.append(_system(text, options))
        elif message.role in ("user", "tool"):
            out.append({"role": "user" if answered else "tool", "content": text})
            answered = True
        elif message.role == "assistant":
            blocks = list(_FUNCTION_BLOCK.finditer(text))
            calls = [_r2e_call(b.group(1), _block_arguments(b.group(2))) for b in blocks]
            made = [c for c in calls if c.name is not None]
            if len(made) > 1:
                raise TraceConversionError(
                    f"an assistant turn makes {len(made)} calls in text and one result message "
                    "follows: the results cannot be told apart"
                )
            if made and made[0].name == SUBMIT:
                submitted = True
            content = _joined(_FUNCTION_BLOCK.sub("", text), *(c.text for c in calls))
            out.append(_assistant(content, calls))
            answered = not made
            if submitted:
                break
        else:
            raise TraceConversionError(f"a message has role {message.role!r}")
    return _finish(out, submitted)


def _action(text: str) -> tuple[str, str | None]:
    """An SWE-agent ``ai`` turn as (thought, action): the action is its last fenced block."""
    blocks = list(_FENCE.finditer(text))
    if not blocks:
        return text.strip(), None
    last = blocks[-1]
    thought = _joined(text[: last.start()], text[last.end() :])
    return thought, last.group(1).strip()


def convert_swe_agent_text(
    row: dict[str, Any], options: ConvertOptions | None = None
) -> Conversation:
    """A ``nebius/SWE-agent-trajectories`` row (see the module docstring)."""
    options = options or ConvertOptions()
    parsed = _row(SweAgentTextRow, row)
    _check_resolved(parsed.target, options)
    out: list[dict[str, Any]] = []
    answered = True
    submitted = False
    for step in parsed.steps():
        text = step.text or ""
        if step.role == "system":
            out.append(_system(text or step.system_prompt or "", options))
        elif step.role == "user":
            out.append({"role": "user" if answered else "tool", "content": text})
            answered = True
        elif step.role in ("ai", "assistant"):
            thought, action = _action(text)
            if action is None:
                out.append(_assistant(thought, []))
                answered = True
                continue
            word = action.split()[0] if action.split() else ""
            if word in SWE_AGENT_COMMANDS:
                raise TraceConversionError(
                    f"uses SWE-agent's {word!r} command, which acts on its open-file window and "
                    f"has no faithful counterpart among the job's tools ({BASH}, {EDITOR}, "
                    f"{SUBMIT})"
                )
            if action == "submit":
                call = _Call(name=SUBMIT)
                submitted = True
            else:
                call = _Call(name=BASH, arguments=_bash(action))
            out.append(_assistant(thought, [call]))
            answered = False
            if submitted:
                break
        else:
            raise TraceConversionError(f"a step has role {step.role!r}")
    return _finish(out, submitted)


def _row(model: type[_M], row: Any) -> _M:
    if not isinstance(row, dict):
        raise TraceConversionError(f"a row is a JSON object, not {type(row).__name__}")
    try:
        return model.model_validate(row)
    except ValidationError as exc:
        raise TraceConversionError(f"not a row of this source: {exc.errors()[0]['msg']}") from exc


CONVERTERS: Final[dict[Source, Callable[[dict[str, Any], ConvertOptions], Conversation]]] = {
    "openhands": convert_openhands,
    "swe-smith": convert_xml_text,
    "swe-agent-text": convert_swe_agent_text,
}


def read_rows(text: str) -> list[tuple[int, Any]]:
    """The rows of a file and their numbers: the entries of a JSON array (numbered from 1), or
    the lines of JSONL (their line numbers; blank lines skipped, a bad line kept as its text)."""
    if text.lstrip().startswith("["):
        try:
            entries = json.loads(text)
        except json.JSONDecodeError:
            entries = None
        if isinstance(entries, list):
            return list(enumerate(entries, start=1))
    rows: list[tuple[int, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append((number, json.loads(line)))
        except json.JSONDecodeError as exc:
            rows.append((number, _NotJSON(str(exc))))
    return rows


class _NotJSON:
    def __init__(self, reason: str) -> None:
        self.reason = reason


def convert_rows(
    source: Source, rows: Iterable[tuple[int, Any]], options: ConvertOptions | None = None
) -> ConvertReport:
    """Convert numbered rows with ``source``'s converter."""
    if source not in CONVERTERS:
        raise ValueError(f"unknown source {source!r} (sources: {', '.join(SOURCES)})")
    options = options or ConvertOptions()
    report = ConvertReport(source=source)
    for number, row in rows:
        try:
            if isinstance(row, _NotJSON):
                raise TraceConversionError(f"not JSON: {row.reason}")
            conversation = CONVERTERS[source](row, options)
        except _Unresolved:
            report.unresolved += 1
            continue
        except TraceConversionError as exc:
            report.skipped.append(LineError(line=number, reason=str(exc)))
            continue
        report.conversations.append(ConvertedLine(line=number, conversation=conversation))
    return report


def convert(
    source: str, lines: Iterable[str], options: ConvertOptions | None = None
) -> ConvertReport:
    """Convert the text of a file (``lines``: JSONL lines, or a JSON array's text in pieces)
    with ``source``'s converter (``openhands``, ``swe-smith`` or ``swe-agent-text``)."""
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r} (sources: {', '.join(SOURCES)})")
    text = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
    return convert_rows(source, read_rows(text), options)
