"""``metadata`` of a child: name, namespace, labels and the ownerReference to the job.

The ownerReference (``controller: true``, ``blockOwnerDeletion: true``) is what makes deletion
clean without a finalizer: the garbage collector removes every child, sandbox pods included,
when the job goes, even while the operator is down. ``blockOwnerDeletion`` needs the operator's
ServiceAccount to have ``update`` on ``agentrljobs/finalizers`` (the chart grants it).
"""

from __future__ import annotations

from typing import Any

from agentrl.api import API_VERSION, KIND, AgentRLJob
from agentrl.reconcile.constants import Component
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.labels import component_labels


def owner_reference(job: AgentRLJob, uid: str) -> dict[str, Any]:
    """The ownerReference every child carries."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job.metadata.name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def object_meta(
    job: AgentRLJob,
    ctx: BuildContext,
    *,
    name: str,
    component: Component,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Metadata of a namespaced child owned by the job."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ctx.namespace,
        "labels": component_labels(job, component),
        "ownerReferences": [owner_reference(job, ctx.uid)],
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta
