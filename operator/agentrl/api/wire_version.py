"""The version of the wire contract (:mod:`agentrl.api.wire`) and the skew policy both sides
apply to what the other wrote.

Every document that crosses between the operator and its workloads carries the contract's
version as ``wireVersion: "MAJOR.MINOR"``: ``runtime.yaml`` (written by the operator, read by
the trainer and the rollout tier) and each annotation a workload writes on its pod (read by the
operator). The version is the contract's own, independent of the package's: whoever changes the
contract's schema bumps :data:`WIRE_VERSION` and adds a line to :data:`WIRE_HISTORY`
(``tests/api/test_wire_version.py`` fails until they do; ``make wire-schema`` pins the new
version's schema).

The policy, applied by :func:`receive`:

* **Same major, minor within one of the reader's** (1.1 reads 1.0, 1.1 and 1.2): accepted. Keys
  the reader does not know (a newer writer's, or an older writer's key that has since been
  removed) are dropped and reported (:attr:`Received.unknown`); keys the reader knows and the
  writer left out take the model's default. So a minor version may add a key only with a
  default that means what the older side meant, and may remove a key only if the previous
  minor had a default for it.
* **Anything wider** (another major, two minors apart, or a version that is not one):
  :class:`WireSkewError`, whose message names both versions. A workload refuses to start with
  it (its last log line, and so its termination message, starts with
  :data:`WIRE_SKEW_PREFIX`); the operator ignores the content of a skewed annotation and sets
  the job's ``WireCompatible`` condition to False (reason ``VersionSkew``) instead.
* A document without ``wireVersion`` was written before the contract carried one and is read as
  :data:`UNVERSIONED` (1.0).

What is left out on purpose: ``job.yaml`` (the resolved manifest) is versioned by the CRD's
``apiVersion``, not by this; the workloads of 1.0 predate the policy and parse ``runtime.yaml``
strictly (``docs/install.md``, "Upgrades and version skew", says what that means for the one
upgrade from 1.0).

Callers: :mod:`agentrl.api.wire` (re-exports these names), and through it the trainer's
configuration, the rollout tier's concurrency source, ``agentrl tasks validate`` and the
operator's ``reconcile.observed`` / ``reconcile.wire_skew``.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Generic, NamedTuple, TypeVar, get_args

from pydantic import BaseModel

#: The contract version this code writes and reads around (see :data:`WIRE_HISTORY`).
WIRE_VERSION: Final = "1.1"
#: The key of the version in ``runtime.yaml`` and in every annotation payload.
WIRE_VERSION_KEY: Final = "wireVersion"
#: What a document without :data:`WIRE_VERSION_KEY` is read as: written before the contract
#: carried a version.
UNVERSIONED: Final = "1.0"
#: Every contract version, oldest first, with what changed. A bump adds a line here and pins
#: the new version's schema (``make wire-schema``, ``tests/api/wire_schemas/VERSION.json``).
WIRE_HISTORY: Final[Mapping[str, str]] = {
    "1.0": "the contract before it carried a version: runtime.yaml (RuntimeConfig with "
    "sandbox.pods), agentrl.dev/watchdog (WatchdogReport), agentrl.dev/progress "
    "(TrainerProgress); its readers parse runtime.yaml strictly",
    "1.1": "wireVersion in runtime.yaml and in both annotations; readers tolerate and report "
    "unknown keys and refuse a wider skew than one minor version",
}
#: A workload's refusal starts with this; the operator finds it in a failed container's
#: termination message (its log tail) and lifts the line into the job's status.
WIRE_SKEW_PREFIX: Final = "wire contract skew:"
#: Where the policy is explained to users.
WIRE_SKEW_HELP: Final = "docs/install.md, Upgrades and version skew"


class WireVersion(NamedTuple):
    """``MAJOR.MINOR`` of the contract."""

    major: int
    minor: int

    @classmethod
    def parse(cls, text: str) -> WireVersion:
        """``"1.2"`` → ``WireVersion(1, 2)``; ValueError for anything else."""
        major, _, minor = text.partition(".")
        if not (major.isdigit() and minor.isdigit()):
            raise ValueError(f"{text!r} is not a wire contract version (MAJOR.MINOR)")
        return cls(int(major), int(minor))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


def readable(ours: str = WIRE_VERSION) -> tuple[WireVersion, WireVersion]:
    """The oldest and the newest version a side speaking ``ours`` reads."""
    own = WireVersion.parse(ours)
    return WireVersion(own.major, max(own.minor - 1, 0)), WireVersion(own.major, own.minor + 1)


def compatible(theirs: str, ours: str = WIRE_VERSION) -> bool:
    """Whether a side speaking ``ours`` reads what a side speaking ``theirs`` wrote."""
    try:
        other = WireVersion.parse(theirs)
    except ValueError:
        return False
    low, high = readable(ours)
    return low <= other <= high


class WireSkewError(ValueError):
    """The other side speaks a contract version this side does not read (wider than one minor
    version apart). A ValueError, so callers that already treat a malformed document as one
    keep doing so; the message names both versions and where the policy is explained."""

    def __init__(self, what: str, theirs: str, *, reader: str, ours: str = WIRE_VERSION) -> None:
        low, high = readable(ours)
        self.what = what
        self.theirs = theirs
        self.ours = ours
        super().__init__(
            f"{WIRE_SKEW_PREFIX} {what} is wire contract {theirs}; {reader} speaks {ours} and "
            f"reads {low} to {high}: run the operator and the job's images at most one minor "
            f"version apart ({WIRE_SKEW_HELP})"
        )


#: A :class:`WireSkewError`'s message, read back by the operator from a workload's last words.
_REFUSAL = re.compile(
    re.escape(WIRE_SKEW_PREFIX)
    + r" (?P<what>\S+) is wire contract (?P<theirs>\S+); (?P<reader>.+?) speaks (?P<ours>\S+) "
)


class Refusal(NamedTuple):
    """A workload's refusal, read back from its last words (:func:`skew_line`)."""

    line: str
    """The line, from :data:`WIRE_SKEW_PREFIX` on."""
    what: str | None = None
    """What it refused (``runtime.yaml``); None when the line is not in the known form."""
    writer_version: str | None = None
    """The version ``what`` was written in."""
    reader_version: str | None = None
    """The version the refusing workload speaks."""


