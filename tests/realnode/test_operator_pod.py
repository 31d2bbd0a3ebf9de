"""The chart installs the operator as a pod on the real node, from the operator image built
here: the kubelet starts it, its own probes on the health port make it Ready, and it reconciles
a job from inside the cluster with its own ServiceAccount (the in-cluster API address through
kube-proxy, the chart's RBAC, no kubeconfig of ours)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.chart.charting import CHART, Helm, unique_release

from agentrl.devcluster import images
from agentrl.devcluster.node.config import REAL_NODE_TAINT
from agentrl.devcluster.testing import ClusterHandle, Kubectl, wait_for

pytestmark = [pytest.mark.apiserver, pytest.mark.realnode, pytest.mark.slow]


@pytest.fixture
def operator_pod_release(
    cluster: ClusterHandle,
    cluster_helm: Helm,
    kubectl: Kubectl,
    crd_installed: None,
    tmp_path: Path,
) -> Iterator[str]:
    assert images.OPERATOR_IMAGE.rsplit(":", 1)[0] == "localhost/agentrl/operator"
    repository, tag = images.OPERATOR_IMAGE.rsplit(":", 1)
    values = {
        # the CRD is cluster-wide and applied from crds/ by the suite's fixture
        "crds": {"install": False},
        "watchNamespaces": [kubectl.namespace],
        "operator": {
            "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
            "nodeSelector": {"agentrl.dev/real-node": "true"},
            "tolerations": [
                {
                    "key": REAL_NODE_TAINT["key"],
                    "operator": "Exists",
                    "effect": REAL_NODE_TAINT["effect"],
                }
            ],
        },
    }
    path = tmp_path / "values.json"
    path.write_text(json.dumps(values))
    release = unique_release("op")
    cluster_helm.run(
        "install",
        release,
        str(CHART),
        "--namespace",
        str(kubectl.namespace),
        "--values",
        str(path),
        "--wait",
        "--timeout",
        "240s",
        timeout=300,
    )
    yield release
    cluster_helm.run(
        "uninstall",
        release,
        "--namespace",
        str(kubectl.namespace),
        "--wait",
        check=False,
        timeout=180,
    )


def test_the_chart_runs_the_operator_as_a_pod_that_reconciles_from_inside(
    kubectl: Kubectl, operator_pod_release: str
) -> None:
    deployment = f"{operator_pod_release}-agentrl"
    pods = kubectl.json("get", "pods", "-l", "app.kubernetes.io/name=agentrl")["items"]
    assert len(pods) == 1
    pod = pods[0]
    node = kubectl.json("get", "node", pod["spec"]["nodeName"])
    assert node["metadata"]["labels"]["agentrl.dev/real-node"] == "true"
    status = pod["status"]["containerStatuses"][0]
    # Ready through the kubelet's own probes of /healthz, and started exactly once
    assert status["ready"] is True and status["restartCount"] == 0
    assert status["image"].endswith(images.OPERATOR_IMAGE.removeprefix("localhost/"))
    assert pod["spec"]["serviceAccountName"] == deployment
    assert kubectl.json("get", "deployment", deployment)["status"]["availableReplicas"] == 1

    kubectl.apply(
        {
            "apiVersion": "agentrl.dev/v1alpha1",
            "kind": "AgentRLJob",
            "metadata": {"name": "from-inside"},
            "spec": {"model": {"source": {"path": "tiny"}}},
        }
    )
    # nobody else watches this namespace: the operator pod is the one writing these
    job = wait_for(
        lambda: (
            (j := kubectl.json("get", "arj", "from-inside"))
            .get("status", {})
            .get("observedGeneration")
            and j
        ),
        timeout=120,
        interval=1,
        what="the operator pod to reconcile the job",
    )
    assert {c["type"] for c in job["status"]["conditions"]} >= {"Ready", "EnginesReady"}
    config = kubectl.json("get", "configmap", "from-inside-config")
    owner = config["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("AgentRLJob", "from-inside")
    logs = kubectl.run("logs", f"deployment/{deployment}").stdout
    assert "from-inside" in logs
