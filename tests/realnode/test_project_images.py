"""The project's own images, built here from images/*/Dockerfile (cpu flavour), run as pods on
the local cluster's real node: each starts and answers, the tiny engine serves SGLang's
``/health`` behind a Service another pod reaches by name, and a sandbox pod rendered by the
operator's own builder runs with its security context while the project's Kubernetes sandbox
provider runs commands in it through the real exec path (API server -> kubelet -> containerd).

The images come from ``agentrl dev prepare`` (step ``images``); the session cluster's ``up``
imports every finished archive into the node's containerd.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from tests.factories import make_job, sandbox_pods_of

from agentrl.api import AgentRLJob
from agentrl.devcluster import images
from agentrl.devcluster.node.config import REAL_NODE_LABELS, REAL_NODE_TAINT
from agentrl.devcluster.testing import ClusterHandle, Kubectl, wait_for
from agentrl.sandbox.kubernetes import (
    KubeApiTransport,
    KubernetesProvider,
)
from agentrl.sandbox.provider import SandboxRequest

pytestmark = [pytest.mark.apiserver, pytest.mark.realnode, pytest.mark.slow]

ON_REAL_NODE: dict[str, Any] = {
    "nodeSelector": {"agentrl.dev/real-node": REAL_NODE_LABELS["agentrl.dev/real-node"]},
    "tolerations": [
        {"key": REAL_NODE_TAINT["key"], "operator": "Exists", "effect": REAL_NODE_TAINT["effect"]}
    ],
}


@pytest.fixture(scope="module", autouse=True)
def project_images_on_the_node(cluster: ClusterHandle) -> None:
    """Every project image is built and present in the node's runtime (as the kubelet sees
    it: the node's status lists the images its runtime holds)."""
    wanted = {
        images.OPERATOR_IMAGE,
        images.TRAINER_IMAGE,
        images.ENGINE_IMAGE,
        images.SANDBOX_IMAGE,
    }
    unbuilt = [i.ref for i in images.IMAGES.values() if not images.finished(i)]
    assert not unbuilt, f"{unbuilt} not built: run 'agentrl dev prepare'"

    def missing() -> set[str]:
        nodes = cluster.kubectl().json("get", "nodes", "-l", "agentrl.dev/real-node=true")
        names = {
            n
            for node in nodes["items"]
            for i in node["status"].get("images", [])
            for n in i.get("names") or []
        }
        return {
            w for w in wanted if not any(n.endswith(w.removeprefix("localhost/")) for n in names)
        }

    # the kubelet reports its runtime's images in the node status every few seconds
    wait_for(
        lambda: not missing(), timeout=90, interval=2, what=f"the node to list {sorted(missing())}"
    )


def _pod(name: str, image: str, command: list[str], **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": image,
        "command": command,
        "imagePullPolicy": "Never",
    }
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"restartPolicy": "Never", "containers": [container], **ON_REAL_NODE, **spec},
    }


def _phase(kubectl: Kubectl, name: str) -> str:
    return str(kubectl.json("get", "pod", name)["status"].get("phase", ""))


@pytest.mark.parametrize(
    ("image", "user"),
    [
        (images.OPERATOR_IMAGE, "65532"),
        (images.TRAINER_IMAGE, "0"),
        (images.ENGINE_IMAGE, "0"),
    ],
    ids=["operator", "trainer", "engine"],
)
def test_each_agentrl_image_runs_agentrl_as_its_declared_user(
    kubectl: Kubectl, image: str, user: str
) -> None:
    name = "cli-" + image.split("/")[-1].split(":")[0]
    kubectl.apply(_pod(name, image, ["sh", "-c", "id -u; agentrl --help"]))
    wait_for(
        lambda: _phase(kubectl, name) in {"Succeeded", "Failed"},
        timeout=180,
        what=f"{name} to finish",
        interval=1,
    )
    logs = kubectl.run("logs", name).stdout
    assert _phase(kubectl, name) == "Succeeded", logs
    lines = logs.splitlines()
    assert lines[0] == user
    assert "Usage: agentrl" in logs and "trainer" in logs and "operator" in logs


def test_the_tiny_engine_serves_health_behind_a_service_another_pod_resolves(
    kubectl: Kubectl,
) -> None:
    engine = _pod(
        "tiny-engine",
        images.ENGINE_IMAGE,
        ["agentrl", "engine", "serve-tiny", "--host", "0.0.0.0", "--port", "30000"],
        container={
            "ports": [{"name": "http", "containerPort": 30000}],
            "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 2},
        },
    )
    engine["spec"]["restartPolicy"] = "Always"
    kubectl.apply(engine)
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "tiny-engine"},
            "spec": {
                "selector": {"app": "tiny-engine"},
                "ports": [{"port": 80, "targetPort": 30000}],
            },
        }
    )
    # the kubelet's own readiness probe of /health passes
    kubectl.run("wait", "--for=condition=Ready", "pod/tiny-engine", "--timeout=240s", timeout=260)
    namespace = kubectl.namespace
    client = _pod(
        "engine-client",
        images.SANDBOX_IMAGE,
        [
            "python3",
            "-c",
            "import json,urllib.request as u;"
            f"print(u.urlopen('http://tiny-engine.{namespace}.svc.cluster.local/health').status);"
            f"print(json.load(u.urlopen('http://tiny-engine/model_info')))",
        ],
    )
    kubectl.apply(client)
    wait_for(
        lambda: _phase(kubectl, "engine-client") in {"Succeeded", "Failed"},
        timeout=120,
        what="the client pod",
        interval=1,
    )
    out = kubectl.run("logs", "engine-client").stdout
    assert _phase(kubectl, "engine-client") == "Succeeded", out
    status, info = out.splitlines()[:2]
    assert status == "200"
    assert "model_path" in info


