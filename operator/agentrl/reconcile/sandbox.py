"""Sandbox pods and the NetworkPolicy that confines them.

:func:`sandbox_pods` is the hardened pod template of one sandbox. The operator does not create
sandbox pods: it writes the template into ``runtime.yaml`` (``sandbox.pods``, a
:class:`~agentrl.api.wire.SandboxPods`), and the kubernetes sandbox provider
(``agentrl.sandbox.kubernetes``, inside the rollout workers) names a copy per episode, sets the
task's image and its own labels, and creates the pod (:func:`sandbox_pod` is that copy). The pod
is owned by the job (deleted with it, even while the operator is down), carries no
ServiceAccount token and no service links, runs with seccomp ``RuntimeDefault``, every
capability dropped and no privilege escalation, with CPU, memory and ephemeral storage from
``spec.sandbox``, and ``spec.sandbox.priorityClassName`` (the lowest of a job's classes, see
``agentrl.reconcile.priority``). Its ``activeDeadlineSeconds`` (startup + episode + verifier
timeouts) reaps a sandbox whose worker died without deleting it.

The user is the one thing that depends on the image, so ``spec.dataset.format`` picks a
:class:`SandboxProfile` (:data:`PROFILES`; the reasons are in docs/rollout.md):

- ``toy``: uid/gid 1000, ``runAsNonRoot``. The task writes its repository into an emptyDir the
  provider mounts at the workdir; nothing else of the image needs writing.
- ``swebench``, ``swesmith``, ``harbor``: uid/gid 0. These images keep the repository
  (``/testbed``), the conda environment (``/opt/miniconda3``) or the test and log directories
  (``/tests``, ``/logs``) root-owned, the harnesses run their evaluation as root, and git refuses
  a repository owned by another user. Root here has no capabilities at all: it writes those
  files because it owns them, not through ``CAP_DAC_OVERRIDE``, and cannot chown, setuid, bind
  privileged ports, load modules or mount. (The SWE-bench harness adds ``SYS_ADMIN`` for
  browser-based JavaScript suites; their log parsers are not supported, and it is not added.)
  A namespace enforcing PodSecurity ``restricted`` refuses these pods; ``baseline`` admits them.

``readOnlyRootFilesystem`` is off for every kind: the agent and the tests write outside the
repository (pytest's and Python's temporary files in ``/tmp``, caches in ``$HOME``, SWE-bench
eval scripts ``pip install -e .`` into the environment).

:func:`network_policy` (``NAME-sandbox``) denies all ingress and egress of sandbox pods. With
``spec.sandbox.allowInternet`` it allows DNS to kube-dns and public IPv4 addresses only: never
RFC 1918 ranges (cluster pods and services on most clusters), link-local (the cloud metadata
server) or carrier-grade NAT. Exec goes through the kubelet, not the pod network, so it needs no
ingress rule.
"""

from __future__ import annotations

from typing import Any, Final

from pydantic import BaseModel, ConfigDict

from agentrl.api import AgentRLJob
from agentrl.api.model import DatasetFormat
from agentrl.api.wire import SandboxPods
from agentrl.reconcile import names
from agentrl.reconcile.constants import Component
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.labels import sandbox_pod_labels, sandbox_selector
from agentrl.reconcile.meta import object_meta, owner_reference
from agentrl.reconcile.pods import node_placement, priority_class

#: Keeps the sandbox container alive; every command arrives through exec.
DEFAULT_COMMAND: Final = ("sleep", "infinity")
#: The unprivileged user sandbox processes of toy tasks run as (task images often default to
#: root, which ``runAsNonRoot`` alone would refuse to start).
SANDBOX_UID: Final = 1000


class SandboxProfile(BaseModel):
    """Who the sandbox's processes are, for one kind of task image."""

    model_config = ConfigDict(frozen=True)

    run_as_user: int
    run_as_group: int
    run_as_non_root: bool
    read_only_root_filesystem: bool = False


