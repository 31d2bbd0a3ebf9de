"""``spec.model``: what is trained and served, and ``spec.dataset``: the tasks.

Also the chat formats the rollout tier knows (:class:`BundledChatTemplate`, the call syntax of
each and of each SGLang tool-call parser) and the pure check that a parser and a template can
work together (:func:`tool_call_format_mismatch`): ``agentrl validate`` and the API server run
it as a rule of ``spec.model`` when both are named in the manifest, and the rollout workers run
it again on the template file they load (:mod:`agentrl.rollout.hf_tokenizer`).
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Final

from pydantic import Field

from agentrl.api import sglang_parsers
from agentrl.api.base import ManifestModel, ObjectName
from agentrl.api.rules import Rule

#: Where a ``spec.model.source.pvc`` is mounted (read-only) in every pod that reads the model.
MODEL_MOUNT_PATH: Final = "/models"

#: The manifest fields the chat-format rules and errors name.
CHAT_TEMPLATE_FIELD = "spec.model.chatTemplate"
TOOL_CALL_PARSER_FIELD = "spec.model.toolCallParser"
#: The ``spec.model.source.path`` of the built-in tiny policy, which acts in text, not through
#: a tool-call parser (``agentrl.tiny.policy.BUILTIN_PATH``).
TINY_POLICY_PATH: Final = "tiny"


class ToolCallSyntax(StrEnum):
    """How a model writes a tool call in its reply."""

    JSON = "json"
    """A JSON object ``{"name": ..., "arguments": {...}}`` inside ``<tool_call></tool_call>``
    (Hermes; Qwen2.5, Qwen3 Instruct and hybrid-thinking models)."""
    XML = "xml"
    """``<tool_call><function=NAME><parameter=ARG>value</parameter></function></tool_call>``
    (Qwen3-Coder)."""


class BundledChatTemplate(StrEnum):
    """Chat templates that ship with agentrl (``agentrl/rollout/chat_templates/``)."""

    QWEN3_INSTRUCT = "qwen3-instruct"
    """ChatML with a ``<tools>`` system block and JSON tool calls (Qwen2.5 / Qwen3 Instruct)."""
    QWEN3_CODER = "qwen3-coder"
    """ChatML with an XML tool list and XML tool calls (Qwen3-Coder)."""
    QWEN3_THINKING = "qwen3-thinking"
    """Qwen3 hybrid thinking with JSON tool calls, keeping the ``<think>`` block of every
    assistant turn (append-only, unlike the stock template, which drops earlier ones)."""


#: The call syntax each bundled template renders.
TEMPLATE_CALL_SYNTAX: dict[BundledChatTemplate, ToolCallSyntax] = {
    BundledChatTemplate.QWEN3_INSTRUCT: ToolCallSyntax.JSON,
    BundledChatTemplate.QWEN3_CODER: ToolCallSyntax.XML,
    BundledChatTemplate.QWEN3_THINKING: ToolCallSyntax.JSON,
}
#: The call syntax of each SGLang ``--tool-call-parser`` the rollout tier can parse itself.
PARSER_CALL_SYNTAX: dict[str, ToolCallSyntax] = {
    "qwen": ToolCallSyntax.JSON,
    "qwen25": ToolCallSyntax.JSON,
    "hermes": ToolCallSyntax.JSON,
    "qwen3_coder": ToolCallSyntax.XML,
}


#: The ``toolCallParser`` values the training rollout reads, as the rule's message lists them.
_ROLLOUT_PARSERS = ", ".join(PARSER_CALL_SYNTAX)


def compatible_parsers(syntax: ToolCallSyntax) -> tuple[str, ...]:
    """The ``toolCallParser`` values that read ``syntax``. Not ``auto``: SGLang would pick a
    parser from the template for its OpenAI endpoint, but the training rollout reads the calls
    itself and needs the parser named."""
    return tuple(p for p, s in PARSER_CALL_SYNTAX.items() if s == syntax)


def tool_call_format_mismatch(
    parser: str | None, syntax: ToolCallSyntax | None, *, template: str = "the chat template"
) -> str | None:
    """Why ``parser`` cannot read the tool calls of a template rendering ``syntax``, or None
    when they fit or either is unknown. A parser outside :data:`PARSER_CALL_SYNTAX` with a
    known syntax does not fit: none of the bundled syntaxes is its own."""
    if parser is None or syntax is None or parser in compatible_parsers(syntax):
        return None
    return (
        f"toolCallParser {parser} cannot read the tool calls of {template}, which writes them "
        f"as {_SYNTAX_WORDS[syntax]}: set {TOOL_CALL_PARSER_FIELD} to one of "
        f"{', '.join(compatible_parsers(syntax))}, or {CHAT_TEMPLATE_FIELD} to a template in "
        "the syntax of the parser"
    )


_SYNTAX_WORDS = {
    ToolCallSyntax.JSON: 'JSON in <tool_call> ({"name": ..., "arguments": ...})',
    ToolCallSyntax.XML: "XML in <tool_call> (<function=NAME><parameter=ARG>)",
}


def _cel_by_bundled(values: dict[BundledChatTemplate, str]) -> str:
    """CEL choosing ``values[self.chatTemplate.bundled]`` (a string literal)."""
    *first, (_, last) = values.items()
    out = f"'{last}'"
    for template, value in reversed(first):
        out = f"(self.chatTemplate.bundled == '{template.value}' ? '{value}' : {out})"
    return out
# A relative path with no ".." component.
_PARENT_STEP = r"(^|/)[.][.](/|$)"


class ConfigMapKeyRef(ManifestModel):
    """A key of a ConfigMap in the job's namespace."""

    name: ObjectName
    """ConfigMap name."""
    key: str = Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")
    """Key inside the ConfigMap."""


