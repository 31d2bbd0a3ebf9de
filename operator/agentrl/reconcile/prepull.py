"""The image pre-pull DaemonSets (``spec.sandbox.prePull``): pull the dataset's task images onto
every sandbox node before episodes need them, within the registry's pull budget.

A sandbox whose image is not on its node waits for the pull — tens of seconds to minutes for a
SWE-bench image — and the episode's startup timeout runs meanwhile; a registry's hourly pull
limit (Docker Hub: 100 per hour authenticated) turns a cold start of hundreds of sandboxes into
``ImagePullBackOff``. Pre-pulling moves that cost ahead of the run and paces it.

How one DaemonSet pulls: its pod runs one init container per image. The kubelet pulls an init
container's image before starting it, and init containers run one after another, so a node
pulls one image at a time. Each of those containers runs a static busybox, copied into a shared
``emptyDir`` by a first init container from :data:`DEFAULT_TOOL_IMAGE`, because task images
need not contain a shell or ``true`` (distroless, scratch). Then a tiny container sleeps, so the
pod turns Ready once every image is on the node: ``numberReady`` of the DaemonSet counts the
nodes that are done.

Chunks: a pod with thousands of init containers would pass the API server's object size limit,
so images are split into DaemonSets of at most :data:`IMAGES_PER_DAEMONSET`
(``NAME-prepull-0``, ``-1``, ...), which run side by side.

The pull budget (``prePull.maxPullsPerHour``, shared by all nodes and chunks): when every image
on every node fits in one hour's budget (``images × nodes ≤ maxPullsPerHour``) nothing waits;
otherwise each pull container sleeps after its pull for
``ceil(3600 × chunks × nodes / maxPullsPerHour)`` seconds, so the cluster's steady pull rate
stays within the budget (each node × chunk pulls once per interval; the first image of every
chunk starts at once). The busybox pull and the sandboxes' own pulls are not counted.

Where the task images come from: the dataset sits on a volume or in an image only the trainer
mounts, so the operator cannot read it. It creates an empty ConfigMap ``NAME-task-images``
(:func:`task_images_configmap`); the trainer's driver, once it has loaded the dataset, writes
the distinct task images there in the order it will draw their tasks (its ServiceAccount may
``get`` and ``patch`` that one ConfigMap and no other); the operator reads them back on its next
reconcile (:func:`read_task_images`) and pulls them after ``spec.sandbox.image`` and before
``prePull.images``. The operator applies the ConfigMap without a ``data`` field, so its
server-side apply never takes the trainer's list away.

Pure, like every builder: the controller passes the task images (read from that ConfigMap) and
the number of sandbox nodes (nodes matching ``spec.sandbox.nodeSelector``), applies the
DaemonSets this returns, deletes the job's pre-pull DaemonSets whose names are not among them,
and turns the DaemonSets' status into words with :func:`prepull_progress`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from pydantic import BaseModel, ConfigDict

from agentrl.api import AgentRLJob, SandboxProvider
from agentrl.api.wire import TASK_IMAGES_KEY
from agentrl.reconcile import names
from agentrl.reconcile.constants import Component
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.labels import component_labels, selector
from agentrl.reconcile.meta import object_meta
from agentrl.reconcile.pods import node_placement

#: Image of the busybox copied into every pull container (a static build: it runs in any
#: image). Pass another (a mirror) through ``tool_image``.
DEFAULT_TOOL_IMAGE: Final = "busybox:1.36-musl"
#: Images per DaemonSet: keeps one pod well under the API server's object size limit (~1.5 MB)
#: at about 0.5 kB per init container.
IMAGES_PER_DAEMONSET: Final = 100
#: Label telling the chunks apart (selectors of DaemonSets must not overlap).
LABEL_CHUNK: Final = "agentrl.dev/prepull-chunk"
#: Annotation on each DaemonSet: how many images it pulls (read back for progress).
ANNOTATION_IMAGES: Final = "agentrl.dev/prepull-images"
#: Annotation on each DaemonSet: seconds each pull container waits after its pull.
ANNOTATION_INTERVAL: Final = "agentrl.dev/prepull-interval-seconds"
#: Where the busybox copy lives in every container.
TOOLS_DIR: Final = "/agentrl-prepull"
#: The unprivileged user everything runs as (nobody).
PREPULL_UID: Final = 65534

_TOOLS_VOLUME: Final = "tools"
_BUSYBOX: Final = f"{TOOLS_DIR}/busybox"
#: Large enough to be forever, small enough for any ``sleep`` implementation (2^31 − 1 s).
_FOREVER_SECONDS: Final = "2147483647"
_RESOURCES: Final = {
    "requests": {"cpu": "10m", "memory": "16Mi"},
    "limits": {"cpu": "100m", "memory": "64Mi"},
}


def wanted(job: AgentRLJob) -> bool:
    """Pre-pull runs: ``prePull.enabled`` and sandboxes are pods (E2B and local sandboxes do
    not run on the cluster's nodes)."""
    sandbox = job.spec.sandbox
    return sandbox.pre_pull.enabled and sandbox.provider == SandboxProvider.KUBERNETES


def task_images_configmap(job: AgentRLJob, ctx: BuildContext) -> dict[str, Any]:
    """The ConfigMap ``NAME-task-images`` the trainer fills with the dataset's task images.
    It has no ``data``: the trainer owns that field, and the operator's apply leaves it alone."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(
            job, ctx, name=names.task_images(job.metadata.name), component=Component.PREPULL
        ),
    }


def read_task_images(configmap: Mapping[str, Any] | None) -> list[str]:
    """The task images listed in the ``NAME-task-images`` ConfigMap (as the API server returns
    it), each once, in order; empty while the trainer has not written them yet."""
    data = (configmap or {}).get("data") or {}
    lines = (line.strip() for line in str(data.get(TASK_IMAGES_KEY, "")).splitlines())
    return list(dict.fromkeys(line for line in lines if line))


def prepull_images(job: AgentRLJob, dataset_images: Iterable[str]) -> list[str]:
    """The images to pre-pull, each once, in order: ``spec.sandbox.image``, the dataset's task
    images, then ``prePull.images``."""
    ordered = [job.spec.sandbox.image, *dataset_images, *job.spec.sandbox.pre_pull.images]
    return list(dict.fromkeys(image for image in ordered if image))


def chunk_images(images: Sequence[str]) -> list[list[str]]:
    """``images`` in chunks of at most :data:`IMAGES_PER_DAEMONSET`."""
    return [
        list(images[i : i + IMAGES_PER_DAEMONSET])
        for i in range(0, len(images), IMAGES_PER_DAEMONSET)
    ]


def pull_interval_seconds(job: AgentRLJob, *, images: int, nodes: int, chunks: int) -> int:
    """Seconds each pull container waits after its pull: 0 when all pulls fit in one hour's
    budget, else the interval that keeps the steady rate within ``maxPullsPerHour``."""
    budget = job.spec.sandbox.pre_pull.max_pulls_per_hour
    if images * max(nodes, 1) <= budget:
        return 0
    return math.ceil(3600 * max(chunks, 1) * max(nodes, 1) / budget)


def _security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
    }


def _tools_mount(*, read_only: bool) -> dict[str, Any]:
    return {"name": _TOOLS_VOLUME, "mountPath": TOOLS_DIR, "readOnly": read_only}


def _pull_container(index: int, image: str, interval: int) -> dict[str, Any]:
    command = [_BUSYBOX, "sleep", str(interval)] if interval else [_BUSYBOX, "true"]
    return {
        "name": f"pull-{index}",
        "image": image,
        # A restarted pre-pull pod must not pull again (``Always`` is the default for :latest).
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "resources": _RESOURCES,
        "securityContext": _security_context(),
        "volumeMounts": [_tools_mount(read_only=True)],
    }


def _pod_spec(
    job: AgentRLJob, images: Sequence[str], interval: int, tool_image: str
) -> dict[str, Any]:
    tools = {
        "name": "tools",
        "image": tool_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/busybox", "cp", "/bin/busybox", _BUSYBOX],
        "resources": _RESOURCES,
        "securityContext": _security_context(),
        "volumeMounts": [_tools_mount(read_only=False)],
    }
    done = {
        "name": "done",
        "image": tool_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/busybox", "sleep", _FOREVER_SECONDS],
        "resources": _RESOURCES,
        "securityContext": _security_context(),
    }
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 1,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": PREPULL_UID,
            "runAsGroup": PREPULL_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "initContainers": [
            tools,
            *(_pull_container(i, image, interval) for i, image in enumerate(images)),
        ],
        "containers": [done],
        "volumes": [{"name": _TOOLS_VOLUME, "emptyDir": {"sizeLimit": "16Mi"}}],
    }
    spec.update(node_placement(job.spec.sandbox.node_selector, job.spec.sandbox.tolerations))
    if job.spec.dataset.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in job.spec.dataset.image_pull_secrets]
    return spec


def prepull_daemonsets(
    job: AgentRLJob,
    ctx: BuildContext,
    dataset_images: Sequence[str],
    *,
    nodes: int,
    tool_image: str = DEFAULT_TOOL_IMAGE,
) -> list[dict[str, Any]]:
    """The pre-pull DaemonSets of ``job``; empty unless ``prePull.enabled`` and sandboxes are
    pods (E2B and local sandboxes do not run on the cluster's nodes). ``dataset_images``: the
    task images the dataset names; ``nodes``: how many nodes match
    ``spec.sandbox.nodeSelector`` (for the pull budget)."""
    if not wanted(job):
        return []
    images = prepull_images(job, dataset_images)
    chunks = chunk_images(images)
    interval = pull_interval_seconds(job, images=len(images), nodes=nodes, chunks=len(chunks))
    out = []
    for number, chunk in enumerate(chunks):
        match = {**selector(job, Component.PREPULL), LABEL_CHUNK: str(number)}
        labels = {**component_labels(job, Component.PREPULL), LABEL_CHUNK: str(number)}
        meta = object_meta(
            job,
            ctx,
            name=names.prepull(job.metadata.name, number),
            component=Component.PREPULL,
            annotations={ANNOTATION_IMAGES: str(len(chunk)), ANNOTATION_INTERVAL: str(interval)},
        )
        meta["labels"][LABEL_CHUNK] = str(number)
        out.append(
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "metadata": meta,
                "spec": {
                    "selector": {"matchLabels": match},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": _pod_spec(job, chunk, interval, tool_image),
                    },
                },
            }
        )
    return out


class PrePullProgress(BaseModel):
    """How far pre-pulling has come, from the DaemonSets' status."""

    model_config = ConfigDict(frozen=True)

    images: int
    """Images to pull on each node."""
    nodes: int
    """Sandbox nodes the DaemonSets run on."""
    nodes_done: int
    """Nodes that hold every image."""
    done: bool
    """Every image is on every node."""
    message: str
    """The progress in one sentence (for the SandboxPoolReady condition or an Event)."""


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0


def _chunk_progress(ds: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """``(images, nodes, nodes done, pull interval)`` of one DaemonSet."""
    meta = ds.get("metadata") or {}
    status = ds.get("status") or {}
    annotations = meta.get("annotations") or {}
    images = int(annotations.get(ANNOTATION_IMAGES, "0") or 0)
    interval = int(annotations.get(ANNOTATION_INTERVAL, "0") or 0)
    nodes = _int(status.get("desiredNumberScheduled"))
    current = _int(status.get("observedGeneration")) == _int(meta.get("generation"))
    # A ready pod of an older template (fewer images) is not done with this one.
    done = min(_int(status.get("numberReady")), _int(status.get("updatedNumberScheduled")))
    return images, nodes, done if current else 0, interval


def prepull_progress(daemonsets: Sequence[Mapping[str, Any]]) -> PrePullProgress | None:
    """Progress of the job's pre-pull DaemonSets as read from the API server; None when there
    are none."""
    if not daemonsets:
        return None
    chunks = [_chunk_progress(ds) for ds in daemonsets]
    images = sum(c[0] for c in chunks)
    nodes = max(c[1] for c in chunks)
    interval = max(c[3] for c in chunks)
    if nodes == 0:
        return PrePullProgress(
            images=images,
            nodes=0,
            nodes_done=0,
            done=False,
            message=f"pre-pull of {images} images waits: no node matches "
            "spec.sandbox.nodeSelector yet",
        )
    nodes_done = min(c[2] for c in chunks)
    pulled = sum(c[0] * c[2] for c in chunks)
    share = pulled / (images * nodes) if images else 1.0
    done = nodes_done >= nodes
    message = (
        f"{images} images pre-pulled on all {nodes} sandbox nodes"
        if done
        else f"pre-pulling {images} images on {nodes} sandbox nodes: {math.floor(share * 100)}% "
        f"done, {nodes_done} of {nodes} nodes hold every image"
    )
    if interval and not done:
        message += f"; paced at one pull per node every {interval} s (prePull.maxPullsPerHour)"
    return PrePullProgress(
        images=images, nodes=nodes, nodes_done=nodes_done, done=done, message=message
    )
