"""PriorityClasses on the real API server: an operator run with the chart's classes
(``--trainer-priority-class`` and its siblings) writes them into every pod template it applies
and into the sandbox template of runtime.yaml, and the API server's Priority admission gives
the pods the classes' values; a job's own ``priorityClassName`` wins. And the quota arithmetic
agrees with the API server's own: a ResourceQuota scoped by PriorityClass charges a sandbox pod
exactly when ``quotas.applies_to_sandboxes`` says it limits sandboxes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import AsyncClient
from lightkube.config.kubeconfig import KubeConfig

from agentrl.api import AgentRLJob
from agentrl.api.wire import CONFIG_RUNTIME_KEY, RuntimeConfig
from agentrl.controller.kube import LightkubeAPI
from agentrl.controller.reconciler import Reconciler
from agentrl.controller.settings import OperatorSettings
from agentrl.controller.workqueue import Key
from agentrl.devcluster.testing import ClusterHandle, Kubectl, wait_for
from agentrl.reconcile.constants import FIELD_MANAGER
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.priority import PriorityClasses, with_priority_classes
from agentrl.reconcile.quotas import applies_to_sandboxes, quota_from_object
from agentrl.reconcile.sandbox import sandbox_pod

pytestmark = [pytest.mark.apiserver, pytest.mark.usefixtures("crd_installed")]

MANIFEST = yaml.safe_load(Path("examples/quickstart-cluster.yaml").read_text())
NAME = MANIFEST["metadata"]["name"]
#: value and preemption policy per kind, as the chart's values.yaml has them
CLASSES = {
    "trainer": (1000000, "PreemptLowerPriority"),
    "engines": (100000, "PreemptLowerPriority"),
    "rollout": (10000, "PreemptLowerPriority"),
    "sandboxes": (1000, "Never"),
}


@pytest.fixture
def classes(cluster: ClusterHandle) -> Iterator[dict[str, str]]:
    """The four classes (cluster-scoped, so named uniquely): kind → name."""
    admin = cluster.kubectl()
    prefix = f"t-{uuid.uuid4().hex[:6]}"
    names = {kind: f"{prefix}-{kind}" for kind in CLASSES}
    for kind, (value, policy) in CLASSES.items():
        admin.apply({
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": names[kind]}, "value": value, "globalDefault": False,
            "preemptionPolicy": policy,
        })  # fmt: skip
    yield names
    admin.run("delete", "priorityclass", *names.values(), "--wait=false", check=False)


async def _reconcile(cluster: ClusterHandle, namespace: str, settings: OperatorSettings) -> None:
    client = AsyncClient(
        config=KubeConfig.from_file(cluster.kubeconfig), field_manager=FIELD_MANAGER
    )
    try:
        await Reconciler(LightkubeAPI(client), settings).reconcile(Key(namespace, NAME))
    finally:
        await client.close()


def _settings(names: dict[str, str]) -> OperatorSettings:
    return OperatorSettings(priority_classes=PriorityClasses(**names))


def _template_class(kubectl: Kubectl, kind: str, name: str) -> str | None:
    spec = kubectl.json("get", kind, name)["spec"]["template"]["spec"]
    return spec.get("priorityClassName")  # type: ignore[no-any-return]


def _sandbox_template(kubectl: Kubectl) -> dict[str, Any]:
    config = kubectl.json("get", "configmap", f"{NAME}-config")
    runtime = RuntimeConfig.model_validate(yaml.safe_load(config["data"][CONFIG_RUNTIME_KEY]))
    assert runtime.sandbox.pods is not None
    return runtime.sandbox.pods.template


async def test_the_operators_classes_reach_every_pod_and_the_api_server_gives_their_priority(
    cluster: ClusterHandle, kubectl: Kubectl, namespace: str, classes: dict[str, str]
) -> None:
    kubectl.apply(MANIFEST)
    await _reconcile(cluster, namespace, _settings(classes))
    assert _template_class(kubectl, "statefulset", f"{NAME}-engine") == classes["engines"]
    assert _template_class(kubectl, "job", f"{NAME}-trainer") == classes["trainer"]
    assert _template_class(kubectl, "deployment", f"{NAME}-rollout") == classes["rollout"]
    assert _sandbox_template(kubectl)["spec"]["priorityClassName"] == classes["sandboxes"]

    # the Job controller makes the trainer's pod; the Priority admission resolves its class
    def trainer_pod() -> dict[str, Any] | None:
        items = kubectl.json(
            "get", "pods", "-l", f"agentrl.dev/job={NAME},app.kubernetes.io/component=trainer"
        )["items"]
        return items[0] if items else None

    wait_for(lambda: trainer_pod() is not None, timeout=60, what="the trainer's pod")
    pod = trainer_pod()
    assert pod is not None
    assert (pod["spec"]["priorityClassName"], pod["spec"]["priority"]) == (
        classes["trainer"],
        1000000,
    )
    assert pod["spec"]["preemptionPolicy"] == "PreemptLowerPriority"

    # a sandbox pod made from runtime.yaml's template is admitted with the sandboxes' class
    sandbox = _sandbox_pod(kubectl, "sbx-admitted")
    assert (sandbox["spec"]["priority"], sandbox["spec"]["preemptionPolicy"]) == (1000, "Never")


async def test_a_jobs_own_class_wins_over_the_operators(
    cluster: ClusterHandle, kubectl: Kubectl, namespace: str, classes: dict[str, str]
) -> None:
    manifest = yaml.safe_load(yaml.safe_dump(MANIFEST))
    manifest["spec"]["rollout"]["priorityClassName"] = classes["trainer"]
    kubectl.apply(manifest)
    await _reconcile(cluster, namespace, _settings(classes))
    assert _template_class(kubectl, "deployment", f"{NAME}-rollout") == classes["trainer"]
    assert _template_class(kubectl, "statefulset", f"{NAME}-engine") == classes["engines"]


def _sandbox_pod(kubectl: Kubectl, name: str) -> dict[str, Any]:
    """A sandbox pod as a rollout worker creates it from runtime.yaml, read back."""
    config = kubectl.json("get", "configmap", f"{NAME}-config")
    runtime = RuntimeConfig.model_validate(yaml.safe_load(config["data"][CONFIG_RUNTIME_KEY]))
    assert runtime.sandbox.pods is not None
    kubectl.apply(runtime.sandbox.pods.pod(f"{NAME}-{name}", None))
    return kubectl.json("get", "pod", f"{NAME}-{name}")  # type: ignore[no-any-return]


def _quota(name: str, operator: str, *values: str) -> dict[str, Any]:
    expression: dict[str, Any] = {"scopeName": "PriorityClass", "operator": operator}
    if values:
        expression["values"] = list(values)
    return {
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name},
        "spec": {"hard": {"pods": "10"}, "scopeSelector": {"matchExpressions": [expression]}},
    }  # fmt: skip


async def test_a_quota_scoped_by_priority_class_charges_sandboxes_as_the_operator_counts_them(
    cluster: ClusterHandle, kubectl: Kubectl, namespace: str, classes: dict[str, str]
) -> None:
    sandboxes = classes["sandboxes"]
    quotas = {
        "in-sandboxes": _quota("in-sandboxes", "In", sandboxes),
        "in-trainer": _quota("in-trainer", "In", classes["trainer"]),
        "notin-sandboxes": _quota("notin-sandboxes", "NotIn", sandboxes),
        "exists": _quota("exists", "Exists"),
    }
    for quota in quotas.values():
        kubectl.apply(quota)
    # the quota controller fills status.hard before admission charges anything
    wait_for(
        lambda: all(
            kubectl.json("get", "resourcequota", q).get("status", {}).get("hard") for q in quotas
        ),
        timeout=60,
        what="the quota controller to process the quotas",
    )
    # the sandbox pod alone (no reconcile: the job's other pods would be charged too), built
    # as the operator builds it for the job with the operator's classes filled in
    kubectl.apply(MANIFEST)
    job = with_priority_classes(
        AgentRLJob.model_validate(kubectl.json("get", "arj", NAME)), PriorityClasses(**classes)
    )
    ctx = BuildContext.for_job(job, namespace=namespace)
    kubectl.apply(sandbox_pod(job, ctx, pod_name=f"{NAME}-sbx-1"))

    def charged() -> dict[str, str]:
        return {
            q: kubectl.json("get", "resourcequota", q)["status"].get("used", {}).get("pods", "0")
            for q in quotas
        }

    # what the API server charged for the one sandbox pod
    expected = {"in-sandboxes": "1", "in-trainer": "0", "notin-sandboxes": "0", "exists": "1"}
    wait_for(lambda: charged() == expected, timeout=60, what=f"quota usage {expected}")
    # and what the operator's arithmetic says of each quota, read back from the API server
    for name in quotas:
        read = quota_from_object(kubectl.json("get", "resourcequota", name))
        assert applies_to_sandboxes(read, priority_class=sandboxes) is (expected[name] == "1")


async def test_an_operator_upgraded_to_classes_keeps_reconciling_a_running_job(
    cluster: ClusterHandle, kubectl: Kubectl, namespace: str, classes: dict[str, str]
) -> None:
    """A job started under an operator without classes, then reconciled by one with them (the
    chart upgraded): Kubernetes never changes a Job's pod template, so the running trainer
    attempt keeps its pods as they are while the engines and rollout workers take their
    classes, and the rest of the trainer Job still follows the spec (suspend)."""
    kubectl.apply(MANIFEST)
    await _reconcile(cluster, namespace, OperatorSettings())
    assert _template_class(kubectl, "job", f"{NAME}-trainer") is None
    await _reconcile(cluster, namespace, _settings(classes))  # no 422 escapes
    assert _template_class(kubectl, "job", f"{NAME}-trainer") is None
    assert _template_class(kubectl, "statefulset", f"{NAME}-engine") == classes["engines"]
    assert _template_class(kubectl, "deployment", f"{NAME}-rollout") == classes["rollout"]
    status = kubectl.json("get", "arj", NAME)["status"]
    assert status["observedGeneration"] == 1
    kubectl.run("patch", "arj", NAME, "--type=merge", "-p", '{"spec": {"suspend": true}}')
    await _reconcile(cluster, namespace, _settings(classes))
    assert kubectl.json("get", "job", f"{NAME}-trainer")["spec"]["suspend"] is True
