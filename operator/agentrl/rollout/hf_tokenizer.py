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
  is rendered and tokenised in place on every call; the base rendering is computed once.

Observations use the ``tool`` role when the template renders it, else ``user`` (decided once, at
construction; :attr:`HFTurnTokenizer.observation_role`).

Construction checks that the template is *prefix-stable*: that rendering more messages only
appends ids. Templates that rewrite earlier turns once later ones exist (Qwen3's, which drops
the ``<think>`` block of past assistant turns, is one) raise :class:`TokenizerConfigError`: a
token-level trajectory cannot equal their rendering, so they need a prefix-stable template.

``transformers`` is imported only by :func:`load_hf_turn_tokenizer`; nothing in the operator
imports this module.

Callers: :func:`agentrl.rollout.runtime.turn_tokenizer_for`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: The manifest field that names the model directory the tokenizer is loaded from.
MODEL_FIELD = "spec.model.source"

Message = dict[str, str]

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


class TokenizerConfigError(ValueError):
    """The model's tokenizer cannot drive token-level episodes: a configuration error, raised
    before any episode starts and never retried."""


def _starts_with(ids: Sequence[int], prefix: Sequence[int]) -> bool:
    return len(ids) >= len(prefix) and list(ids[: len(prefix)]) == list(prefix)


class HFTurnTokenizer:
    """:class:`~agentrl.rollout.agent.TurnTokenizer` over a Hugging Face tokenizer with a chat
    template. Raises :class:`TokenizerConfigError` if the template cannot be used (see the
    module docstring)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, *, name: str | None = None) -> None:
        self._tok = tokenizer
        self._name = name or getattr(tokenizer, "name_or_path", None) or "the tokenizer"
        if not getattr(tokenizer, "chat_template", None):
            raise TokenizerConfigError(
                f"{self._name} has no chat_template, so turns cannot be rendered as the model "
                f"expects; use an instruct/chat model in {MODEL_FIELD} or add a chat_template "
                "to its tokenizer_config.json"
            )
        self.observation_role = "tool" if self._renders_tool_role() else "user"
        """Role of observation messages: ``tool`` when the template renders it, else ``user``."""
        self._base_ids = self._ids(list(_BASE), generation_prompt=False)

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
        self.observation_ids(_PROBE_OBSERVATION)  # raises if the template is not prefix-stable

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
        message = {"role": self.observation_role, "content": observation}
        ids = self._ids([*_BASE, message], generation_prompt=True)
        if not _starts_with(ids, self._base_ids):
            raise self._unstable(
                f"adding a {self.observation_role} message changes the ids of earlier turns"
            )
        return ids[len(self._base_ids) :]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=True))

    # -----------------------------------------------------------------------------------------

    def _render(self, messages: list[Message], *, generation_prompt: bool) -> str:
        from jinja2 import TemplateError

        try:
            text = self._tok.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=generation_prompt
            )
        except TemplateError as exc:
            roles = ", ".join(m["role"] for m in messages)
            raise TokenizerConfigError(
                f"the chat template of {self._name} fails on a conversation of roles {roles}: {exc}"
            ) from exc
        return str(text)

    def _ids(self, messages: list[Message], *, generation_prompt: bool) -> list[int]:
        # Rendered text tokenised without added special tokens: what apply_chat_template(
        # tokenize=True) returns, on every transformers version (their return types differ).
        text = self._render(messages, generation_prompt=generation_prompt)
        return list(self._tok.encode(text, add_special_tokens=False))

    def _renders_tool_role(self) -> bool:
        from jinja2 import TemplateError

        messages = [*_BASE, {"role": "tool", "content": _MARKER}]
        try:
            text = self._tok.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
        except (TemplateError, KeyError, TypeError, ValueError):
            return False  # templates that reject unknown roles raise
        return _MARKER in str(text)  # others drop them silently

    def _close_ids(self) -> list[int]:
        text = self._render(
            [*_BASE[:2], {"role": "assistant", "content": _MARKER}], generation_prompt=False
        )
        at = text.rfind(_MARKER)
        if at < 0:
            raise TokenizerConfigError(
                f"the chat template of {self._name} does not render an assistant message's "
                "content; token-level episodes need it to"
            )
        return list(self._tok.encode(text[at + len(_MARKER) :], add_special_tokens=False))

    def _unstable(self, problem: str) -> TokenizerConfigError:
        return TokenizerConfigError(
            f"the chat template of {self._name} is not prefix-stable: {problem}. Token-level "
            "episodes append ids turn by turn, so the template must render a conversation as "
            "the ids of its shorter prefixes plus new ones; set a prefix-stable chat_template "
            f"in the tokenizer_config.json of the model in {MODEL_FIELD}"
        )


def load_hf_turn_tokenizer(path: str) -> HFTurnTokenizer:
    """The turn tokenizer of the model directory at ``path`` (the engine's ``tokenizer_path``,
    which is ``spec.model.source.path`` as the pods see it). Loads local files only."""
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
    return HFTurnTokenizer(tokenizer, name=path)
