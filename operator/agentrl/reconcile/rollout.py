"""The rollout tier: Deployment ``NAME-rollout`` of rollout workers and their ServiceAccount,
Role and RoleBinding.

Rollout workers are Ray workers that join the Ray head on trainer rank 0; the driver places
rollout actors on them, and those actors run episodes and create sandboxes through the
kubernetes sandbox provider. That provider is the only reason the workers talk to the API
server, so their Role grants exactly its verbs on pods, ``pods/exec`` and ``pods/log`` in this
namespace (``rbac.sandbox_provider_rules``).

Replicas: ``spec.rollout.workers``, 0 while suspended or finished. The pod template does not
depend on the sandbox concurrency, so ``kubectl scale`` never restarts a worker: the workers
read the in-effect concurrency from the mounted ConfigMap.

Called by ``children.desired_children``.
"""

from __future__ import annotations

from typing import Any, Final

from agentrl.api import AgentRLJob
from agentrl.reconcile import names
from agentrl.reconcile.configmap import trainer_master_addr
from agentrl.reconcile.constants import RAY_HEAD_PORT, Component
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.labels import component_labels, selector
from agentrl.reconcile.meta import object_meta
from agentrl.reconcile.pods import config_mount, config_volume, identity_env, pull_secrets
from agentrl.reconcile.rbac import rbac_objects, sandbox_provider_rules

#: A rollout worker is a Ray worker joining the trainer's head; it offers no GPU.
WORKER_COMMAND: Final = [
    "ray",
    "start",
    "--block",
    "--address=$(RAY_HEAD_ADDRESS)",
    "--num-gpus=0",
]
#: Requests of one worker (no limits: asyncio episodes and tokenisation burst on CPU, and a
#: CPU limit would throttle every episode of the worker at once).
WORKER_REQUESTS: Final = {"cpu": "2", "memory": "4Gi"}


def worker_pod_spec(job: AgentRLJob, ctx: BuildContext) -> dict[str, Any]:
    """The rollout worker's pod spec."""
    master = trainer_master_addr(job, ctx.namespace)
    return {
        "serviceAccountName": names.rollout(job.metadata.name),
        "automountServiceAccountToken": True,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        **pull_secrets(job),
        "containers": [
            {
                "name": "rollout",
                "image": ctx.rollout_image(job),
                "command": list(WORKER_COMMAND),
                "env": [
                    *identity_env(),
                    {"name": "AGENTRL_JOB_NAME", "value": job.metadata.name},
                    {"name": "RAY_HEAD_ADDRESS", "value": f"{master}:{RAY_HEAD_PORT}"},
                ],
                "resources": {"requests": dict(WORKER_REQUESTS)},
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volumeMounts": [config_mount()],
            }
        ],
        "volumes": [config_volume(job)],
    }


def deployment(job: AgentRLJob, ctx: BuildContext, *, replicas: int) -> dict[str, Any]:
    """The rollout Deployment at ``replicas``."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(
            job, ctx, name=names.rollout(job.metadata.name), component=Component.ROLLOUT
        ),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector(job, Component.ROLLOUT)},
            "template": {
                "metadata": {"labels": component_labels(job, Component.ROLLOUT)},
                "spec": worker_pod_spec(job, ctx),
            },
        },
    }


def rollout_rbac(job: AgentRLJob, ctx: BuildContext) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding ``NAME-rollout`` for the sandbox provider."""
    return rbac_objects(
        job,
        ctx,
        name=names.rollout(job.metadata.name),
        component=Component.ROLLOUT,
        rules=sandbox_provider_rules(),
    )
