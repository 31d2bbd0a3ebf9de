"""GPU placement end to end, on the local control plane's four simulated 8-GPU MI355X nodes
with the operator running as a real process.

The report's layout (24 one-GPU engines and one 8-GPU trainer pod) fills those nodes exactly.
Created together, the scheduler could spread the engines over all four nodes and leave no node
with 8 free GPUs for the trainer (3 of 8 applies never became Ready). The operator now scales
the engines up only once the trainer's pods are scheduled: 20 fresh applies in a row must all
become Ready, the trainer's node must hold no engine, and every engine pod must be created
after the trainer pod was bound. A job the nodes cannot hold gets the shortfall in
GPUsAvailable and the scheduler's reason in its conditions, with its objects created.
"""

from __future__ import annotations

import socket
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrl.devcluster.testing import ClusterHandle, Kubectl, wait_for
from e2e.conftest import OperatorProcess, condition

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("storage")]

REPORT = yaml.safe_load(Path("examples/mi355x-report.yaml").read_text())
NAME = REPORT["metadata"]["name"]
#: Fresh applies in a row that must all become Ready (3 of 8 failed before the fix).
APPLIES = 20
LABEL = "amd.com/gpu.product-name"
GPU = "amd.com/gpu"


@dataclass
class Outcome:
    """One apply: Ready or not, and where the GPU pods went."""

    ready: bool
    seconds: float
    engines_per_node: dict[str, int] = field(default_factory=dict)
    trainer_nodes: list[str] = field(default_factory=list)
    engines_created_before_trainer_bound: list[str] = field(default_factory=list)
    note: str = ""


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _pods(kubectl: Kubectl, component: str) -> list[dict[str, Any]]:
    return list(
        kubectl.json(
            "get", "pods", "-l", f"agentrl.dev/job={NAME},app.kubernetes.io/component={component}"
        )["items"]
    )


def _scheduled_at(pod: dict[str, Any]) -> datetime | None:
    for cond in pod["status"].get("conditions", []):
        if cond["type"] == "PodScheduled" and cond["status"] == "True":
            return _time(cond["lastTransitionTime"])
    return None


def _outcome(kubectl: Kubectl, ready: bool, seconds: float, note: str = "") -> Outcome:
    engines = _pods(kubectl, "engine")
    trainers = _pods(kubectl, "trainer")
    bound = [t for t in (_scheduled_at(p) for p in trainers) if t is not None]
    trainer_bound = max(bound) if len(bound) == len(trainers) and bound else None
    return Outcome(
        ready=ready,
        seconds=seconds,
        engines_per_node=dict(
            Counter(p["spec"]["nodeName"] for p in engines if p["spec"].get("nodeName"))
        ),
        trainer_nodes=[p["spec"].get("nodeName", "") for p in trainers],
        engines_created_before_trainer_bound=[
            p["metadata"]["name"]
            for p in engines
            if trainer_bound is None or _time(p["metadata"]["creationTimestamp"]) < trainer_bound
        ],
        note=note,
    )


def _deadlocked(kubectl: Kubectl) -> str | None:
    """The deadlock this test guards against: every engine placed, the trainer pod not."""
    engines = _pods(kubectl, "engine")
    trainers = _pods(kubectl, "trainer")
    placed = [p for p in engines if p["spec"].get("nodeName")]
    stuck = [p for p in trainers if not p["spec"].get("nodeName")]
    if len(placed) == REPORT["spec"]["inference"]["engines"] and stuck:
        return "every engine placed and the trainer pod unschedulable"
    return None


def _apply_until_ready(kubectl: Kubectl, timeout: float) -> Outcome:
    started = time.monotonic()
    kubectl.apply(REPORT)
    while time.monotonic() - started < timeout:
        ready = condition(kubectl, NAME, "Ready")
        if ready and ready["status"] == "True":
            return _outcome(kubectl, True, time.monotonic() - started)
        stuck = _deadlocked(kubectl)
        if stuck:
            return _outcome(kubectl, False, time.monotonic() - started, stuck)
        time.sleep(1)
    return _outcome(kubectl, False, time.monotonic() - started, f"not Ready in {timeout:.0f}s")


def _delete_and_wait_gone(kubectl: Kubectl) -> None:
    kubectl.run("delete", "arj", NAME, "--wait=true", "--timeout=60s")

    def gone() -> bool:
        left = kubectl.run(
            "get",
            "pods,statefulsets,jobs.batch,deployments,persistentvolumeclaims",
            "-l",
            f"agentrl.dev/job={NAME}",
            "-o",
            "name",
        ).stdout.split()
        return not left

    wait_for(gone, timeout=180, interval=1, what=f"{NAME}'s pods and children gone")


def _fresh_volume(cluster: ClusterHandle, namespace: str, names: list[str]) -> None:
    """A PersistentVolume for this apply's checkpoint claim (the last one's was released with
    its claim and is not bound again)."""
    name = f"pv-{namespace}-place-{uuid.uuid4().hex[:6]}"
    names.append(name)
    cluster.kubectl().apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": name, "labels": {"agentrl-test": namespace}},
            "spec": {
                "capacity": {"storage": "10Ti"},
                "accessModes": ["ReadWriteMany", "ReadWriteOnce", "ReadOnlyMany"],
                "persistentVolumeReclaimPolicy": "Delete",
                "hostPath": {"path": f"/tmp/agentrl-test/{name}"},
            },
        }
    )


