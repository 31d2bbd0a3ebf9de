"""Cross-field rules, written once and enforced twice.

Each :class:`Rule` carries a CEL expression (emitted into the CRD as an
``x-kubernetes-validations`` entry, so the API server enforces it) and the same predicate in
Python (run by ``agentrl validate`` and the operator before anything is applied). The corpus of
invalid manifests in ``tests/api/invalid/`` is rejected by both, naming the same field, which
keeps the two spellings honest.

Transition rules (``oldSelf``: immutable fields) exist only in CEL: offline validation has no
old object to compare with.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Rule:
    """One cross-field rule of a manifest type."""

    cel: str
    """The CEL expression; ``self`` is the object the rule is attached to."""
    message_expression: str
    """CEL string expression the API server shows when ``cel`` is false."""
    field_path: str = ""
    """JSONPath (``.maxTurns``) of the field the error names, relative to the object."""
    check: Callable[[Any], bool] | None = None
    """The same predicate in Python, on the parsed model; ``None`` for transition rules."""
    message: Callable[[Any], str] | None = None
    """The message in Python (same words as ``message_expression``)."""
    reason: str = "FieldValueInvalid"
    """The API server's error reason: FieldValueInvalid, FieldValueForbidden, ..."""
    transition: bool = False
    """True when the rule compares with ``oldSelf`` (immutability)."""

    def to_crd(self) -> dict[str, str]:
        """The ``x-kubernetes-validations`` entry for the CRD."""
        out = {"rule": self.cel, "messageExpression": self.message_expression}
        if self.field_path:
            out["fieldPath"] = self.field_path
        if self.reason != "FieldValueInvalid":
            out["reason"] = self.reason
        return out


def immutable(field: str, what: str) -> Rule:
    """A transition rule: ``field`` may not change once the object exists."""
    return Rule(
        cel=f"self.{field} == oldSelf.{field}",
        message_expression=(
            f"'{what} is immutable once the job exists; delete and re-create the job to change it'"
        ),
        field_path=f".{field}",
        transition=True,
    )


def let(name: str, value: str, body: str) -> str:
    """CEL for ``body`` with ``name`` bound to ``value``, evaluated once.

    The API server's CEL has no ``cel.bind`` (Kubernetes does not load the bindings
    extension), so a one-element list's ``map`` binds the name: ``[value].map(name, body)[0]``.
    """
    return f"[{value}].map({name}, {body})[0]"