class ChatTemplateSource(ManifestModel):
    """``spec.model.chatTemplate``: the Jinja chat template episodes are rendered with, instead
    of the one in the model's ``tokenizer_config.json``. Exactly one of ``bundled``, ``path``
    and ``configMapKeyRef``. The template must be append-only (rendering later turns never
    changes the ids of earlier ones); the rollout workers check it at start."""

    bundled: BundledChatTemplate | None = None
    """A template that ships with agentrl: ``qwen3-instruct``, ``qwen3-coder`` or
    ``qwen3-thinking`` (Qwen3 hybrid thinking that keeps every turn's ``<think>`` block)."""
    path: str | None = Field(default=None, min_length=1, max_length=512)
    """A template file inside the model directory (``spec.model.source.path``), relative to
    it, e.g. ``chat_template_keep_thinking.jinja``."""
    config_map_key_ref: ConfigMapKeyRef | None = None
    """A ConfigMap key holding the template text."""

    cel_rules = (
        Rule(
            cel="[has(self.bundled), has(self.path), has(self.configMapKeyRef)]"
            ".filter(x, x).size() == 1",
            message_expression="'set exactly one of bundled, path and configMapKeyRef in "
            "spec.model.chatTemplate'",
            check=lambda c: (
                [c.bundled is not None, c.path is not None, c.config_map_key_ref is not None].count(
                    True
                )
                == 1
            ),
            message=lambda c: (
                "set exactly one of bundled, path and configMapKeyRef in spec.model.chatTemplate"
            ),
        ),
        Rule(
            cel=f"!has(self.path) || (!self.path.startsWith('/') && "
            f"!self.path.matches('{_PARENT_STEP}'))",
            message_expression="'path %s must be relative to the model directory, without ..'"
            ".format([self.path])",
            field_path=".path",
            check=lambda c: (
                c.path is None
                or (not c.path.startswith("/") and re.search(_PARENT_STEP, c.path) is None)
            ),
            message=lambda c: f"path {c.path} must be relative to the model directory, without ..",
        ),
    )


