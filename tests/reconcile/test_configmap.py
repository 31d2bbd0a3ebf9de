"""The ConfigMap the workloads read: resolved manifest and runtime endpoints."""

from __future__ import annotations

import yaml

from agentrl.api.wire import SPEC_FILE, SPEC_MOUNT_PATH
from agentrl.reconcile import configmap
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.policies.suspend import workload_scale
from tests.factories import make_job


def _data(job):
    cm = configmap.config_map(job, BuildContext.for_job(job), workload_scale(job))
    return cm, yaml.safe_load(cm["data"]["job.yaml"]), yaml.safe_load(cm["data"]["runtime.yaml"])


def test_config_map_is_named_and_owned_and_holds_two_files():
    job = make_job("swe", "rl").with_uid("u1").obj()
    cm, _, _ = _data(job)
    assert cm["metadata"]["name"] == "swe-config"
    assert cm["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert sorted(cm["data"]) == ["job.yaml", "runtime.yaml"]
    # The engine launcher reads the resolved manifest from the mounted ConfigMap.
    assert f"{SPEC_MOUNT_PATH}/job.yaml" == SPEC_FILE


def test_resolved_manifest_has_defaults_filled_in_and_the_uid():
    job = make_job("swe", "rl").with_uid("u1").obj()
    _, manifest, _ = _data(job)
    assert manifest["metadata"] == {"name": "swe", "namespace": "rl", "uid": "u1"}
    assert manifest["spec"]["rollout"]["groupSize"] == 8  # a default the user did not write
    assert manifest["spec"]["inference"]["contextLength"] == 65536
    assert "status" not in manifest


def test_runtime_lists_engine_urls_and_trainer_rendezvous():
    job = make_job("swe", "rl").with_uid("u1").with_engines(3).with_trainer(nodes=2).obj()
    _, _, runtime = _data(job)
    assert runtime["engines"] == {
        "service": "swe-engine",
        "port": 30000,
        "urls": [
            "http://swe-engine-0.swe-engine.rl.svc:30000",
            "http://swe-engine-1.swe-engine.rl.svc:30000",
            "http://swe-engine-2.swe-engine.rl.svc:30000",
        ],
    }
    assert runtime["trainer"] == {
        "masterAddr": "swe-trainer-0.swe-trainer.rl.svc",
        "masterPort": 29500,
        "rayHeadAddress": "swe-trainer-0.swe-trainer.rl.svc:6379",
        "nodes": 2,
    }
    assert runtime["checkpointDir"] == "/checkpoints"


def test_runtime_carries_the_concurrency_in_effect_and_the_workers():
    job = make_job("swe", "rl").with_concurrency(384).with_workers(5).obj()
    _, _, runtime = _data(job)
    pods = runtime["sandbox"].pop("pods")
    assert runtime["sandbox"] == {
        "provider": "kubernetes",
        "concurrency": 384,
        "desired": 384,
        "limitedBy": None,
        "networkPolicy": "swe-sandbox",
    }
    assert pods["namePrefix"] == "swe-sbx-"
    assert pods["selector"] == {"agentrl.dev/job": "swe", "app.kubernetes.io/component": "sandbox"}
    # Each worker's share of the 384 is its own to compute (concurrency_source.split_concurrency).
    assert runtime["rollout"] == {"workers": 5}


def test_runtime_carries_the_sandbox_pod_the_workers_create():
    # The rollout workers make every sandbox pod from this template (provider kubernetes), so
    # it is the operator's whole hardened pod, owned by the job, in the job's namespace.
    job = make_job("swe", "rl").with_uid("u1").with_sandbox(cpu="2", memory="4Gi").obj()
    _, _, runtime = _data(job)
    template = runtime["sandbox"]["pods"]["template"]
    assert "name" not in template["metadata"]
    assert template["metadata"]["namespace"] == "rl"
    assert template["metadata"]["labels"]["app.kubernetes.io/component"] == "sandbox"
    (owner,) = template["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("AgentRLJob", "swe", "u1")
    spec = template["spec"]
    assert spec["automountServiceAccountToken"] is False
    (container,) = spec["containers"]
    assert container["resources"]["limits"]["cpu"] == "2"
    assert container["resources"]["requests"]["memory"] == "4Gi"
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_other_providers_get_no_sandbox_pod_template():
    job = make_job("swe").with_sandbox(provider="local").obj()
    _, _, runtime = _data(job)
    assert "pods" not in runtime["sandbox"] or runtime["sandbox"]["pods"] is None


def test_suspended_runtime_has_no_engines_and_zero_concurrency():
    job = make_job("swe").with_engines(2).with_concurrency(64).suspended().obj()
    _, _, runtime = _data(job)
    assert runtime["suspended"] is True
    assert runtime["engines"]["urls"] == []
    assert runtime["sandbox"]["concurrency"] == 0
    assert runtime["sandbox"]["desired"] == 64
    assert runtime["sandbox"]["limitedBy"] == "spec.suspend"
    assert runtime["rollout"] == {"workers": 0}


def test_scaling_changes_the_config_map_content():
    a, _, _ = _data(make_job("swe").with_concurrency(16).obj())
    b, _, _ = _data(make_job("swe").with_concurrency(384).obj())
    assert a["data"]["runtime.yaml"] != b["data"]["runtime.yaml"]
    assert "concurrency: 384" in b["data"]["runtime.yaml"]
