"""The engine StatefulSet, its headless Service, PDB and the watchdog's RBAC, against objects
written out by hand."""

from __future__ import annotations

from agentrl.reconcile import engine
from agentrl.reconcile.context import BuildContext, Images
from tests.factories import make_job

UID = "5f0c-uid"
OWNER = {
    "apiVersion": "agentrl.dev/v1alpha1",
    "kind": "AgentRLJob",
    "name": "swe",
    "uid": UID,
    "controller": True,
    "blockOwnerDeletion": True,
}
LABELS = {
    "team": "rl",
    "app.kubernetes.io/name": "agentrl",
    "app.kubernetes.io/instance": "swe",
    "app.kubernetes.io/component": "engine",
    "app.kubernetes.io/part-of": "agentrl",
    "app.kubernetes.io/managed-by": "agentrl-operator",
    "agentrl.dev/job": "swe",
}
SELECTOR = {"agentrl.dev/job": "swe", "app.kubernetes.io/component": "engine"}


#: Four MI355X engines of two GPUs each in zone a, tolerating the GPU taint.
SWE = (
    make_job("swe", "rl")
    .with_uid(UID)
    .with_labels(team="rl")
    .with_engines(4, gpus_per_engine=2)
    .with_node_selector(**{"amd.com/gpu.product-name": "AMD_Instinct_MI355X", "zone": "a"})
    .with_tolerations({"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"})
    .with_inference(startupTimeoutSeconds=1805, shmSize="32Gi")
)


def _ctx(job):
    return BuildContext.for_job(job)


def test_statefulset_metadata_and_spec_are_as_written_by_hand():
    job = SWE.obj()
    sts = engine.statefulset(job, _ctx(job), replicas=4)
    assert sts["apiVersion"] == "apps/v1"
    assert sts["kind"] == "StatefulSet"
    assert sts["metadata"] == {
        "name": "swe-engine",
        "namespace": "rl",
        "labels": LABELS,
        "ownerReferences": [OWNER],
    }
    spec = sts["spec"]
    assert spec["serviceName"] == "swe-engine"
    assert spec["replicas"] == 4
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["selector"] == {"matchLabels": SELECTOR}
    assert spec["template"]["metadata"] == {"labels": LABELS}


def test_engine_pod_shares_its_process_namespace_and_has_placement_from_the_spec():
    job = SWE.obj()
    pod = engine.statefulset(job, _ctx(job), replicas=4)["spec"]["template"]["spec"]
    assert pod["shareProcessNamespace"] is True
    assert pod["serviceAccountName"] == "swe-engine"
    assert pod["automountServiceAccountToken"] is True  # the watchdog patches its pod
    # Keys sorted: amd.com/... before zone.
    assert pod["affinity"] == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "amd.com/gpu.product-name",
                                "operator": "In",
                                "values": ["AMD_Instinct_MI355X"],
                            },
                            {"key": "zone", "operator": "In", "values": ["a"]},
                        ]
                    }
                ]
            }
        },
        # engines pack onto nodes already running this job's engines (whole nodes stay free)
        "podAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "labelSelector": {"matchLabels": SELECTOR},
                        "topologyKey": "kubernetes.io/hostname",
                    },
                }
            ]
        },
    }
    assert pod["tolerations"] == [
        {"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert [c["name"] for c in pod["containers"]] == ["engine", "watchdog"]
    assert pod["volumes"] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}},
        {"name": "engine-log", "emptyDir": {}},
        {"name": "config", "configMap": {"name": "swe-config"}},
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "swe-checkpoints"}},
    ]


def test_engine_container_requests_gpus_per_engine_and_never_disables_graphs():
    job = SWE.obj()
    pod = engine.statefulset(job, _ctx(job), replicas=4)["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "ghcr.io/agentrl/sglang-engine:0.1.0"
    assert "command" not in container  # the image's entrypoint: agentrl engine launch
    args = container["args"]
    assert args[args.index("--tp-size") + 1] == "2"
    assert args[args.index("--port") + 1] == "30000"
    assert args[args.index("--host") + 1] == "0.0.0.0"
    assert "--enable-metrics" in args
    assert not any(a.startswith("--disable-cuda-graph") for a in args)
    assert container["resources"] == {
        "requests": {"cpu": "16", "memory": "256Gi", "amd.com/gpu": "2"},
        "limits": {"amd.com/gpu": "2"},
    }
    assert container["ports"] == [{"name": "http", "containerPort": 30000, "protocol": "TCP"}]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SGLANG_USE_AITER"] == "1"
    assert env["HSA_NO_SCRATCH_RECLAIM"] == "1"
    assert env["AGENTRL_CONFIG"] == "/etc/agentrl/job.yaml"
    assert env["AGENTRL_JOB_UID"] == UID
    assert container["volumeMounts"] == [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "engine-log", "mountPath": "/var/log/agentrl"},
        {"name": "config", "mountPath": "/etc/agentrl", "readOnly": True},
        {"name": "checkpoints", "mountPath": "/checkpoints", "readOnly": True},
    ]


