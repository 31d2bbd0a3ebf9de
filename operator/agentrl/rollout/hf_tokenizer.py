"""Token-level turns for real models: a :class:`~agentrl.rollout.agent.TurnTokenizer` over a
Hugging Face tokenizer and its chat template.

The agent keeps an episode as token ids (TITO): the engine's ``output_ids`` are appended as they
came and never re-tokenised. This module supplies the ids *between* generations, each taken from
the model's own chat template so that the whole trajectory is what the template would render for
the conversation:

- :meth:`HFTurnTokenizer.initial_ids`: system and user message plus the generation prompt.
- :meth:`HFTurnTokenizer.close_turn_ids`: what the template writes after an assistant message's
  content (ChatML: ``<|im_end|>`` and a newline), minus the first of those tokens when the
  engine already stopped on it.
- :meth:`HFTurnTokenizer.observation_ids`: one tool message plus the next generation prompt,
  taken as the difference between two renderings of a small fixed conversation (ending in an
  assistant turn, and the same plus the observation and the generation prompt). The observation
  is rendered in place on every call; the base rendering is computed once, and when the new
  text starts with an added token (``<|im_start|>``) only the new text is tokenised (checked
  once at construction to give the same ids as tokenising the whole). Deltas are rendered
  without the tool list when that changes none of their ids (also checked at construction).

Observations use the ``tool`` role when the template renders it, else ``user`` (decided once, at
construction; :attr:`HFTurnTokenizer.observation_role`).

Native tool calls: given ``tools`` (OpenAI definitions), every rendering passes them to the
template (``apply_chat_template(..., tools=...)``), so the prompt lists them as the model was
trained to see them; :meth:`HFTurnTokenizer.tool_results_ids` renders several tool results of
one turn (templates that group them, such as Qwen's ``<tool_response>`` blocks in one user
turn, get them grouped); given ``tool_call_parser`` (:mod:`agentrl.rollout.toolcalls`),
:meth:`HFTurnTokenizer.parse_reply` reads the calls from the engine's output ids.

The boundary tokens are handled in one place, :meth:`HFTurnTokenizer.close_turn_ids`: what the
template writes after an assistant message's content (ChatML: ``<|im_end|>`` then a newline the
model never generates: the engine stops on ``<|im_end|>``) minus what the engine produced.

:meth:`HFTurnTokenizer.prefix_mismatch` checks that the whole conversation rendered by the
template (with the tools) tokenises to the trajectory's ids, giving the first index where they
differ (:class:`PrefixChecker`, one per episode, does the same tokenising only what is new
since its last check); :func:`mask_after_break` turns the loss off for the span after a break
and :func:`record_prefix_check` counts checks and breaks.

Construction checks that the template is *prefix-stable* (append-only): that rendering more
messages only appends ids, over a probe conversation with tool calls, grouped tool results,
reasoning (``reasoning_content``) and a later user message. Templates that rewrite earlier
turns once later ones exist (the stock Qwen3 hybrid template, which drops the ``<think>`` block
of assistant turns before the last user message, is one) raise :class:`TokenizerConfigError`
naming ``spec.model.chatTemplate``: a token-level trajectory cannot equal their rendering, so
they need an append-only template (the bundled ``qwen3-thinking`` keeps every ``<think>``
block). With a parser, construction also checks that the parser reads back a call the template
writes (a parser of another syntax fails here, naming ``spec.model.toolCallParser``).

``transformers`` is imported only by :func:`load_hf_turn_tokenizer`; nothing in the operator
imports this module. ``spec.model.chatTemplate`` is resolved to template text by
:func:`agentrl.rollout.chat_templates.resolve_chat_template` (in :func:`load_hf_turn_tokenizer`).

Callers: :func:`agentrl.rollout.runtime.turn_tokenizer_for`, ``bench/chat_format.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from agentrl.api.model import CHAT_TEMPLATE_FIELD, TOOL_CALL_PARSER_FIELD, ChatTemplateSource
from agentrl.rollout import metrics, text_actions
from agentrl.rollout.tasks.model import Task
from agentrl.rollout.toolcalls import (
    ParsedReply,
    ParsedToolCall,
    ToolCallParser,
    ToolSchema,
    UnknownToolCallParser,
    get_parser,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: The manifest field that names the model directory the tokenizer is loaded from.
MODEL_FIELD = "spec.model.source"

Message = dict[str, Any]

# The fixed conversation observation deltas are computed against. Its texts are arbitrary; only
# the template text around them ends up in the ids handed out.
_BASE: tuple[Message, ...] = (
    {"role": "system", "content": "system"},
    {"role": "user", "content": "task"},
    {"role": "assistant", "content": "reply"},
)
# Content that no template writes by itself, found in a rendering to cut it.
_MARKER = "agentrl-turn-marker"
_PROBE_OBSERVATION = "observation text"
# The tool and call the append-only and parser checks render (never shown to a model).
_PROBE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "agentrl_probe",
        "description": "probe",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string"}, "count": {"type": "integer"}},
            "required": ["text"],
        },
    },
}
_PROBE_CALL = ParsedToolCall(
    name="agentrl_probe", arguments={"text": "line one\nline two", "count": 2}
)
_ADVICE = (
    f"set {CHAT_TEMPLATE_FIELD} to an append-only template (bundled: qwen3-instruct, "
    "qwen3-coder, or qwen3-thinking, which keeps every turn's <think> block), or a "
    f"prefix-stable chat_template in the tokenizer_config.json of the model in {MODEL_FIELD}"
)


class TokenizerConfigError(ValueError):
    """The model's tokenizer cannot drive token-level episodes: a configuration error, raised
    before any episode starts and never retried."""


def _starts_with(ids: Sequence[int], prefix: Sequence[int]) -> bool:
    return len(ids) >= len(prefix) and list(ids[: len(prefix)]) == list(prefix)


class HFTurnTokenizer:
    """:class:`~agentrl.rollout.agent.TurnTokenizer` over a Hugging Face tokenizer with a chat
    template. Raises :class:`TokenizerConfigError` if the template cannot be used (see the
    module docstring)."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        name: str | None = None,
        tools: Sequence[ToolSchema] | None = None,
        tool_call_parser: str | None = None,
        chat_template: str | None = None,
        template_source: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        reasoning: bool | None = None,
    ) -> None:
        """``tools``: the OpenAI tool definitions every rendering passes to the template.
        ``tool_call_parser``: an SGLang parser name (:data:`~agentrl.rollout.toolcalls.
        PARSERS`) for :meth:`parse_reply`. ``chat_template``: template text used instead of
        the tokenizer's (``spec.model.chatTemplate``), ``template_source`` says where it came
        from in errors. ``template_kwargs``: extra template variables (``enable_thinking``).
        ``reasoning``: split a ``<think>`` block off replies; default: when the template
        mentions ``<think>``."""
        self._tok = tokenizer
        self._name = name or getattr(tokenizer, "name_or_path", None) or "the tokenizer"
        self._template = chat_template
        self._kwargs = dict(template_kwargs or {})
        self.tools: list[dict[str, Any]] | None = [dict(t) for t in tools] if tools else None
        """The tool definitions every rendering passes to the template."""
        template_text = chat_template or getattr(tokenizer, "chat_template", None)
        if not template_text:
            raise TokenizerConfigError(
                f"{self._name} has no chat_template, so turns cannot be rendered as the model "
                f"expects; use an instruct/chat model in {MODEL_FIELD}, add a chat_template "
                f"to its tokenizer_config.json or set {CHAT_TEMPLATE_FIELD}"
            )
        if chat_template:
            self._source = template_source or CHAT_TEMPLATE_FIELD
        else:
            self._source = f"the chat template of {self._name}"
        self.reasoning = reasoning if reasoning is not None else "<think>" in str(template_text)
        """Whether :meth:`parse_reply` splits a ``<think>`` block off replies."""
        try:
            self.parser: ToolCallParser | None = (
                get_parser(tool_call_parser) if tool_call_parser else None
            )
        except UnknownToolCallParser as exc:
            raise TokenizerConfigError(str(exc)) from exc
        self.observation_role = "tool" if self._renders_tool_role() else "user"
        """Role of observation messages: ``tool`` when the template renders it, else ``user``."""
        self._base_text = self._render(list(_BASE), generation_prompt=False)
        self._base_ids = self._encode(self._base_text)
        # Added tokens (special or not) are cut out before the rest is tokenised, so text that
        # starts with one tokenises alike alone and after other text.
        added: Mapping[str, int] = getattr(tokenizer, "get_added_vocab", dict)()
        self._added = tuple(t for t in added if isinstance(t, str) and t)
        self._fast = False
        self._delta_tools = True

        prompt = self.initial_ids(_BASE[0]["content"], _BASE[1]["content"])
        if not _starts_with(self._base_ids, prompt):
            raise self._unstable(
                "its generation prompt is not how it renders the start of an assistant turn"
            )
        self._close = self._close_ids()
        if not self._close or list(self._base_ids[-len(self._close) :]) != self._close:
            raise self._unstable(
                "what it writes after an assistant message's content "
                f"({self._close!r}) is not how that message ends in a conversation"
            )
        probe = self.observation_ids(_PROBE_OBSERVATION)  # raises unless prefix-stable
        self._fast = True
        self._fast = self.observation_ids(_PROBE_OBSERVATION) == probe
        if self.tools:
            self._render_deltas_without_tools()
        self._check_append_only()
        if self.parser is not None:
            self._check_parser(self.parser)

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Tokens a turn may end on: the template's end-of-turn token and the tokenizer's eos.

        The agent does not send them; engines stop on the model's ``generation_config`` eos."""
        stops = [self._close[0]]
        eos = getattr(self._tok, "eos_token_id", None)
        if isinstance(eos, int) and eos not in stops:
            stops.append(eos)
        return tuple(stops)

    def initial_ids(self, system: str, user: str) -> list[int]:
        """System and user message (with the tools, when given) plus the generation prompt."""
        return self._ids(
            [{"role": "system", "content": system}, {"role": "user", "content": user}],
            generation_prompt=True,
        )

    def close_turn_ids(self, generated: Sequence[int]) -> list[int]:
        """The ids that end an assistant turn after ``generated``. An engine that stopped on the
        end-of-turn token already produced the first of them; one that stopped on another token
        (an eos outside the template) or at the token limit gets all of them appended."""
        if generated and generated[-1] == self._close[0]:
            return self._close[1:]
        return list(self._close)

    def observation_ids(self, observation: str) -> list[int]:
        """One observation message plus the next generation prompt, tokenised in context."""
        return self.append_ids([{"role": self.observation_role, "content": observation}])

    def tool_results_ids(self, results: Sequence[str]) -> list[int]:
        """The results of one turn's tool calls, in call order, plus the next generation
        prompt: consecutive tool messages, which templates that group them render as one
        block (Qwen: one user turn of ``<tool_response>`` blocks)."""
        return self.append_ids([{"role": self.observation_role, "content": r} for r in results])

    def append_ids(self, messages: Sequence[Message]) -> list[int]:
        """``messages`` (tool results, a user message) after a closed assistant turn, plus the
        next generation prompt, tokenised in context."""
        text = self._render(
            [*_BASE, *messages], generation_prompt=True, with_tools=self._delta_tools
        )
        if self._fast and text.startswith(self._base_text):
            suffix = text[len(self._base_text) :]
            if suffix.startswith(self._added):
                # An added token starts the new text: only it needs tokenising.
                return self._encode(suffix)
        ids = self._encode(text)
        if not _starts_with(ids, self._base_ids):
            roles = ", ".join(str(m.get("role")) for m in messages)
            raise self._unstable(f"adding {roles} messages changes the ids of earlier turns")
        return ids[len(self._base_ids) :]

    def task_message(self, task: Task) -> str:
        """The first user message of an episode: the instruction (the tools are in the
        template), or without a parser the instruction and the text actions."""
        if self.parser is None:
            return text_actions.task_message(task)
        return task.instruction

    def parse_reply(self, generated: Sequence[int]) -> ParsedReply:
        """The content, reasoning and tool calls of the engine's output ids, decoded as the
        agent decodes them (:meth:`decode`) and read by ``tool_call_parser`` (without one: as a
        text action, :mod:`agentrl.rollout.text_actions`); a malformed call is the reply's
        ``error`` (:class:`~agentrl.rollout.toolcalls.ToolCallError`)."""
        if self.parser is None:
            return text_actions.parse_text_action(self.decode(generated))
        return self.parser.parse(self.decode(generated), self.tools, reasoning=self.reasoning)

    def render_ids(self, messages: Sequence[Message], *, generation_prompt: bool) -> list[int]:
        """The template's rendering of ``messages`` (with the tools), tokenised."""
        return self._ids(list(messages), generation_prompt=generation_prompt)

    def prefix_mismatch(
        self,
        trajectory: Sequence[int],
        messages: Sequence[Message],
        *,
        generation_prompt: bool | None = None,
    ) -> int | None:
        """Where the trajectory's ids first differ from the whole conversation rendered by the
        template (with the tools) and tokenised, or None when they are equal. The rendering
        ends with a generation prompt when the last message is not the assistant's (a
        trajectory about to be sent to the engine), unless ``generation_prompt`` says."""
        if generation_prompt is None:
            generation_prompt = not messages or messages[-1].get("role") != "assistant"
        return first_mismatch(
            trajectory, self.render_ids(messages, generation_prompt=generation_prompt)
        )

    def prefix_checker(self) -> PrefixChecker | None:
        """A :meth:`prefix_mismatch` for one episode that tokenises only what is new since its
        last check (one per episode: the tokenizer is shared by all of them); None without a
        ``tool_call_parser``, whose text actions the template has no calls for."""
        return PrefixChecker(self) if self.parser is not None else None

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=True))

    # -----------------------------------------------------------------------------------------

    def _render(
        self, messages: list[Message], *, generation_prompt: bool, with_tools: bool = True
    ) -> str:
        from jinja2 import TemplateError

        try:
            text = self._apply(messages, generation_prompt=generation_prompt, with_tools=with_tools)
        except TemplateError as exc:
            roles = ", ".join(str(m.get("role")) for m in messages)
            raise TokenizerConfigError(
                f"{self._source} fails on a conversation of roles {roles}: {exc}"
            ) from exc
        return str(text)

    def _apply(
        self, messages: list[Message], *, generation_prompt: bool, with_tools: bool = True
    ) -> Any:
        return self._tok.apply_chat_template(
            messages,
            tools=cast(Any, self.tools) if with_tools else None,
            chat_template=self._template,
            tokenize=False,
            add_generation_prompt=generation_prompt,
            **self._kwargs,
        )

    def _encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def _render_deltas_without_tools(self) -> None:
        """Render observation deltas without the tool list when that changes none of their
        ids (templates list tools in the system turn, which deltas never include): the tool
        schemas are then not serialised again on every turn."""
        with_tools = (self._base_text, self._base_ids)
        probes = [[_PROBE_OBSERVATION], [_PROBE_OBSERVATION, "second result"]]
        expected = [self.tool_results_ids(p) for p in probes]
        self._delta_tools = False
        try:
            self._base_text = self._render(list(_BASE), generation_prompt=False, with_tools=False)
            self._base_ids = self._encode(self._base_text)
            same = [self.tool_results_ids(p) for p in probes] == expected
        except Exception:  # any failure without the tools: keep rendering them
            same = False
        if not same:
            self._delta_tools = True
            self._base_text, self._base_ids = with_tools

    def _encode_extending(
        self, text: str, known: tuple[str, list[int]]
    ) -> tuple[list[int], tuple[str, list[int]]]:
        """The ids of ``text``, tokenising only what follows ``known`` (a text and its ids)
        when ``text`` extends it at an added token, and the longest head of ``text`` that ends
        before an added token with its ids, for the next call."""
        known_text, known_ids = known
        rest = text[len(known_text) :]
        if (
            self._fast
            and known_text
            and text.startswith(known_text)
            and rest.startswith(self._added)
        ):
            ids = [*known_ids, *self._encode(rest)]
        else:
            ids = self._encode(text)
        cut = max((text.rfind(t) for t in self._added), default=-1)
        if self._fast and cut > 0:
            tail = self._encode(text[cut:])
            if ids[len(ids) - len(tail) :] == tail:
                return ids, (text[:cut], ids[: len(ids) - len(tail)])
        return ids, ("", [])

    def _ids(self, messages: list[Message], *, generation_prompt: bool) -> list[int]:
        # Rendered text tokenised without added special tokens: what apply_chat_template(
        # tokenize=True) returns, on every transformers version (their return types differ).
        return self._encode(self._render(messages, generation_prompt=generation_prompt))

    def _renders_tool_role(self) -> bool:
        from jinja2 import TemplateError

        messages = [*_BASE, {"role": "tool", "content": _MARKER}]
        try:
            text = self._apply(messages, generation_prompt=True)
        except (TemplateError, KeyError, TypeError, ValueError):
            return False  # templates that reject unknown roles raise
        return _MARKER in str(text)  # others drop them silently

    def _check_append_only(self) -> None:
        """Every prefix of a probe conversation (tool calls, grouped tool results, reasoning,
        a later user message) renders as a prefix of the whole, and each generation prompt as
        the start of the assistant turn that follows it."""
        call = _PROBE_CALL.openai()
        observe = self.observation_role

        def assistant(content: str, reasoning: str | None, calls: int) -> Message:
            message: Message = {"role": "assistant", "content": content}
            if reasoning is not None:
                message["reasoning_content"] = reasoning
            if calls:
                message["tool_calls"] = [call] * calls
            return message

        conversation: list[Message] = [
            dict(_BASE[0]),
            dict(_BASE[1]),
            assistant("first reply", "first thought", 2),
            {"role": observe, "content": "result one"},
            {"role": observe, "content": "result two"},
            assistant("", None, 1),
            {"role": observe, "content": "result three"},
            assistant("second reply", "second thought", 1),
            {"role": observe, "content": "result four"},
            {"role": "user", "content": "a later request"},
            assistant("last reply", "last thought", 0),
        ]
        whole = self._ids(conversation, generation_prompt=False)
        # Where a trajectory stands between generations: after a closed assistant turn, and
        # after the messages that follow it plus the generation prompt.
        for k in range(3, len(conversation)):
            head = conversation[:k]
            if head[-1]["role"] == "assistant":
                if not _starts_with(whole, self._ids(head, generation_prompt=False)):
                    raise self._unstable(
                        "rendering later turns changes the ids of earlier turns (the first "
                        f"{k} messages, ending in an assistant turn, render differently once "
                        "more follow; templates that drop the reasoning of earlier assistant "
                        "turns do this)"
                    )
            elif conversation[k]["role"] == "assistant":
                prompt = self._ids(head, generation_prompt=True)
                # The reply may or may not hold reasoning (a template with thinking turned off
                # puts an empty block in the generation prompt).
                plain = {n: v for n, v in conversation[k].items() if n != "reasoning_content"}
                if not any(
                    _starts_with(self._ids([*head, reply], generation_prompt=False), prompt)
                    for reply in (conversation[k], plain)
                ):
                    raise self._unstable(
                        "its generation prompt is not how it renders the start of an assistant "
                        f"turn after a {head[-1]['role']} message"
                    )

    def _check_parser(self, parser: ToolCallParser) -> None:
        """The parser reads back the call the template writes for an assistant message."""
        head: list[Message] = [dict(_BASE[0]), dict(_BASE[1])]
        message: Message = {
            "role": "assistant",
            "content": "",
            "tool_calls": [_PROBE_CALL.openai()],
        }
        prompt = self._render(head, generation_prompt=True)
        whole = self._render([*head, message], generation_prompt=False)
        reply = whole[len(prompt) :] if whole.startswith(prompt) else whole
        closing = str(self._tok.decode(self._close, skip_special_tokens=False))
        if reply.endswith(closing):
            reply = reply[: -len(closing)]
        parsed = parser.parse(reply, [_PROBE_TOOL], reasoning=self.reasoning)
        if parsed.error is not None or parsed.calls != [_PROBE_CALL]:
            got = parsed.error.detail if parsed.error is not None else f"calls {parsed.calls}"
            raise TokenizerConfigError(
                f"{TOOL_CALL_PARSER_FIELD} {parser.name} cannot read the tool calls "
                f"{self._source} writes (a call rendered as {reply!r} reads as: {got}); set "
                f"{TOOL_CALL_PARSER_FIELD} to the parser of the template's call syntax, or "
                f"{CHAT_TEMPLATE_FIELD} to a template in the syntax of {parser.name}"
            )

    def _close_ids(self) -> list[int]:
        text = self._render(
            [*_BASE[:2], {"role": "assistant", "content": _MARKER}], generation_prompt=False
        )
        at = text.rfind(_MARKER)
        if at < 0:
            raise TokenizerConfigError(
                f"{self._source} does not render an assistant message's content; token-level "
                "episodes need it to"
            )
        return self._encode(text[at + len(_MARKER) :])

    def _unstable(self, problem: str) -> TokenizerConfigError:
        return TokenizerConfigError(
            f"{self._source} is not prefix-stable: {problem}. Token-level episodes append ids "
            "turn by turn, so the template must render a conversation as the ids of its "
            f"shorter prefixes plus new ones; {_ADVICE}"
        )


