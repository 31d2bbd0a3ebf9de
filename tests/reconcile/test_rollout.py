"""The rollout Deployment and the sandbox provider's RBAC."""

from __future__ import annotations

from typing import Any

import pytest

from agentrl.api import AgentRLJob
from agentrl.reconcile import engine, rollout
from agentrl.reconcile.context import BuildContext, Images
from tests.factories import make_job


def test_rollout_deployment_runs_the_spec_workers_as_ray_workers():
    job = make_job("swe", "rl").with_workers(3).obj()
    dep = rollout.deployment(job, BuildContext.for_job(job), replicas=3)
    assert (dep["apiVersion"], dep["kind"]) == ("apps/v1", "Deployment")
    assert dep["metadata"]["name"] == "swe-rollout"
    assert dep["spec"]["replicas"] == 3
    assert dep["spec"]["selector"] == {
        "matchLabels": {"agentrl.dev/job": "swe", "app.kubernetes.io/component": "rollout"}
    }
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "swe-rollout"
    container = pod["containers"][0]
    # Ray versions must match the head's, so the default image is the trainer's.
    assert container["image"] == "ghcr.io/agentrl/rocm-trainer:0.1.0"
    # agentrl ray join: waits for the head and follows it across trainer restarts
    assert container["command"] == [
        "agentrl",
        "ray",
        "join",
        "--address=$(RAY_HEAD_ADDRESS)",
        "--num-gpus=0",
        "--num-cpus=2",
        '--resources={"agentrl_rollout_node": 2}',
    ]
    assert container["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"}}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["RAY_HEAD_ADDRESS"] == "swe-trainer-0.swe-trainer.rl.svc:6379"
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["volumeMounts"] == [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "config", "mountPath": "/etc/agentrl", "readOnly": True},
    ]
    # no PriorityClass unless the spec (or the operator's default filled into it) names one
    assert "priorityClassName" not in pod


def test_rollout_pods_size_dev_shm_for_rays_object_store_from_their_memory_request():
    # spec.rollout.memory 4Gi: Ray's 30% of it is the store, 4 GiB × 0.3 = 1288490188.8 bytes;
    # /dev/shm 10% above: 1.2 GiB × 1.1 = 1351.68 MiB, rounded up to 1352Mi
    job = make_job("swe", "rl").with_workers(1).obj()
    pod = _worker_pod(job)
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["RAY_DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES"] == "1288490188"
    assert pod["volumes"][0] == {
        "name": "dshm",
        "emptyDir": {"medium": "Memory", "sizeLimit": "1352Mi"},
    }
    # 10Gi: 3 GiB store = 3221225472 bytes; 3072 MiB × 1.1 = 3379.2 → 3380Mi
    big = make_job("swe", "rl").with_rollout(memory="10Gi").obj()
    pod = _worker_pod(big)
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["RAY_DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES"] == "3221225472"
    assert pod["volumes"][0]["emptyDir"]["sizeLimit"] == "3380Mi"


def test_rollout_pods_run_with_the_priority_class_of_the_spec():
    job = make_job("swe", "rl").with_rollout(priorityClassName="agentrl-rollout").obj()
    assert _worker_pod(job)["priorityClassName"] == "agentrl-rollout"


def test_rollout_image_can_be_given_explicitly():
    job = make_job("swe").obj()
    ctx = BuildContext.for_job(job, images=Images(rollout="ghcr.io/agentrl/rollout:2"))
    pod = rollout.deployment(job, ctx, replicas=1)["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "ghcr.io/agentrl/rollout:2"


def test_rollout_pod_template_does_not_depend_on_sandbox_concurrency():
    # kubectl scale must never restart a worker: the template is the same at 16 and 384.
    low = make_job("swe").with_concurrency(16).obj()
    high = make_job("swe").with_concurrency(384).obj()
    a = rollout.deployment(low, BuildContext.for_job(low), replicas=1)
    b = rollout.deployment(high, BuildContext.for_job(high), replicas=1)
    assert a == b


def test_rollout_role_grants_exactly_the_sandbox_providers_verbs():
    job = make_job("swe", "rl").obj()
    sa, role, binding = rollout.rollout_rbac(job, BuildContext.for_job(job))
    assert sa["metadata"]["name"] == "swe-rollout"
    assert (role["kind"], role["metadata"]["namespace"]) == ("Role", "rl")
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["pods"],
            "verbs": ["create", "get", "list", "watch", "delete"],
        },
        {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"]},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    ]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "swe-rollout", "namespace": "rl"}
    ]