#: Toy tasks: the repository is written into an emptyDir; no need to be root.
UNPRIVILEGED: Final = SandboxProfile(
    run_as_user=SANDBOX_UID, run_as_group=SANDBOX_UID, run_as_non_root=True
)
#: SWE-bench, SWE-smith and Harbor images: root-owned repository and tools, root without any
#: capability.
IMAGE_ROOT: Final = SandboxProfile(run_as_user=0, run_as_group=0, run_as_non_root=False)
#: The profile per dataset format.
PROFILES: Final = {
    DatasetFormat.TOY: UNPRIVILEGED,
    DatasetFormat.SWEBENCH: IMAGE_ROOT,
    DatasetFormat.SWESMITH: IMAGE_ROOT,
    DatasetFormat.HARBOR: IMAGE_ROOT,
}


def sandbox_profile(job: AgentRLJob) -> SandboxProfile:
    """The profile ``spec.dataset.format`` selects."""
    return PROFILES[job.spec.dataset.format]
#: Address ranges sandboxes never reach, even with ``allowInternet``.
BLOCKED_CIDRS: Final = (
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "169.254.0.0/16",  # link-local: the cloud metadata server
    "100.64.0.0/10",  # carrier-grade NAT, used by some CNIs for pods
)


def sandbox_deadline_seconds(job: AgentRLJob) -> int:
    """Longest a sandbox may live: its startup, the episode and the verifier."""
    sandbox, rollout = job.spec.sandbox, job.spec.rollout
    return (
        sandbox.startup_timeout_seconds
        + rollout.episode_timeout_seconds
        + rollout.verifier_timeout_seconds
    )


def sandbox_pods(job: AgentRLJob, ctx: BuildContext) -> SandboxPods:
    """The sandbox pod template the operator hands the rollout workers (``runtime.yaml``)."""
    sandbox = job.spec.sandbox
    profile = sandbox_profile(job)
    limits = {
        "cpu": sandbox.cpu,
        "memory": sandbox.memory,
        "ephemeral-storage": sandbox.ephemeral_storage,
    }
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        # No service environment variables: they would advertise cluster services.
        "enableServiceLinks": False,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 5,
        "activeDeadlineSeconds": sandbox_deadline_seconds(job),
        "securityContext": {
            "runAsNonRoot": profile.run_as_non_root,
            "runAsUser": profile.run_as_user,
            "runAsGroup": profile.run_as_group,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": "sandbox",
                "image": sandbox.image,
                "command": list(DEFAULT_COMMAND),
                "resources": {"requests": dict(limits), "limits": dict(limits)},
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                    "runAsNonRoot": profile.run_as_non_root,
                    "readOnlyRootFilesystem": profile.read_only_root_filesystem,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
            }
        ],
    }
    if sandbox.runtime_class_name is not None:
        spec["runtimeClassName"] = sandbox.runtime_class_name
    spec.update(node_placement(sandbox.node_selector, sandbox.tolerations))
    spec.update(priority_class(sandbox.priority_class_name))
    if job.spec.dataset.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in job.spec.dataset.image_pull_secrets]
    return SandboxPods(
        name_prefix=names.sandbox_pod_prefix(job.metadata.name),
        selector=sandbox_selector(job),
        template={
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "namespace": ctx.namespace,
                "labels": sandbox_pod_labels(job),
                "ownerReferences": [owner_reference(job, ctx.uid)],
            },
            "spec": spec,
        },
    )


def sandbox_pod(
    job: AgentRLJob, ctx: BuildContext, *, pod_name: str, image: str | None = None
) -> dict[str, Any]:
    """One sandbox's pod as a worker makes it from :func:`sandbox_pods` (without the worker's
    own labels). ``image``: the task's image, or ``spec.sandbox.image`` when None."""
    return sandbox_pods(job, ctx).pod(pod_name, image)


def _egress_rules(job: AgentRLJob) -> list[dict[str, Any]]:
    if not job.spec.sandbox.allow_internet:
        return []
    dns = {
        "to": [
            {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                },
                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
            }
        ],
        "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
    }
    internet = {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": list(BLOCKED_CIDRS)}}]}
    return [dns, internet]


def network_policy(job: AgentRLJob, ctx: BuildContext) -> dict[str, Any]:
    """``NAME-sandbox``: default deny for sandbox pods; public internet only when allowed."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_meta(
            job, ctx, name=names.sandbox_policy(job.metadata.name), component=Component.SANDBOX
        ),
        "spec": {
            "podSelector": {"matchLabels": sandbox_selector(job)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": _egress_rules(job),
        },
    }
