"""Wire contract skew on the real API server: a trainer pod whose progress annotation is written
in a contract version two minors from the operator's; one reconcile later ``kubectl describe``
shows WireCompatible=False naming both versions, with a Warning event, and the step it reported
is not taken; a pod of the next minor version (one apart) is read and the condition clears."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrl.api.wire import ANNOTATION_PROGRESS
from agentrl.devcluster.testing import ClusterHandle, Kubectl
from tests.controller.apiserver import condition, reconcile_once
from tests.factories import make_pod

pytestmark = [pytest.mark.apiserver]

MANIFEST = yaml.safe_load(Path("examples/quickstart-cluster.yaml").read_text())
NAME = MANIFEST["metadata"]["name"]
POD = f"{NAME}-trainer-0-abcde"


def _rank0_pod(progress: dict[str, Any]) -> dict[str, Any]:
    pod = (
        make_pod(POD, "trainer", job=NAME)
        .annotated("batch.kubernetes.io/job-completion-index", "0")
        .annotated(ANNOTATION_PROGRESS, progress)
        .obj()
    )
    del pod["status"]
    pod["spec"] = {"containers": [{"name": "trainer", "image": "localhost/agentrl/none:0"}]}
    return pod


@pytest.mark.usefixtures("crd_installed")
async def test_a_trainer_two_minor_versions_ahead_is_named_in_the_status(
    cluster: ClusterHandle, kubectl: Kubectl, namespace: str
) -> None:
    kubectl.apply(MANIFEST)
    kubectl.apply(_rank0_pod({"wireVersion": "1.3", "step": 7}))
    await reconcile_once(cluster.kubeconfig, namespace, NAME)
    wire = condition(kubectl, NAME, "WireCompatible")
    assert (wire["status"], wire["reason"]) == ("False", "VersionSkew")
    assert wire["message"] == (
        "this operator speaks wire contract 1.1 and reads 1.0 to 1.2; pod "
        f"{POD} wrote agentrl.dev/progress in 1.3 (ignored): run the operator and the job's "
        "images at most one minor version apart (docs/install.md, Upgrades and version skew)"
    )
    status = kubectl.json("get", "arj", NAME)["status"]
    assert status.get("trainer", {}).get("step", 0) == 0
    events: list[dict[str, Any]] = kubectl.json(
        "get", "events", "--field-selector", f"involvedObject.name={NAME},type=Warning"
    )["items"]
    assert [e["message"] for e in events if e["reason"] == "VersionSkew"] == [
        f"WireCompatible: {wire['message']}"
    ]

    # the trainer of the next minor version: one apart, read, its unknown key named
    kubectl.apply(_rank0_pod({"wireVersion": "1.2", "step": 8, "rolloutLagSteps": 1}))
    await reconcile_once(cluster.kubeconfig, namespace, NAME)
    wire = condition(kubectl, NAME, "WireCompatible")
    assert (wire["status"], wire["reason"]) == ("True", "VersionsCompatible")
    assert "the workloads: trainer 1.2" in wire["message"]
    assert "agentrl.dev/progress rolloutLagSteps" in wire["message"]
    assert kubectl.json("get", "arj", NAME)["status"]["trainer"]["step"] == 8
