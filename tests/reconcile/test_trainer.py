"""The trainer Indexed Job and its headless Service, against objects written out by hand."""

from __future__ import annotations

from agentrl.reconcile import trainer
from agentrl.reconcile.context import BuildContext
from tests.factories import make_job

SELECTOR = {"agentrl.dev/job": "swe", "app.kubernetes.io/component": "trainer"}


#: Two nodes of eight GPUs on the ionic NICs, a two-hour deadline; ``SWE.copy()`` to adjust.
SWE = (
    make_job("swe", "rl")
    .with_uid("u1")
    .with_labels(team="rl")
    .with_trainer(nodes=2, gpusPerNode=8, backoffLimit=4)
    .with_network(ncclSocketIfname="eth1", glooSocketIfname="eth1", ibHca="ionic_0")
    .with_deadline(7200)
)


def test_trainer_job_is_indexed_with_one_pod_per_node():
    job = SWE.obj()
    obj = trainer.trainer_job(job, BuildContext.for_job(job), attempt=2)
    assert (obj["apiVersion"], obj["kind"]) == ("batch/v1", "Job")
    assert obj["metadata"]["name"] == "swe-trainer"
    assert obj["metadata"]["annotations"] == {"agentrl.dev/trainer-attempt": "2"}
    spec = obj["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == 2
    assert spec["parallelism"] == 2
    # Whole-group restarts are the operator's: the Job itself fails on the first pod failure.
    assert spec["backoffLimit"] == 0
    assert spec["podFailurePolicy"] == {
        "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]
    }
    assert spec["suspend"] is False
    assert spec["activeDeadlineSeconds"] == 7200


def test_trainer_template_carries_only_the_operators_labels():
    job = SWE.obj()
    template = trainer.trainer_job(job, BuildContext.for_job(job))["spec"]["template"]
    assert "team" not in template["metadata"]["labels"]
    assert template["metadata"]["labels"]["app.kubernetes.io/component"] == "trainer"
    assert template["metadata"]["labels"]["agentrl.dev/job"] == "swe"


def test_trainer_pod_rendezvous_env_and_interface_pinning():
    job = SWE.obj()
    pod = trainer.trainer_job(job, BuildContext.for_job(job), attempt=1)["spec"]["template"]["spec"]
    assert pod["subdomain"] == "swe-trainer"
    assert pod["restartPolicy"] == "Never"
    # the driver patches its own pod with its progress, through the trainer's own account
    assert pod["serviceAccountName"] == "swe-trainer"
    assert pod["automountServiceAccountToken"] is True
    container = pod["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["MASTER_ADDR"]["value"] == "swe-trainer-0.swe-trainer.rl.svc"
    assert env["MASTER_PORT"]["value"] == "29500"
    assert env["RAY_HEAD_ADDRESS"]["value"] == "swe-trainer-0.swe-trainer.rl.svc:6379"
    assert env["NNODES"]["value"] == "2"
    assert env["GPUS_PER_NODE"]["value"] == "8"
    assert env["AGENTRL_TRAINER_ATTEMPT"]["value"] == "1"
    assert env["NODE_RANK"]["valueFrom"] == {
        "fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        }
    }
    assert env["NCCL_SOCKET_IFNAME"]["value"] == "eth1"
    assert env["GLOO_SOCKET_IFNAME"]["value"] == "eth1"
    assert env["NCCL_IB_HCA"]["value"] == "ionic_0"


def test_trainer_container_names_its_ports_and_tells_the_driver_where_to_serve_metrics():
    job = SWE.obj()
    pod = trainer.trainer_job(job, BuildContext.for_job(job))["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    # the chart's PodMonitor scrapes the port by its name, "metrics"
    assert container["ports"] == [
        {"name": "rendezvous", "containerPort": 29500},
        {"name": "ray", "containerPort": 6379},
        {"name": "metrics", "containerPort": 9401},
    ]
    env = {e["name"]: e for e in container["env"]}
    assert env["AGENTRL_METRICS_PORT"] == {"name": "AGENTRL_METRICS_PORT", "value": "9401"}


def test_unset_network_fields_leave_nccl_to_choose():
    job = make_job("swe").obj()
    env = trainer.trainer_env(job, BuildContext.for_job(job), attempt=0)
    names = {e["name"] for e in env}
    assert not names & {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA"}


def test_trainer_requests_its_gpus_and_mounts_the_checkpoint_volume_read_write():
    job = SWE.obj()
    container = trainer.trainer_job(job, BuildContext.for_job(job))["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert container["image"] == "ghcr.io/agentrl/rocm-trainer:0.1.0"
    assert container["resources"] == {
        "requests": {"cpu": "32", "memory": "512Gi", "amd.com/gpu": "8"},
        "limits": {"amd.com/gpu": "8"},
    }
    assert {"name": "checkpoints", "mountPath": "/checkpoints", "readOnly": False} in container[
        "volumeMounts"
    ]


def test_a_named_checkpoint_volume_replaces_the_jobs_own_claim():
    job = make_job("swe").with_checkpoint_volume("shared-ckpt").obj()
    pod = trainer.trainer_job(job, BuildContext.for_job(job))["spec"]["template"]["spec"]
    assert {
        "name": "checkpoints",
        "persistentVolumeClaim": {"claimName": "shared-ckpt"},
    } in pod["volumes"]


def test_a_torch_trainer_without_gpus_requests_none():
    job = make_job("swe").with_trainer(backend="torch", gpusPerNode=0).obj()
    container = trainer.trainer_job(job, BuildContext.for_job(job))["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert container["resources"] == {"requests": {"cpu": "32", "memory": "512Gi"}}


def test_suspend_is_passed_to_the_job_and_no_deadline_without_one():
    job = make_job("swe").obj()
    spec = trainer.trainer_job(job, BuildContext.for_job(job), suspend=True)["spec"]
    assert spec["suspend"] is True
    assert "activeDeadlineSeconds" not in spec


def test_the_trainer_pods_grace_period_is_the_checkpoint_stop_grace_period():
    default = make_job("swe").obj()
    pod = trainer.trainer_job(default, BuildContext.for_job(default))["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 1200
    job = SWE.copy().with_trainer(checkpoint={"stopGracePeriodSeconds": 3600}).obj()
    pod = trainer.trainer_job(job, BuildContext.for_job(job))["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 3600


def test_trainer_service_resolves_ranks_before_they_are_ready():
    job = SWE.obj()
    svc = trainer.headless_service(job, BuildContext.for_job(job))
    assert svc["metadata"]["name"] == "swe-trainer"
    assert svc["spec"] == {
        "clusterIP": "None",
        "publishNotReadyAddresses": True,
        "selector": SELECTOR,
        "ports": [
            {"name": "rendezvous", "port": 29500, "protocol": "TCP"},
            {"name": "ray", "port": 6379, "protocol": "TCP"},
        ],
    }


def test_the_trainer_role_allows_only_its_progress_annotation_and_events():
    job = SWE.obj()
    objs = {o["kind"]: o for o in trainer.trainer_rbac(job, BuildContext.for_job(job))}
    assert objs["Role"]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ]
    assert objs["RoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": "swe-trainer", "namespace": "rl"}
    ]


def test_the_trainer_mounts_a_config_map_chat_template_for_the_episodes_it_runs_itself():
    # Without rollout workers the driver runs the episodes and renders them with the template.
    job = (
        make_job("swe")
        .with_model_pvc("weights", "Qwen3-8B")
        .with_spec("model.chatTemplate", {"configMapKeyRef": {"name": "tpl", "key": "t.jinja"}})
        .obj()
    )
    pod = trainer.trainer_job(job, BuildContext.for_job(job))["spec"]["template"]["spec"]
    assert pod["volumes"][-2:] == [
        {"name": "model", "persistentVolumeClaim": {"claimName": "weights", "readOnly": True}},
        {
            "name": "chat-template",
            "configMap": {"name": "tpl", "items": [{"key": "t.jinja", "path": "t.jinja"}]},
        },
    ]
    assert pod["containers"][0]["volumeMounts"][-1] == {
        "name": "chat-template",
        "mountPath": "/etc/agentrl-chat-template",
        "readOnly": True,
    }
    plain = make_job("swe").obj()
    assert "chat-template" not in str(trainer.trainer_job(plain, BuildContext.for_job(plain)))
