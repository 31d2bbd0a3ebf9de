"""The operator end to end, on the local control plane with simulated MI355X nodes, running
as a real process: children, conditions lifted from the scheduler, /scale reaching the rollout
tier, suspend/resume, trainer restarts, deadlines, TTL, deletion and restart safety."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.factories import make_job

from agentrl.devcluster import stages
from agentrl.devcluster.testing import Kubectl, wait_for
from e2e.conftest import OperatorProcess, condition, wait_condition

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("storage")]

REPORT = yaml.safe_load(Path("examples/mi355x-report.yaml").read_text())
CHILD_KINDS = (
    "configmap",
    "service",
    "statefulset",
    "job.batch",
    "deployment",
    "poddisruptionbudget",
    "networkpolicy",
    "serviceaccount",
    "role",
    "rolebinding",
    "persistentvolumeclaim",
)


#: A job the simulated cluster can run: 2 single-GPU engines, 1 trainer node of 2 GPUs.
SMALL = (
    make_job("small", None)
    .with_model_pvc("models", "Qwen3-8B")
    .with_model(architecture="Qwen3-8B")
    .with_inference(
        engines=2, contextLength=32768, maxRunningRequests=32, cpu="8", memory="64Gi"
    )
    .with_rollout(groupSize=4, maxTrajectoryTokens=32768, maxTokensPerTurn=4096, workers=1)
    .with_concurrency(8)
    .with_trainer(
        nodes=1, gpusPerNode=2, trajectoriesPerStep=8, cpu="8", memory="64Gi", backoffLimit=1
    )
)


def children(kubectl: Kubectl, job: str) -> dict[str, list[str]]:
    out = {}
    for kind in CHILD_KINDS:
        items = kubectl.json("get", kind, "-l", f"agentrl.dev/job={job}")["items"]
        out[kind] = sorted(i["metadata"]["name"] for i in items)
    return out


def runtime_config(kubectl: Kubectl, job: str) -> dict[str, Any]:
    cm = kubectl.json("get", "configmap", f"{job}-config")
    return dict(yaml.safe_load(cm["data"]["runtime.yaml"]))


def test_the_report_example_becomes_ready_with_the_right_children(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    kubectl.apply(REPORT)
    name = REPORT["metadata"]["name"]
    wait_condition(kubectl, name, "Ready", "True", timeout=180)
    sts = kubectl.json("get", "statefulset", f"{name}-engine")
    assert sts["spec"]["replicas"] == 24
    pod_spec = sts["spec"]["template"]["spec"]
    engine = next(c for c in pod_spec["containers"] if c["name"] == "engine")
    assert engine["resources"]["limits"]["amd.com/gpu"] == "1"
    args = engine["args"]
    assert args[args.index("--context-length") + 1] == "65536"
    assert args[args.index("--max-running-requests") + 1] == "32"
    assert args[args.index("--cuda-graph-max-bs-decode") + 1] == "32"
    assert not any(a.startswith("--disable-cuda-graph") for a in args)
    assert engine["startupProbe"]["httpGet"]["path"]
    assert pod_spec["shareProcessNamespace"] is True
    assert {c["name"] for c in pod_spec["containers"]} == {"engine", "watchdog"}
    terms = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert {
        "key": "amd.com/gpu.product-name",
        "operator": "In",
        "values": ["AMD_Instinct_MI355X"],
    } in terms["nodeSelectorTerms"][0]["matchExpressions"]
    trainer = kubectl.json("get", "job", f"{name}-trainer")
    container = trainer["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["amd.com/gpu"] == "8"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert trainer["spec"]["completionMode"] == "Indexed"
    pods = kubectl.json("get", "pods", "-l", f"agentrl.dev/job={name}")["items"]
    running = [p for p in pods if p["status"].get("phase") == "Running"]
    assert len(running) == 24 + 1 + 8  # engines, trainer rank 0, rollout workers
    job = kubectl.json("get", "arj", name)
    assert job["status"]["engines"]["ready"] == 24
    assert job["status"]["sandbox"]["selector"]
    assert job["status"]["observedGeneration"] == job["metadata"]["generation"]
    owners = {
        o["uid"]
        for kind in ("statefulset", "job.batch", "deployment", "configmap")
        for o in kubectl.json("get", kind, "-l", f"agentrl.dev/job={name}")["items"][0]["metadata"][
            "ownerReferences"
        ]
    }
    assert owners == {job["metadata"]["uid"]}


def test_an_oversized_job_reports_the_schedulers_reason(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    # 5 engines × 8 GPUs = 40 > the 32 GPUs of the 4 simulated nodes (the trainer takes 2 more)
    kubectl.apply(
        SMALL.copy("big").with_engines(5, gpus_per_engine=8).manifest()
    )

    def unschedulable() -> dict[str, str] | None:
        cond = condition(kubectl, "big", "EnginesReady")
        return cond if cond and cond["reason"] == "Unschedulable" else None

    cond = wait_for(unschedulable, timeout=90, what="EnginesReady=False/Unschedulable")
    assert cond["status"] == "False"
    assert "Insufficient amd.com/gpu" in cond["message"]
    ready = condition(kubectl, "big", "Ready")
    assert ready is not None and ready["status"] == "False"
    events = kubectl.json("get", "events", "--field-selector", "involvedObject.name=big")
    assert any("Insufficient amd.com/gpu" in e["message"] for e in events["items"])


def test_kubectl_scale_reaches_the_rollout_tiers_config(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    kubectl.apply(SMALL.manifest())
    wait_for(
        lambda: kubectl.run("get", "deployment", "small-rollout", check=False).returncode == 0,
        timeout=60,
        what="the rollout Deployment (the last child applied)",
    )
    template_before = kubectl.json("get", "deployment", "small-rollout")["spec"]["template"]
    kubectl.run("scale", "arj/small", "--replicas=48")
    wait_for(
        lambda: runtime_config(kubectl, "small")["sandbox"]["concurrency"] == 48,
        timeout=60,
        what="concurrency 48 in the rollout config",
    )
    job = kubectl.json("get", "arj", "small")
    wait_for(
        lambda: kubectl.json("get", "arj", "small")["status"]["sandbox"]["concurrency"] == 48,
        timeout=60,
        what="status.sandbox.concurrency 48",
    )
    assert job["spec"]["sandbox"]["concurrency"] == 48
    # scaling changes no pod template: nothing restarts
    assert kubectl.json("get", "deployment", "small-rollout")["spec"]["template"] == template_before


def test_suspend_scales_to_zero_and_resume_restores(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    kubectl.apply(SMALL.manifest())
    wait_condition(kubectl, "small", "Ready", "True", timeout=120)
    kubectl.run("patch", "arj", "small", "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_condition(kubectl, "small", "Suspended", "True")
    wait_for(
        lambda: kubectl.json("get", "statefulset", "small-engine")["spec"]["replicas"] == 0,
        what="engines scaled to 0",
    )
    assert kubectl.json("get", "job", "small-trainer")["spec"]["suspend"] is True
    assert kubectl.json("get", "deployment", "small-rollout")["spec"]["replicas"] == 0
    assert runtime_config(kubectl, "small")["sandbox"]["concurrency"] == 0
    wait_for(
        lambda: (
            not [
                p
                for p in kubectl.json("get", "pods", "-l", "agentrl.dev/job=small")["items"]
                if p["status"].get("phase") == "Running"
            ]
        ),
        timeout=90,
        what="no running pods while suspended",
    )
    kubectl.run("patch", "arj", "small", "--type=merge", "-p", '{"spec":{"suspend":false}}')
    wait_condition(kubectl, "small", "Suspended", "False")
    wait_condition(kubectl, "small", "Ready", "True", timeout=120)
    assert kubectl.json("get", "statefulset", "small-engine")["spec"]["replicas"] == 2
    assert kubectl.json("get", "job", "small-trainer")["spec"]["suspend"] is False


def _trainer_pod(kubectl: Kubectl, job: str) -> dict[str, Any] | None:
    pods = kubectl.json(
        "get", "pods", "-l", f"agentrl.dev/job={job},app.kubernetes.io/component=trainer"
    )["items"]
    live = [
        p
        for p in pods
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]
    return live[0] if live else None


def test_a_failed_trainer_restarts_then_fails_past_its_backoff_limit(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    kubectl.apply(SMALL.manifest())  # backoffLimit 1: one restart allowed
    for attempt in (0, 1):
        pod = wait_for(
            lambda: _trainer_pod(kubectl, "small"),
            timeout=90,
            what=f"trainer attempt {attempt} running",
        )
        trainer_job = kubectl.json("get", "job", "small-trainer")
        assert trainer_job["metadata"]["annotations"]["agentrl.dev/trainer-attempt"] == str(attempt)
        kubectl.run(
            "annotate",
            "pod",
            pod["metadata"]["name"],
            f"{stages.OUTCOME}=Failed",
            f"{stages.AFTER}=100ms",
        )
        if attempt == 0:
            wait_for(
                lambda: kubectl.json("get", "arj", "small")["status"]["trainer"]["restarts"] == 1,
                timeout=90,
                what="restart counted",
            )
    failed = wait_condition(kubectl, "small", "Failed", "True", timeout=90)
    assert failed["reason"] == "BackoffLimitExceeded"
    assert kubectl.json("get", "arj", "small")["status"]["trainer"]["restarts"] == 1


def test_active_deadline_fails_the_job(kubectl: Kubectl, operator: OperatorProcess) -> None:
    kubectl.apply(SMALL.copy().with_deadline(8).manifest())
    failed = wait_condition(kubectl, "small", "Failed", "True", timeout=90)
    assert failed["reason"] == "DeadlineExceeded"


def test_a_completed_job_is_deleted_after_its_ttl(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    kubectl.apply(SMALL.copy().with_ttl(3).manifest())
    pod = wait_for(lambda: _trainer_pod(kubectl, "small"), timeout=90, what="trainer running")
    kubectl.run(
        "annotate",
        "pod",
        pod["metadata"]["name"],
        f"{stages.OUTCOME}=Succeeded",
        f"{stages.AFTER}=100ms",
    )
    wait_condition(kubectl, "small", "Complete", "True", timeout=90)
    wait_for(
        lambda: kubectl.run("get", "arj", "small", check=False).returncode != 0,
        timeout=60,
        what="the job deleted by its TTL",
    )


def test_deleting_the_job_leaves_nothing_behind(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    kubectl.apply(SMALL.manifest())
    wait_condition(kubectl, "small", "Ready", "True", timeout=120)
    # a sandbox pod as the rollout tier creates them: labelled and owned by the job
    uid = kubectl.json("get", "arj", "small")["metadata"]["uid"]
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "small-sbx-test",
                "labels": {"agentrl.dev/job": "small", "app.kubernetes.io/component": "sandbox"},
                "ownerReferences": [
                    {
                        "apiVersion": "agentrl.dev/v1alpha1",
                        "kind": "AgentRLJob",
                        "name": "small",
                        "uid": uid,
                    }
                ],
            },
            "spec": {"containers": [{"name": "main", "image": "python:3.11-slim"}]},
        }
    )
    operator.stop()  # deletion must not need the operator: no finalizer
    assert kubectl.json("get", "arj", "small")["metadata"].get("finalizers") in (None, [])
    kubectl.run("delete", "arj", "small", "--wait=true", "--timeout=60s")

    def all_gone() -> bool:
        left = {k: v for k, v in children(kubectl, "small").items() if v}
        pods = kubectl.json("get", "pods", "-l", "agentrl.dev/job=small")["items"]
        return not left and not pods

    wait_for(all_gone, timeout=120, what="every child and pod of the job gone")


def test_an_operator_killed_mid_reconcile_converges_without_duplicates(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    kubectl.apply(SMALL.manifest())
    # kill it as soon as it has started writing children, before it could finish
    wait_for(
        lambda: kubectl.run("get", "configmap", "small-config", check=False).returncode == 0,
        timeout=60,
        interval=0.05,
        what="the first child",
    )
    operator.kill()
    operator.start()
    wait_condition(kubectl, "small", "Ready", "True", timeout=120)
    found = children(kubectl, "small")
    assert found["statefulset"] == ["small-engine"]
    assert found["job.batch"] == ["small-trainer"]
    assert found["deployment"] == ["small-rollout"]
    assert found["configmap"] == ["small-config"]
    assert found["persistentvolumeclaim"] == ["small-checkpoints"]
    pods = kubectl.json("get", "pods", "-l", "agentrl.dev/job=small")["items"]
    assert len(pods) == 2 + 1 + 1  # engines, trainer, one rollout worker
    assert "Traceback" not in operator.text()


def test_operator_metrics_count_reconciles_and_api_requests(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    import urllib.request

    operator.stop()
    port = free_port()
    operator.metrics_port = port
    operator.health_port = free_port()
    operator.start()
    kubectl.apply(SMALL.manifest())
    wait_condition(kubectl, "small", "Ready", "True", timeout=120)
    text = wait_for(lambda: _scrape(urllib.request, port), timeout=30, what="/metrics")
    samples = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert samples['agentrl_operator_reconciles_total{result="ok"}'] >= 1
    assert samples['agentrl_jobs_by_condition{condition="Ready",status="True"}'] == 1
    applied = sum(
        v
        for k, v in samples.items()
        if k.startswith("agentrl_operator_api_requests_total{kind=") and 'verb="apply"' in k
    )
    assert applied >= 15  # every child at least once
    assert samples["agentrl_operator_workers"] == 8
    # kopf's liveness endpoint answers while the operator runs
    with urllib.request.urlopen(f"http://127.0.0.1:{operator.health_port}/healthz",
                                timeout=5) as resp:
        assert resp.status == 200


def _scrape(urllib_request: Any, port: int) -> str | None:
    try:
        with urllib_request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            return str(resp.read().decode())
    except OSError:
        return None


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
