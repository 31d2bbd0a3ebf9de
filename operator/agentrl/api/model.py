"""``spec.model``: what is trained and served, and ``spec.dataset``: the tasks."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from agentrl.api import sglang_parsers
from agentrl.api.base import ManifestModel, ObjectName
from agentrl.api.rules import Rule


class ModelSource(ManifestModel):
    """Where the weights come from: a path inside the image/node, or a PVC."""

    path: str = Field(min_length=1, max_length=512)
    """Path of the HF-format model directory (config.json, safetensors) as the pods see it;
    with ``pvc`` set, a path inside that volume. For ``agentrl run``: a local directory, or
    ``tiny`` for the built-in tiny CPU policy."""
    pvc: str | None = Field(default=None, min_length=1, max_length=253)
    """Name of a PersistentVolumeClaim holding the model, mounted read-only at /models."""


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