def _job(kubectl: Kubectl, name: str) -> AgentRLJob:
    kubectl.apply(
        make_job(name, None)
        .with_model_path("tiny")
        .with_sandbox(
            image=images.SANDBOX_IMAGE,
            cpu="100m",
            memory="128Mi",
            startupTimeoutSeconds=120,
            nodeSelector=ON_REAL_NODE["nodeSelector"],
            tolerations=ON_REAL_NODE["tolerations"],
        )
        .manifest()
    )
    return AgentRLJob.model_validate(kubectl.json("get", "arj", name))


@pytest.fixture
async def provider(
    cluster: ClusterHandle, kubectl: Kubectl, crd_installed: None
) -> AsyncIterator[tuple[KubernetesProvider, AgentRLJob]]:
    job = _job(kubectl, "real-sandbox")
    namespace = kubectl.namespace or "default"
    prov = KubernetesProvider(
        transport=KubeApiTransport(namespace, kubeconfig=str(cluster.kubeconfig)),
        pods=sandbox_pods_of(job, namespace=namespace),
        worker_id="realnode-test",
        creates_per_second=10,
        poll_seconds=0.2,
    )
    yield prov, job
    await prov.aclose()


async def test_a_sandbox_pod_from_the_operators_builder_runs_hardened_and_execs_for_real(
    kubectl: Kubectl, provider: tuple[KubernetesProvider, AgentRLJob]
) -> None:
    prov, _job_obj = provider
    sandbox = await prov.create(SandboxRequest(episode_id="ep-real-1", image=None))
    try:
        pod = kubectl.json("get", "pod", sandbox.id)
        node = kubectl.json("get", "node", pod["spec"]["nodeName"])
        assert node["metadata"]["labels"].get("agentrl.dev/real-node") == "true"
        # the commands below run in the container, through the kubelet's exec stream
        who = await sandbox.exec(
            "id -u; id -g; grep -E '^Cap(Eff|Bnd)' /proc/self/status", timeout=30
        )
        assert who.exit_code == 0, who.output
        uid, gid, cap_eff, cap_bnd = who.stdout.strip().splitlines()
        assert (uid, gid) == ("1000", "1000")
        assert cap_eff.split()[1] == "0000000000000000"
        assert cap_bnd.split()[1] == "0000000000000000"
        token = await sandbox.exec("ls /var/run/secrets/kubernetes.io/serviceaccount", timeout=30)
        assert token.exit_code != 0  # no ServiceAccount token mounted
        seccomp = await sandbox.exec("grep ^Seccomp: /proc/self/status", timeout=30)
        assert seccomp.stdout.split()[1] == "2"  # filter mode: RuntimeDefault is applied
        escalate = await sandbox.exec("grep ^NoNewPrivs: /proc/self/status", timeout=30)
        assert escalate.stdout.split()[1] == "1"
        # files go in and out through the same exec path, and the toy tasks' tools are there
        await sandbox.write_file("task/check.py", "print(sum(range(10)))\n")
        run = await sandbox.exec("python3 task/check.py && python3 -m pytest --version", timeout=60)
        assert run.exit_code == 0, run.output
        assert run.stdout.splitlines()[0] == "45"
        assert (await sandbox.read_file("task/check.py")).decode() == "print(sum(range(10)))\n"
        # a command that overruns its timeout is killed and reported as such
        slow = await sandbox.exec("sleep 30", timeout=2)
        assert slow.timed_out
    finally:
        await sandbox.close()
    wait_for(
        lambda: kubectl.run("get", "pod", sandbox.id, check=False).returncode != 0,
        timeout=90,
        what="the sandbox pod to be deleted",
        interval=1,
    )


def test_the_rendered_sandbox_pod_keeps_its_security_context_on_the_real_node(
    kubectl: Kubectl, crd_installed: None
) -> None:
    job = _job(kubectl, "render-sandbox")
    pods = sandbox_pods_of(job, namespace=kubectl.namespace or "default")
    manifest = pods.pod("render-sandbox-pod")
    kubectl.apply(json.dumps(manifest))
    kubectl.run(
        "wait", "--for=condition=Ready", "pod/render-sandbox-pod", "--timeout=120s", timeout=140
    )
    stored = kubectl.json("get", "pod", "render-sandbox-pod")
    spec = stored["spec"]
    assert spec["automountServiceAccountToken"] is False
    container = spec["containers"][0]
    context = {**spec.get("securityContext", {}), **container.get("securityContext", {})}
    assert context["runAsNonRoot"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    statuses = stored["status"]["containerStatuses"]
    assert statuses[0]["ready"] is True and statuses[0]["restartCount"] == 0
