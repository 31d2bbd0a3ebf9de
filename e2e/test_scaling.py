"""Sandbox concurrency scaling end to end, on the local control plane: an HPA reads the job's
/scale, the pre-pull DaemonSet runs on sandbox nodes, ``kubectl scale`` changes the sandbox pods
in flight, the built-in autoscaler fed synthetic engine metrics moves within its bounds and
steps and explains each move, and a ResourceQuota caps concurrency with the reason shown.

The first two need only the API server and kube-controller-manager; the others run the
operator as a process (the ``operator`` fixture). The rollout tier's Deployment runs on kwok
nodes, where no code runs, so the scaling test runs a rollout worker in the test process
instead: the real :class:`~agentrl.rollout.scheduler.RolloutScheduler` and kubernetes sandbox
provider, following the concurrency in the ConfigMap the operator writes through
:mod:`agentrl.rollout.concurrency_source`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import types
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.factories import make_job

from agentrl.api import AgentRLJob
from agentrl.api.rollout import ClassAction, TerminalClass
from agentrl.controller.engine_metrics import ANNOTATION_SYNTHETIC_ENGINE_METRICS
from agentrl.devcluster.testing import ClusterHandle, Kubectl, wait_for
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.policies.autoscale import REASON_LOWERED, REASON_RAISED
from agentrl.reconcile.prepull import prepull_daemonsets, prepull_progress
from agentrl.rollout.concurrency_source import ConfigMapSource, follow
from agentrl.rollout.scheduler import RolloutScheduler
from agentrl.rollout.tasks.cli import applied_sandbox_pods
from agentrl.sandbox.kubernetes import KubeApiTransport, KubernetesProvider
from agentrl.sandbox.provider import SandboxRequest

SANDBOX_SELECTOR = "app.kubernetes.io/component=sandbox"


#: A small job the simulated cluster can run (2 single-GPU engines, 1 trainer node); each test
#: names its copy and sets the sandbox concurrency: ``SMALL.copy("scaled").with_concurrency(2)``.
SMALL = (
    make_job("small", None)
    .with_model_pvc("models", "Qwen3-8B")
    .with_model(architecture="Qwen3-8B")
    .with_inference(
        engines=2, contextLength=32768, maxRunningRequests=32, cpu="8", memory="64Gi"
    )
    .with_rollout(groupSize=2, maxTrajectoryTokens=32768, maxTokensPerTurn=4096, workers=1)
    .with_sandbox(cpu="500m", memory="512Mi")
    .with_trainer(nodes=1, gpusPerNode=2, trajectoriesPerStep=8, cpu="8", memory="64Gi")
)


def sandbox_status(kubectl: Kubectl, name: str) -> dict[str, Any]:
    return dict((kubectl.json("get", "arj", name).get("status") or {}).get("sandbox") or {})


def runtime_concurrency(kubectl: Kubectl, name: str) -> int | None:
    proc = kubectl.run("get", "configmap", f"{name}-config", "-o", "json", check=False)
    if proc.returncode != 0:
        return None
    runtime = yaml.safe_load(json.loads(proc.stdout)["data"]["runtime.yaml"])
    return int(runtime["sandbox"]["concurrency"])


def live_sandbox_pods(kubectl: Kubectl) -> int:
    pods = kubectl.json("get", "pods", "-l", SANDBOX_SELECTOR)["items"]
    return sum(1 for p in pods if not p["metadata"].get("deletionTimestamp"))


# ---- an HPA reads the job's /scale (API server + kube-controller-manager) ------------------


@pytest.mark.apiserver
@pytest.mark.usefixtures("crd_installed")
def test_an_hpa_targeting_the_job_is_accepted_and_reads_its_scale(kubectl: Kubectl) -> None:
    kubectl.apply(SMALL.copy("swe-agent").with_concurrency(96).manifest())
    # What the operator would write; set here so the HPA also finds the pod selector.
    kubectl.run(
        "patch",
        "arj",
        "swe-agent",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(
            {
                "status": {
                    "sandbox": {
                        "concurrency": 96,
                        "selector": "agentrl.dev/job=swe-agent,app.kubernetes.io/component=sandbox",
                    }
                }
            }
        ),
    )
    kubectl.run("apply", "-f", "examples/autoscaling/hpa.yaml")

    def scale_read() -> dict[str, Any] | None:
        hpa = kubectl.json("get", "hpa", "swe-agent-sandboxes")
        conditions = {c["type"]: c for c in (hpa.get("status") or {}).get("conditions", [])}
        able = conditions.get("AbleToScale")
        return hpa if able and able["reason"] == "SucceededGetScale" else None

    # the HPA controller syncs every 15 s by default
    hpa = wait_for(scale_read, timeout=90, interval=2, what="the HPA to read the job's /scale")
    status = hpa["status"]
    assert status["currentReplicas"] == 96
    active = next(c for c in status["conditions"] if c["type"] == "ScalingActive")
    # no external metrics API on this cluster: the HPA got the scale but not the metric, and
    # left the field alone
    assert active["status"] == "False", active
    assert kubectl.json("get", "arj", "swe-agent")["spec"]["sandbox"]["concurrency"] == 96


# ---- the pre-pull DaemonSet (API server, controllers, kwok) ---------------------------------


@pytest.mark.apiserver
@pytest.mark.usefixtures("crd_installed")
def test_the_pre_pull_daemonset_runs_on_sandbox_nodes_and_reports_progress(
    kubectl: Kubectl,
) -> None:
    nodes = kubectl.json("get", "nodes")["items"]
    # the dev cluster labels its CPU nodes as the sandbox pool
    node_selector = {"agentrl.dev/node-pool": "sandbox"}
    manifest = (
        SMALL.copy("prepull")
        .with_concurrency(4)
        .with_sandbox(
            nodeSelector=node_selector, prePull={"enabled": True, "maxPullsPerHour": 1000}
        )
        .manifest()
    )
    kubectl.apply(manifest)
    created = kubectl.json("get", "arj", "prepull")
    job = AgentRLJob.model_validate(manifest)
    ctx = BuildContext(namespace=kubectl.namespace or "default", uid=created["metadata"]["uid"])
    matching = [n for n in nodes if node_selector.items() <= n["metadata"]["labels"].items()]
    sets = prepull_daemonsets(job, ctx, ["swe/task-a:1", "swe/task-b:1"], nodes=len(matching))
    assert len(sets) == 1
    for ds in sets:
        kubectl.apply(ds, "--server-side", "--field-manager=agentrl-operator")

    def progress() -> Any:
        items = kubectl.json("get", "daemonsets", "-l", "app.kubernetes.io/component=prepull")
        result = prepull_progress(items["items"])
        return result if result is not None and result.done else None

    done = wait_for(progress, timeout=120, interval=2, what="pre-pull on every sandbox node")
    assert done.nodes == len(matching)
    assert done.message == f"3 images pre-pulled on all {len(matching)} sandbox nodes"


# ---- with the operator running --------------------------------------------------------------


class HoldingRunner:
    """An episode runner whose episodes hold one real sandbox pod for ``hold`` seconds."""

    def __init__(self, provider: KubernetesProvider, hold: float) -> None:
        self.provider = provider
        self.hold = hold
        self.completed = 0
        self.cancelled = 0

    async def run(self, task: Any, *, group_id: str, policy_version: int) -> Any:
        sandbox = await self.provider.create(SandboxRequest(episode_id=f"{task.id}-{group_id}"))
        try:
            await asyncio.sleep(self.hold)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            await sandbox.close()
        self.completed += 1
        return types.SimpleNamespace(
            terminal_class=TerminalClass.COMPLETED, training_action=ClassAction.TRAIN
        )


async def _wait(check: Any, *, timeout: float, what: str) -> Any:
    return await asyncio.to_thread(wait_for, check, timeout=timeout, interval=0.5, what=what)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.usefixtures("storage", "operator")
async def test_kubectl_scale_up_and_down_changes_the_sandbox_pods_in_flight(
    kubectl: Kubectl, cluster: ClusterHandle
) -> None:
    manifest = SMALL.copy("scaled").with_concurrency(2).manifest()
    kubectl.apply(manifest)
    await _wait(
        lambda: runtime_concurrency(kubectl, "scaled") == 2,
        timeout=60,
        what="the operator to write concurrency 2",
    )
    provider = KubernetesProvider(
        transport=KubeApiTransport(
            kubectl.namespace or "default", kubeconfig=str(cluster.kubeconfig)
        ),
        # what the operator wrote into the job's runtime.yaml, as a rollout worker receives it
        pods=applied_sandbox_pods(
            "scaled", kubectl.namespace, kubeconfig=str(cluster.kubeconfig)
        ),
        worker_id="e2e-worker",
        creates_per_second=20,
        poll_seconds=0.25,
    )
    runner = HoldingRunner(provider, hold=4.0)
    tasks = (types.SimpleNamespace(id=f"t{i}") for i in range(10_000))
    scheduler = RolloutScheduler(runner=runner, tasks=tasks, concurrency=0)  # type: ignore[arg-type]
    scheduler.start()
    # What a rollout worker outside the cluster does: watch the in-effect concurrency in the
    # ConfigMap the operator writes (in the cluster it polls the mounted file instead).
    source = ConfigMapSource(
        kubectl.namespace or "default", "scaled-config", kubeconfig=str(cluster.kubeconfig)
    )
    follower = asyncio.create_task(follow(source, scheduler))
    try:
        await _wait(
            lambda: live_sandbox_pods(kubectl) == 2, timeout=60, what="2 sandbox pods in flight"
        )

        kubectl.run("scale", "arj/scaled", "--replicas=6")
        await _wait(
            lambda: live_sandbox_pods(kubectl) == 6,
            timeout=60,
            what="6 sandbox pods in flight after scaling up",
        )

        kubectl.run("scale", "arj/scaled", "--replicas=1")
        await _wait(
            lambda: scheduler.concurrency == 1,
            timeout=30,
            what="the worker to follow the lower concurrency",
        )
        # in-flight episodes finish (4 s each) instead of being killed; then one at a time
        await _wait(
            lambda: live_sandbox_pods(kubectl) <= 1 and scheduler.in_flight == 1,
            timeout=60,
            what="1 sandbox pod in flight after scaling down",
        )
        samples = []
        for _ in range(6):
            samples.append(live_sandbox_pods(kubectl))
            await asyncio.sleep(1)
        assert max(samples) <= 1, samples
        assert runner.cancelled == 0
        assert runner.completed >= 6
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
        await scheduler.cancel()
        await provider.aclose()


def _moves(kubectl: Kubectl, name: str, reason: str) -> list[tuple[int, int]]:
    """``(from, to)`` of every autoscaler Event with ``reason`` on the job, in the order of
    ``from`` (timestamps have one-second resolution, too coarse to order moves a second
    apart)."""
    events = kubectl.json(
        "get", "events", "--field-selector", f"involvedObject.name={name},reason={reason}"
    )["items"]
    out = []
    for event in events:
        match = re.search(r"concurrency (\d+) → (\d+)", event["message"])
        assert match, event["message"]
        out.append((int(match.group(1)), int(match.group(2))))
    return sorted(out, reverse=reason == REASON_LOWERED)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.usefixtures("storage", "operator")
def test_the_autoscaler_fed_synthetic_metrics_moves_within_bounds_and_steps_and_says_why(
    kubectl: Kubectl,
) -> None:
    idle = {
        "engines": [
            {"pod": f"e-{i}", "runningRequests": 2, "queuedRequests": 0, "tokenUsage": 0.1}
            for i in range(2)
        ]
    }
    autoscale = {
        "enabled": True,
        "min": 4,
        "max": 30,
        "maxStepUp": 8,
        "maxStepDown": 5,
        "cooldownSeconds": 1,
    }
    manifest = SMALL.copy("auto").with_concurrency(8).with_sandbox(autoscale=autoscale).manifest()
    manifest["metadata"]["annotations"] = {ANNOTATION_SYNTHETIC_ENGINE_METRICS: json.dumps(idle)}
    kubectl.apply(manifest)

    # idle engines: raised by at most 8 per move up to max 30: 8 → 16 → 24 → 30
    wait_for(
        lambda: sandbox_status(kubectl, "auto").get("desired") == 30,
        timeout=120,
        interval=1,
        what="the autoscaler to reach autoscale.max",
    )
    assert kubectl.json("get", "arj", "auto")["spec"]["sandbox"]["concurrency"] == 30
    reason = sandbox_status(kubectl, "auto")["lastScaleReason"]
    assert reason.startswith("raised sandbox concurrency 24 → 30 (+6) (limited by autoscale.max")
    assert "KV-cache usage 0.1 < target 0.7" in reason
    ups = _moves(kubectl, "auto", REASON_RAISED)
    assert ups == [(8, 16), (16, 24), (24, 30)]
    assert runtime_concurrency(kubectl, "auto") == 30

    # saturated engines (queue 10 > 4 per engine): lowered by at most 5 per move down to min 4
    busy = {
        "engines": [
            {"pod": f"e-{i}", "runningRequests": 30, "queuedRequests": 10, "tokenUsage": 0.5}
            for i in range(2)
        ]
    }
    kubectl.run(
        "annotate",
        "--overwrite",
        "arj",
        "auto",
        f"{ANNOTATION_SYNTHETIC_ENGINE_METRICS}={json.dumps(busy)}",
    )
    wait_for(
        lambda: sandbox_status(kubectl, "auto").get("desired") == 4,
        timeout=180,
        interval=1,
        what="the autoscaler to reach autoscale.min",
    )
    downs = _moves(kubectl, "auto", REASON_LOWERED)
    # 30 → 25 → 20 → 15 → 10 → 5 → 4
    assert downs == [(30, 25), (25, 20), (20, 15), (15, 10), (10, 5), (5, 4)]
    assert sandbox_status(kubectl, "auto")["lastScaleReason"] == (
        "lowered sandbox concurrency 5 → 4 (-1) (limited by autoscale.min 4): "
        "10 requests queued per engine > target 4"
    )


@pytest.mark.e2e
@pytest.mark.usefixtures("storage", "operator")
def test_a_resource_quota_caps_concurrency_and_status_names_it(kubectl: Kubectl) -> None:
    # Scoped to Terminating pods (those with activeDeadlineSeconds): sandbox pods, not the
    # engines, trainer or rollout workers, which the quota therefore neither counts nor blocks.
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "sandboxes"},
            "spec": {"hard": {"pods": "5"}, "scopes": ["Terminating"]},
        }
    )
    wait_for(
        lambda: (
            (kubectl.json("get", "resourcequota", "sandboxes").get("status") or {}).get("used")
            is not None
        ),
        timeout=60,
        what="the quota controller to fill status",
    )
    kubectl.apply(SMALL.copy("capped").with_concurrency(8).manifest())

    def capped() -> dict[str, Any] | None:
        sandbox = sandbox_status(kubectl, "capped")
        return sandbox if sandbox.get("limitedBy") else None

    sandbox = wait_for(capped, timeout=60, interval=1, what="status.sandbox.limitedBy")
    assert sandbox["limitedBy"] == "ResourceQuota/sandboxes pods"
    assert (sandbox["concurrency"], sandbox["desired"]) == (5, 8)
    assert runtime_concurrency(kubectl, "capped") == 5

    # raising the quota lifts the cap
    kubectl.run(
        "patch",
        "resourcequota",
        "sandboxes",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"hard": {"pods": "50"}}}),
    )
    wait_for(
        lambda: sandbox_status(kubectl, "capped").get("concurrency") == 8,
        timeout=60,
        interval=1,
        what="the cap to lift",
    )
    assert sandbox_status(kubectl, "capped").get("limitedBy") is None


def test_the_shipped_hpa_and_keda_examples_target_the_agentrljob() -> None:
    for path in ("examples/autoscaling/hpa.yaml", "examples/autoscaling/keda-scaledobject.yaml"):
        doc = yaml.safe_load(Path(path).read_text())
        assert doc["spec"]["scaleTargetRef"] == {
            "apiVersion": "agentrl.dev/v1alpha1",
            "kind": "AgentRLJob",
            "name": "swe-agent",
        }, path
