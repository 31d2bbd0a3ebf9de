"""A held-out evaluation on the real API server: the trainer's progress annotation carries it,
the reconciler writes it into ``status.rollout`` (the ``Pass@1`` printer column) and posts one
``Evaluated`` event per evaluation — none again from a restarted operator. The rollout's tool
health takes the same path into ``status.rollout.tools``, which the CRD must declare (the API
server drops what it does not)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrl.api.wire import ANNOTATION_PROGRESS
from agentrl.devcluster.testing import ClusterHandle, Kubectl
from tests.controller.apiserver import reconcile_once
from tests.factories import make_pod

pytestmark = [pytest.mark.apiserver]

MANIFEST = yaml.safe_load(Path("examples/quickstart-cluster.yaml").read_text())
NAME = MANIFEST["metadata"]["name"]


def _progress(eval_step: int, pass_at_1: float) -> dict[str, Any]:
    return {
        "step": eval_step,
        "lastCheckpointStep": 0,
        "weightVersion": str(eval_step),
        "passAt1": pass_at_1,
        "evalStep": eval_step,
        "evalEpisodes": 14,
        "evalInfraErrors": 2,
    }


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


def _evaluated_events(kubectl: Kubectl) -> list[dict[str, Any]]:
    return kubectl.json(
        "get", "events", "--field-selector", f"involvedObject.name={NAME},reason=Evaluated"
    )["items"]


@pytest.mark.usefixtures("crd_installed")
async def test_an_evaluation_reaches_status_the_printer_column_and_one_event(
    cluster: ClusterHandle, kubectl: Kubectl, namespace: str
) -> None:
    kubectl.apply(MANIFEST)
    kubectl.apply(_rank0_pod(_progress(0, 0.375)))
    await reconcile_once(cluster.kubeconfig, namespace, NAME)

    rollout = kubectl.json("get", "arj", NAME)["status"]["rollout"]
    assert (rollout["passAt1"], rollout["evalStep"]) == (0.375, 0)
    assert (rollout["evalEpisodes"], rollout["evalInfraErrors"]) == (14, 2)
    # the printer column, as the API server serves it, reads that field and shows the figure
    crd = kubectl.json("get", "crd", "agentrljobs.agentrl.dev")
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    path = next(c["jsonPath"] for c in columns if c["name"] == "Pass@1")
    assert path == ".status.rollout.passAt1"
    assert kubectl.run("get", "arj", NAME, "-o", f"jsonpath={{{path}}}").stdout == "0.375"
    header, row = kubectl.run("get", "arj", NAME, "-o", "wide").stdout.splitlines()[:2]
    start = header.index("PASS@1")
    assert row[start:].split()[0] == "0.375"
    events = _evaluated_events(kubectl)
    assert len(events) == 1
    assert events[0]["type"] == "Normal"
    assert events[0]["message"] == (
        "held-out pass@1 0.375 after step 0 over 14 attempts (2 infra errors left out)"
    )

    # an operator restart (a fresh reconciler) sees the evaluation already in status: no repeat
    await reconcile_once(cluster.kubeconfig, namespace, NAME)
    assert len(_evaluated_events(kubectl)) == 1

    # the next evaluation: the figure moves and one more event is posted
    kubectl.apply(_rank0_pod(_progress(10, 0.5)))
    await reconcile_once(cluster.kubeconfig, namespace, NAME)
    rollout = kubectl.json("get", "arj", NAME)["status"]["rollout"]
    assert (rollout["passAt1"], rollout["evalStep"]) == (0.5, 10)
    messages = sorted(e["message"] for e in _evaluated_events(kubectl))
    assert messages == [
        "held-out pass@1 0.375 after step 0 over 14 attempts (2 infra errors left out)",
        "held-out pass@1 0.500 after step 10 over 14 attempts (2 infra errors left out)",
    ]


@pytest.mark.usefixtures("crd_installed")
async def test_the_warm_start_stage_and_the_three_points_reach_status(
    cluster: ClusterHandle, kubectl: Kubectl, namespace: str
) -> None:
    """What the trainer reports while it warms up (stage, progress, loss), then the base and
    after-warm-start figures, which stay in status once RL's evaluations move ``passAt1``."""
    kubectl.apply(MANIFEST)
    warming = {
        "step": 0,
        "stage": "WarmingUp",
        "warmStartProgress": 0.25,
        "warmStartLoss": 3.5,
        "passAt1": 0.125,
        "evalStep": 0,
        "evalEpisodes": 8,
        "evalInfraErrors": 0,
        "passAt1Base": 0.125,
    }
    kubectl.apply(_rank0_pod(warming))
    await reconcile_once(cluster.kubeconfig, namespace, NAME)
    status = kubectl.json("get", "arj", NAME)["status"]
    assert status["trainer"]["stage"] == "WarmingUp"
    assert (status["trainer"]["warmStartProgress"], status["trainer"]["warmStartLoss"]) == (
        0.25,
        3.5,
    )
    assert status["rollout"]["passAt1Base"] == 0.125
    header, row = kubectl.run("get", "arj", NAME, "-o", "wide").stdout.splitlines()[:2]
    assert row[header.index("STAGE") :].split()[0] == "WarmingUp"

    # RL has stepped: a trainer that restarted reports neither of the warm start's points
    kubectl.apply(
        _rank0_pod({**_progress(10, 0.5), "stage": "Training", "passAt1WarmStart": 0.375})
    )
    await reconcile_once(cluster.kubeconfig, namespace, NAME)
    kubectl.apply(_rank0_pod({**_progress(20, 0.625), "stage": "Training"}))
    await reconcile_once(cluster.kubeconfig, namespace, NAME)
    status = kubectl.json("get", "arj", NAME)["status"]
    assert status["trainer"]["stage"] == "Training"
    assert status["trainer"]["warmStartProgress"] == 0.25  # the last the trainer reported
    rollout = status["rollout"]
    assert (rollout["passAt1Base"], rollout["passAt1WarmStart"], rollout["passAt1"]) == (
        0.125,
        0.375,
        0.625,
    )


@pytest.mark.usefixtures("crd_installed")
async def test_tool_health_reaches_status_rollout_tools(
    cluster: ClusterHandle, kubectl: Kubectl, namespace: str
) -> None:
    """The silent failure in plain sight: an agent that never calls a tool."""
    kubectl.apply(MANIFEST)
    tools = {
        "episodes": 30,
        "replies": 240,
        "callsPerEpisode": 0.0,
        "parseFailureRate": 0.0,
        "noToolCallRate": 1.0,
        "submitRate": 0.0,
        "prefixBreakRate": 0.0,
        "endReasons": {"turnCap": 30, "infraError": 2},
    }
    kubectl.apply(_rank0_pod({"step": 3, "truncatedRate": 0.9375, "tools": tools}))
    await reconcile_once(cluster.kubeconfig, namespace, NAME)

    rollout = kubectl.json("get", "arj", NAME)["status"]["rollout"]
    assert rollout["tools"] == {
        **tools,
        "endReasons": {
            "submitted": 0,
            "turnCap": 30,
            "tokenCap": 0,
            "wallClock": 0,
            "infraError": 2,
        },
    }
    path = "{.status.rollout.tools.noToolCallRate}"
    assert kubectl.run("get", "arj", NAME, "-o", f"jsonpath={path}").stdout == "1"
