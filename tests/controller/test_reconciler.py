"""The reconciler's orchestration, against an in-memory API: what it writes, in which order,
and what it does not write when nothing changed."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from agentrl.controller.reconciler import Reconciler, status_patch
from agentrl.controller.settings import OperatorSettings
from agentrl.controller.workqueue import Key
from agentrl.reconcile.status import status_changed
from tests.controller.fake_kube import FakeKube
from tests.factories import make_job

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
KEY = Key("team", "demo")


#: The job as the API server returns it (uid and generation set).
JOB = make_job("demo").with_uid("0f0e0d0c").with_generation(1)


def _reconciler(api: FakeKube) -> Reconciler:
    return Reconciler(api, OperatorSettings(), now=lambda: NOW)  # type: ignore[arg-type]


async def test_a_new_job_gets_every_child_then_one_status_write_then_events() -> None:
    api = FakeKube(JOB.manifest())
    await _reconciler(api).reconcile(KEY)
    writes = api.writes()
    # the Ray token Secret first (created once, before the pods that reference it)
    assert writes[0] == ("create", "Secret")
    applies = [w for w in writes if w[0] == "apply"]
    # ConfigMap, PVC, 3 engine RBAC, 3 rollout RBAC, 3 trainer RBAC, NetworkPolicy, engine
    # Service and PDB, StatefulSet, trainer Service, trainer Job, rollout Deployment: 18
    assert len(applies) == 18
    first_status = writes.index(("patch", "status"))
    assert all(w[0] == "apply" for w in writes[1:first_status])
    assert writes.count(("patch", "status")) == 1
    assert all(w == ("create", "Event") for w in writes[first_status + 1 :])


async def test_a_second_reconcile_with_nothing_changed_writes_nothing() -> None:
    api = FakeKube(JOB.manifest())
    reconciler = _reconciler(api)
    await reconciler.reconcile(KEY)
    api.calls.clear()
    await reconciler.reconcile(KEY)
    # reads only: the children are unchanged and the status is the same
    assert api.writes() == []


async def test_after_forget_applied_every_child_is_applied_again() -> None:
    api = FakeKube(JOB.manifest())
    reconciler = _reconciler(api)
    await reconciler.reconcile(KEY)
    api.calls.clear()
    reconciler.forget_applied(KEY)
    await reconciler.reconcile(KEY)
    assert len([w for w in api.writes() if w[0] == "apply"]) == 18
    assert ("patch", "status") not in api.writes()
    # the Secret is asked for again (a deleted one is made anew) and the existing one is kept
    token = api.children[("Secret", "demo-ray-token")]
    assert api.writes().count(("create", "Secret")) == 1
    assert api.children[("Secret", "demo-ray-token")] is token


async def test_no_event_is_posted_when_the_status_write_fails() -> None:
    api = FakeKube(JOB.manifest())
    api.fail_status_patch = True
    with pytest.raises(RuntimeError):
        await _reconciler(api).reconcile(KEY)
    assert api.events == []


async def test_a_deleted_job_is_forgotten_without_writes() -> None:
    api = FakeKube(JOB.manifest())
    api.job = None
    assert await _reconciler(api).reconcile(KEY) is None
    assert api.writes() == []


async def test_a_manifest_the_models_refuse_gets_invalid_spec_once() -> None:
    job = JOB.manifest()
    job["spec"]["rollout"] = {"groupSize": 1}  # below the minimum of 2
    api = FakeKube(job)
    reconciler = _reconciler(api)
    await reconciler.reconcile(KEY)
    assert [w for w in api.writes() if w[0] == "apply"] == []
    assert api.events == [("Warning", "InvalidSpec")]
    assert api.job is not None
    ready = api.job["status"]["conditions"][0]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", "InvalidSpec")
    assert "spec.rollout.groupSize" in ready["message"]
    api.calls.clear()
    await reconciler.reconcile(KEY)
    assert api.writes() == []  # the same refusal is not written or announced twice


def test_status_patch_sends_null_for_unset_fields_so_stale_values_are_removed() -> None:
    from agentrl.api import AgentRLJobStatus

    patch = status_patch(AgentRLJobStatus())
    assert patch["sandbox"]["limitedBy"] is None
    assert not status_changed(AgentRLJobStatus(), AgentRLJobStatus())
