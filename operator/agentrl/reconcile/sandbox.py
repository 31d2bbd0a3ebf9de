"""Sandbox pods and the NetworkPolicy that confines them.

:func:`sandbox_pod` is the hardened pod template of one sandbox. The operator does not create
sandbox pods: the kubernetes sandbox provider (``agentrl.sandbox.kubernetes``, inside the rollout
workers) calls it per episode with the task's image and a pod name, and creates the pod. The pod
is owned by the job (deleted with it, even while the operator is down), carries no
ServiceAccount token, runs as a non-root user with seccomp ``RuntimeDefault``, every capability
dropped and no privilege escalation, with CPU, memory and ephemeral storage from
``spec.sandbox``. Its ``activeDeadlineSeconds`` (startup + episode + verifier timeouts) reaps a
sandbox whose worker died without deleting it.

:func:`network_policy` (``NAME-sandbox``) denies all ingress and egress of sandbox pods. With
``spec.sandbox.allowInternet`` it allows DNS to kube-dns and public IPv4 addresses only: never
RFC 1918 ranges (cluster pods and services on most clusters), link-local (the cloud metadata
server) or carrier-grade NAT. Exec goes through the kubelet, not the pod network, so it needs no
ingress rule.
"""

from __future__ import annotations

from typing import Any, Final

from agentrl.api import AgentRLJob
from agentrl.reconcile import names
from agentrl.reconcile.constants import Component
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.labels import sandbox_pod_labels, sandbox_selector
from agentrl.reconcile.meta import object_meta, owner_reference

#: Keeps the sandbox container alive; every command arrives through exec.
DEFAULT_COMMAND: Final = ("sleep", "infinity")
#: The unprivileged user sandbox processes run as (task images often default to root, which
#: ``runAsNonRoot`` alone would refuse to start).
SANDBOX_UID: Final = 1000
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


def sandbox_pod(
    job: AgentRLJob,
    ctx: BuildContext,
    *,
    pod_name: str,
    image: str | None = None,
    command: tuple[str, ...] | list[str] = DEFAULT_COMMAND,
) -> dict[str, Any]:
    """The pod of one sandbox. ``pod_name`` should start with ``names.sandbox_pod_prefix``;
    ``image``: the task's image, or ``spec.sandbox.image`` when None."""
    sandbox = job.spec.sandbox
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
            "runAsNonRoot": True,
            "runAsUser": SANDBOX_UID,
            "runAsGroup": SANDBOX_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": "sandbox",
                "image": image or sandbox.image,
                "command": list(command),
                "resources": {"requests": dict(limits), "limits": dict(limits)},
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                    "runAsNonRoot": True,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
            }
        ],
    }
    if sandbox.runtime_class_name is not None:
        spec["runtimeClassName"] = sandbox.runtime_class_name
    if sandbox.node_selector:
        spec["nodeSelector"] = dict(sorted(sandbox.node_selector.items()))
    if sandbox.tolerations:
        spec["tolerations"] = [t.to_manifest() for t in sandbox.tolerations]
    if job.spec.dataset.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in job.spec.dataset.image_pull_secrets]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name,
            "namespace": ctx.namespace,
            "labels": sandbox_pod_labels(job),
            "ownerReferences": [owner_reference(job, ctx.uid)],
        },
        "spec": spec,
    }


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