def _worker_pod(job: AgentRLJob) -> dict[str, Any]:
    return rollout.deployment(job, BuildContext.for_job(job), replicas=1)["spec"]["template"][
        "spec"
    ]


def _engine_model_storage(job: AgentRLJob) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The (volumes, mounts) of the engine pod that hold its ``--model-path``: the mounts of the
    engine container whose mountPath contains that path, and the volumes they name."""
    pod = engine.statefulset(job, BuildContext.for_job(job), replicas=1)["spec"]["template"]["spec"]
    container = pod["containers"][0]
    model_path = container["args"][container["args"].index("--model-path") + 1]
    mounts = [
        m
        for m in container["volumeMounts"]
        if model_path == m["mountPath"] or model_path.startswith(m["mountPath"].rstrip("/") + "/")
    ]
    names = {m["name"] for m in mounts}
    return [v for v in pod["volumes"] if v["name"] in names], mounts


def test_a_model_pvc_is_mounted_read_only_at_models_in_the_rollout_pods():
    # The workers load the model's tokenizer from the path the engines report.
    pod = _worker_pod(make_job("swe").with_model_pvc("weights", "Qwen3-8B").obj())
    assert pod["volumes"][1:] == [
        {"name": "config", "configMap": {"name": "swe-config"}},
        {"name": "model", "persistentVolumeClaim": {"claimName": "weights", "readOnly": True}},
    ]
    assert pod["containers"][0]["volumeMounts"][1:] == [
        {"name": "config", "mountPath": "/etc/agentrl", "readOnly": True},
        {"name": "model", "mountPath": "/models", "readOnly": True},
    ]


@pytest.mark.parametrize(
    ("source", "engine_mounts_model"),
    [
        ({"path": "Qwen3-8B", "pvc": "weights"}, True),
        ({"path": "/org/Qwen3-8B/", "pvc": "weights"}, True),
        ({"path": "/opt/models/Qwen3-8B"}, False),  # inside the images: nothing to mount
    ],
)
def test_rollout_pods_hold_the_engines_model_path_the_way_the_engine_pods_do(
    source: dict[str, str], engine_mounts_model: bool
):
    job = make_job("swe").with_spec("model.source", source).obj()
    engine_volumes, engine_mounts = _engine_model_storage(job)
    assert bool(engine_mounts) is engine_mounts_model
    pod = _worker_pod(job)
    mounts = pod["containers"][0]["volumeMounts"]
    # Exactly the engine's model volumes and mounts, besides the ConfigMap and /dev/shm.
    assert [m for m in mounts if m["name"] not in ("config", "dshm")] == engine_mounts
    assert [v for v in pod["volumes"] if v["name"] not in ("config", "dshm")] == engine_volumes


def test_every_rollout_volume_but_dev_shm_is_read_only():
    pod = _worker_pod(make_job("swe").with_model_pvc("weights").obj())
    mounts = pod["containers"][0]["volumeMounts"]
    assert [(m["name"], m.get("readOnly", False)) for m in mounts] == [
        ("dshm", False),  # Ray's object store writes there
        ("config", True),
        ("model", True),
    ]
    claims = [v["persistentVolumeClaim"] for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert claims == [{"claimName": "weights", "readOnly": True}]


def test_a_config_map_chat_template_is_mounted_read_only_with_only_its_key():
    job = (
        make_job("swe")
        .with_spec("model.chatTemplate", {"configMapKeyRef": {"name": "tpl", "key": "qwen.jinja"}})
        .obj()
    )
    pod = _worker_pod(job)
    assert pod["volumes"][1:] == [
        {"name": "config", "configMap": {"name": "swe-config"}},
        {
            "name": "chat-template",
            "configMap": {"name": "tpl", "items": [{"key": "qwen.jinja", "path": "qwen.jinja"}]},
        },
    ]
    assert pod["containers"][0]["volumeMounts"][1:] == [
        {"name": "config", "mountPath": "/etc/agentrl", "readOnly": True},
        {"name": "chat-template", "mountPath": "/etc/agentrl-chat-template", "readOnly": True},
    ]


@pytest.mark.parametrize(
    "template", [{"bundled": "qwen3-coder"}, {"path": "chat_template_keep_thinking.jinja"}]
)
def test_other_chat_template_sources_mount_nothing(template: dict[str, str]):
    # A bundled template ships in the image; a path template is in the model directory.
    pod = _worker_pod(make_job("swe").with_spec("model.chatTemplate", template).obj())
    assert [v["name"] for v in pod["volumes"]] == ["dshm", "config"]
    assert [m["name"] for m in pod["containers"][0]["volumeMounts"]] == ["dshm", "config"]


def test_rollout_workers_offer_ray_their_cpu_request_not_the_nodes_cpus():
    # Without --num-cpus Ray counts every CPU of the node (no CPU limit): one pod could take all
    # the workers' bundles.
    container = _worker_pod(make_job("swe").with_workers(4).obj())["containers"][0]
    offered = [a for a in container["command"] if a.startswith("--num-cpus=")]
    assert offered == ["--num-cpus=2"]
    assert offered == [f"--num-cpus={container['resources']['requests']['cpu']}"]


def test_rollout_pods_alone_offer_the_resource_the_rollout_bundles_ask_for():
    """A rollout worker's bundle asks for one unit of the rollout-node resource; only rollout
    pods offer it (one per CPU they offer), trainer pods do not: no worker on a trainer node."""
    import json

    from agentrl.ray_cluster.placement import plan_placement, trainer_node_resources

    job = make_job("swe").with_workers(4).obj()
    container = _worker_pod(job)["containers"][0]
    [offer] = [a for a in container["command"] if a.startswith("--resources=")]
    offered = json.loads(offer.removeprefix("--resources="))
    assert offered == {"agentrl_rollout_node": 2}
    from agentrl.api import AgentRLJob

    parsed = AgentRLJob.model_validate(job)
    asks = [b.resources() for b in plan_placement(parsed).rollout.bundles]
    assert asks == [{"CPU": 1.0, "agentrl_rollout_node": 1.0}] * 4
    assert "agentrl_rollout_node" not in trainer_node_resources(parsed.spec).resources()


def test_with_e2b_the_pods_that_run_episodes_get_the_api_key_from_the_secret_not_a_value():
    from agentrl.reconcile.context import BuildContext
    from agentrl.reconcile.trainer import trainer_env
    from agentrl.sandbox.e2b import API_KEY_ENV

    job = make_job("swe").with_e2b(max_concurrent=8).obj()
    expected = {"secretKeyRef": {"name": "e2b", "key": "apiKey"}}  # the factory's ref, key default
    rollout_env = {e["name"]: e for e in _worker_pod(job)["containers"][0]["env"]}
    assert rollout_env[API_KEY_ENV] == {"name": "E2B_API_KEY", "valueFrom": expected}
    trainer = {e["name"]: e for e in trainer_env(job, BuildContext.for_job(job), attempt=0)}
    assert trainer["E2B_API_KEY"] == {"name": "E2B_API_KEY", "valueFrom": expected}
    # other providers get no such variable
    plain = _worker_pod(make_job("swe").obj())["containers"][0]["env"]
    assert "E2B_API_KEY" not in {e["name"] for e in plain}


@pytest.mark.parametrize(("cpu", "offered"), [("250m", 1), ("3", 3), ("3500m", 3)])
def test_rollout_workers_request_and_offer_the_spec_cpu(cpu: str, offered: int) -> None:
    job = make_job("swe").with_spec("rollout.cpu", cpu).with_spec("rollout.memory", "1Gi").obj()
    container = _worker_pod(job)["containers"][0]
    assert container["resources"] == {"requests": {"cpu": cpu, "memory": "1Gi"}}
    # whole CPUs, at least one: a 250m worker still runs one episode actor
    assert f"--num-cpus={offered}" in container["command"]
    assert f'--resources={{"agentrl_rollout_node": {offered}}}' in container["command"]


def test_rollout_workers_go_where_the_spec_places_them() -> None:
    toleration = {"key": "agentrl.dev/real-node", "operator": "Exists", "effect": "NoSchedule"}
    job = (
        make_job("swe")
        .with_spec("rollout.nodeSelector", {"agentrl.dev/real-node": "true"})
        .with_spec("rollout.tolerations", [toleration])
        .obj()
    )
    pod = _worker_pod(job)
    assert pod["nodeSelector"] == {"agentrl.dev/real-node": "true"}
    assert pod["tolerations"] == [toleration]
    plain = _worker_pod(make_job("swe").obj())
    assert "nodeSelector" not in plain and "tolerations" not in plain
