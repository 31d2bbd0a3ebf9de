"""Checkpoint-aware suspend on the real API server: ``suspend: true`` first suspends the trainer
Job (Kubernetes sends its pods SIGTERM, the trainer checkpoints within
``stopGracePeriodSeconds``) while the engines stay up — Suspending — and scales the engines and
rollout workers to zero only once the trainer pods are gone — Suspended.

The report's job with a CPU trainer and tiny engines (so the engines are not held back for the
trainer's placement, ``policies.placement``); its pods stay Pending (the session cluster has no
``models`` volume), so nothing trains here: what is checked is the order the operator imposes
on the real Job controller and pod lifecycle. That the trainer's step and data position survive
the stop is ``tests/trainer/test_stop_checkpoint.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import AsyncClient
from lightkube.config.kubeconfig import KubeConfig

from agentrl.controller.kube import LightkubeAPI
from agentrl.controller.reconciler import Reconciler
from agentrl.controller.settings import OperatorSettings
from agentrl.controller.workqueue import Key
from agentrl.devcluster.testing import ClusterHandle, Kubectl, wait_for
from agentrl.reconcile.constants import FIELD_MANAGER

pytestmark = [pytest.mark.apiserver]

REPORT = yaml.safe_load(Path("examples/mi355x-report.yaml").read_text())
NAME = REPORT["metadata"]["name"]
TRAINER_PODS = f"agentrl.dev/job={NAME},app.kubernetes.io/component=trainer"


def _manifest() -> dict[str, Any]:
    manifest = yaml.safe_load(yaml.safe_dump(REPORT))
    manifest["spec"]["inference"].update(engines=2, server="tiny", gpusPerEngine=0)
    trainer = manifest["spec"]["trainer"]
    trainer.update(backend="torch", gpusPerNode=0)
    trainer.pop("parallelism", None)
    trainer["checkpoint"]["stopGracePeriodSeconds"] = 30
    return manifest


async def _reconcile_once(kubeconfig: Path, namespace: str) -> None:
    client = AsyncClient(config=KubeConfig.from_file(kubeconfig), field_manager=FIELD_MANAGER)
    try:
        await Reconciler(LightkubeAPI(client), OperatorSettings()).reconcile(Key(namespace, NAME))
    finally:
        await client.close()


def _condition(kubectl: Kubectl, type_: str) -> dict[str, str]:
    status = kubectl.json("get", "arj", NAME)["status"]
    return next(c for c in status["conditions"] if c["type"] == type_)


def _trainer_pods(kubectl: Kubectl) -> list[dict[str, Any]]:
    return list(kubectl.json("get", "pods", "-l", TRAINER_PODS)["items"])


def _replicas(kubectl: Kubectl, kind: str, name: str) -> int:
    return int(kubectl.json("get", kind, name)["spec"]["replicas"])


@pytest.mark.usefixtures("crd_installed")
async def test_suspend_waits_for_the_trainer_pods_before_scaling_the_engines_to_zero(
    cluster: ClusterHandle, kubectl: Kubectl, namespace: str
) -> None:
    kubectl.apply(_manifest())
    await _reconcile_once(cluster.kubeconfig, namespace)
    job = kubectl.json("get", "job", f"{NAME}-trainer")
    assert job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 30
    wait_for(lambda: _trainer_pods(kubectl), timeout=60, what="the Job's trainer pod")
    assert _replicas(kubectl, "statefulset", f"{NAME}-engine") == 2

    kubectl.run("patch", "arj", NAME, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    await _reconcile_once(cluster.kubeconfig, namespace)
    # Suspending: the trainer Job is suspended (SIGTERM to its pods), no new episode starts,
    # the engines and the rollout workers are still there for the trainer's last step
    cond = _condition(kubectl, "Suspended")
    assert (cond["status"], cond["reason"]) == ("False", "Suspending"), cond
    assert "trainer pods stopping, at most 30s" in cond["message"]
    status = kubectl.json("get", "arj", NAME)["status"]
    assert status["readyReason"] == "Suspending"
    assert status["sandbox"]["concurrency"] == 0
    assert kubectl.json("get", "job", f"{NAME}-trainer")["spec"]["suspend"] is True
    assert _replicas(kubectl, "statefulset", f"{NAME}-engine") == 2
    assert (
        _replicas(kubectl, "deployment", f"{NAME}-rollout") == REPORT["spec"]["rollout"]["workers"]
    )

    # the Job controller deletes the trainer pods; once they are gone: Suspended, all at zero
    wait_for(lambda: not _trainer_pods(kubectl), timeout=90, what="the trainer pods gone")
    await _reconcile_once(cluster.kubeconfig, namespace)
    cond = _condition(kubectl, "Suspended")
    assert (cond["status"], cond["reason"]) == ("True", "JobSuspended"), cond
    assert kubectl.json("get", "arj", NAME)["status"]["readyReason"] == "JobSuspended"
    assert _replicas(kubectl, "statefulset", f"{NAME}-engine") == 0
    assert _replicas(kubectl, "deployment", f"{NAME}-rollout") == 0
    assert kubectl.json("get", "job", f"{NAME}-trainer")["spec"]["suspend"] is True
    events = kubectl.json("get", "events", "--field-selector", f"involvedObject.name={NAME}")
    reasons = [e["reason"] for e in events["items"]]
    assert "Suspending" in reasons and "JobSuspended" in reasons