class ModelSource(ManifestModel):
    """Where the weights come from: a path inside the image/node, or a PVC."""

    path: str = Field(min_length=1, max_length=512)
    """Path of the HF-format model directory (config.json, safetensors) as the pods see it;
    with ``pvc`` set, a path inside that volume. For ``agentrl run``: a local directory, or
    ``tiny`` for the built-in tiny CPU policy."""
    pvc: str | None = Field(default=None, min_length=1, max_length=253)
    """Name of a PersistentVolumeClaim holding the model, mounted read-only at /models
    (so ``path: Qwen3-8B`` is ``/models/Qwen3-8B`` in the pods; ``/models/Qwen3-8B`` would
    be ``/models/models/Qwen3-8B`` and is refused)."""

    cel_rules = (
        # With a PVC, path is inside the volume, which pods mount at /models; a path that
        # names the mount point again resolves to /models/models/... A volume that really
        # holds a models/ directory is written models/X, without the leading slash.
        Rule(
            cel=f"!has(self.pvc) || !(self.path == '{MODEL_MOUNT_PATH}' || "
            f"self.path.startsWith('{MODEL_MOUNT_PATH}/'))",
            message_expression=f"'path %s is inside the PVC, which is mounted at "
            f"{MODEL_MOUNT_PATH}: it resolves to {MODEL_MOUNT_PATH}%s; write the path inside "
            f"the volume, without the leading {MODEL_MOUNT_PATH}'.format([self.path, self.path])",
            field_path=".path",
            check=lambda src: src.pvc is None
            or not (src.path == MODEL_MOUNT_PATH or src.path.startswith(MODEL_MOUNT_PATH + "/")),
            message=lambda src: (
                f"path {src.path} is inside the PVC, which is mounted at {MODEL_MOUNT_PATH}: "
                f"it resolves to {MODEL_MOUNT_PATH}{src.path}; write the path inside the "
                f"volume, without the leading {MODEL_MOUNT_PATH}"
            ),
        ),
    )


class ModelSpec(ManifestModel):
    """``spec.model``: the policy that is trained and served."""

    source: ModelSource
    """Where the initial weights are read from."""
    served_name: str = Field(default="policy", min_length=1, max_length=128)
    """The model name engines serve (``--served-model-name``) and agents request."""
    architecture: str | None = Field(default=None, max_length=128)
    """Architecture name from the planner's built-in table (e.g. ``Qwen3-30B-A3B``); used by
    ``agentrl plan`` when ``config.json`` is not readable offline."""
    tool_call_parser: sglang_parsers.ToolCallParserName | None = None
    """SGLang ``--tool-call-parser`` (e.g. ``qwen25``, ``qwen3_coder``): one of the names the
    engine image's SGLang release accepts (``agentrl/api/sglang_parsers.json``), or ``auto``."""
    reasoning_parser: sglang_parsers.ReasoningParserName | None = None
    """SGLang ``--reasoning-parser`` (e.g. ``qwen3``): one of the names the engine image's
    SGLang release accepts (``agentrl/api/sglang_parsers.json``), or ``auto``."""
    dtype: str = Field(default="bfloat16", pattern=r"^(bfloat16|float16|float32|auto)$")
    """Weight dtype for engines and trainer."""
    chat_template: ChatTemplateSource | None = None
    """The chat template episodes are rendered with; unset uses the model's own
    (``tokenizer_config.json`` or ``chat_template.jinja``)."""

    cel_rules = (
        Rule(
            cel="!has(self.toolCallParser) || !has(self.chatTemplate) || "
            "!has(self.chatTemplate.bundled) || "
            + " || ".join(
                f"(self.chatTemplate.bundled == '{t.value}' && self.toolCallParser in "
                f"[{', '.join(repr(p) for p in compatible_parsers(s))}])"
                for t, s in TEMPLATE_CALL_SYNTAX.items()
            ),
            message_expression="'toolCallParser %s cannot read the tool calls of the bundled "
            "chat template %s, which writes them as %s: set spec.model.toolCallParser to one "
            "of %s, or spec.model.chatTemplate to a template in the syntax of the parser'"
            ".format([self.toolCallParser, self.chatTemplate.bundled, "
            + _cel_by_bundled({t: _SYNTAX_WORDS[s] for t, s in TEMPLATE_CALL_SYNTAX.items()})
            + ", "
            + _cel_by_bundled(
                {t: ", ".join(compatible_parsers(s)) for t, s in TEMPLATE_CALL_SYNTAX.items()}
            )
            + "])",
            field_path=".toolCallParser",
            check=lambda m: _bundled_mismatch(m) is None,
            message=lambda m: _bundled_mismatch(m) or "",
        ),
        # The training rollout reads the model's tool calls from the generated tokens itself,
        # with the parsers of PARSER_CALL_SYNTAX (agentrl.rollout.toolcalls.PARSERS); any other
        # SGLang name, ``auto`` included, would fail every rollout worker at tokenizer load.
        Rule(
            cel=f"self.source.path == '{TINY_POLICY_PATH}' || !has(self.toolCallParser) || "
            f"self.toolCallParser in [{', '.join(repr(p) for p in PARSER_CALL_SYNTAX)}]",
            message_expression="'toolCallParser %s has no parser in the training rollout, which "
            "reads the tool calls from the generated tokens itself: set "
            f"{TOOL_CALL_PARSER_FIELD} to one of {_ROLLOUT_PARSERS}'.format([self.toolCallParser])",
            field_path=".toolCallParser",
            check=lambda m: _rollout_parser_missing(m) is None,
            message=lambda m: _rollout_parser_missing(m) or "",
        ),
    )