class PrefixChecker:
    """:meth:`HFTurnTokenizer.prefix_mismatch` for one episode, checked turn after turn: the
    conversation is rendered whole each time, but only the text after the last added token
    already checked (``<|im_start|>`` of the last generation prompt) is tokenised again; text
    before an added token tokenises alike whatever follows it."""

    def __init__(self, turns: HFTurnTokenizer) -> None:
        self._turns = turns
        self._known: tuple[str, list[int]] = ("", [])

    def mismatch(
        self,
        trajectory: Sequence[int],
        messages: Sequence[Message],
        *,
        generation_prompt: bool | None = None,
    ) -> int | None:
        """As :meth:`HFTurnTokenizer.prefix_mismatch`."""
        if generation_prompt is None:
            generation_prompt = not messages or messages[-1].get("role") != "assistant"
        text = self._turns._render(list(messages), generation_prompt=generation_prompt)
        ids, self._known = self._turns._encode_extending(text, self._known)
        return first_mismatch(trajectory, ids)


def first_mismatch(left: Sequence[int], right: Sequence[int]) -> int | None:
    """The first index where two id sequences differ (the shorter one's length when one is a
    prefix of the other), or None when they are equal."""
    n = min(len(left), len(right))
    if list(left[:n]) != list(right[:n]):
        return next(i for i in range(n) if left[i] != right[i])
    return None if len(left) == len(right) else n


