"""Namespace ResourceQuotas as a limit on sandbox concurrency: how many sandbox pods of a job
the quotas of its namespace still admit.

The controller lists the ResourceQuotas of the job's namespace, turns each into a
:class:`ResourceQuotaUsage` with :func:`quota_from_object` and passes them, with the number of the
job's sandbox pods the quota already charges (:func:`agentrl.reconcile.observed.sandboxes_charged`),
to ``concurrency.effective_concurrency``. That figure goes into the rollout ConfigMap and
``status.sandbox``, with ``limitedBy`` naming the quota and the resource that binds
(``ResourceQuota/team-quota requests.cpu``).

Why the operator does this rather than letting sandbox creations fail: a pod over quota is
refused at creation with 403 Forbidden, which the rollout tier would count as an infra error per
episode, retry, and fail again — work and noise with no progress. Lowering the concurrency in
effect admits only the episodes that fit, and says why.

One sandbox's charge per quota key follows ``sandbox.sandbox_pod``: requests equal limits for
``cpu``, ``memory`` and ``ephemeral-storage`` (so ``cpu``, ``requests.cpu`` and ``limits.cpu``
are all charged ``spec.sandbox.cpu``), and one ``pods``/``count/pods``. Keys a sandbox does not
use (GPUs, storage claims, services) never bind. A quota's free room is ``hard − used``; the
job's own live sandboxes are in ``used`` already, so the concurrency a quota admits is
``floor(free / per sandbox) + sandboxes already charged``.

Scopes: sandbox pods carry ``activeDeadlineSeconds`` (scope ``Terminating``), requests and
limits (``NotBestEffort``), ``spec.sandbox.priorityClassName`` (the chart's sandbox class unless
the job names its own; ``agentrl.reconcile.priority``) and no cross-namespace affinity; a quota
whose scopes they do not match does not limit them. A ``PriorityClass`` scope selector is matched
as the API server matches it: ``Exists`` when the pod has a class, ``In``/``NotIn`` on the
class's name (the empty name for a pod without one), ``DoesNotExist`` never.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from agentrl.api import AgentRLJob
from agentrl.api.quantities import parse_quantity

#: Slack when dividing parsed quantities (``"1.5"`` CPUs / ``"500m"`` is 3, not 2.9999…).
_EPSILON: Final = 1e-9

#: Scopes a sandbox pod is in (see the module docstring).
SANDBOX_SCOPES: Final = frozenset({"Terminating", "NotBestEffort"})
#: Scopes a sandbox pod is never in.
NOT_SANDBOX_SCOPES: Final = frozenset({"NotTerminating", "BestEffort", "CrossNamespacePodAffinity"})


class ScopeRequirement(BaseModel):
    """One ``spec.scopeSelector.matchExpressions`` entry of a ResourceQuota."""

    model_config = ConfigDict(frozen=True)

    scope_name: str
    operator: str
    values: tuple[str, ...] = ()


class ResourceQuotaUsage(BaseModel):
    """What a ResourceQuota allows and what is used of it, quantities parsed."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(min_length=1)
    """The ResourceQuota's name."""
    hard: dict[str, float] = Field(default_factory=dict)
    """``status.hard`` (else ``spec.hard``): the limits, by resource key."""
    used: dict[str, float] = Field(default_factory=dict)
    """``status.used``: what pods and objects in the namespace charge now."""
    scopes: tuple[str, ...] = ()
    """``spec.scopes``."""
    scope_selector: tuple[ScopeRequirement, ...] = ()
    """``spec.scopeSelector.matchExpressions``."""


class QuotaRoom(BaseModel):
    """The tightest quota on a job's sandboxes."""

    model_config = ConfigDict(frozen=True)

    sandboxes: int
    """Sandbox pods the quotas admit in all (those running included)."""
    limited_by: str
    """``ResourceQuota/NAME KEY``: the quota and resource that bind."""


