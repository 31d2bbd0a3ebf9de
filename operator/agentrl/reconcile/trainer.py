"""The trainer: Indexed Job ``NAME-trainer`` (one pod per node, rank = completion index) and its
headless Service ``NAME-trainer`` for rendezvous.

Pods of an Indexed Job get the hostname ``NAME-trainer-<index>``; with ``subdomain`` set to the
headless Service they resolve as ``NAME-trainer-<index>.NAME-trainer.<ns>.svc`` before they are
ready (``publishNotReadyAddresses``), so rank 0 is ``MASTER_ADDR`` for torch.distributed and the
Ray head the rollout workers join. NCCL/RCCL and Gloo are pinned to the interfaces of
``spec.trainer.network`` (otherwise they may pick a duplicate container address and hang).

Restarts are whole-group (see ``policies.trainer_restarts``): the Job runs with
``backoffLimit: 0`` so its first pod failure fails the attempt, a podFailurePolicy ignores node
disruptions (a drained node is not the trainer's fault), and the operator replaces the failed Job
with the next attempt, up to ``spec.trainer.backoffLimit``. The Job's ``activeDeadlineSeconds``
repeats the job's own deadline as a backstop for when the operator is down.

Called by ``children.desired_children``.
"""

from __future__ import annotations

from typing import Any, Final

from agentrl.api import AgentRLJob
from agentrl.api.wire import (
    CHECKPOINT_MOUNT_PATH,
    RAY_HEAD_PORT,
    TRAINER_MASTER_PORT,
    TRAINER_METRICS_PORT,
)
from agentrl.reconcile import names, prepull
from agentrl.reconcile.configmap import trainer_master_addr
from agentrl.reconcile.constants import (
    ANNOTATION_JOB_COMPLETION_INDEX,
    ANNOTATION_TRAINER_ATTEMPT,
    Component,
)
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.engine import gpu_node_placement
from agentrl.reconcile.labels import own_labels, selector
from agentrl.reconcile.meta import object_meta
from agentrl.reconcile.pods import (
    chat_template_volumes,
    checkpoint_mount,
    checkpoint_volume,
    config_mount,
    config_volume,
    field_env,
    gpu_resources,
    identity_env,
    model_volumes,
    priority_class,
    pull_secrets,
    sandbox_env,
    shm_mount,
    shm_volume,
)
from agentrl.reconcile.ray_auth import ray_auth_env
from agentrl.reconcile.rbac import rbac_objects, trainer_rules


def network_env(job: AgentRLJob) -> list[dict[str, Any]]:
    """NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME and NCCL_IB_HCA from ``spec.trainer.network``
    (RCCL reads the NCCL_* names); unset fields are left to the library."""
    network = job.spec.trainer.network
    pairs = [
        ("NCCL_SOCKET_IFNAME", network.nccl_socket_ifname),
        ("GLOO_SOCKET_IFNAME", network.gloo_socket_ifname),
        ("NCCL_IB_HCA", network.ib_hca),
    ]
    return [{"name": key, "value": value} for key, value in pairs if value is not None]


def trainer_env(job: AgentRLJob, ctx: BuildContext, *, attempt: int) -> list[dict[str, Any]]:
    """The trainer container's environment."""
    trainer = job.spec.trainer
    master = trainer_master_addr(job, ctx.namespace)
    return [
        *identity_env(),
        {"name": "AGENTRL_JOB_NAME", "value": job.metadata.name},
        {"name": "AGENTRL_TRAINER_ATTEMPT", "value": str(attempt)},
        {"name": "AGENTRL_CHECKPOINT_DIR", "value": CHECKPOINT_MOUNT_PATH},
        {"name": "MASTER_ADDR", "value": master},
        {"name": "MASTER_PORT", "value": str(TRAINER_MASTER_PORT)},
        {"name": "RAY_HEAD_ADDRESS", "value": f"{master}:{RAY_HEAD_PORT}"},
        {"name": "AGENTRL_METRICS_PORT", "value": str(TRAINER_METRICS_PORT)},
        {"name": "NNODES", "value": str(trainer.nodes)},
        {"name": "GPUS_PER_NODE", "value": str(trainer.gpus_per_node)},
        field_env("NODE_RANK", f"metadata.annotations['{ANNOTATION_JOB_COMPLETION_INDEX}']"),
        # Ray must not narrow HIP_VISIBLE_DEVICES under the device plugin's allocation.
        {"name": "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES", "value": "1"},
        *network_env(job),
        *sandbox_env(job),  # episodes run here with --no-ray
        *task_images_env(job),
        *ray_auth_env(job),  # the head, the driver and every rank: the job's Ray token
    ]


def task_images_env(job: AgentRLJob) -> list[dict[str, Any]]:
    """``AGENTRL_TASK_IMAGES_CONFIGMAP`` when pre-pull is on: the ConfigMap the driver writes the
    dataset's task images into (:mod:`agentrl.reconcile.prepull`)."""
    if not prepull.wanted(job):
        return []
    name = names.task_images(job.metadata.name)
    return [{"name": "AGENTRL_TASK_IMAGES_CONFIGMAP", "value": name}]


