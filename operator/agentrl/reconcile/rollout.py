"""The rollout tier: Deployment ``NAME-rollout`` of rollout workers and their ServiceAccount,
Role and RoleBinding.

Rollout workers are Ray workers that join the Ray head on trainer rank 0; the driver places
rollout actors on them, and those actors run episodes and create sandboxes through the
kubernetes sandbox provider. That provider is the only reason the workers talk to the API
server, so their Role grants exactly its verbs on pods, ``pods/exec`` and ``pods/log`` in this
namespace (``rbac.sandbox_provider_rules``).

The model: a worker renders each turn with the model's own tokenizer and chat template, which it
loads from the ``tokenizer_path`` the engines report (``/get_model_info``), that is the engines'
``--model-path`` (``wire.model_path``). So the rollout pods mount ``spec.model.source``
exactly as the engine pods do, with the same builder (``pods.model_volumes``): with ``source.pvc``
the claim, read-only (volume and mount), at ``/models``. Only the tokenizer files are read
(``tokenizer_config.json``, ``tokenizer.json`` or ``tokenizer.model``, the chat template, and
``config.json`` when the tokenizer config does not name its class), never the weights. Without
``source.pvc`` there is nothing to mount: ``source.path`` is a directory inside the images, and
must then exist at the same path in the rollout image (the trainer's image unless the operator's
``--rollout-image`` is set) as in the engine image. A Hugging Face hub id that the engine would
download itself cannot work: the download lands in the engine pod's own filesystem, which is not
shared, and the workers load local files only. Either way a missing directory fails the worker
before its first episode, with ``hf_tokenizer.load_hf_turn_tokenizer``'s message naming these
fixes. A claim mounted by engine, trainer and rollout pods on several nodes must allow it
(``ReadOnlyMany`` or ``ReadWriteMany``), as it already must for engines on several nodes.

The chat template: with ``spec.model.chatTemplate.configMapKeyRef`` the pods mount that
ConfigMap, only its key, read-only at ``wire.CHAT_TEMPLATE_MOUNT_PATH``
(``pods.chat_template_volumes``), where the rollout reads it; a bundled template ships in the
image and a ``path`` template is in the model directory.

CPUs: ``ray start`` offers Ray ``--num-cpus`` equal to the pod's CPU request
(:func:`ray_cpus`, from ``spec.rollout.cpu``). Without it Ray counts the CPUs the
container sees, which with a request and no limit is the whole node (say 128). The rollout
workers' placement group (``ray_cluster.placement``: one ``{"CPU": 1}`` bundle per worker, SPREAD)
spreads only softly, so one such pod, for instance the first to join, could take every bundle
and run all the workers on a node where the scheduler reserved only its request. Offering the
request keeps a pod's workers within what was reserved for it.

Placement: ``spec.rollout.nodeSelector`` and ``tolerations`` (CPU node pools; on the local
cluster, the real node), and ``priorityClassName`` (``agentrl.reconcile.priority``).

Ray's object store: a memory-backed ``/dev/shm`` sized for it. Left to itself, Ray sizes the
store at 30% of the memory it sees — with a request and no limit, the whole node's — capped by
/dev/shm, and a container's /dev/shm is 64 MiB, so the store would go to /tmp on disk (Ray
warns "This will harm performance"). So the store is :func:`object_store_bytes`: Ray's own 30%
(``RAY_DEFAULT_OBJECT_STORE_MEMORY_PROPORTION``) of the pod's memory request
``spec.rollout.memory``, handed to ``ray start`` as its cap
(``RAY_DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES``), and /dev/shm is :func:`shm_size`: that plus
the 10% Ray itself advises. Both are derived from ``spec.rollout.memory``: a larger store
takes a larger request.

Replicas: ``spec.rollout.workers``, 0 while suspended or finished. The pod template does not
depend on the sandbox concurrency, so ``kubectl scale`` never restarts a worker: the workers
read the in-effect concurrency from the mounted ConfigMap.

Called by ``children.desired_children``.
"""

from __future__ import annotations

import math
from typing import Any, Final

from agentrl.api import AgentRLJob
from agentrl.api.quantities import parse_quantity
from agentrl.api.wire import RAY_HEAD_PORT, ROLLOUT_NODE_RESOURCE
from agentrl.reconcile import names
from agentrl.reconcile.configmap import trainer_master_addr
from agentrl.reconcile.constants import Component
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.labels import component_labels, selector
from agentrl.reconcile.meta import object_meta
from agentrl.reconcile.pods import (
    chat_template_volumes,
    config_mount,
    config_volume,
    identity_env,
    model_volumes,
    node_placement,
    priority_class,
    pull_secrets,
    sandbox_env,
    shm_mount,
    shm_volume,
)
from agentrl.reconcile.ray_auth import ray_auth_env
from agentrl.reconcile.rbac import rbac_objects, sandbox_provider_rules

