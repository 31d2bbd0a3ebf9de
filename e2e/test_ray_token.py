"""The job's Ray token on the real API server, with the operator running: one Secret per job
with a random token, created once and kept (a restarted operator does not change it under
running pods), referenced by the trainer and rollout pods, owned by the job and collected with
it."""

from __future__ import annotations

import base64
import json
import time

import pytest
from tests.factories import make_job

from agentrl.devcluster.testing import Kubectl, wait_for


def _token(kubectl: Kubectl, name: str) -> str | None:
    done = kubectl.run("get", "secret", f"{name}-ray-token", "-o", "json", check=False)
    if done.returncode != 0:
        return None
    data = json.loads(done.stdout).get("data") or {}
    return base64.b64decode(data["auth_token"]).decode() if "auth_token" in data else None


def _secret_refs(pod_spec: dict) -> dict[str, dict]:  # type: ignore[type-arg]
    env = pod_spec["containers"][0]["env"]
    return {e["name"]: e.get("valueFrom", {}) | {"value": e.get("value")} for e in env}


@pytest.mark.e2e
@pytest.mark.usefixtures("storage")
def test_the_job_gets_one_ray_token_its_ray_pods_share_and_it_goes_with_the_job(
    kubectl: Kubectl, operator
) -> None:  # type: ignore[no-untyped-def]
    name = "raytoken"
    kubectl.apply(make_job(name, kubectl.namespace).manifest())
    token = wait_for(lambda: _token(kubectl, name), timeout=60, what="the Ray token Secret")
    assert len(token) >= 32

    job = kubectl.json("get", "arj", name)
    secret = kubectl.json("get", "secret", f"{name}-ray-token")
    [owner] = secret["metadata"]["ownerReferences"]
    uid = job["metadata"]["uid"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("AgentRLJob", name, uid)

    # every Ray process of the job: the trainer pods (head, driver, ranks) and rollout workers
    trainer = kubectl.json("get", "job", f"{name}-trainer")["spec"]["template"]["spec"]
    rollout = kubectl.json("get", "deployment", f"{name}-rollout")["spec"]["template"]["spec"]
    for pod in (trainer, rollout):
        env = _secret_refs(pod)
        assert env["RAY_AUTH_MODE"]["value"] == "token"
        assert env["RAY_AUTH_TOKEN"]["secretKeyRef"] == {
            "name": f"{name}-ray-token",
            "key": "auth_token",
        }

    # a restarted operator reconciles again (and every resync asks again): the token stays
    operator.stop()
    operator.start()
    kubectl.run("annotate", "arj", name, "test/poke=1", "--overwrite")
    time.sleep(12)  # the restarted operator's first reconcile and two resyncs (5 s here)
    # the log of both operator processes: only the first created it
    assert operator.text().count("created the Ray token Secret") == 1
    assert _token(kubectl, name) == token

    kubectl.run("delete", "arj", name, "--wait=true", timeout=120)
    wait_for(
        lambda: _token(kubectl, name) is None
        and kubectl.run("get", "secret", f"{name}-ray-token", check=False).returncode != 0,
        timeout=90,
        what="the garbage collector to delete the token Secret with its job",
    )
