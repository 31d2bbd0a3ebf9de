"""The kubernetes provider's lifecycle against a fake API transport: pods from the template the
operator writes into runtime.yaml, labelled for reaping, waited for, exec'd into and deleted."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from agentrl.sandbox.errors import SandboxCreateError
from agentrl.sandbox.kubernetes import (
    EPISODE_LABEL,
    WORKER_LABEL,
    KubernetesProvider,
)
from agentrl.sandbox.provider import SandboxRequest
from tests.factories import make_job, sandbox_pods_of


class FakeTransport:
    """Records calls; pods become Running after ``pending_polls`` polls."""

    namespace = "ns"

    def __init__(
        self,
        *,
        pending_polls: int = 1,
        fail_phase: str | None = None,
        lose_create_answer: bool = False,
        list_seconds: float = 0.0,
    ) -> None:
        self.lose_create_answer = lose_create_answer
        self.list_seconds = list_seconds
        """How long a list takes to answer (the API server's round trip)."""
        self.pods: dict[str, dict[str, Any]] = {}
        self.polls: dict[str, int] = {}
        self.pending_polls = pending_polls
        self.fail_phase = fail_phase
        self.deleted: list[str] = []
        self.execs: list[tuple[str, list[str]]] = []
        self.exec_answer: tuple[bytes, bytes, int] = (b"", b"", 0)

    async def create_pod(self, manifest: dict[str, Any]) -> None:
        self.pods[manifest["metadata"]["name"]] = manifest
        if self.lose_create_answer:  # stored by the server, but the answer never arrived
            raise TimeoutError("read timed out")

    async def pod_phase(self, name: str) -> tuple[str, str]:
        self.polls[name] = self.polls.get(name, 0) + 1
        if self.fail_phase is not None:
            return self.fail_phase, "ErrImagePull: not found"
        return ("Running", "") if self.polls[name] > self.pending_polls else ("Pending", "")

    async def exec(self, name: str, argv: list[str], *, timeout: float) -> tuple[bytes, bytes, int]:
        self.execs.append((name, argv))
        return self.exec_answer

    async def delete_pod(self, name: str) -> None:
        self.deleted.append(name)
        self.pods.pop(name, None)

    async def delete_pods(self, selector: Mapping[str, str]) -> int:
        await asyncio.sleep(self.list_seconds)  # the list's round trip: the answer is as of now
        doomed = [
            n
            for n, p in self.pods.items()
            if all(p["metadata"]["labels"].get(k) == v for k, v in selector.items())
        ]
        for name in doomed:
            await self.delete_pod(name)
        return len(doomed)

    async def close(self) -> None:
        return None


#: The job whose sandboxes these tests create: 1 CPU and 2Gi each.
JOB = make_job("swe", "ns").with_model_path("tiny").with_sandbox(cpu="1", memory="2Gi")
#: ... and the sandbox pod template the operator writes for it into runtime.yaml.
PODS = sandbox_pods_of(JOB.obj(), uid="uid-1")
#: The labels of this job's sandbox pods that reaping matches (written out, not read from PODS).
JOB_SANDBOX = {"agentrl.dev/job": "swe", "app.kubernetes.io/component": "sandbox"}


def provider(transport: FakeTransport) -> KubernetesProvider:
    return KubernetesProvider(
        transport=transport,
        pods=PODS,
        worker_id="rollout-0",
        creates_per_second=1000,
        poll_seconds=0,
    )


async def test_a_sandbox_is_a_hardened_pod_labelled_with_its_worker_and_episode() -> None:
    transport = FakeTransport()
    sandbox = await provider(transport).create(SandboxRequest(episode_id="t-1", image="img:1"))
    pod = transport.pods[sandbox.id]
    assert sandbox.id.startswith("swe-sbx-")
    labels = pod["metadata"]["labels"]
    assert labels[WORKER_LABEL] == "rollout-0"
    assert labels[EPISODE_LABEL] == "t-1"
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    container = spec["containers"][0]
    assert container["image"] == "img:1"
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["resources"]["limits"]["memory"] == "2Gi"
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    # It was polled until Running: once Pending, then Running.
    assert transport.polls[sandbox.id] == 2


async def test_a_task_without_an_image_gets_a_writable_workspace_volume() -> None:
    transport = FakeTransport()
    sandbox = await provider(transport).create(SandboxRequest(episode_id="t", workdir="/work"))
    spec = transport.pods[sandbox.id]["spec"]
    assert spec["volumes"] == [{"name": "workspace", "emptyDir": {}}]
    assert spec["containers"][0]["volumeMounts"] == [{"name": "workspace", "mountPath": "/work"}]


async def test_a_pod_that_fails_to_start_is_deleted_and_is_a_create_error() -> None:
    transport = FakeTransport(fail_phase="Failed")
    with pytest.raises(SandboxCreateError, match="ErrImagePull"):
        await provider(transport).create(SandboxRequest(episode_id="t"))
    assert len(transport.deleted) == 1
    assert transport.pods == {}


async def test_closing_the_sandbox_deletes_its_pod() -> None:
    transport = FakeTransport()
    async with await provider(transport).create(SandboxRequest(episode_id="t")) as sandbox:
        name = sandbox.id
    assert transport.deleted == [name]


async def test_the_first_create_reaps_pods_a_previous_incarnation_left() -> None:
    transport = FakeTransport()
    transport.pods["swe-sbx-old"] = {
        "metadata": {"labels": {**JOB_SANDBOX, WORKER_LABEL: "rollout-0"}}
    }
    transport.pods["swe-sbx-other"] = {
        "metadata": {"labels": {**JOB_SANDBOX, WORKER_LABEL: "rollout-1"}}
    }
    await provider(transport).create(SandboxRequest(episode_id="t"))
    assert transport.deleted == ["swe-sbx-old"]
    assert "swe-sbx-other" in transport.pods


async def test_exec_runs_under_timeout_in_the_workdir_and_reports_the_exit_code() -> None:
    transport = FakeTransport()
    sandbox = await provider(transport).create(SandboxRequest(episode_id="t", workdir="/w"))
    transport.exec_answer = (b"out", b"err", 2)
    result = await sandbox.exec("make", timeout=7)
    assert (result.exit_code, result.stdout, result.stderr) == (2, "out", "err")
    assert transport.execs[-1][1] == ["timeout", "-k", "1", "7", "/bin/sh", "-c", "cd /w && make"]
    transport.exec_answer = (b"", b"", 124)
    assert (await sandbox.exec("sleep 99", timeout=1)).timed_out


async def test_reading_a_missing_file_raises_file_not_found() -> None:
    transport = FakeTransport()
    sandbox = await provider(transport).create(SandboxRequest(episode_id="t", workdir="/w"))
    transport.exec_answer = (b"", b"", 44)
    with pytest.raises(FileNotFoundError):
        await sandbox.read_file("nope.txt")


async def test_a_create_whose_answer_was_lost_deletes_the_pod_the_server_stored() -> None:
    transport = FakeTransport(lose_create_answer=True)
    with pytest.raises(SandboxCreateError, match="read timed out"):
        await provider(transport).create(SandboxRequest(episode_id="t"))
    # The pod was stored; it was deleted again, so no uncounted sandbox stays alive.
    assert len(transport.deleted) == 1
    assert transport.pods == {}


async def test_episodes_that_start_together_wait_for_the_reap_and_keep_their_pods() -> None:
    # A restarted worker's first episodes start at once. The reap of the previous incarnation's
    # pods lists this worker's pods (a round trip) and deletes them: a create that did not wait
    # for it had its new pod in that list and lost it.
    transport = FakeTransport(list_seconds=0.05)
    transport.pods["swe-sbx-left-over"] = {
        "metadata": {"labels": {**JOB_SANDBOX, WORKER_LABEL: "rollout-0"}}
    }
    prov = provider(transport)
    sandboxes = await asyncio.gather(
        *(prov.create(SandboxRequest(episode_id=f"t-{i}")) for i in range(4))
    )
    assert transport.deleted == ["swe-sbx-left-over"]
    assert sorted(transport.pods) == sorted(s.id for s in sandboxes)


async def test_reaping_matches_the_jobs_labels_as_well_as_the_worker_id() -> None:
    transport = FakeTransport()
    reaper = provider(transport)
    transport.pods["swe-sbx-old"] = {
        "metadata": {"labels": {**JOB_SANDBOX, WORKER_LABEL: "rollout-0"}}
    }
    transport.pods["other-sbx-old"] = {
        "metadata": {
            "labels": {**JOB_SANDBOX, "agentrl.dev/job": "other", WORKER_LABEL: "rollout-0"}
        }
    }
    assert await reaper.reap() == 1
    assert transport.deleted == ["swe-sbx-old"]
