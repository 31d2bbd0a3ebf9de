"""The sandbox pod template and the sandbox NetworkPolicy."""

from __future__ import annotations

import pytest

from agentrl.reconcile import sandbox
from agentrl.reconcile.context import BuildContext
from tests.factories import make_job

#: A sandbox of 1 CPU, 2Gi, 5Gi of scratch with the rollout's timeouts; ``SWE.copy()`` to adjust.
SWE = (
    make_job("swe", "rl")
    .with_uid("u-7")
    .with_sandbox(cpu="1", memory="2Gi", ephemeralStorage="5Gi", startupTimeoutSeconds=120)
    .with_rollout(episodeTimeoutSeconds=1800, llmTimeoutSeconds=600, verifierTimeoutSeconds=600)
)


def test_sandbox_pod_is_hardened_and_owned_by_the_job():
    job = SWE.obj()
    pod = sandbox.sandbox_pod(
        job, BuildContext.for_job(job), pod_name="swe-sbx-abc123def456", image="task:1"
    )
    assert pod["metadata"]["name"] == "swe-sbx-abc123def456"
    assert pod["metadata"]["namespace"] == "rl"
    assert pod["metadata"]["labels"]["agentrl.dev/job"] == "swe"
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "sandbox"
    assert pod["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "agentrl.dev/v1alpha1",
            "kind": "AgentRLJob",
            "name": "swe",
            "uid": "u-7",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert spec["restartPolicy"] == "Never"
    # 120 s startup + 1800 s episode + 600 s verifier = 2520 s.
    assert spec["activeDeadlineSeconds"] == 2520
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert "runtimeClassName" not in spec
    (container,) = spec["containers"]
    assert container["image"] == "task:1"
    assert container["command"] == ["sleep", "infinity"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": False,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    limits = {"cpu": "1", "memory": "2Gi", "ephemeral-storage": "5Gi"}
    assert container["resources"] == {"requests": limits, "limits": limits}


def _job_of(format_: str):
    builder = make_job("swe", "rl").with_uid("u-7").with_spec("dataset.format", format_)
    if format_ != "toy":
        builder = builder.with_spec("dataset.path", "/data/tasks.jsonl")
    return builder.obj()


#: What each dataset kind's pod runs as, written out by hand.
PROFILE_EXPECTATIONS = {
    # toy repositories are written into an emptyDir: an unprivileged uid is enough
    "toy": ({"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000}, True),
    # SWE-bench/SWE-smith/Harbor images: root-owned /testbed, conda, /tests and /logs
    "swebench": ({"runAsNonRoot": False, "runAsUser": 0, "runAsGroup": 0}, False),
    "swesmith": ({"runAsNonRoot": False, "runAsUser": 0, "runAsGroup": 0}, False),
    "harbor": ({"runAsNonRoot": False, "runAsUser": 0, "runAsGroup": 0}, False),
}


@pytest.mark.parametrize("format_", sorted(PROFILE_EXPECTATIONS))
def test_the_dataset_format_picks_the_user_and_nothing_else_loosens(format_: str) -> None:
    job = _job_of(format_)
    pod = sandbox.sandbox_pod(
        job, BuildContext.for_job(job), pod_name="swe-sbx-1", image="swebench/sweb.eval:1"
    )
    user, non_root = PROFILE_EXPECTATIONS[format_]
    spec = pod["spec"]
    assert spec["securityContext"] == {**user, "seccompProfile": {"type": "RuntimeDefault"}}
    (container,) = spec["containers"]
    # every kind: no capability at all (root included), no escalation, RuntimeDefault
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": non_root,
        "readOnlyRootFilesystem": False,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert "add" not in container["securityContext"]["capabilities"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert "hostNetwork" not in spec and "hostPID" not in spec
    assert "privileged" not in container["securityContext"]


def test_sandbox_pod_uses_the_runtime_class_and_default_image_when_set():
    job = (
        SWE.copy()
        .with_sandbox(
            runtimeClassName="gvisor", image="python:3.12-slim", nodeSelector={"pool": "cpu"}
        )
        .obj()
    )
    pod = sandbox.sandbox_pod(job, BuildContext.for_job(job), pod_name="swe-sbx-x")
    assert pod["spec"]["runtimeClassName"] == "gvisor"
    assert pod["spec"]["nodeSelector"] == {"pool": "cpu"}
    assert pod["spec"]["containers"][0]["image"] == "python:3.12-slim"


def test_sandbox_pod_pulls_task_images_with_the_datasets_secrets():
    job = make_job("swe").with_spec("dataset.imagePullSecrets", ["hub"]).obj()
    pod = sandbox.sandbox_pod(job, BuildContext.for_job(job), pod_name="swe-sbx-x")
    assert pod["spec"]["imagePullSecrets"] == [{"name": "hub"}]


def test_network_policy_denies_everything_by_default():
    job = SWE.obj()
    policy = sandbox.network_policy(job, BuildContext.for_job(job))
    assert (policy["apiVersion"], policy["kind"]) == ("networking.k8s.io/v1", "NetworkPolicy")
    assert policy["metadata"]["name"] == "swe-sandbox"
    assert policy["spec"] == {
        "podSelector": {
            "matchLabels": {"agentrl.dev/job": "swe", "app.kubernetes.io/component": "sandbox"}
        },
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [],
        "egress": [],
    }


def test_allow_internet_opens_dns_and_public_addresses_only():
    job = SWE.copy().with_sandbox(allowInternet=True).obj()
    egress = sandbox.network_policy(job, BuildContext.for_job(job))["spec"]["egress"]
    assert egress == [
        {
            "to": [
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                    },
                    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                }
            ],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
        },
        {
            "to": [
                {
                    "ipBlock": {
                        "cidr": "0.0.0.0/0",
                        "except": [
                            "10.0.0.0/8",
                            "172.16.0.0/12",
                            "192.168.0.0/16",
                            "169.254.0.0/16",
                            "100.64.0.0/10",
                        ],
                    }
                }
            ]
        },
    ]


def test_sandbox_pod_labels_match_the_network_policy_selector():
    job = SWE.obj()
    ctx = BuildContext.for_job(job)
    labels = sandbox.sandbox_pod(job, ctx, pod_name="swe-sbx-x")["metadata"]["labels"]
    selector = sandbox.network_policy(job, ctx)["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= labels.items()


def test_sandbox_pod_tolerates_the_sandbox_pools_taints():
    taint = {"key": "pool", "operator": "Equal", "value": "sandbox", "effect": "NoSchedule"}
    job = make_job("swe").with_sandbox(tolerations=[taint]).obj()
    pod = sandbox.sandbox_pod(job, BuildContext.for_job(job), pod_name="swe-sbx-x")
    assert pod["spec"]["tolerations"] == [taint]
