"""Which PriorityClass each kind of pod of a job runs with: the job's own
``spec.<component>.priorityClassName``, else the operator's default for that kind (the Helm
chart's ``priorityClasses``, passed as ``agentrl operator --trainer-priority-class`` and so on),
else none.

The order the chart creates is trainer > engines > rollout workers > sandboxes: losing a trainer
pod costs a restart from the last checkpoint, an engine a model load and graph capture, a
rollout worker its running episodes, a sandbox one episode (retried as an infra error).

:func:`with_priority_classes` fills the operator's defaults into the job once per reconcile,
before anything is built (``controller.reconciler``), so every builder, the quota arithmetic
(``quotas``: a ResourceQuota scoped to PriorityClasses counts sandboxes by their class) and the
resolved spec in the ConfigMap read one figure from one place: the spec.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from agentrl.api import AgentRLJob
from agentrl.api.base import DNS_SUBDOMAIN_PATTERN

#: An optional PriorityClass name (a DNS subdomain).
_NAME = Field(default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)


class PriorityClasses(BaseModel):
    """The operator's default PriorityClass per kind of pod; None: no class."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    trainer: str | None = _NAME
    """Trainer pods (``spec.trainer.priorityClassName`` unset)."""
    engines: str | None = _NAME
    """Engine pods (``spec.inference.priorityClassName`` unset)."""
    rollout: str | None = _NAME
    """Rollout worker pods (``spec.rollout.priorityClassName`` unset)."""
    sandboxes: str | None = _NAME
    """Sandbox pods (``spec.sandbox.priorityClassName`` unset)."""


def with_priority_classes(job: AgentRLJob, defaults: PriorityClasses) -> AgentRLJob:
    """``job`` with each unset ``priorityClassName`` taken from ``defaults``; a job that names
    its own class keeps it. ``job`` itself is left as it is."""
    spec = job.spec
    pairs = (
        ("trainer", spec.trainer, defaults.trainer),
        ("inference", spec.inference, defaults.engines),
        ("rollout", spec.rollout, defaults.rollout),
        ("sandbox", spec.sandbox, defaults.sandboxes),
    )
    update = {
        field: part.model_copy(update={"priority_class_name": default})
        for field, part, default in pairs
        if part.priority_class_name is None and default is not None
    }
    if not update:
        return job
    return job.model_copy(update={"spec": spec.model_copy(update=update)})
