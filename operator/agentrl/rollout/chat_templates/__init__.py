"""The chat templates that ship with agentrl, and where ``spec.model.chatTemplate`` takes its
template text from.

The ``*.jinja`` files beside this module are agentrl's own templates, written from the formats
the model families use (names: :class:`~agentrl.api.model.BundledChatTemplate`):

- ``qwen3-instruct``: ChatML with a ``<tools>`` system block and JSON calls in ``<tool_call>``
  (Qwen2.5 / Qwen3 Instruct);
- ``qwen3-coder``: ChatML with an XML tool list and ``<function=...><parameter=...>`` calls
  (Qwen3-Coder);
- ``qwen3-thinking``: Qwen3 hybrid thinking that keeps the ``<think>`` block of every assistant
  turn (the stock template drops earlier ones, so its renderings are not append-only).

All three render consecutive tool results as one user turn of ``<tool_response>`` blocks and
never rewrite an earlier message once later ones exist.

Callers: :mod:`agentrl.rollout.hf_tokenizer` (:func:`resolve_chat_template`),
:mod:`agentrl.rollout.hf_model_files` (the template of the tokenizer it writes).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from agentrl.api.model import CHAT_TEMPLATE_FIELD, BundledChatTemplate, ChatTemplateSource


class ChatTemplateNotFound(ValueError):
    """``spec.model.chatTemplate`` names a template that is not there."""


def bundled_template(name: BundledChatTemplate | str) -> str:
    """The text of a bundled template."""
    template = BundledChatTemplate(name)
    return resources.files(__package__).joinpath(f"{template.value}.jinja").read_text("utf-8")


def resolve_chat_template(
    source: ChatTemplateSource | None, *, model_dir: str, config_map_dir: str | None = None
) -> tuple[str, str] | None:
    """The template text ``spec.model.chatTemplate`` selects and a description of where it
    came from (for error messages), or None when it is unset (the model's own template).

    ``model_dir`` is the model directory as this process sees it (``path`` is relative to it);
    ``config_map_dir`` is where the ConfigMap of ``configMapKeyRef`` is mounted (a file per
    key), which the pod builder decides."""
    if source is None:
        return None
    if source.bundled is not None:
        return bundled_template(source.bundled), f"the bundled chat template {source.bundled}"
    if source.path is not None:
        file = Path(model_dir) / source.path
        where = f"{CHAT_TEMPLATE_FIELD}.path {source.path!r} (in {model_dir})"
    elif source.config_map_key_ref is not None:
        ref = source.config_map_key_ref
        if config_map_dir is None:
            raise ChatTemplateNotFound(
                f"{CHAT_TEMPLATE_FIELD}.configMapKeyRef {ref.name}/{ref.key} is not mounted in "
                "this process"
            )
        file = Path(config_map_dir) / ref.key
        where = f"{CHAT_TEMPLATE_FIELD}.configMapKeyRef {ref.name}/{ref.key}"
    else:  # the manifest rules allow no other case
        raise ChatTemplateNotFound(f"{CHAT_TEMPLATE_FIELD} names no template")
    try:
        return file.read_text("utf-8"), where
    except OSError as exc:
        raise ChatTemplateNotFound(f"cannot read {where}: {exc}") from exc
