"""Checkpoint-aware suspend on the real API server: ``suspend: true`` first suspends the trainer
Job (Kubernetes sends its pods SIGTERM, the trainer checkpoints within
``stopGracePeriodSeconds``) while the engines stay up — Suspending — and scales the engines and
rollout workers to zero only once the trainer pods are gone — Suspended.

The report's job with a CPU trainer and tiny engines (so the engines are not held back for the
trainer's placement, ``policies.placement``); its pods stay Pending (the session cluster has no
``models`` volume), so nothing trains here: what is checked is the order the operator imposes
on the real Job controller and pod lifecycle. That the trainer's step and data position survive
the stop is ``tests/trainer/test_stop_checkpoint.py`` and ``test_trainer_sigterm.py``.

On the real node (``realnode``): the operator's trainer Job with a container that exits 143
after SIGTERM, as the trainer does, shows the Job semantics that exit code relies on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrl.devcluster.testing import ClusterHandle, Kubectl, wait_for
from tests.controller.apiserver import apply_and_reconcile, condition, reconcile_once
from tests.factories import from_manifest

pytestmark = [pytest.mark.apiserver]

REPORT = yaml.safe_load(Path("examples/mi355x-report.yaml").read_text())
NAME = REPORT["metadata"]["name"]
TRAINER_PODS = f"agentrl.dev/job={NAME},app.kubernetes.io/component=trainer"


#: The report's job cut to CPU: two tiny engines, a torch trainer, a 30 s stop grace period.
TINY_REPORT = (
    from_manifest(REPORT)
    .with_inference(engines=2, server="tiny", gpusPerEngine=0)
    .with_trainer(backend="torch", gpusPerNode=0)
    .without_spec("trainer.parallelism")
    .with_spec("trainer.checkpoint.stopGracePeriodSeconds", 30)
)


def _trainer_pods(kubectl: Kubectl) -> list[dict[str, Any]]:
    return list(kubectl.json("get", "pods", "-l", TRAINER_PODS)["items"])


def _replicas(kubectl: Kubectl, kind: str, name: str) -> int:
    return int(kubectl.json("get", kind, name)["spec"]["replicas"])


@pytest.mark.usefixtures("crd_installed")
async def test_suspend_waits_for_the_trainer_pods_before_scaling_the_engines_to_zero(
    cluster: ClusterHandle, kubectl: Kubectl, namespace: str
) -> None:
    await apply_and_reconcile(kubectl, TINY_REPORT.manifest(), cluster.kubeconfig, namespace)
    job = kubectl.json("get", "job", f"{NAME}-trainer")
    assert job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 30
    wait_for(lambda: _trainer_pods(kubectl), timeout=60, what="the Job's trainer pod")
    assert _replicas(kubectl, "statefulset", f"{NAME}-engine") == 2

    kubectl.run("patch", "arj", NAME, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    await reconcile_once(cluster.kubeconfig, namespace, NAME)
    # Suspending: the trainer Job is suspended (SIGTERM to its pods), no new episode starts,
    # the engines and the rollout workers are still there for the trainer's last step
    cond = condition(kubectl, NAME, "Suspended")
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
    await reconcile_once(cluster.kubeconfig, namespace, NAME)
    cond = condition(kubectl, NAME, "Suspended")
    assert (cond["status"], cond["reason"]) == ("True", "JobSuspended"), cond
    assert kubectl.json("get", "arj", NAME)["status"]["readyReason"] == "JobSuspended"
    assert _replicas(kubectl, "statefulset", f"{NAME}-engine") == 0
    assert _replicas(kubectl, "deployment", f"{NAME}-rollout") == 0
    assert kubectl.json("get", "job", f"{NAME}-trainer")["spec"]["suspend"] is True
    events = kubectl.json("get", "events", "--field-selector", f"involvedObject.name={NAME}")
    reasons = [e["reason"] for e in events["items"]]
    assert "Suspending" in reasons and "JobSuspended" in reasons


def _probe_trainer_job(name: str) -> dict[str, Any]:
    """The operator's trainer Job for the manifest above (its podFailurePolicy, backoffLimit 0
    and grace period), its container swapped for busybox that, like the trainer, exits 143 a
    moment after SIGTERM, on the real node."""
    from agentrl.api.validation import load_job
    from agentrl.devcluster.node import artifacts
    from agentrl.reconcile import trainer
    from agentrl.reconcile.context import BuildContext

    job = load_job(yaml.safe_dump(TINY_REPORT.manifest()))
    built = trainer.trainer_job(job, BuildContext.for_job(job))
    built["metadata"] = {"name": name}  # no ownerReference: no AgentRLJob owns it here
    pod = built["spec"]["template"]["spec"]
    for key in ("serviceAccountName", "volumes", "affinity", "subdomain"):
        pod.pop(key, None)
    pod["nodeSelector"] = {"agentrl.dev/real-node": "true"}
    pod["tolerations"] = [{"key": "agentrl.dev/real-node", "operator": "Exists"}]
    pod["containers"] = [
        {
            "name": "trainer",
            "image": artifacts.BUSYBOX.name,
            "imagePullPolicy": "Never",
            "command": [
                "/bin/sh",
                "-c",
                "trap 'sleep 1; exit 143' TERM; while :; do sleep 1; done",
            ],
        }
    ]
    return built


def _job_status(kubectl: Kubectl, name: str) -> dict[str, Any]:
    return dict(kubectl.json("get", "job", name)["status"])


def _running_pod(kubectl: Kubectl, name: str) -> bool:
    pods = kubectl.json("get", "pods", "-l", f"job-name={name}")["items"]
    return any(p["status"].get("phase") == "Running" for p in pods)


@pytest.mark.realnode
def test_a_trainer_pod_stopped_by_suspend_is_no_failure_but_a_deleted_one_fails_the_attempt(
    kubectl: Kubectl,
) -> None:
    # The premise of exit code 143 (agentrl.trainer.stopping), on a real kubelet: the pods of a
    # suspended Job that exit 143 after SIGTERM do not count against backoffLimit 0, while a
    # deleted pod's 143 fails the attempt (never a completed index), which the operator then
    # restarts from the checkpoint.
    name = "probe-trainer"
    assert _probe_trainer_job(name)["spec"]["backoffLimit"] == 0
    kubectl.apply(_probe_trainer_job(name))
    wait_for(lambda: _running_pod(kubectl, name), timeout=90, what="the probe pod running")
    kubectl.run("patch", "job", name, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_for(
        lambda: not kubectl.json("get", "pods", "-l", f"job-name={name}")["items"],
        timeout=60,
        what="the suspended Job's pod gone",
    )
    status = _job_status(kubectl, name)
    assert not status.get("failed") and not status.get("succeeded"), status
    types = {c["type"]: c["status"] for c in status.get("conditions", [])}
    assert types.get("Suspended") == "True" and "Failed" not in types, status

    kubectl.run("patch", "job", name, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    wait_for(lambda: _running_pod(kubectl, name), timeout=90, what="the resumed pod running")
    kubectl.run("delete", "pods", "-l", f"job-name={name}", "--wait=false")
    failed = wait_for(
        lambda: next(
            (
                c
                for c in _job_status(kubectl, name).get("conditions", [])
                if c["type"] == "Failed" and c["status"] == "True"
            ),
            None,
        ),
        timeout=60,
        what="the Job failed",
    )
    assert failed["reason"] == "BackoffLimitExceeded"
    assert not _job_status(kubectl, name).get("succeeded")