def trainer_rbac(job: AgentRLJob, ctx: BuildContext) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding ``NAME-trainer`` for the driver's progress."""
    return rbac_objects(
        job,
        ctx,
        name=names.trainer(job.metadata.name),
        component=Component.TRAINER,
        rules=trainer_rules(job, task_images=prepull.wanted(job)),
    )


def trainer_pod_spec(job: AgentRLJob, ctx: BuildContext, *, attempt: int) -> dict[str, Any]:
    """The trainer pod's spec."""
    trainer = job.spec.trainer
    model_vols, model_mounts = model_volumes(job)
    # The driver runs episodes itself when there are no rollout workers: their chat template.
    template_vols, template_mounts = chat_template_volumes(job)
    return {
        "subdomain": names.trainer(job.metadata.name),
        "restartPolicy": "Never",
        # SIGTERM (suspend, drain, deletion) → the driver finishes its step and checkpoints
        # (agentrl.trainer.stopping); SIGKILL only after this.
        "terminationGracePeriodSeconds": trainer.checkpoint.stop_grace_period_seconds,
        # The driver (rank 0) writes its progress on its own pod (agentrl.dev/progress), which
        # the operator lifts into status.trainer and status.rollout.
        "serviceAccountName": names.trainer(job.metadata.name),
        "automountServiceAccountToken": True,
        **gpu_node_placement(job, Component.TRAINER),
        **priority_class(trainer.priority_class_name),
        **pull_secrets(job),
        "containers": [
            {
                "name": "trainer",
                "image": trainer.image,
                # No command: the trainer image's entrypoint runs the driver (rank 0) or a rank.
                "env": trainer_env(job, ctx, attempt=attempt),
                # A failed trainer's last log lines become its termination message, which the
                # operator quotes when it restarts the trainer (the Job is then deleted).
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "ports": [
                    {"name": "rendezvous", "containerPort": TRAINER_MASTER_PORT},
                    {"name": "ray", "containerPort": RAY_HEAD_PORT},
                    # the driver's /metrics (rank 0), scraped by the chart's PodMonitor
                    {"name": "metrics", "containerPort": TRAINER_METRICS_PORT},
                ],
                "resources": gpu_resources(
                    cpu=trainer.cpu,
                    memory=trainer.memory,
                    gpu_resource=job.spec.inference.gpu_resource,
                    gpus=trainer.gpus_per_node,
                ),
                "volumeMounts": [
                    shm_mount(),
                    config_mount(),
                    checkpoint_mount(read_only=False),
                    *model_mounts,
                    *template_mounts,
                ],
            }
        ],
        # /dev/shm bounded by the pod's memory, like the host's would be.
        "volumes": [
            shm_volume(None),
            config_volume(job),
            checkpoint_volume(job),
            *model_vols,
            *template_vols,
        ],
    }


#: Pod failures that do not count against the attempt: the node was drained or the pod was
#: preempted, which says nothing about the trainer.
POD_FAILURE_POLICY: Final = {
    "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]
}


def trainer_job(
    job: AgentRLJob, ctx: BuildContext, *, attempt: int = 0, suspend: bool = False
) -> dict[str, Any]:
    """The trainer Job for ``attempt`` (0 first, +1 per restart); ``suspend`` when the job is
    suspended or finished."""
    trainer = job.spec.trainer
    name = names.trainer(job.metadata.name)
    spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": trainer.nodes,
        "parallelism": trainer.nodes,
        "backoffLimit": 0,
        "podFailurePolicy": {"rules": [dict(r) for r in POD_FAILURE_POLICY["rules"]]},
        "suspend": suspend,
        "template": {
            # Our labels only: a Job's template is immutable, so a label the user adds to the
            # job later must not make the next apply of a running attempt fail.
            "metadata": {"labels": own_labels(job, Component.TRAINER)},
            "spec": trainer_pod_spec(job, ctx, attempt=attempt),
        },
    }
    if job.spec.active_deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = job.spec.active_deadline_seconds
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": object_meta(
            job,
            ctx,
            name=name,
            component=Component.TRAINER,
            annotations={ANNOTATION_TRAINER_ATTEMPT: str(attempt)},
        ),
        "spec": spec,
    }


def headless_service(job: AgentRLJob, ctx: BuildContext) -> dict[str, Any]:
    """``NAME-trainer``: rendezvous DNS for every rank, resolvable before readiness."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(
            job, ctx, name=names.trainer(job.metadata.name), component=Component.TRAINER
        ),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector(job, Component.TRAINER),
            "ports": [
                {"name": "rendezvous", "port": TRAINER_MASTER_PORT, "protocol": "TCP"},
                {"name": "ray", "port": RAY_HEAD_PORT, "protocol": "TCP"},
            ],
        },
    }
