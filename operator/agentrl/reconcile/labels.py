"""Labels and selectors of a job's children.

Every child carries the ``app.kubernetes.io/*`` labels, ``agentrl.dev/job`` and the job's own
``metadata.labels`` (the manifest promises they are copied to every child). Selectors use only
``agentrl.dev/job`` and ``app.kubernetes.io/component``: a selector is immutable on a
StatefulSet, Job and Deployment, so it must never depend on labels a user may edit.

Called by every builder, by the status computation (the sandbox selector string backs the
``/scale`` subresource) and by the kubernetes sandbox provider through ``sandbox.sandbox_pod``.
"""

from __future__ import annotations

from agentrl.api import AgentRLJob
from agentrl.reconcile.constants import (
    APP_NAME,
    FIELD_MANAGER,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_JOB,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_PART_OF,
    Component,
)


def selector(job: AgentRLJob, component: Component) -> dict[str, str]:
    """The immutable selector of one component's pods."""
    return {LABEL_JOB: job.metadata.name, LABEL_COMPONENT: component.value}


def job_selector(job: AgentRLJob) -> dict[str, str]:
    """Every pod of the job, whatever its component (the controller lists pods with it)."""
    return {LABEL_JOB: job.metadata.name}


def own_labels(job: AgentRLJob, component: Component) -> dict[str, str]:
    """The operator's labels of a child, without the user's."""
    return {
        LABEL_NAME: APP_NAME,
        LABEL_INSTANCE: job.metadata.name,
        LABEL_COMPONENT: component.value,
        LABEL_PART_OF: APP_NAME,
        LABEL_MANAGED_BY: FIELD_MANAGER,
        LABEL_JOB: job.metadata.name,
    }


def component_labels(job: AgentRLJob, component: Component) -> dict[str, str]:
    """All labels of a child (and of its pods): the user's labels, then ours, which win."""
    return {**job.metadata.labels, **own_labels(job, component)}


def sandbox_pod_labels(job: AgentRLJob) -> dict[str, str]:
    """Labels of a sandbox pod; they include :func:`sandbox_selector`, which the NetworkPolicy,
    the status counts and the ``/scale`` selector match."""
    return component_labels(job, Component.SANDBOX)


def sandbox_selector(job: AgentRLJob) -> dict[str, str]:
    """The sandbox pods' selector."""
    return selector(job, Component.SANDBOX)


def selector_string(labels: dict[str, str]) -> str:
    """A label selector in string form (``k=v,k=v``, keys sorted): what an HPA reads from
    ``status.sandbox.selector`` through the scale subresource."""
    return ",".join(f"{key}={labels[key]}" for key in sorted(labels))
