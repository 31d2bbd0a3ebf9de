"""The checkpoint PersistentVolumeClaim ``NAME-checkpoints``, made unless
``spec.trainer.checkpoint.volume`` names an existing claim.

ReadWriteMany: every trainer rank writes its shard of a distributed checkpoint, and engines on
other nodes read exported weights from it (``/update_weights_from_disk``). A cluster without a
ReadWriteMany storage class names its own volume instead. The claim is owned by the job, so it
is deleted with it; name a volume to keep checkpoints beyond the job.
"""

from __future__ import annotations

from typing import Any

from agentrl.api import AgentRLJob
from agentrl.reconcile import names
from agentrl.reconcile.constants import Component
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.meta import object_meta


def checkpoint_claim_name(job: AgentRLJob) -> str:
    """The claim trainer and engines mount at /checkpoints."""
    return job.spec.trainer.checkpoint.volume or names.checkpoints(job.metadata.name)


def checkpoint_pvc(job: AgentRLJob, ctx: BuildContext) -> dict[str, Any] | None:
    """The checkpoint PVC, or None when the spec names an existing volume."""
    checkpoint = job.spec.trainer.checkpoint
    if checkpoint.volume is not None:
        return None
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": checkpoint.size}},
    }
    if checkpoint.storage_class_name is not None:
        spec["storageClassName"] = checkpoint.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": object_meta(
            job, ctx, name=names.checkpoints(job.metadata.name), component=Component.CHECKPOINTS
        ),
        "spec": spec,
    }