def _rollout_parser_missing(model: ModelSpec) -> str | None:
    parser = model.tool_call_parser
    if model.source.path == TINY_POLICY_PATH or parser is None or parser in PARSER_CALL_SYNTAX:
        return None
    return (
        f"toolCallParser {parser} has no parser in the training rollout, which reads the tool "
        f"calls from the generated tokens itself: set {TOOL_CALL_PARSER_FIELD} to one of "
        f"{_ROLLOUT_PARSERS}"
    )


def _bundled_mismatch(model: ModelSpec) -> str | None:
    bundled = model.chat_template.bundled if model.chat_template is not None else None
    if bundled is None:
        return None
    return tool_call_format_mismatch(
        model.tool_call_parser,
        TEMPLATE_CALL_SYNTAX[bundled],
        template=f"the bundled chat template {bundled.value}",
    )


class DatasetFormat(StrEnum):
    """Task formats the rollout tier reads."""

    TOY = "toy"
    SWEBENCH = "swebench"
    SWESMITH = "swesmith"
    HARBOR = "harbor"


class DatasetSpec(ManifestModel):
    """``spec.dataset``: the tasks episodes are drawn from."""

    format: DatasetFormat = DatasetFormat.TOY
    """``toy`` (the bundled generated Python repositories), ``swebench`` (SWE-bench 5.x JSONL:
    each row's image, eval script, log parser and eval type; SWE-smith rows are read too),
    ``swesmith`` (SWE-smith JSONL only: ``image_name`` per repository snapshot) or ``harbor``
    (a directory of Harbor task directories). The format also picks the sandbox pods' security
    profile: toy tasks run as uid 1000, SWE-bench, SWE-smith and Harbor images as root with
    every capability dropped (their repository and tools are root-owned; see
    docs/rollout.md)."""
    path: str | None = Field(default=None, max_length=512)
    """JSONL file or task directory; required unless ``format`` is ``toy``."""
    held_out_fraction: float = Field(default=0.2, ge=0.0, lt=1.0)
    """Share of tasks kept out of training and used to measure pass@1 (0 ≤ x < 1)."""
    seed: int = Field(default=0, ge=0)
    """Seed of the task order and of the held-out split."""
    max_tasks: int | None = Field(default=None, ge=1, le=1_000_000)
    """Use at most this many tasks (after shuffling); unset uses all."""
    image_pull_secrets: list[ObjectName] = Field(default_factory=list, max_length=16)
    """Secrets for pulling task images (sandbox pods and the pre-pull DaemonSet)."""

    cel_rules = (
        Rule(
            cel="self.format == 'toy' || has(self.path)",
            message_expression="'path is required when format is %s: set spec.dataset.path to "
            "the JSONL file or task directory'.format([self.format])",
            field_path=".path",
            check=lambda d: d.format == DatasetFormat.TOY or d.path is not None,
            message=lambda d: (
                f"path is required when format is {d.format.value}: "
                "set spec.dataset.path to the JSONL file or task directory"
            ),
            reason="FieldValueRequired",
        ),
    )
