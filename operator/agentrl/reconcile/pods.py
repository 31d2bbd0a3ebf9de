"""Pieces shared by the pod templates of engines, trainer and rollout workers: environment
lists, the ConfigMap, checkpoint, model, chat template and /dev/shm volumes.

Kept apart from the builders so that the same volume is spelled the same way in every pod.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.api import AgentRLJob
from agentrl.api.engine import Toleration
from agentrl.api.sandbox import SandboxProvider
from agentrl.api.wire import (
    CHAT_TEMPLATE_MOUNT_PATH,
    CHECKPOINT_MOUNT_PATH,
    E2B_API_KEY_ENV,
    MODEL_MOUNT_PATH,
    SPEC_FILE,
    SPEC_MOUNT_PATH,
    config_map_name,
)
from agentrl.reconcile.pvc import checkpoint_claim_name

CONFIG_VOLUME = "config"
CHECKPOINT_VOLUME = "checkpoints"
MODEL_VOLUME = "model"
CHAT_TEMPLATE_VOLUME = "chat-template"
SHM_VOLUME = "dshm"

#: Env var every workload reads to find the resolved manifest.
CONFIG_ENV = "AGENTRL_CONFIG"


def env_list(values: Mapping[str, str]) -> list[dict[str, Any]]:
    """``{"A": "1"}`` → ``[{"name": "A", "value": "1"}]``, in the mapping's order."""
    return [{"name": key, "value": value} for key, value in values.items()]


def field_env(name: str, field_path: str) -> dict[str, Any]:
    """An env var from the downward API (``metadata.name``, an annotation, ...)."""
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def identity_env() -> list[dict[str, Any]]:
    """POD_NAME, POD_NAMESPACE and the config path, which every workload reads."""
    return [
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        {"name": CONFIG_ENV, "value": SPEC_FILE},
    ]


def sandbox_env(job: AgentRLJob) -> list[dict[str, Any]]:
    """What the sandbox provider reads from the environment of the pods that run episodes:
    with ``provider: e2b``, :data:`E2B_API_KEY_ENV` from ``spec.sandbox.e2b.apiKeySecretRef``
    (the key never appears in the pod spec or the ConfigMap); nothing otherwise."""
    e2b = job.spec.sandbox.e2b
    if job.spec.sandbox.provider != SandboxProvider.E2B or e2b is None:
        return []
    ref = e2b.api_key_secret_ref
    return [
        {
            "name": E2B_API_KEY_ENV,
            "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}},
        }
    ]


def config_volume(job: AgentRLJob) -> dict[str, Any]:
    """The job's ConfigMap as a volume."""
    return {"name": CONFIG_VOLUME, "configMap": {"name": config_map_name(job.metadata.name)}}


def config_mount() -> dict[str, Any]:
    """The ConfigMap mounted read-only where the workloads look for it."""
    return {"name": CONFIG_VOLUME, "mountPath": SPEC_MOUNT_PATH, "readOnly": True}


def checkpoint_volume(job: AgentRLJob) -> dict[str, Any]:
    """The checkpoint claim as a volume."""
    return {
        "name": CHECKPOINT_VOLUME,
        "persistentVolumeClaim": {"claimName": checkpoint_claim_name(job)},
    }


def checkpoint_mount(*, read_only: bool) -> dict[str, Any]:
    """The checkpoint volume at /checkpoints."""
    return {"name": CHECKPOINT_VOLUME, "mountPath": CHECKPOINT_MOUNT_PATH, "readOnly": read_only}


def model_volumes(job: AgentRLJob) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts) for ``spec.model.source.pvc``, read-only at /models; empty without.

    The one spelling of the model volume in every pod that reads the model: engines (weights),
    trainer (weights) and rollout workers (tokenizer files only), so ``wire.model_path``
    names the same directory in all of them. Without ``source.pvc`` the path is inside the
    images and there is nothing to mount."""
    pvc = job.spec.model.source.pvc
    if pvc is None:
        return [], []
    volume = {"name": MODEL_VOLUME, "persistentVolumeClaim": {"claimName": pvc, "readOnly": True}}
    mount = {"name": MODEL_VOLUME, "mountPath": MODEL_MOUNT_PATH, "readOnly": True}
    return [volume], [mount]


def chat_template_volumes(job: AgentRLJob) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts) for ``spec.model.chatTemplate.configMapKeyRef``: that ConfigMap with
    only its key, as a file named by the key, read-only at :data:`CHAT_TEMPLATE_MOUNT_PATH`;
    empty for the other template sources (bundled templates ship in the image, ``path`` is in
    the model directory). For the pods that render episodes (rollout workers, trainer)."""
    template = job.spec.model.chat_template
    ref = template.config_map_key_ref if template is not None else None
    if ref is None:
        return [], []
    volume = {
        "name": CHAT_TEMPLATE_VOLUME,
        "configMap": {"name": ref.name, "items": [{"key": ref.key, "path": ref.key}]},
    }
    mount = {"name": CHAT_TEMPLATE_VOLUME, "mountPath": CHAT_TEMPLATE_MOUNT_PATH, "readOnly": True}
    return [volume], [mount]


def shm_volume(size: str | None) -> dict[str, Any]:
    """A memory-backed /dev/shm (the container runtime's default is 64 MiB, far too small for
    RCCL, PyTorch's shared-memory tensors and Ray's object store). ``size``: its
    ``sizeLimit``; None bounds it by the pod's memory only. Its pages count as the pod's
    memory."""
    empty_dir: dict[str, Any] = {"medium": "Memory"}
    if size is not None:
        empty_dir["sizeLimit"] = size
    return {"name": SHM_VOLUME, "emptyDir": empty_dir}


def shm_mount() -> dict[str, Any]:
    """/dev/shm."""
    return {"name": SHM_VOLUME, "mountPath": "/dev/shm"}


def gpu_resources(*, cpu: str, memory: str, gpu_resource: str, gpus: int) -> dict[str, Any]:
    """Requests for CPU and memory; the GPU in requests and limits (an extended resource must
    have them equal). No CPU or memory limit: a GPU pod owns its node's share and a CPU limit
    would throttle the data loader and tokenizer threads."""
    requests: dict[str, Any] = {"cpu": cpu, "memory": memory}
    resources: dict[str, Any] = {"requests": requests}
    if gpus > 0:
        requests[gpu_resource] = str(gpus)
        resources["limits"] = {gpu_resource: str(gpus)}
    return resources


def node_placement(
    node_selector: Mapping[str, str], tolerations: Sequence[Toleration]
) -> dict[str, Any]:
    """``nodeSelector`` (keys sorted: deterministic) and ``tolerations`` of a pod spec, each
    only when set (sandbox, pre-pull and rollout worker pods)."""
    out: dict[str, Any] = {}
    if node_selector:
        out["nodeSelector"] = dict(sorted(node_selector.items()))
    if tolerations:
        out["tolerations"] = [t.to_manifest() for t in tolerations]
    return out


def priority_class(name: str | None) -> dict[str, Any]:
    """``priorityClassName`` of a pod spec when a class is set (``spec.<component>.
    priorityClassName``, the operator's default filled in by ``priority.with_priority_classes``);
    nothing otherwise, so the cluster's default applies."""
    return {"priorityClassName": name} if name is not None else {}


def pull_secrets(job: AgentRLJob) -> dict[str, Any]:
    """``imagePullSecrets`` of the workload pods (engine, trainer, rollout), when any."""
    if not job.spec.image_pull_secrets:
        return {}
    return {"imagePullSecrets": [{"name": s} for s in job.spec.image_pull_secrets]}
