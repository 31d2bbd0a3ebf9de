"""The wire contract (:mod:`agentrl.api.wire`): what one side writes, the other reads back equal.

The writers and readers are the real ones: the operator's ConfigMap builder against the model
the workloads parse ``runtime.yaml`` with, and the engine watchdog's pod annotation against the
operator's reading of the pod.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from agentrl.api import wire
from agentrl.api.wire import LastFault, RuntimeConfig, WatchdogReport, WatchdogState
from agentrl.engine.watchdog_report import LightkubeReporter
from agentrl.reconcile.configmap import config_map
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.observed import pod_from_object
from agentrl.reconcile.policies.suspend import WorkloadScale
from agentrl.rollout.concurrency_source import InEffect, parse_runtime
from tests.factories import make_job


def test_the_runtime_configmap_the_operator_writes_parses_with_the_workloads_model() -> None:
    job = make_job("swe").with_concurrency(64).obj()
    scale = WorkloadScale(
        engines=2,
        rollout_workers=3,
        sandbox_concurrency=12,
        concurrency_limited_by="a ResourceQuota",
        trainer_suspended=False,
    )
    data = config_map(job, BuildContext.for_job(job, uid="0000"), scale)["data"]
    text = data[wire.CONFIG_RUNTIME_KEY]
    runtime = RuntimeConfig.model_validate(yaml.safe_load(text))
    # nothing lost or renamed on the way: the model writes back the same document
    assert runtime.model_dump(by_alias=True) == yaml.safe_load(text)
    assert runtime.sandbox.concurrency == 12
    assert runtime.rollout.workers == 3
    assert len(runtime.engines.urls) == 2
    assert runtime.checkpoint_dir == wire.CHECKPOINT_MOUNT_PATH
    assert parse_runtime(text) == InEffect(concurrency=12, workers=3)
    assert wire.CONFIG_JOB_KEY in data


class _PatchRecorder:
    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []

    async def patch(self, _kind: Any, _name: str, patch: dict[str, Any], **_kw: Any) -> None:
        self.patches.append(patch)


async def test_a_watchdog_report_the_engine_writes_is_read_back_equal_by_the_operator() -> None:
    report = WatchdogReport(
        state=WatchdogState.DEGRADED,
        ready=False,
        restarts=4,
        restarts_in_window=3,
        max_restarts=2,
        window_seconds=600,
        faults=5,
        last_fault=LastFault(
            signature="GPU_MEMORY_ACCESS_FAULT",
            line="Memory access fault by GPU node-2",
            time="2026-01-01T00:00:00Z",
        ),
        last_recovery_seconds=41.5,
        weight_version="7",
        updated_at="2026-01-01T00:00:05Z",
    )
    client = _PatchRecorder()
    reporter = LightkubeReporter(
        pod_name="swe-engine-0", namespace="ns", job_name="swe", client=client
    )
    await reporter.annotate(report)
    (patch,) = client.patches
    raw = patch["metadata"]["annotations"][wire.ANNOTATION_WATCHDOG]
    # the JSON shape old operators read: camelCase keys
    assert json.loads(raw)["restartsInWindow"] == 3
    assert json.loads(raw)["lastFault"]["signature"] == "GPU_MEMORY_ACCESS_FAULT"
    pod = pod_from_object(
        {"metadata": {"name": "swe-engine-0", "annotations": patch["metadata"]["annotations"]}}
    )
    assert pod.watchdog == report
    assert pod.watchdog is not None and pod.watchdog.crash_loop


def test_the_operator_reads_a_report_with_unknown_keys_and_reads_none_for_garbage() -> None:
    raw = json.dumps({"state": "Ready", "ready": True, "newerKey": 1})
    pod = pod_from_object(
        {"metadata": {"name": "p", "annotations": {wire.ANNOTATION_WATCHDOG: raw}}}
    )
    assert pod.watchdog == WatchdogReport(state="Ready", ready=True)
    garbage = pod_from_object(
        {"metadata": {"name": "p", "annotations": {wire.ANNOTATION_WATCHDOG: "{"}}}
    )
    assert garbage.watchdog is None
