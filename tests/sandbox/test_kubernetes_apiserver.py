"""The kubernetes sandbox provider against a real API server (the local control plane).

create → exec → write_file/read_file → close goes through kube-apiserver: the pod is stored,
scheduled by kube-scheduler onto a kwok node and marked Running by kwok; exec travels as a
websocket on the pod's ``exec`` subresource, which the API server proxies to kwok, whose
ClusterExec runs the command on this machine. So a command's side effect shows up in the test's
own temporary directory, which is how these tests know it really ran. Reaping is checked by
label on the pods the API server holds.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentrl.api import AgentRLJob
from agentrl.devcluster.testing import ClusterHandle, Kubectl
from agentrl.sandbox.kubernetes import (
    EPISODE_LABEL,
    WORKER_LABEL,
    KubeApiTransport,
    KubernetesProvider,
)
from agentrl.sandbox.provider import SandboxRequest
from tests.factories import make_job, sandbox_pods_of

pytestmark = [pytest.mark.apiserver, pytest.mark.usefixtures("crd_installed")]


def create_job(kubectl: Kubectl, name: str) -> AgentRLJob:
    """An AgentRLJob stored in the test namespace (sandbox pods are owned by it: a pod whose
    owner does not exist would be garbage-collected under the test)."""
    kubectl.apply(
        make_job(name, None)
        .with_model_path("tiny")
        .with_rollout(episodeTimeoutSeconds=600, verifierTimeoutSeconds=300)
        .with_sandbox(cpu="100m", memory="128Mi", startupTimeoutSeconds=60)
        .manifest()
    )
    return AgentRLJob.model_validate(kubectl.json("get", "arj", name))


def make_provider(
    cluster: ClusterHandle, kubectl: Kubectl, job: AgentRLJob, worker: str
) -> KubernetesProvider:
    namespace = kubectl.namespace or "default"
    return KubernetesProvider(
        transport=KubeApiTransport(namespace, kubeconfig=str(cluster.kubeconfig)),
        pods=sandbox_pods_of(job, namespace=namespace),
        worker_id=worker,
        creates_per_second=50,
        poll_seconds=0.1,
    )


def pod_names(kubectl: Kubectl, selector: str) -> set[str]:
    pods = kubectl.json("get", "pods", "-l", selector)["items"]
    return {p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")}


def get_pod(kubectl: Kubectl, name: str) -> dict[str, Any] | None:
    proc = kubectl.run("get", "pod", name, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


@pytest.fixture
def job(kubectl: Kubectl) -> AgentRLJob:
    return create_job(kubectl, "swe")


@pytest.fixture
async def provider(
    cluster: ClusterHandle, kubectl: Kubectl, job: AgentRLJob
) -> AsyncIterator[KubernetesProvider]:
    provider = make_provider(cluster, kubectl, job, "rollout-0")
    yield provider
    await provider.aclose()


async def test_a_sandbox_is_a_running_pod_built_from_the_hardened_template(
    provider: KubernetesProvider, kubectl: Kubectl, job: AgentRLJob, tmp_path: Path
) -> None:
    workdir = str(tmp_path / "ws")
    sandbox = await provider.create(SandboxRequest(episode_id="task-1#0", workdir=workdir))
    try:
        pod = get_pod(kubectl, sandbox.id)
        assert pod is not None
        assert pod["status"]["phase"] == "Running"
        meta, spec = pod["metadata"], pod["spec"]
        assert sandbox.id.startswith("swe-sbx-")
        assert meta["labels"][WORKER_LABEL] == "rollout-0"
        assert meta["labels"][EPISODE_LABEL] == "task-1-0"  # '#' is not valid in a label value
        assert meta["labels"]["app.kubernetes.io/component"] == "sandbox"
        owner = meta["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["uid"]) == (
            "AgentRLJob",
            "swe",
            (job.metadata.model_extra or {})["uid"],
        )
        assert spec["automountServiceAccountToken"] is False
        assert spec["enableServiceLinks"] is False
        assert spec["restartPolicy"] == "Never"
        # startup 60 + episode 600 + verifier 300 seconds
        assert spec["activeDeadlineSeconds"] == 960
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] == 1000
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        container = spec["containers"][0]
        assert container["name"] == "sandbox"
        assert container["image"] == "python:3.11-slim"  # spec.sandbox.image's default
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["resources"]["limits"] == {
            "cpu": "100m",
            "memory": "128Mi",
            "ephemeral-storage": "10Gi",
        }
        assert container["workingDir"] == workdir
        assert container["volumeMounts"][0]["mountPath"] == workdir
        # scheduled by the real kube-scheduler onto a (kwok) node
        assert spec["nodeName"]
    finally:
        await sandbox.close()


async def test_exec_runs_through_the_exec_subresource_with_output_and_exit_code(
    provider: KubernetesProvider, tmp_path: Path
) -> None:
    workdir = tmp_path / "ws"
    workdir.mkdir()
    async with await provider.create(
        SandboxRequest(episode_id="e", workdir=str(workdir), env={"GREETING": "hello there"})
    ) as sandbox:
        result = await sandbox.exec(
            'echo "$GREETING"; echo oops >&2; pwd > where.txt; exit 3', timeout=30
        )
        assert (result.exit_code, result.stdout, result.stderr) == (3, "hello there\n", "oops\n")
        assert not result.timed_out
        # The command ran (kwok's local exec, on this machine) in the sandbox's workdir.
        assert (workdir / "where.txt").read_text() == f"{workdir}\n"

        ok = await sandbox.exec("printf 'a\\nb'", timeout=30)
        assert (ok.exit_code, ok.stdout, ok.ok) == (0, "a\nb", True)


async def test_a_command_past_its_timeout_is_killed_in_the_pod_and_reported(
    provider: KubernetesProvider, tmp_path: Path
) -> None:
    workdir = tmp_path / "ws"
    workdir.mkdir()
    async with await provider.create(
        SandboxRequest(episode_id="e", workdir=str(workdir))
    ) as sandbox:
        result = await sandbox.exec("sleep 30; touch finished", timeout=0.5)
        # coreutils timeout's exit status for a command it had to stop
        assert (result.exit_code, result.timed_out) == (124, True)
        assert not (workdir / "finished").exists()


async def test_a_file_written_into_the_sandbox_reads_back_byte_for_byte(
    provider: KubernetesProvider, tmp_path: Path
) -> None:
    workdir = tmp_path / "ws"
    # 100,000 bytes of every byte value: more than two 48 KiB write chunks.
    data = bytes(range(256)) * 390 + b"tail"
    async with await provider.create(
        SandboxRequest(episode_id="e", workdir=str(workdir))
    ) as sandbox:
        await sandbox.write_file("deep/dir/blob.bin", data)
        assert await sandbox.read_file("deep/dir/blob.bin") == data
        assert (workdir / "deep" / "dir" / "blob.bin").read_bytes() == data
        await sandbox.write_file("notes.txt", "héllo\n")
        assert await sandbox.read_file(str(workdir / "notes.txt")) == "héllo\n".encode()
        with pytest.raises(FileNotFoundError):
            await sandbox.read_file("missing.txt")


async def test_closing_the_sandbox_deletes_its_pod_from_the_api_server(
    provider: KubernetesProvider, kubectl: Kubectl, tmp_path: Path
) -> None:
    sandbox = await provider.create(SandboxRequest(episode_id="e", workdir=str(tmp_path)))
    assert get_pod(kubectl, sandbox.id) is not None
    await sandbox.close()
    assert get_pod(kubectl, sandbox.id) is None
    await sandbox.close()  # idempotent


async def test_a_restarted_worker_reaps_what_its_dead_incarnation_left_and_nothing_else(
    cluster: ClusterHandle, kubectl: Kubectl, job: AgentRLJob, tmp_path: Path
) -> None:
    other_job = create_job(kubectl, "other")
    request = SandboxRequest(episode_id="e", workdir=str(tmp_path))

    # The first incarnation of rollout-0 creates two sandboxes and dies without closing them.
    dead = make_provider(cluster, kubectl, job, "rollout-0")
    left = {(await dead.create(request)).id for _ in range(2)}
    await dead.aclose()
    # A sibling worker of the same job, and a worker of another job that has the same name.
    sibling = make_provider(cluster, kubectl, job, "rollout-1")
    sibling_pod = (await sibling.create(request)).id
    namesake = make_provider(cluster, kubectl, other_job, "rollout-0")
    namesake_pod = (await namesake.create(request)).id
    assert pod_names(kubectl, f"{WORKER_LABEL}=rollout-0") == {*left, namesake_pod}

    restarted = make_provider(cluster, kubectl, job, "rollout-0")
    try:
        fresh = await restarted.create(request)  # the first create reaps
        assert pod_names(kubectl, f"{WORKER_LABEL}=rollout-0") == {fresh.id, namesake_pod}
        assert pod_names(kubectl, f"{WORKER_LABEL}=rollout-1") == {sibling_pod}
        assert await restarted.reap() == 1  # only the fresh one is left to reap now
        assert pod_names(kubectl, f"{WORKER_LABEL}=rollout-0") == {namesake_pod}
    finally:
        await restarted.aclose()
        await sibling.aclose()
        await namesake.aclose()