#: The rollout worker's command: a verb of the agentrl CLI in the rollout (trainer) image.
RAY_JOIN_COMMAND: Final = ("agentrl", "ray", "join")
#: Share of a worker pod's memory request that Ray's object store gets: Ray's own default share
#: (``RAY_DEFAULT_OBJECT_STORE_MEMORY_PROPORTION``), of the pod's request instead of the node.
OBJECT_STORE_SHARE: Final = 0.3
#: /dev/shm over the object store: Ray's advice when it finds /dev/shm too small (a shm size of
#: 1.1 × the store), room for the other users of /dev/shm (Python's semaphores, torch).
SHM_HEADROOM: Final = 1.1
#: The variable ``ray start`` caps its default object store size with (bytes).
OBJECT_STORE_CAP_ENV: Final = "RAY_DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES"
_MIB: Final = 1024 * 1024


def object_store_bytes(job: AgentRLJob) -> int:
    """Ray's object store on a rollout worker pod: :data:`OBJECT_STORE_SHARE` of
    ``spec.rollout.memory``, in bytes."""
    return math.floor(parse_quantity(job.spec.rollout.memory) * OBJECT_STORE_SHARE)


def shm_size(job: AgentRLJob) -> str:
    """The worker pod's /dev/shm: :func:`object_store_bytes` × :data:`SHM_HEADROOM`, rounded
    up to whole MiB."""
    return f"{math.ceil(object_store_bytes(job) * SHM_HEADROOM / _MIB)}Mi"


def ray_cpus(job: AgentRLJob) -> int:
    """CPUs a worker pod offers Ray: its CPU request (``spec.rollout.cpu``) in whole CPUs
    (``ray start --num-cpus`` takes an integer), at least 1. Not the CPUs the container sees:
    without a limit that is the whole node."""
    return max(math.floor(parse_quantity(job.spec.rollout.cpu)), 1)


def worker_command(job: AgentRLJob) -> list[str]:
    """A rollout worker is a Ray node following the trainer's head (``agentrl ray join``: it
    waits for the head, which does not exist before trainer pod 0 runs, and joins each new head
    after a trainer restart); it offers no GPU and :func:`ray_cpus` CPUs, and room for as many
    rollout worker bundles (only rollout pods offer it)."""
    cpus = ray_cpus(job)
    return [
        *RAY_JOIN_COMMAND,
        "--address=$(RAY_HEAD_ADDRESS)",
        "--num-gpus=0",
        f"--num-cpus={cpus}",
        f'--resources={{"{ROLLOUT_NODE_RESOURCE}": {cpus}}}',
    ]


def worker_pod_spec(job: AgentRLJob, ctx: BuildContext) -> dict[str, Any]:
    """The rollout worker's pod spec."""
    master = trainer_master_addr(job, ctx.namespace)
    # The engines' model volume at the engines' path, read-only: the tokenizer's files.
    model_vols, model_mounts = model_volumes(job)
    template_vols, template_mounts = chat_template_volumes(job)
    return {
        "serviceAccountName": names.rollout(job.metadata.name),
        "automountServiceAccountToken": True,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        **pull_secrets(job),
        **node_placement(job.spec.rollout.node_selector, job.spec.rollout.tolerations),
        **priority_class(job.spec.rollout.priority_class_name),
        "containers": [
            {
                "name": "rollout",
                "image": ctx.rollout_image(job),
                "command": worker_command(job),
                "env": [
                    *identity_env(),
                    {"name": "AGENTRL_JOB_NAME", "value": job.metadata.name},
                    {"name": "RAY_HEAD_ADDRESS", "value": f"{master}:{RAY_HEAD_PORT}"},
                    *ray_auth_env(job),  # the head's token, or the worker cannot join
                    *sandbox_env(job),
                    # the object store /dev/shm is sized for, not 30% of the whole node
                    {"name": OBJECT_STORE_CAP_ENV, "value": str(object_store_bytes(job))},
                ],
                # no limits: asyncio episodes and tokenisation burst on CPU, and a CPU limit
                # would throttle every episode of the worker at once
                "resources": {
                    "requests": {"cpu": job.spec.rollout.cpu, "memory": job.spec.rollout.memory}
                },
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volumeMounts": [
                    shm_mount(),
                    config_mount(),
                    *model_mounts,
                    *template_mounts,
                ],
            }
        ],
        "volumes": [shm_volume(shm_size(job)), config_volume(job), *model_vols, *template_vols],
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
