"""The ordered list of children and what every child carries."""

from __future__ import annotations

import pytest

from agentrl.reconcile.children import TrainerJobPlan, desired_children
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.policies.suspend import workload_scale
from tests.factories import make_job

ORDER = [
    ("ConfigMap", "swe-config"),
    ("PersistentVolumeClaim", "swe-checkpoints"),
    ("ServiceAccount", "swe-engine"),
    ("Role", "swe-engine"),
    ("RoleBinding", "swe-engine"),
    ("ServiceAccount", "swe-rollout"),
    ("Role", "swe-rollout"),
    ("RoleBinding", "swe-rollout"),
    ("ServiceAccount", "swe-trainer"),
    ("Role", "swe-trainer"),
    ("RoleBinding", "swe-trainer"),
    ("NetworkPolicy", "swe-sandbox"),
    ("Service", "swe-engine"),
    ("PodDisruptionBudget", "swe-engine"),
    ("StatefulSet", "swe-engine"),
    ("Service", "swe-trainer"),
    ("Job", "swe-trainer"),
    ("Deployment", "swe-rollout"),
]


def _children(factory, **kwargs):
    job = factory.obj()
    return desired_children(job, BuildContext.for_job(job), **kwargs)


def _by_kind(children):
    return {(c["kind"], c["metadata"]["name"]): c for c in children}


def test_children_come_in_apply_order():
    children = _children(make_job("swe", "rl"))
    assert [(c["kind"], c["metadata"]["name"]) for c in children] == ORDER


@pytest.mark.parametrize("kind_name", ORDER, ids=lambda kn: f"{kn[0]}/{kn[1]}")
def test_every_child_is_owned_by_the_job_and_labelled(kind_name):
    child = _by_kind(_children(make_job("swe", "rl").with_uid("uid-9").with_labels(team="x")))[
        kind_name
    ]
    meta = child["metadata"]
    assert meta["namespace"] == "rl"
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "agentrl.dev/v1alpha1",
            "kind": "AgentRLJob",
            "name": "swe",
            "uid": "uid-9",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert meta["labels"]["agentrl.dev/job"] == "swe"
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "agentrl-operator"
    assert meta["labels"]["team"] == "x"


def test_suspend_scales_engines_and_workers_to_zero_and_suspends_the_trainer():
    children = _by_kind(_children(make_job("swe").with_engines(4).with_workers(2).suspended()))
    assert children[("StatefulSet", "swe-engine")]["spec"]["replicas"] == 0
    assert children[("Deployment", "swe-rollout")]["spec"]["replicas"] == 0
    assert children[("Job", "swe-trainer")]["spec"]["suspend"] is True


def test_resume_restores_the_spec_scale():
    children = _by_kind(_children(make_job("swe").with_engines(4).with_workers(2)))
    assert children[("StatefulSet", "swe-engine")]["spec"]["replicas"] == 4
    assert children[("Deployment", "swe-rollout")]["spec"]["replicas"] == 2
    assert children[("Job", "swe-trainer")]["spec"]["suspend"] is False


def test_a_finished_job_keeps_nothing_running():
    job = make_job("swe").with_engines(4)
    children = _by_kind(_children(job, scale=workload_scale(job.obj(), finished=True)))
    assert children[("StatefulSet", "swe-engine")]["spec"]["replicas"] == 0
    assert children[("Deployment", "swe-rollout")]["spec"]["replicas"] == 0


def test_the_trainer_job_can_be_left_alone_and_carries_its_attempt():
    left = _by_kind(_children(make_job("swe"), trainer_job=TrainerJobPlan(apply=False)))
    assert ("Job", "swe-trainer") not in left
    third = _by_kind(_children(make_job("swe"), trainer_job=TrainerJobPlan(attempt=2)))
    assert third[("Job", "swe-trainer")]["metadata"]["annotations"] == {
        "agentrl.dev/trainer-attempt": "2"
    }


def test_a_named_checkpoint_volume_means_no_pvc_child():
    kinds = [c["kind"] for c in _children(make_job("swe").with_checkpoint_volume("mine"))]
    assert "PersistentVolumeClaim" not in kinds


def test_building_twice_gives_identical_children():
    factory = make_job("swe").with_engines(3)
    assert _children(factory) == _children(factory)


def test_workload_pods_pull_with_the_jobs_image_pull_secrets():
    children = _by_kind(_children(make_job("swe").with_spec("imagePullSecrets", ["registry"])))
    want = [{"name": "registry"}]
    sts = children[("StatefulSet", "swe-engine")]["spec"]["template"]["spec"]
    job = children[("Job", "swe-trainer")]["spec"]["template"]["spec"]
    dep = children[("Deployment", "swe-rollout")]["spec"]["template"]["spec"]
    assert sts["imagePullSecrets"] == want
    assert job["imagePullSecrets"] == want
    assert dep["imagePullSecrets"] == want


def test_workload_pods_have_no_pull_secrets_unless_the_job_names_some():
    children = _by_kind(_children(make_job("swe")))
    assert "imagePullSecrets" not in children[("StatefulSet", "swe-engine")]["spec"]["template"][
        "spec"
    ]
