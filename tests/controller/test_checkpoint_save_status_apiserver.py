"""Failing checkpoint saves on the real API server: the trainer's progress annotation reports a
failed save; one reconcile later ``kubectl get arj`` shows the job Degraded with the reason,
``kubectl describe`` the step and the error on ``CheckpointSaved`` and ``Degraded``, and one
Warning event is posted (not again by a restarted operator); after a save that succeeds, one
reconcile clears it."""

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
ERROR = "PermissionError: [Errno 13] Permission denied: '/checkpoints/trainer/.tmp-step-00000020'"


def _progress(step: int, last: int, failures: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {"step": step, "lastCheckpointStep": last, "weightVersion": str(step)}
    if failures is not None:
        out["checkpointSaveFailure"] = {"failures": failures, "step": step, "error": ERROR}
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
    return row[header.index("DEGRADED") : header.index("STEP")].strip()


def _warnings(kubectl: Kubectl) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = kubectl.json(
        "get", "events", "--field-selector", f"involvedObject.name={NAME},type=Warning"
    )["items"]
    return [e for e in events if e["reason"] == "CheckpointSaveFailing"]


@pytest.mark.usefixtures("crd_installed")
async def test_a_failed_save_degrades_the_job_at_the_next_reconcile_and_a_save_clears_it(
    cluster: ClusterHandle, kubectl: Kubectl, namespace: str
) -> None:
    kubectl.apply(MANIFEST)
    kubectl.apply(_rank0_pod(_progress(10, 10, None)))
    await reconcile_once(cluster.kubeconfig, namespace, NAME)
    saved = condition(kubectl, NAME, "CheckpointSaved")
    assert (saved["status"], saved["reason"]) == ("True", "CheckpointWritten")
    assert condition(kubectl, NAME, "Degraded")["status"] == "False"

    # the save of step 20 failed after its tries: one reconcile later the job shows it
    kubectl.apply(_rank0_pod(_progress(20, 10, 1)))
    await reconcile_once(cluster.kubeconfig, namespace, NAME)
    detail = (
        f"1 checkpoint save in a row failed, the last of step 20 after 3 tries: {ERROR}; the "
        "last checkpoint is step 10"
    )
    for type_ in ("CheckpointSaved", "Degraded"):
        cond = condition(kubectl, NAME, type_)
        assert cond["reason"] == "CheckpointSaveFailing"
        assert cond["message"].startswith(detail)
    assert condition(kubectl, NAME, "CheckpointSaved")["status"] == "False"
    assert condition(kubectl, NAME, "Degraded")["status"] == "True"
    assert _degraded_column(kubectl) == "CheckpointSaveFailing"
    [event] = _warnings(kubectl)
    assert detail in event["message"]
    # a restarted operator (a fresh reconciler) posts no second event
    await reconcile_once(cluster.kubeconfig, namespace, NAME)
    assert len(_warnings(kubectl)) == 1

    # step 30's save succeeds: the trainer's report has no failure left
    kubectl.apply(_rank0_pod(_progress(30, 30, None)))
    await reconcile_once(cluster.kubeconfig, namespace, NAME)
    degraded = condition(kubectl, NAME, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("False", "AsExpected")
    saved = condition(kubectl, NAME, "CheckpointSaved")
    assert (saved["status"], saved["message"]) == ("True", "the last checkpoint is step 30")
    assert "degradedReason" not in kubectl.json("get", "arj", NAME)["status"]
    assert _degraded_column(kubectl) == ""
