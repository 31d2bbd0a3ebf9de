"""The pre-pull DaemonSet built from a dataset's images, on the local control plane (API
server, controllers, kwok nodes): every sandbox node ends up holding each distinct image of the
dataset, and the progress the operator reports counts them once each."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from tests.factories import make_job
from tests.reconcile.test_prepull_dataset import DJANGO, SMITH_A, SMITH_B, dataset

from agentrl.api import AgentRLJob
from agentrl.devcluster.testing import ClusterHandle, Kubectl, wait_for
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


@pytest.mark.e2e
@pytest.mark.usefixtures("storage", "operator")
async def test_the_operator_pre_pulls_the_images_the_trainer_writes_for_its_dataset(
    kubectl: Kubectl, cluster: ClusterHandle, tmp_path: Path
) -> None:
    """The whole hand-over on the real API server: the operator creates ``NAME-task-images``,
    the trainer's sink writes the dataset's images there (as the trainer's driver does after
    loading the dataset), the operator's DaemonSet pulls them on every sandbox node, and its
    periodic re-apply of the ConfigMap leaves the trainer's list in place."""
    from lightkube import AsyncClient, KubeConfig

    from agentrl.rollout.tasks import load_tasks
    from agentrl.trainer.loop import TaskOrder
    from agentrl.trainer.task_images import LightkubeTaskImagesSink, images_in_draw_order, publish

    name, ns = "prepull-listed", kubectl.namespace or "default"
    node_selector = {"agentrl.dev/node-pool": "sandbox"}
    path = dataset(tmp_path)
    manifest = (
        make_job(name, ns)
        .with_spec("dataset.format", "swebench")
        .with_spec("dataset.path", str(path))
        .with_spec("dataset.heldOutFraction", 0.0)
        .with_spec("trainer.evaluation.tasks", 0)  # no held-out tasks: no evaluation
        .with_sandbox(
            nodeSelector=node_selector, prePull={"enabled": True, "maxPullsPerHour": 1000}
        )
        .manifest()
    )
    kubectl.apply(manifest)

    def created() -> Any:
        done = kubectl.run("get", "configmap", f"{name}-task-images", "-o", "json", check=False)
        return done.returncode == 0

    wait_for(created, timeout=60, interval=1, what="the operator to create the task-images map")
    # the trainer's ServiceAccount may write this map, and no other of the job's
    trainer_sa = f"system:serviceaccount:{ns}:{name}-trainer"
    can = kubectl.run(
        "auth", "can-i", "patch", f"configmap/{name}-task-images", f"--as={trainer_sa}",
        check=False,
    )  # fmt: skip
    assert can.stdout.strip() == "yes"
    cannot = kubectl.run(
        "auth", "can-i", "patch", f"configmap/{name}-config", f"--as={trainer_sa}", check=False
    )
    assert cannot.stdout.strip() == "no"

    # what the driver writes: the images in the order it draws the tasks
    job = AgentRLJob.model_validate(manifest)
    tasks = load_tasks(job.spec.dataset)
    images = images_in_draw_order(TaskOrder(tasks, job.spec.dataset.seed), cursor=0, pending=[])
    assert sorted(images) == sorted([SMITH_A, SMITH_B, DJANGO])  # four rows, three images
    client = AsyncClient(config=KubeConfig.from_file(str(cluster.kubeconfig)))
    try:
        sink = LightkubeTaskImagesSink(name=f"{name}-task-images", namespace=ns, client=client)
        assert await publish(sink, images) == 0
    finally:
        await client.close()

    def pulled() -> Any:
        items = kubectl.json("get", "daemonsets", "-l", f"agentrl.dev/job={name}")["items"]
        result = prepull_progress(items)
        # before the trainer's list, the DaemonSet pulls the sandbox image alone (and is soon
        # done with it): wait for the template that names the trainer's images
        listed = [
            [c["image"] for c in ds["spec"]["template"]["spec"]["initContainers"][1:]]
            for ds in items
        ]
        wanted = listed == [["python:3.11-slim", *images]]
        return result if wanted and result is not None and result.done else None

    done = await asyncio.to_thread(
        wait_for, pulled, timeout=120, interval=1, what="the trainer's images pre-pulled"
    )
    matching = [
        n
        for n in kubectl.json("get", "nodes")["items"]
        if node_selector.items() <= n["metadata"]["labels"].items()
    ]
    assert done.message == f"4 images pre-pulled on all {len(matching)} sandbox nodes"
    # the operator re-applies its children every resync (5 s here): the list stays
    await asyncio.sleep(12)
    data = kubectl.json("get", "configmap", f"{name}-task-images").get("data", {})
    assert data == {"images": "".join(f"{i}\n" for i in images)}