def test_probes_allow_the_startup_timeout_and_readiness_asks_the_watchdog():
    job = SWE.obj()
    container = engine.statefulset(job, _ctx(job), replicas=4)["spec"]["template"]["spec"][
        "containers"
    ][0]
    # 1805 s / 10 s per probe = 180.5 → 181 failures before the kubelet gives up.
    assert container["startupProbe"] == {
        "httpGet": {"path": "/health", "port": 30000},
        "periodSeconds": 10,
        "timeoutSeconds": 5,
        "failureThreshold": 181,
    }
    assert container["readinessProbe"] == {
        "httpGet": {"path": "/readyz", "port": 9400},
        "periodSeconds": 5,
        "timeoutSeconds": 5,
        "failureThreshold": 1,
    }
    assert container["livenessProbe"] == {
        "httpGet": {"path": "/health", "port": 30000},
        "periodSeconds": 30,
        "timeoutSeconds": 5,
        "failureThreshold": 5,
    }


def test_watchdog_sidecar_runs_agentrl_engine_watchdog_and_reads_the_engine_log():
    job = SWE.obj()
    ctx = BuildContext.for_job(job, images=Images(watchdog="ghcr.io/agentrl/watchdog:1"))
    sidecar = engine.statefulset(job, ctx, replicas=4)["spec"]["template"]["spec"]["containers"][1]
    assert sidecar["name"] == "watchdog"
    assert sidecar["image"] == "ghcr.io/agentrl/watchdog:1"
    assert sidecar["command"] == ["agentrl", "engine", "watchdog"]
    assert sidecar["ports"] == [{"name": "watchdog", "containerPort": 9400, "protocol": "TCP"}]
    assert "amd.com/gpu" not in sidecar["resources"]["requests"]
    assert {"name": "engine-log", "mountPath": "/var/log/agentrl", "readOnly": True} in sidecar[
        "volumeMounts"
    ]
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 9400}


def test_without_the_watchdog_readiness_is_sglang_health_and_no_token_is_mounted():
    job = make_job("swe").with_watchdog(False).obj()
    pod = engine.statefulset(job, _ctx(job), replicas=1)["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["engine"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["containers"][0]["readinessProbe"]["httpGet"] == {"path": "/health", "port": 30000}


def test_headless_service_gives_stable_dns_to_ready_engines_only():
    job = SWE.obj()
    svc = engine.headless_service(job, _ctx(job))
    assert svc["metadata"]["name"] == "swe-engine"
    assert svc["metadata"]["ownerReferences"] == [OWNER]
    assert svc["spec"] == {
        "clusterIP": "None",
        "publishNotReadyAddresses": False,
        "selector": SELECTOR,
        "ports": [
            {"name": "http", "port": 30000, "targetPort": 30000, "protocol": "TCP"},
            {"name": "watchdog", "port": 9400, "targetPort": 9400, "protocol": "TCP"},
        ],
    }


def test_disruption_budget_lets_one_engine_go_at_a_time():
    job = SWE.obj()
    pdb = engine.disruption_budget(job, _ctx(job))
    assert (pdb["apiVersion"], pdb["kind"]) == ("policy/v1", "PodDisruptionBudget")
    assert pdb["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": SELECTOR},
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
    }


def test_watchdog_role_can_patch_only_the_engine_pods_by_name():
    job = SWE.obj()
    sa, role, binding = engine.engine_rbac(job, _ctx(job))
    assert (sa["kind"], sa["metadata"]["name"]) == ("ServiceAccount", "swe-engine")
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["pods"],
            "verbs": ["get", "patch"],
            "resourceNames": ["swe-engine-0", "swe-engine-1", "swe-engine-2", "swe-engine-3"],
        },
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        {
            "apiGroups": ["agentrl.dev"],
            "resources": ["agentrljobs"],
            "verbs": ["get"],
            "resourceNames": ["swe"],
        },
    ]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "swe-engine",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "swe-engine", "namespace": "rl"}
    ]


def test_a_model_pvc_is_mounted_read_only_at_models():
    job = make_job("swe").with_model_pvc("weights").obj()
    pod = engine.statefulset(job, _ctx(job), replicas=1)["spec"]["template"]["spec"]
    assert {
        "name": "model",
        "persistentVolumeClaim": {"claimName": "weights", "readOnly": True},
    } in pod["volumes"]
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in pod["containers"][0][
        "volumeMounts"
    ]
    args = pod["containers"][0]["args"]
    assert args[args.index("--model-path") + 1] == "/models/qwen"


def test_trainer_pods_prefer_nodes_without_this_jobs_engines():
    from agentrl.reconcile import trainer

    job = SWE.obj()
    pod = trainer.trainer_job(job, _ctx(job), attempt=0, suspend=False)["spec"]["template"]["spec"]
    assert pod["affinity"]["podAntiAffinity"] == {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 100,
                "podAffinityTerm": {
                    "labelSelector": {"matchLabels": SELECTOR},
                    "topologyKey": "kubernetes.io/hostname",
                },
            }
        ]
    }
