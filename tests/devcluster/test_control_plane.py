"""The local control plane is the real thing: the scheduler places GPU pods on GPU nodes and
explains why it cannot, the garbage collector deletes dependents, StatefulSets and Jobs run
under kwok's stages, and RBAC answers impersonated questions."""

from __future__ import annotations

import pytest

from agentrl.devcluster import stages
from agentrl.devcluster.testing import Kubectl, wait_for

pytestmark = pytest.mark.apiserver


def _deployment(name: str, gpus: int, annotations: dict[str, str] | None = None) -> dict:  # type: ignore[type-arg]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": annotations or {}},
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox",
                            "resources": {"limits": {"amd.com/gpu": str(gpus)}},
                        }
                    ]
                },
            },
        },
    }


def _pods(kubectl: Kubectl, selector: str) -> list[dict]:  # type: ignore[type-arg]
    return kubectl.json("get", "pods", "-l", selector)["items"]  # type: ignore[no-any-return]


def test_a_one_gpu_deployment_runs_on_a_gpu_node(kubectl: Kubectl) -> None:
    kubectl.apply(_deployment("one-gpu", 1))
    pods = wait_for(
        lambda: [p for p in _pods(kubectl, "app=one-gpu") if p["status"].get("phase") == "Running"],
        what="a Running pod",
    )
    node = kubectl.json("get", "node", pods[0]["spec"]["nodeName"])
    assert node["metadata"]["labels"]["amd.com/gpu.product-name"] == "AMD_Instinct_MI355X"


def test_a_deployment_wanting_more_gpus_than_any_node_stays_pending_with_the_reason(
    kubectl: Kubectl,
) -> None:
    kubectl.apply(_deployment("nine-gpus", 9))

    def unschedulable() -> str | None:
        for pod in _pods(kubectl, "app=nine-gpus"):
            for cond in pod["status"].get("conditions", []):
                if cond["type"] == "PodScheduled" and cond.get("reason") == "Unschedulable":
                    return str(cond["message"])
        return None

    message = wait_for(unschedulable, what="the scheduler's verdict")
    # 4 GPU nodes have 8 each (insufficient), 2 CPU nodes have none, the real node is tainted
    assert "0/7 nodes are available" in message
    assert "Insufficient amd.com/gpu" in message
    assert _pods(kubectl, "app=nine-gpus")[0]["status"]["phase"] == "Pending"


def test_deleting_an_owner_garbage_collects_its_dependents(kubectl: Kubectl) -> None:
    kubectl.run("create", "configmap", "owner")
    uid = kubectl.json("get", "configmap", "owner")["metadata"]["uid"]
    dependent = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "dependent",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}
            ],
        },
    }
    kubectl.apply(dependent)
    kubectl.run("delete", "configmap", "owner")
    wait_for(
        lambda: kubectl.run("get", "configmap", "dependent", check=False).returncode != 0,
        what="the garbage collector to delete the dependent",
    )


def test_a_statefulset_creates_its_pods_in_order(kubectl: Kubectl) -> None:
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 3,
            "serviceName": "web",
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "main", "image": "busybox"}]},
            },
        },
    }
    kubectl.apply(sts)
    wait_for(
        lambda: kubectl.json("get", "statefulset", "web")["status"].get("readyReplicas") == 3,
        what="3 ready replicas",
    )
    pods = sorted(_pods(kubectl, "app=web"), key=lambda p: p["metadata"]["creationTimestamp"])
    # OrderedReady: web-1 is created only once web-0 is Ready, and so on
    assert [p["metadata"]["name"] for p in pods] == ["web-0", "web-1", "web-2"]


def _batch_job(name: str, outcome: str) -> dict:  # type: ignore[type-arg]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": {stages.OUTCOME: outcome, stages.AFTER: "500ms"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "busybox"}],
                },
            },
        },
    }


def _job_condition(kubectl: Kubectl, name: str) -> str | None:
    for cond in kubectl.json("get", "job", name)["status"].get("conditions", []):
        if cond["type"] in ("Complete", "Failed") and cond["status"] == "True":
            return str(cond["type"])
    return None


def test_a_job_runs_to_completion_under_kwok_stages(kubectl: Kubectl) -> None:
    kubectl.apply(_batch_job("done", "Succeeded"))
    assert wait_for(lambda: _job_condition(kubectl, "done"), what="the Job to finish") == "Complete"
    assert kubectl.json("get", "job", "done")["status"]["succeeded"] == 1


def test_a_job_whose_pod_fails_is_failed(kubectl: Kubectl) -> None:
    kubectl.apply(_batch_job("broken", "Failed"))
    assert wait_for(lambda: _job_condition(kubectl, "broken"), what="the Job to fail") == "Failed"


def test_rbac_answers_impersonated_questions(kubectl: Kubectl) -> None:
    ns = kubectl.namespace
    assert ns is not None
    kubectl.run("create", "serviceaccount", "reader")
    kubectl.run("create", "role", "pod-reader", "--verb=get,list", "--resource=pods")
    kubectl.run(
        "create", "rolebinding", "reader", "--role=pod-reader", f"--serviceaccount={ns}:reader"
    )
    who = f"system:serviceaccount:{ns}:reader"

    def can(*args: str) -> str:
        proc = kubectl.run("auth", "can-i", *args, "--as", who, check=False)
        return proc.stdout.strip()

    wait_for(lambda: can("list", "pods") == "yes", what="the RoleBinding to take effect")
    assert can("delete", "pods") == "no"
    assert can("list", "secrets") == "no"
    assert can("list", "pods", "-n", "kube-system") == "no"


def test_nodes_carry_the_amd_node_labeller_labels(kubectl: Kubectl) -> None:
    out = kubectl.json("get", "nodes", "-l", "amd.com/gpu.product-name=AMD_Instinct_MI355X")
    assert len(out["items"]) == 4
    assert {n["status"]["allocatable"]["amd.com/gpu"] for n in out["items"]} == {"8"}
    assert all(
        any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
        for n in out["items"]
    )