def mask_after_break(loss_mask: Sequence[int], at: int) -> list[int]:
    """``loss_mask`` with the loss turned off from ``at`` (a break found by
    :meth:`HFTurnTokenizer.prefix_mismatch`) to the end: the tokens after the break stay in
    the context the engine saw, but their sampled origin under the template's rendering can no
    longer be shown, so they are not trained on."""
    return [*loss_mask[:at], *([0] * max(0, len(loss_mask) - at))]


def record_prefix_check(mismatch: int | None) -> None:
    """Count one prefix check (``agentrl_rollout_tito_prefix_checks_total``)."""
    metrics.TITO_PREFIX_CHECKS.labels(result="match" if mismatch is None else "break").inc()


def load_hf_turn_tokenizer(
    path: str,
    *,
    chat_template: ChatTemplateSource | None = None,
    config_map_dir: str | None = None,
    tools: Sequence[ToolSchema] | None = None,
    tool_call_parser: str | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> HFTurnTokenizer:
    """The turn tokenizer of the model directory at ``path`` (the engine's ``tokenizer_path``,
    which is ``spec.model.source.path`` as the pods see it). Loads local files only.
    ``chat_template`` is ``spec.model.chatTemplate`` (``config_map_dir``: where its ConfigMap
    is mounted); the other arguments go to :class:`HFTurnTokenizer`."""
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise TokenizerConfigError(
            f"token-level episodes for the model at {path!r} need the transformers package "
            "(transformers>=4.45) in the rollout workers' environment"
        ) from exc
    if not Path(path).is_dir():
        raise TokenizerConfigError(
            f"the engine's tokenizer_path {path!r} is not a directory on this rollout worker; "
            f"it comes from {MODEL_FIELD}.path, and the workers read the model's tokenizer "
            "files at the same path as the engines. On a cluster, put the model on a "
            f"PersistentVolumeClaim ({MODEL_FIELD}.pvc, which the operator mounts read-only at "
            "/models in the engine, trainer and rollout pods, with "
            f"{MODEL_FIELD}.path the directory inside it), or, "
            f"without {MODEL_FIELD}.pvc, have that directory at the same path in the rollout "
            "image as in the engine image. A Hugging Face hub id that the engine downloads "
            "itself does not work: the download stays in the engine pod, and the workers read "
            "local files only"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise TokenizerConfigError(
            f"cannot load a tokenizer from {path!r} ({MODEL_FIELD}.path): {exc}; the directory "
            "needs the model's tokenizer files (tokenizer.json or tokenizer.model, "
            "tokenizer_config.json)"
        ) from exc
    from agentrl.rollout.chat_templates import ChatTemplateNotFound, resolve_chat_template

    try:
        resolved = resolve_chat_template(
            chat_template, model_dir=path, config_map_dir=config_map_dir
        )
    except ChatTemplateNotFound as exc:
        raise TokenizerConfigError(str(exc)) from exc
    return HFTurnTokenizer(
        tokenizer,
        name=path,
        tools=tools,
        tool_call_parser=tool_call_parser,
        chat_template=resolved[0] if resolved else None,
        template_source=resolved[1] if resolved else None,
        template_kwargs=template_kwargs,
    )
