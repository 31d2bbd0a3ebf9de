"""Failing weight pushes on the real API server: the trainer's progress annotation reports an
engine's failed pushes in a row; one reconcile after the third, ``kubectl get arj`` shows the
job Degraded with the reason, ``kubectl describe`` the engine and the error, and a Warning
event is posted; after a push the engine takes, one reconcile clears it."""

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
ENGINE = f"http://{NAME}-engine-1.{NAME}-engine.NS.svc:30000"
ERROR = "EngineUnavailable: POST /update_weights_from_disk: connection refused"


def _progress(step: int, failures: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {"step": step, "lastCheckpointStep": 0, "weightVersion": str(step)}
    if failures is not None:
        out["weightPushFailures"] = [
            {"engine": ENGINE, "failures": failures, "error": ERROR, "version": str(step)}
        ]
    return out


def _rank0_pod(progress: dict[str, Any]) -> dict[str, Any]:
    pod = (
        make_pod(f"{NAME}-trainer-0-abcde", "trainer", job=NAME)
        .annotated("batch.kubernetes.io/job-completion-index", "0")
        .annotated(ANNOTATION_PROGRESS, progress)
        .obj()
    )
    del pod["status"]
    pod["spec"] = {"containers": [{"name": "trainer", "image": "localhost/agentrl/none:0"}]}
    return pod


def _degraded_column(kubectl: Kubectl) -> str:
    """The DEGRADED column of ``kubectl get arj`` (no -o wide): its cell, or "" when empty."""
    header, row = kubectl.run("get", "arj", NAME).stdout.splitlines()[:2]
    start = header.index("DEGRADED")
    end = header.index("STEP")
    return row[start:end].strip()


def _warnings(kubectl: Kubectl) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = kubectl.json(
        "get", "events", "--field-selector", f"involvedObject.name={NAME},type=Warning"
    )["items"]
    return [e for e in events if e["reason"] == "WeightPushFailing"]


@pytest.mark.usefixtures("crd_installed")
async def test_the_third_failed_push_degrades_the_job_and_a_taken_push_clears_it(
    cluster: ClusterHandle, kubectl: Kubectl, namespace: str
) -> None:
    kubectl.apply(MANIFEST)
    for step, failures in ((3, 1), (4, 2)):
        kubectl.apply(_rank0_pod(_progress(step, failures)))
        await reconcile_once(cluster.kubeconfig, namespace, NAME)
        assert condition(kubectl, NAME, "Degraded")["status"] == "False"
        assert _degraded_column(kubectl) == ""
    assert _warnings(kubectl) == []

    # the third failed push in a row: one reconcile later the job shows it
    kubectl.apply(_rank0_pod(_progress(5, 3)))
    await reconcile_once(cluster.kubeconfig, namespace, NAME)
    degraded = condition(kubectl, NAME, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "WeightPushFailing")
    detail = f"{ENGINE}: 3 weight pushes in a row failed (last: weight version 5): {ERROR}"
    assert degraded["message"].endswith(detail)
    synced = condition(kubectl, NAME, "WeightsSynced")
    assert (synced["status"], synced["reason"], synced["message"]) == (
        "False",
        "WeightPushFailing",
        detail,
    )
    assert _degraded_column(kubectl) == "WeightPushFailing"
    [event] = _warnings(kubectl)
    assert detail in event["message"]
    # a restarted operator (a fresh reconciler) posts no second event
    await reconcile_once(cluster.kubeconfig, namespace, NAME)
    assert len(_warnings(kubectl)) == 1

    # the engine takes push 6: the trainer's report has no failure left
    kubectl.apply(_rank0_pod(_progress(6, None)))
    await reconcile_once(cluster.kubeconfig, namespace, NAME)
    degraded = condition(kubectl, NAME, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("False", "AsExpected")
    assert condition(kubectl, NAME, "WeightsSynced")["reason"] != "WeightPushFailing"
    assert "degradedReason" not in kubectl.json("get", "arj", NAME)["status"]
    assert _degraded_column(kubectl) == ""
