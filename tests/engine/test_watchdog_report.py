"""The lightkube reporter's requests to the API server: the pod annotation patch and the Event
on the AgentRLJob (a mock transport answers them)."""

from __future__ import annotations

import json

import httpx2
from lightkube import AsyncClient, KubeConfig

from agentrl.api.wire import WatchdogReport, WatchdogState
from agentrl.engine.watchdog_report import LightkubeReporter

#: A kubeconfig pointing at an address the mock transport answers (nothing leaves the process).
KUBECONFIG = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "test", "cluster": {"server": "http://apiserver.test"}}],
    "users": [{"name": "watchdog", "user": {"token": "t"}}],
    "contexts": [{"name": "test", "context": {"cluster": "test", "user": "watchdog"}}],
    "current-context": "test",
}


def client_recording(requests: list[httpx2.Request]) -> AsyncClient:
    def answer(request: httpx2.Request) -> httpx2.Response:
        requests.append(request)
        body = json.loads(request.content or b"{}")
        if request.method == "GET":  # the job, for its uid
            body = {
                "apiVersion": "agentrl.dev/v1alpha1",
                "kind": "AgentRLJob",
                "metadata": {"name": "swe", "namespace": "team", "uid": "uid-from-api"},
            }
        elif request.method == "PATCH":
            body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "swe-engine-0"}}
        return httpx2.Response(200, json=body)

    return AsyncClient(
        config=KubeConfig.from_dict(KUBECONFIG),
        transport=httpx2.MockTransport(answer),
    )


def report(state: WatchdogState) -> WatchdogReport:
    return WatchdogReport(
        state=state,
        ready=False,
        restarts=6,
        restarts_in_window=6,
        max_restarts=5,
        window_seconds=3600,
        faults=6,
        updated_at="2026-10-01T12:00:00Z",
    )


async def test_state_is_merge_patched_into_the_pod_annotation() -> None:
    requests: list[httpx2.Request] = []
    reporter = LightkubeReporter(
        pod_name="swe-engine-0", namespace="team", job_name="swe", job_uid="u1",
        client=client_recording(requests),
    )  # fmt: skip
    await reporter.annotate(report(WatchdogState.DEGRADED))
    (patch,) = requests
    assert patch.method == "PATCH"
    assert patch.url.path == "/api/v1/namespaces/team/pods/swe-engine-0"
    assert patch.headers["content-type"] == "application/merge-patch+json"
    value = json.loads(patch.content)["metadata"]["annotations"]["agentrl.dev/watchdog"]
    assert json.loads(value)["state"] == "Degraded"
    assert json.loads(value)["restartsInWindow"] == 6


async def test_events_are_recorded_on_the_job_and_its_uid_is_looked_up_once() -> None:
    requests: list[httpx2.Request] = []
    reporter = LightkubeReporter(
        pod_name="swe-engine-0", namespace="team", job_name="swe",
        client=client_recording(requests),
    )  # fmt: skip
    await reporter.event("Warning", "WatchdogCrashLoop", "engine restarted 6 times")
    await reporter.event("Normal", "EngineRecovered", "ready")
    methods = [(r.method, r.url.path) for r in requests]
    assert methods == [
        ("GET", "/apis/agentrl.dev/v1alpha1/namespaces/team/agentrljobs/swe"),
        ("POST", "/api/v1/namespaces/team/events"),
        ("POST", "/api/v1/namespaces/team/events"),
    ]
    event = json.loads(requests[1].content)
    assert event["involvedObject"] == {
        "apiVersion": "agentrl.dev/v1alpha1",
        "kind": "AgentRLJob",
        "name": "swe",
        "namespace": "team",
        "uid": "uid-from-api",
    }
    assert event["type"] == "Warning"
    assert event["reason"] == "WatchdogCrashLoop"
    assert event["message"] == "swe-engine-0: engine restarted 6 times"


async def test_an_api_error_is_logged_not_raised() -> None:
    def refuse(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(403, json={"kind": "Status", "message": "forbidden", "code": 403})

    reporter = LightkubeReporter(
        pod_name="p", namespace="n", job_name="j", job_uid="u",
        client=AsyncClient(
            config=KubeConfig.from_dict(KUBECONFIG),
            transport=httpx2.MockTransport(refuse),
        ),
    )  # fmt: skip
    await reporter.annotate(report(WatchdogState.READY))
    await reporter.event("Warning", "EngineFault", "x")  # no exception escapes
