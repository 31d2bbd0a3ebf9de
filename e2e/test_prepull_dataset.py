"""The pre-pull DaemonSet built from a dataset's images, on the local control plane (API
server, controllers, kwok nodes): every sandbox node ends up holding each distinct image of the
dataset, and the progress the operator reports counts them once each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.factories import make_job
from tests.reconcile.test_prepull_dataset import DJANGO, SMITH_A, SMITH_B, dataset

from agentrl.api import AgentRLJob
from agentrl.devcluster.testing import Kubectl, wait_for
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.prepull import prepull_daemonsets, prepull_progress
from agentrl.rollout.tasks import load_dataset, task_images


@pytest.mark.apiserver
@pytest.mark.usefixtures("crd_installed")
def test_the_datasets_images_are_pre_pulled_once_each_on_every_sandbox_node(
    kubectl: Kubectl, tmp_path: Path
) -> None:
    node_selector = {"agentrl.dev/node-pool": "sandbox"}
    manifest = (
        make_job("prepull-data", kubectl.namespace)
        .with_spec("dataset.format", "swesmith")
        .with_spec("dataset.path", "/data/tasks.jsonl")
        .with_sandbox(
            nodeSelector=node_selector, prePull={"enabled": True, "maxPullsPerHour": 1000}
        )
        .manifest()
    )
    kubectl.apply(manifest)
    created = kubectl.json("get", "arj", "prepull-data")
    job = AgentRLJob.model_validate(manifest)
    ctx = BuildContext(namespace=kubectl.namespace or "default", uid=created["metadata"]["uid"])
    nodes = kubectl.json("get", "nodes")["items"]
    matching = [n for n in nodes if node_selector.items() <= n["metadata"]["labels"].items()]
    assert matching, "the dev cluster labels its CPU nodes as the sandbox pool"

    images = task_images(load_dataset(dataset(tmp_path)))
    assert images == [SMITH_A, SMITH_B, DJANGO]
    [ds] = prepull_daemonsets(job, ctx, images, nodes=len(matching))
    kubectl.apply(ds, "--server-side", "--field-manager=agentrl-operator")

    def progress() -> Any:
        items = kubectl.json("get", "daemonsets", "-l", "app.kubernetes.io/component=prepull")
        result = prepull_progress(items["items"])
        return result if result is not None and result.done else None

    done = wait_for(progress, timeout=120, interval=2, what="pre-pull on every sandbox node")
    # the sandbox image and the dataset's three distinct images (four tasks)
    assert done.message == f"4 images pre-pulled on all {len(matching)} sandbox nodes"
    pods = kubectl.json("get", "pods", "-l", "app.kubernetes.io/component=prepull")["items"]
    assert len(pods) == len(matching)
    for pod in pods:
        pulled = [c["image"] for c in pod["spec"]["initContainers"][1:]]
        assert pulled == ["python:3.11-slim", SMITH_A, SMITH_B, DJANGO]
