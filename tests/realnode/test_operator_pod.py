"""The chart installs the operator as a pod on the real node, from the operator image built
here: the kubelet starts it, its own probes on the health port make it Ready, and it reconciles
a job from inside the cluster with its own ServiceAccount (the in-cluster API address through
kube-proxy, the chart's RBAC, no kubeconfig of ours)."""

from __future__ import annotations

import pytest
from tests.factories import make_job

from agentrl.devcluster import images
from agentrl.devcluster.testing import Kubectl, wait_for

pytestmark = [pytest.mark.apiserver, pytest.mark.realnode, pytest.mark.slow]


def test_the_chart_runs_the_operator_as_a_pod_that_reconciles_from_inside(
    kubectl: Kubectl, operator_on_real_node: str
) -> None:
    deployment = f"{operator_on_real_node}-agentrl"
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

    kubectl.apply(make_job("from-inside", None).with_model_path("tiny").manifest())
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
