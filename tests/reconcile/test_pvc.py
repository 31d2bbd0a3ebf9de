"""The checkpoint PVC."""

from __future__ import annotations

from agentrl.reconcile import pvc
from agentrl.reconcile.context import BuildContext
from tests.factories import make_job


def test_checkpoint_pvc_is_read_write_many_with_the_spec_size():
    job = (
        make_job("swe", "rl")
        .with_spec("trainer.checkpoint.size", "2Ti")
        .with_spec("trainer.checkpoint.storageClassName", "cephfs")
        .obj()
    )
    claim = pvc.checkpoint_pvc(job, BuildContext.for_job(job))
    assert claim is not None
    assert (claim["apiVersion"], claim["kind"]) == ("v1", "PersistentVolumeClaim")
    assert claim["metadata"]["name"] == "swe-checkpoints"
    assert claim["metadata"]["labels"]["app.kubernetes.io/component"] == "checkpoints"
    assert claim["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "2Ti"}},
        "storageClassName": "cephfs",
    }


def test_no_pvc_is_made_when_the_spec_names_a_volume():
    job = make_job("swe").with_checkpoint_volume("mine").obj()
    assert pvc.checkpoint_pvc(job, BuildContext.for_job(job)) is None
    assert pvc.checkpoint_claim_name(job) == "mine"


def test_without_a_storage_class_the_cluster_default_is_used():
    job = make_job("swe").obj()
    claim = pvc.checkpoint_pvc(job, BuildContext.for_job(job))
    assert claim is not None
    assert "storageClassName" not in claim["spec"]
    assert claim["spec"]["resources"] == {"requests": {"storage": "500Gi"}}
