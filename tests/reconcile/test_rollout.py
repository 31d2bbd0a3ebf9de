"""The rollout Deployment and the sandbox provider's RBAC."""

from __future__ import annotations

from agentrl.reconcile import rollout
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
    assert container["command"] == [
        "ray",
        "start",
        "--block",
        "--address=$(RAY_HEAD_ADDRESS)",
        "--num-gpus=0",
    ]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["RAY_HEAD_ADDRESS"] == "swe-trainer-0.swe-trainer.rl.svc:6379"
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["volumeMounts"] == [
        {"name": "config", "mountPath": "/etc/agentrl", "readOnly": True}
    ]


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
