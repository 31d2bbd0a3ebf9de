"""The sandbox concurrency in effect: ``spec.sandbox.concurrency`` after the limits that apply
to it, with the name of the limit that binds.

Written into the ConfigMap the rollout tier reads (so ``kubectl scale`` reaches it) and into
``status.sandbox``. The limits: the E2B plan's concurrent-sandbox limit, and for pod sandboxes
the namespace's ResourceQuotas, which the controller lists and passes in as plain data
(``quotas.ResourceQuotaUsage``, see ``agentrl.reconcile.quotas``). The lowest binds and is named.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from agentrl.api import AgentRLJob, SandboxProvider
from agentrl.reconcile.quotas import ResourceQuotaUsage, sandbox_room


class EffectiveConcurrency(BaseModel):
    """Concurrency the rollout tier may run, and what capped it."""

    model_config = ConfigDict(frozen=True)

    value: int
    """Episodes (and sandboxes) in flight at once."""
    desired: int
    """``spec.sandbox.concurrency``."""
    limited_by: str | None = None
    """What holds ``value`` below ``desired`` (a field path or a state), None when nothing."""


def effective_concurrency(
    job: AgentRLJob,
    *,
    finished: bool = False,
    quotas: Sequence[ResourceQuotaUsage] = (),
    sandboxes_in_use: int = 0,
) -> EffectiveConcurrency:
    """The in-effect concurrency of ``job``: 0 while suspended or after it finished, else
    :func:`capped_concurrency`. Computed once per reconcile (``policies.suspend.workload_scale``,
    called by ``status.compute_status``) and handed to the children and the status from
    there."""
    desired = job.spec.sandbox.concurrency
    if job.spec.suspend:
        return EffectiveConcurrency(value=0, desired=desired, limited_by="spec.suspend")
    if finished:
        return EffectiveConcurrency(value=0, desired=desired, limited_by="finished")
    return capped_concurrency(job, quotas=quotas, sandboxes_in_use=sandboxes_in_use)


def capped_concurrency(
    job: AgentRLJob,
    *,
    quotas: Sequence[ResourceQuotaUsage] = (),
    sandboxes_in_use: int = 0,
    caps: Sequence[tuple[int, str]] = (),
) -> EffectiveConcurrency:
    """The spec's concurrency of a running ``job`` capped by the E2B plan's concurrent-sandbox
    limit and, for pod sandboxes, by what the namespace's ResourceQuotas admit
    (``sandboxes_in_use``: the job's sandbox pods the quotas already charge), then by the
    further ``caps`` (value, name) after those. The capacity planner (``agentrl.sim``) calls it
    with its own hypothetical caps and no quotas."""
    sandbox = job.spec.sandbox
    desired = sandbox.concurrency
    found: list[tuple[int, str]] = []
    provider_cap = sandbox.provider_cap()
    if provider_cap is not None:
        found.append(provider_cap)
    if sandbox.provider == SandboxProvider.KUBERNETES:
        room = sandbox_room(job, quotas, sandboxes_in_use=sandboxes_in_use)
        if room is not None:
            found.append((room.sandboxes, room.limited_by))
    found += caps
    # The first of equal caps is named: the provider's own limit before a quota.
    binding = min(found, key=lambda cap: cap[0], default=None)
    if binding is not None and binding[0] < desired:
        return EffectiveConcurrency(value=binding[0], desired=desired, limited_by=binding[1])
    return EffectiveConcurrency(value=desired, desired=desired)
