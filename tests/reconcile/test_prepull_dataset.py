"""A dataset's images reach the pre-pull DaemonSets: ``agentrl tasks images`` lists them (each
once) and writes them into ``spec.sandbox.prePull.images``, and the builder pulls each image
once per node, paced within ``prePull.maxPullsPerHour``."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner

from agentrl.api import AgentRLJob
from agentrl.cli import main
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.prepull import (
    prepull_daemonsets,
    read_task_images,
    task_images_configmap,
    wanted,
)
from agentrl.reconcile.trainer import trainer_env, trainer_rbac
from agentrl.rollout.tasks import load_dataset, task_images
from tests.factories import make_job
from tests.rollout.swebench_rows import row

SMITH_A = "swebench/swesmith.x86_64.pandas-dev_1776_pandas.95280573"
SMITH_B = "swebench/swesmith.x86_64.pallets_1776_click.fde47b4b"
DJANGO = "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"


def _smith(instance_id: str, image: str) -> dict[str, object]:
    return {
        "instance_id": instance_id,
        "repo": "swesmith/" + instance_id.rsplit(".", 1)[0],
        "image_name": image,
        "patch": "diff --git a/a.py b/a.py\n",
        "FAIL_TO_PASS": json.dumps(["tests/test_a.py::test_a"]),
        "PASS_TO_PASS": "[]",
    }


def dataset(tmp_path: Path) -> Path:
    rows = [
        _smith("pandas-dev__pandas.95280573.a", SMITH_A),
        _smith("pandas-dev__pandas.95280573.b", SMITH_A),  # same snapshot, same image
        _smith("pallets__click.fde47b4b.c", SMITH_B),
        row(
            "django__django-11099",
            "django/django",
            fail_to_pass=["t"],
            pass_to_pass=[],
            log_parser="parse_log_django",
            test_command="./tests/runtests.py --verbosity 2",
            test_file="tests/x/tests.py",
        ),
    ]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_daemonset_pulls_the_datasets_images_once_each_within_the_budget(
    tmp_path: Path,
) -> None:
    job = (
        make_job("swe")
        .with_spec("dataset.format", "swesmith")
        .with_spec("dataset.path", "/data/tasks.jsonl")
        .with_sandbox(prePull={"enabled": True, "maxPullsPerHour": 10, "images": ["x:1", SMITH_A]})
        .obj()
    )
    images = task_images(load_dataset(dataset(tmp_path)))
    [ds] = prepull_daemonsets(job, BuildContext.for_job(job), images, nodes=3)
    pulls = ds["spec"]["template"]["spec"]["initContainers"][1:]
    # sandbox image, the dataset's three distinct images, then the extra one (its copy of
    # SMITH_A is not pulled twice)
    assert [c["image"] for c in pulls] == ["python:3.11-slim", SMITH_A, SMITH_B, DJANGO, "x:1"]
    # 5 images × 3 nodes = 15 pulls > 10 per hour: each node waits 3600 × 3 / 10 = 1080 s
    assert {tuple(c["command"][1:]) for c in pulls} == {("sleep", "1080")}
    assert ds["metadata"]["annotations"]["agentrl.dev/prepull-interval-seconds"] == "1080"


def test_tasks_images_lists_each_image_once(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["tasks", "images", str(dataset(tmp_path))])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [SMITH_A, SMITH_B, DJANGO]
    assert result.stderr == "3 images\n"


def test_tasks_images_writes_them_into_the_manifests_pre_pull_list(tmp_path: Path) -> None:
    manifest = make_job("swe").with_sandbox(prePull={"images": [SMITH_B, "x:1"]}).obj()
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest.to_manifest()))
    result = CliRunner().invoke(
        main, ["tasks", "images", str(dataset(tmp_path)), "--manifest", str(path)]
    )
    assert result.exit_code == 0, result.stderr
    job = AgentRLJob.model_validate(yaml.safe_load(result.stdout))
    assert job.spec.sandbox.pre_pull.enabled is True
    assert job.spec.sandbox.pre_pull.images == [SMITH_B, "x:1", SMITH_A, DJANGO]
    assert result.stderr == "2 images added to spec.sandbox.prePull.images\n"


# ---- the trainer's list, read back by the operator ----------------------------------------


#: A SWE-smith dataset; tests set ``spec.sandbox`` on a copy.
SWESMITH = make_job("swe").with_dataset(format="swesmith", path="/data/tasks.jsonl")


def test_the_task_images_configmap_exists_only_with_pre_pull_and_carries_no_data() -> None:
    on = SWESMITH.copy().with_sandbox(prePull={"enabled": True}).obj()
    cm = task_images_configmap(on, BuildContext.for_job(on))
    assert cm["metadata"]["name"] == "swe-task-images"
    # the trainer owns data: an apply that named it would take the trainer's list away
    assert "data" not in cm
    assert wanted(on)
    assert not wanted(SWESMITH.copy().with_sandbox(prePull={"enabled": False}).obj())
    e2b = {"apiKeySecretRef": {"name": "e2b"}, "maxConcurrent": 4}
    e2b_job = SWESMITH.copy().with_sandbox(prePull={"enabled": True}, provider="e2b", e2b=e2b)
    assert not wanted(e2b_job.obj())


def test_the_operator_reads_the_images_as_the_trainer_wrote_them() -> None:
    # what the API server returns after the trainer's merge patch of data.images
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "swe-task-images", "namespace": "team"},
        "data": {"images": f"{SMITH_A}\n{SMITH_B}\n\n {SMITH_A}\n{DJANGO}\n"},
    }
    assert read_task_images(configmap) == [SMITH_A, SMITH_B, DJANGO]
    assert read_task_images({"metadata": {"name": "swe-task-images"}}) == []  # not written yet
    assert read_task_images(None) == []  # not created yet


def test_the_trainer_may_write_its_task_images_configmap_and_no_other() -> None:
    on = SWESMITH.copy().with_sandbox(prePull={"enabled": True}).obj()
    role = next(o for o in trainer_rbac(on, BuildContext.for_job(on)) if o["kind"] == "Role")
    configmap_rules = [r for r in role["rules"] if "configmaps" in r["resources"]]
    assert configmap_rules == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "verbs": ["get", "patch"],
            "resourceNames": ["swe-task-images"],
        }
    ]
    env = {e["name"]: e.get("value") for e in trainer_env(on, BuildContext.for_job(on), attempt=0)}
    assert env["AGENTRL_TASK_IMAGES_CONFIGMAP"] == "swe-task-images"

    off = SWESMITH.copy().with_sandbox(prePull={"enabled": False}).obj()
    role = next(o for o in trainer_rbac(off, BuildContext.for_job(off)) if o["kind"] == "Role")
    assert not [r for r in role["rules"] if "configmaps" in r["resources"]]
    env = {e["name"] for e in trainer_env(off, BuildContext.for_job(off), attempt=0)}
    assert "AGENTRL_TASK_IMAGES_CONFIGMAP" not in env
