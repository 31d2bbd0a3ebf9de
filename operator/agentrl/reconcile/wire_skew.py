"""WireCompatible: whether the job's workloads and this operator speak versions of the wire
contract (``runtime.yaml`` and the workloads' annotations, :mod:`agentrl.api.wire`) at most one
minor version apart, the skew policy of :mod:`agentrl.api.wire_version`.

The operator learns a workload's version from what the workload wrote, in the live engine and
trainer pods (:func:`readings`):

* each annotation says the version it was written in (``wireVersion``; none: 1.0). One outside
  the window is ignored by the status (``observed``) and named here; keys of one inside the
  window that this operator does not know are named in the True message.
* a trainer that refused ``runtime.yaml`` said so in its last log line, which the kubelet keeps
  as the container's termination message (``terminationMessagePolicy: FallbackToLogsOnError``);
  ``policies.trainer_restarts`` fails the job on it, since a restart can only refuse again.

With nothing reported (no workload has written yet, or none runs: between trainer attempts,
suspended, finished) the last verdict stands, as a workload's last word does.

Pure; called by ``status.compute_status``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from agentrl.api import Condition, Reason
from agentrl.api.wire import (
    ANNOTATION_PROGRESS,
    ANNOTATION_WATCHDOG,
    CONFIG_RUNTIME_KEY,
    WIRE_VERSION,
    TrainerProgress,
    WatchdogReport,
    WireSkewError,
    receive_annotation,
    skew_line,
)
from agentrl.api.wire_version import WIRE_SKEW_HELP, readable
from agentrl.reconcile.constants import Component
from agentrl.reconcile.observed import Observed

#: The annotations the workloads write, with the model each is read as.
ANNOTATIONS: Final = ((ANNOTATION_WATCHDOG, WatchdogReport), (ANNOTATION_PROGRESS, TrainerProgress))
#: The components whose pods write them or read ``runtime.yaml``.
COMPONENTS: Final = (Component.ENGINE, Component.TRAINER)
#: Unknown keys named in the message at most (the rest are counted).
UNKNOWN_KEYS_SHOWN: Final = 8


@dataclass(frozen=True)
class WireReading:
    """What one pod told of its contract version."""

    pod: str
    component: Component
    source: str
    """The annotation it wrote, or ``runtime.yaml`` when it refused that."""
    version: str | None
    """The version the workload speaks; None when its refusal did not say."""
    skewed: bool
    """The workload and this operator are more than one minor version apart."""
    unknown: tuple[str, ...] = ()
    """Keys of its annotation this operator does not know (ignored)."""
    refusal: str | None = None
    """Its refusal of ``runtime.yaml``, in its own words."""


@dataclass(frozen=True)
class WireVerdict:
    """The WireCompatible condition before it becomes one."""

    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str


def readings(observed: Observed) -> list[WireReading]:
    """Every version the live engine and trainer pods told, by pod name."""
    found: list[WireReading] = []
    for component in COMPONENTS:
        for pod in observed.pods_of(component):
            for key, model in ANNOTATIONS:
                raw = pod.annotations.get(key)
                if not raw:
                    continue
                try:
                    received = receive_annotation(raw, model, key=key)
                except WireSkewError as exc:
                    found.append(WireReading(pod.name, component, key, exc.theirs, True))
                    continue
                except ValueError:  # malformed: says nothing of a version
                    continue
                found.append(
                    WireReading(pod.name, component, key, received.version, False, received.unknown)
                )
            for container in pod.containers:
                refusal = skew_line(container.terminated_message)
                if refusal is not None:
                    found.append(
                        WireReading(
                            pod.name,
                            component,
                            refusal.what or CONFIG_RUNTIME_KEY,
                            refusal.reader_version,
                            True,
                            refusal=refusal.line,
                        )
                    )
    return found


def _ours() -> str:
    low, high = readable()
    return f"this operator speaks wire contract {WIRE_VERSION} and reads {low} to {high}"


def _skew_message(skewed: list[WireReading]) -> str:
    parts = []
    for r in skewed:
        if r.refusal is not None:
            speaks = f" speaks {r.version} and" if r.version else ""
            parts.append(f"pod {r.pod}{speaks} refused {r.source} ({r.refusal})")
        else:
            parts.append(f"pod {r.pod} wrote {r.source} in {r.version} (ignored)")
    return (
        f"{_ours()}; " + "; ".join(parts) + ": run the operator and the job's images at most "
        f"one minor version apart ({WIRE_SKEW_HELP})"
    )


def _compatible_message(found: list[WireReading]) -> str:
    versions: dict[str, set[str]] = {}
    for r in found:
        versions.setdefault(r.component.value, set()).add(r.version or "?")
    spoken = ", ".join(f"{c} {'/'.join(sorted(v))}" for c, v in sorted(versions.items()))
    message = f"{_ours()}; the workloads: {spoken}"
    unknown = sorted({f"{r.source} {key}" for r in found for key in r.unknown})
    if unknown:
        shown = ", ".join(unknown[:UNKNOWN_KEYS_SHOWN])
        more = len(unknown) - UNKNOWN_KEYS_SHOWN
        message += (
            f"; keys this operator does not know, ignored: {shown}"
            + (f" and {more} more" if more > 0 else "")
            + " (a newer workload's, or one this operator no longer reads)"
        )
    return message


def verdict(observed: Observed, previous: Condition | None = None) -> WireVerdict:
    """WireCompatible from what the pods told now; ``previous`` (the condition as it is) stands
    when none told anything."""
    found = readings(observed)
    skewed = [r for r in found if r.skewed]
    if skewed:
        return WireVerdict("False", Reason.VERSION_SKEW, _skew_message(skewed))
    if found:
        return WireVerdict("True", Reason.VERSIONS_COMPATIBLE, _compatible_message(found))
    if previous is not None:
        return WireVerdict(previous.status, previous.reason, previous.message)
    return WireVerdict(
        "Unknown",
        Reason.VERSIONS_NOT_REPORTED,
        f"no workload has reported its wire contract version yet ({_ours()})",
    )