def _quantities(raw: Mapping[str, Any] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in (raw or {}).items():
        try:
            out[str(key)] = parse_quantity(value)
        except ValueError:
            continue  # a key we cannot read cannot be checked; the API server still enforces it
    return out


def quota_from_object(obj: Mapping[str, Any]) -> ResourceQuotaUsage:
    """A ResourceQuota as the API server returns it → :class:`ResourceQuotaUsage`."""
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    expressions = (spec.get("scopeSelector") or {}).get("matchExpressions") or ()
    return ResourceQuotaUsage(
        name=str((obj.get("metadata") or {}).get("name", "")),
        hard=_quantities(status.get("hard") or spec.get("hard")),
        used=_quantities(status.get("used")),
        scopes=tuple(spec.get("scopes") or ()),
        scope_selector=tuple(
            ScopeRequirement(
                scope_name=str(e.get("scopeName", "")),
                operator=str(e.get("operator", "")),
                values=tuple(e.get("values") or ()),
            )
            for e in expressions
        ),
    )


def sandbox_charge(job: AgentRLJob) -> dict[str, float]:
    """What one sandbox pod of ``job`` charges, per quota key."""
    sandbox = job.spec.sandbox
    cpu = parse_quantity(sandbox.cpu)
    memory = parse_quantity(sandbox.memory)
    storage = parse_quantity(sandbox.ephemeral_storage)
    charge = {"pods": 1.0, "count/pods": 1.0}
    for key, value in (
        ("cpu", cpu),
        ("memory", memory),
        ("ephemeral-storage", storage),
    ):
        charge[key] = value
        charge[f"requests.{key}"] = value
        charge[f"limits.{key}"] = value
    return charge


def _scope_matches(scope: str) -> bool:
    return scope in SANDBOX_SCOPES


def _requirement_matches(req: ScopeRequirement, priority_class: str) -> bool:
    if req.scope_name == "PriorityClass":
        # A pod without a class is matched as the empty name (the API server's label set for
        # the scope always has the key, so DoesNotExist never matches).
        if req.operator == "In":
            return priority_class in req.values
        if req.operator == "NotIn":
            return priority_class not in req.values
        if req.operator == "Exists":
            return priority_class != ""
        return False
    if req.operator == "Exists":
        return _scope_matches(req.scope_name)
    if req.operator == "DoesNotExist":
        return not _scope_matches(req.scope_name)
    return False


def applies_to_sandboxes(quota: ResourceQuotaUsage, *, priority_class: str | None = None) -> bool:
    """Whether the quota's scopes select sandbox pods (every scope must match);
    ``priority_class``: the sandbox pods' PriorityClass (``spec.sandbox.priorityClassName``),
    None for none."""
    if any(not _scope_matches(s) for s in quota.scopes):
        return False
    return all(_requirement_matches(r, priority_class or "") for r in quota.scope_selector)


def sandbox_room(
    job: AgentRLJob, quotas: Iterable[ResourceQuotaUsage], *, sandboxes_in_use: int = 0
) -> QuotaRoom | None:
    """The most sandbox pods of ``job`` the quotas admit, and which quota key binds; None when
    no quota limits sandbox pods. ``sandboxes_in_use``: the job's sandbox pods the quotas charge
    now (:func:`agentrl.reconcile.observed.sandboxes_charged`)."""
    charge = sandbox_charge(job)
    best: QuotaRoom | None = None
    for quota in sorted(quotas, key=lambda q: q.name):
        if not applies_to_sandboxes(quota, priority_class=job.spec.sandbox.priority_class_name):
            continue
        for key in sorted(quota.hard):
            per = charge.get(key, 0.0)
            if per <= 0:
                continue
            free = quota.hard[key] - quota.used.get(key, 0.0)
            room = max(0, math.floor(free / per + _EPSILON) + sandboxes_in_use)
            if best is None or room < best.sandboxes:
                best = QuotaRoom(sandboxes=room, limited_by=f"ResourceQuota/{quota.name} {key}")
    return best


def quotas_from_objects(objects: Sequence[Mapping[str, Any]]) -> list[ResourceQuotaUsage]:
    """Every ResourceQuota listed in the namespace → :class:`ResourceQuotaUsage`."""
    return [quota_from_object(o) for o in objects]
