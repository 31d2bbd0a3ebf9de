"""The sandbox profiles as the real API server admits them (PodSecurity admission is built into
kube-apiserver): a toy sandbox pod passes the ``restricted`` standard; a SWE-bench one (root,
no capabilities) is refused by ``restricted`` for running as root and nothing else, and
admitted by ``baseline``. And a SWE-bench sandbox created by the kubernetes provider runs as a
pod with that profile."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from agentrl.api import AgentRLJob
from agentrl.devcluster.testing import ClusterHandle, Kubectl
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.sandbox import sandbox_pod
from agentrl.sandbox.kubernetes import (
    KubeApiTransport,
    KubernetesProvider,
)
from agentrl.sandbox.provider import SandboxRequest
from tests.factories import make_job, sandbox_pods_of

pytestmark = [pytest.mark.apiserver, pytest.mark.usefixtures("crd_installed")]

IMAGE = "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"


def _job(kubectl: Kubectl, name: str, format_: str) -> AgentRLJob:
    factory = make_job(name, None).with_model_path("tiny").with_dataset(format=format_)
    if format_ != "toy":
        factory.with_dataset(path="/data/tasks.jsonl")
    kubectl.apply(
        factory.with_rollout(episodeTimeoutSeconds=600, verifierTimeoutSeconds=300)
        .with_sandbox(cpu="100m", memory="128Mi", startupTimeoutSeconds=60)
        .manifest()
    )
    return AgentRLJob.model_validate(kubectl.json("get", "arj", name))


def _enforce(cluster: ClusterHandle, kubectl: Kubectl, level: str) -> None:
    cluster.kubectl().run(
        "label",
        "namespace",
        kubectl.namespace or "default",
        f"pod-security.kubernetes.io/enforce={level}",
        "--overwrite",
    )


def _dry_run(kubectl: Kubectl, job: AgentRLJob) -> Any:
    ctx = BuildContext.for_job(job, namespace=kubectl.namespace, uid=job.metadata.uid)
    pod = sandbox_pod(job, ctx, pod_name=f"{job.metadata.name}-sbx-1", image=IMAGE)
    return kubectl.run(
        "create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(pod), check=False
    )


def test_restricted_admits_the_toy_profile_and_refuses_only_the_root_of_the_swe_one(
    cluster: ClusterHandle, kubectl: Kubectl
) -> None:
    toy, swe = _job(kubectl, "toy", "toy"), _job(kubectl, "swe", "swebench")
    _enforce(cluster, kubectl, "restricted")
    assert _dry_run(kubectl, toy).returncode == 0
    refused = _dry_run(kubectl, swe)
    assert refused.returncode != 0
    message = " ".join(refused.stderr.split())
    assert 'violates PodSecurity "restricted:latest"' in message
    # root is the only violation: capabilities, escalation and seccomp pass the standard
    assert "runAsNonRoot != true" in message and "runAsUser=0" in message
    for other in ("allowPrivilegeEscalation", "unrestricted capabilities", "seccompProfile"):
        assert other not in message, message


def test_baseline_admits_the_swe_profile(cluster: ClusterHandle, kubectl: Kubectl) -> None:
    swe = _job(kubectl, "swe", "swebench")
    _enforce(cluster, kubectl, "baseline")
    admitted = _dry_run(kubectl, swe)
    assert admitted.returncode == 0, admitted.stderr


async def test_a_swebench_sandbox_runs_as_a_root_pod_without_capabilities(
    cluster: ClusterHandle, kubectl: Kubectl
) -> None:
    job = _job(kubectl, "swe", "swebench")
    namespace = kubectl.namespace or "default"
    provider = KubernetesProvider(
        transport=KubeApiTransport(namespace, kubeconfig=str(cluster.kubeconfig)),
        pods=sandbox_pods_of(job, namespace=namespace),
        worker_id="rollout-0",
        creates_per_second=50,
        poll_seconds=0.1,
    )
    try:
        request = SandboxRequest(episode_id="django-1", image=IMAGE, workdir="/testbed")
        async with await provider.create(request) as box:
            pod = json.loads(kubectl.run("get", "pod", box.id, "-o", "json").stdout)
            assert pod["status"]["phase"] == "Running"
            spec = pod["spec"]
            assert spec["securityContext"]["runAsUser"] == 0
            assert spec["securityContext"]["runAsNonRoot"] is False
            (container,) = spec["containers"]
            assert container["image"] == IMAGE
            assert container["workingDir"] == "/testbed"
            assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            # an image of its own: no emptyDir over /testbed (that would hide the repository)
            assert "volumes" not in spec
    finally:
        await provider.aclose()