def skew_line(text: str | None) -> Refusal | None:
    """The refusal in a workload's last words (a termination message, a log tail): the last
    line holding :data:`WIRE_SKEW_PREFIX`, or None when there is none."""
    for line in reversed((text or "").splitlines()):
        at = line.find(WIRE_SKEW_PREFIX)
        if at < 0:
            continue
        found = line[at:].strip()
        parts = _REFUSAL.match(found)
        if parts is None:
            return Refusal(found)
        return Refusal(found, parts["what"], parts["theirs"], parts["ours"])
    return None


# ---- receiving a document ---------------------------------------------------------------------

_M = TypeVar("_M", bound=BaseModel)


@dataclass(frozen=True)
class Received(Generic[_M]):
    """A document read under the skew policy."""

    value: _M
    """The document as this side's model; its ``wire_version`` is the writer's."""
    version: str
    """The writer's contract version (:data:`UNVERSIONED` when it wrote none)."""
    unknown: tuple[str, ...] = ()
    """Keys this side does not know, dropped before validation, as dotted paths
    (``rollout.concurrencyPerWorker``, ``weightPushFailures[].newKey``)."""


def version_of(doc: Mapping[str, Any]) -> str:
    """The contract version a document was written in (:data:`UNVERSIONED` without one)."""
    found = doc.get(WIRE_VERSION_KEY, UNVERSIONED)
    return found if isinstance(found, str) else repr(found)


def receive(model: type[_M], doc: Any, *, what: str, reader: str) -> Received[_M]:
    """``doc`` (parsed YAML or JSON) as ``model`` under the skew policy.

    Raises:
        WireSkewError: ``doc`` was written in a version this side does not read.
        pydantic.ValidationError: ``doc`` is not a ``model`` even with unknown keys dropped
            (a ValueError too).
    """
    if not isinstance(doc, Mapping):
        return Received(model.model_validate(doc), UNVERSIONED)
    theirs = version_of(doc)
    if not compatible(theirs):
        raise WireSkewError(what, theirs, reader=reader)
    unknown: list[str] = []
    known = _known(model, doc, "", unknown)
    known.pop("wire_version", None)
    known[WIRE_VERSION_KEY] = theirs
    return Received(model.model_validate(known), theirs, tuple(unknown))


def _known(
    model: type[BaseModel], doc: Mapping[str, Any], path: str, unknown: list[str]
) -> dict[str, Any]:
    """``doc`` without the keys ``model`` (and the models nested in it) does not know; each
    dropped key's path goes to ``unknown``."""
    fields: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        fields[name] = info.annotation
        if info.alias:
            fields[info.alias] = info.annotation
    kept: dict[str, Any] = {}
    for key, value in doc.items():
        if key not in fields:
            unknown.append(f"{path}{key}")
            continue
        nested = _model_in(fields[key])
        if nested is not None and isinstance(value, Mapping):
            value = _known(nested, value, f"{path}{key}.", unknown)
        elif nested is not None and isinstance(value, list):
            value = [
                _known(nested, item, f"{path}{key}[].", unknown)
                if isinstance(item, Mapping)
                else item
                for item in value
            ]
        kept[key] = value
    return kept


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (itself, optional, or a list of it), or None."""
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


# ---- the schema a version pins ------------------------------------------------------------------


def schema_of(models: Mapping[str, type[BaseModel]]) -> dict[str, Any]:
    """The JSON schema of each document model (by the key or file it travels under), as it is
    written on the wire (camelCase) and without titles and descriptions: what changes it changes
    the contract, a docstring does not."""
    return {
        name: _structure(model.model_json_schema(by_alias=True, mode="validation"))
        for name, model in models.items()
    }


def _structure(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            key: _structure(value)
            for key, value in node.items()
            if not (key in ("title", "description") and isinstance(value, str))
        }
    if isinstance(node, list):
        return [_structure(item) for item in node]
    return node
