"""Offline validation of AgentRLJob manifests with the API server's rules.

``validate_documents`` applies, in order, what the API server would: the schema (types, bounds,
enums, unknown fields — the same constraints the CRD is generated from) and then every
cross-field :class:`~agentrl.api.rules.Rule` (the Python twin of each CEL rule). Errors carry the
path of the field in manifest spelling (``spec.rollout.groupSize``) and a message that says what
is wrong and what is allowed. Transition rules (immutable fields) need the old object and are
left to the API server.

``agentrl validate`` checks more than the API server does: each :data:`JobCheck` it is given
runs on every valid job and returns errors (refusals naming a field) and notes (what it could
not check). The trainer memory estimate is one (``agentrl.sim.memory``'s, wired in by
``agentrl.sim.cli``); it does not run in :func:`validate_document`, which the operator and the
workloads share: they stay exactly the API server's rules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from agentrl.api.base import ManifestModel
from agentrl.api.job import API_VERSION, KIND, AgentRLJob


@dataclass(frozen=True)
class FieldError:
    """One problem with one field of one document."""

    path: str
    """Manifest path, e.g. ``spec.rollout.groupSize`` (empty for the whole document)."""
    message: str
    """What is wrong and what is allowed."""
    document: int = 0
    """Index of the document in its file (0-based)."""

    def render(self, source: str) -> str:
        where = f"{source}" + (f"[{self.document}]" if self.document else "")
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


class ManifestSyntaxError(ValueError):
    """The YAML itself cannot be read; carries line and column (1-based)."""

    def __init__(self, message: str, line: int | None, column: int | None) -> None:
        super().__init__(message)
        self.line = line
        self.column = column


def load_documents(text: str) -> list[Any]:
    """Every non-empty YAML document in ``text``."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        col = mark.column + 1 if mark else None
        problem = exc.problem or str(exc)
        raise ManifestSyntaxError(
            f"line {line}, column {col}: invalid YAML: {problem}", line, col
        ) from exc
    except yaml.YAMLError as exc:
        raise ManifestSyntaxError(f"invalid YAML: {exc}", None, None) from exc
    return docs


def _loc_to_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _describe(err: dict[str, Any]) -> str:
    kind = err["type"]
    ctx = err.get("ctx") or {}
    value = err.get("input")
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        return "unknown field (check the spelling; see docs/manifest.md for the fields allowed)"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        return f"{value!r} is out of range: {err['msg'].lower()}"
    if kind == "enum" or kind == "literal_error":
        return f"{value!r} is not allowed: {err['msg'].lower()}"
    if kind in ("string_too_long", "string_too_short", "too_long", "too_short"):
        return str(err["msg"]).lower()
    if kind == "string_pattern_mismatch":
        return f"{value!r} does not match the pattern {ctx.get('pattern')!r}"
    return f"{err['msg']} (got {value!r})"


def _rule_errors(model: BaseModel, path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    if isinstance(model, ManifestModel):
        for rule in type(model).cel_rules:
            if rule.check is None or rule.transition:
                continue
            if not rule.check(model):
                message = rule.message(model) if rule.message else rule.message_expression
                where = path + rule.field_path if rule.field_path else path
                errors.append(FieldError(where.lstrip("."), message))
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        alias = field.alias or name
        children = value if isinstance(value, list) else [value]
        for i, child in enumerate(children):
            if isinstance(child, BaseModel):
                sub = f"{path}.{alias}" + (f"[{i}]" if isinstance(value, list) else "")
                errors.extend(_rule_errors(child, sub))
    return errors


def validate_document(doc: Any, index: int = 0) -> tuple[AgentRLJob | None, list[FieldError]]:
    """Validate one parsed document; returns the job (if valid) and the errors."""
    if not isinstance(doc, dict):
        return None, [FieldError("", "a manifest must be a YAML mapping", index)]
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        return None, [
            FieldError(
                "apiVersion" if doc.get("apiVersion") != API_VERSION else "kind",
                f"expected apiVersion: {API_VERSION} and kind: {KIND} "
                f"(got {doc.get('apiVersion')!r}, {doc.get('kind')!r})",
                index,
            )
        ]
    try:
        job = AgentRLJob.model_validate(doc)
    except ValidationError as exc:
        errors = [
            FieldError(_loc_to_path(e["loc"]), _describe(dict(e)), index)
            for e in exc.errors(include_url=False)
        ]
        return None, errors
    errors = [FieldError(e.path, e.message, index) for e in _rule_errors(job, "")]
    return (None if errors else job), errors


def validate_text(text: str) -> tuple[list[AgentRLJob], list[FieldError]]:
    """Validate every document of a YAML stream (raises ManifestSyntaxError on bad YAML)."""
    jobs: list[AgentRLJob] = []
    errors: list[FieldError] = []
    for i, doc in enumerate(load_documents(text)):
        job, errs = validate_document(doc, i)
        errors += errs
        if job is not None:
            jobs.append(job)
    return jobs, errors


def load_job(text: str) -> AgentRLJob:
    """The single valid AgentRLJob in ``text``; raises ValueError listing every problem."""
    jobs, errors = validate_text(text)
    if errors:
        raise ValueError("\n".join(e.render("manifest") for e in errors))
    if len(jobs) != 1:
        raise ValueError(f"expected exactly one AgentRLJob, found {len(jobs)}")
    return jobs[0]


@dataclass(frozen=True)
class CheckResult:
    """What one :data:`JobCheck` found in one job."""

    errors: list[FieldError] = dataclass_field(default_factory=list)
    """Refusals, each naming the field to change."""
    notes: list[str] = dataclass_field(default_factory=list)
    """What the check could not decide, and why (not errors)."""


#: A check ``agentrl validate`` runs on each job that passed the API server's rules.
JobCheck = Callable[[AgentRLJob], CheckResult]