def test_the_report_example_is_ready_in_20_fresh_applies_on_exactly_its_nodes(
    cluster: ClusterHandle, kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    outcomes: list[Outcome] = []
    volumes: list[str] = []
    try:
        for _ in range(APPLIES):
            _fresh_volume(cluster, namespace, volumes)
            outcomes.append(_apply_until_ready(kubectl, timeout=240))
            _delete_and_wait_gone(kubectl)
    finally:
        cluster.kubectl().run("delete", "pv", *volumes, "--wait=false", check=False)
    report = "\n".join(
        f"apply {i}: {'Ready' if o.ready else 'NOT Ready'} after {o.seconds:.0f}s; trainer on "
        f"{o.trainer_nodes}, engines per node {dict(sorted(o.engines_per_node.items()))} {o.note}"
        for i, o in enumerate(outcomes)
    )
    print(report)  # shown with -s: each apply's placement and time
    assert [o.ready for o in outcomes] == [True] * APPLIES, report
    for o in outcomes:
        # 24 engines on the three nodes the 8-GPU trainer pod left whole: 8 each
        (trainer_node,) = o.trainer_nodes
        assert trainer_node not in o.engines_per_node, report
        assert sorted(o.engines_per_node.values()) == [8, 8, 8], report
        assert o.engines_created_before_trainer_bound == [], report


def test_a_job_on_gpus_the_cluster_lacks_names_the_shortfall_and_why_its_pods_wait(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    manifest = yaml.safe_load(yaml.safe_dump(REPORT))
    manifest["spec"]["inference"]["nodeSelector"] = {LABEL: "AMD_Instinct_MI300X"}
    kubectl.apply(manifest)

    def gpus_false() -> dict[str, str] | None:
        cond = condition(kubectl, NAME, "GPUsAvailable")
        return cond if cond and cond["status"] == "False" else None

    cond = wait_for(gpus_false, timeout=90, what="GPUsAvailable=False")
    assert cond["reason"] == "GPUCapacityInsufficient"
    # 8 + 24 × 1 = 32 GPUs: four 8-GPU nodes, and no node carries the MI300X label
    assert cond["message"].startswith(
        f"needs 4 nodes with 8 {GPU} labelled {LABEL}=AMD_Instinct_MI300X for 1 trainer pod "
        f"with 8 {GPU} and 24 engines with 1 {GPU} (32 in all); the cluster has 0 matching "
        f"nodes; not matching: "
    )
    assert f"not labelled {LABEL}=AMD_Instinct_MI300X (" in cond["message"]

    def engines_waiting() -> dict[str, str] | None:
        cond = condition(kubectl, NAME, "EnginesReady")
        waiting = cond and cond["reason"] == "WaitingForTrainerPlacement"
        return cond if waiting and "Unschedulable" in cond["message"] else None

    engines = wait_for(engines_waiting, timeout=90, what="EnginesReady=WaitingForTrainerPlacement")
    # the scheduler's own words for the trainer pod, lifted into the engines' condition
    assert "didn't match Pod's node affinity/selector" in engines["message"]
    trainer = condition(kubectl, NAME, "TrainerReady")
    assert trainer is not None and trainer["reason"] == "Unschedulable"
    # the objects exist all the same, for a cluster autoscaler to see the pending trainer pod
    sts = kubectl.json("get", "statefulset", f"{NAME}-engine")
    assert sts["spec"]["replicas"] == 0
    assert kubectl.json("get", "job", f"{NAME}-trainer")["spec"]["parallelism"] == 1
    events = kubectl.json("get", "events", "--field-selector", f"involvedObject.name={NAME}")
    assert any(e["reason"] == "GPUCapacityInsufficient" for e in events["items"])


def _metrics(port: int) -> dict[str, float] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_nodes_are_listed_until_the_gpu_pods_are_scheduled_and_not_after(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    operator.stop()
    operator.metrics_port = _free_port()
    operator.start()
    port = operator.metrics_port
    node_lists = 'agentrl_operator_api_requests_total{kind="Node",verb="list"}'
    reconciles = 'agentrl_operator_reconciles_total{result="ok"}'
    kubectl.apply(REPORT)
    wait_for(
        lambda: (condition(kubectl, NAME, "Ready") or {}).get("status") == "True",
        timeout=180,
        what=f"{NAME} Ready",
    )
    cond = condition(kubectl, NAME, "GPUsAvailable")
    assert cond is not None and (cond["status"], cond["reason"]) == (
        "True",
        "GPUCapacitySufficient",
    )
    assert cond["message"].startswith("all 25 GPU pods are scheduled: ")
    before = wait_for(lambda: _metrics(port), timeout=30, what="/metrics")
    assert before[node_lists] >= 1  # read while the pods were not yet placed
    # two more reconciles of the placed job (the 5 s resync) read no Node
    after = wait_for(
        lambda: (m := _metrics(port)) and m[reconciles] >= before[reconciles] + 2 and m,
        timeout=60,
        what="two more reconciles",
    )
    assert after[node_lists] == before[node_lists]
