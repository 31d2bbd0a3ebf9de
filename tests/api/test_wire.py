"""The wire contract (:mod:`agentrl.api.wire`): what one side writes, the other reads back equal.

The writers and readers are the real ones: the operator's ConfigMap builder against the model
the workloads parse ``runtime.yaml`` with, and the engine watchdog's pod annotation against the
operator's reading of the pod.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from agentrl.api import wire
from agentrl.api.wire import LastFault, RuntimeConfig, WatchdogReport, WatchdogState
from agentrl.engine.watchdog_report import LightkubeReporter
from agentrl.reconcile.configmap import config_map
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.observed import pod_from_object
from agentrl.reconcile.policies.suspend import WorkloadScale, workload_scale
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


def test_a_sandbox_pod_from_the_template_changes_only_name_image_and_labels() -> None:
    job = make_job("swe", "ns").with_uid("u1").obj()
    pods = RuntimeConfig.model_validate(
        yaml.safe_load(
            config_map(job, BuildContext.for_job(job), workload_scale(job))["data"][
                wire.CONFIG_RUNTIME_KEY
            ]
        )
    ).sandbox.pods
    assert pods is not None
    before = copy.deepcopy(pods.template)
    pod = pods.pod("swe-sbx-abc", "task:1", {"agentrl.dev/episode": "e1"})
    assert pods.template == before  # the template is copied, never changed
    assert pod["metadata"]["name"] == "swe-sbx-abc"
    assert pod["metadata"]["labels"]["agentrl.dev/episode"] == "e1"
    assert pod["spec"]["containers"][0]["image"] == "task:1"
    pod["metadata"].pop("name")
    pod["metadata"]["labels"].pop("agentrl.dev/episode")
    pod["spec"]["containers"][0]["image"] = before["spec"]["containers"][0]["image"]
    assert pod == before
    assert pods.pod("x")["spec"]["containers"][0]["image"] == job.spec.sandbox.image


def test_a_template_without_the_selectors_labels_or_with_two_containers_is_refused() -> None:
    template = {
        "metadata": {"labels": {"agentrl.dev/job": "swe"}},
        "spec": {"containers": [{"name": "sandbox"}]},
    }
    selector = {"agentrl.dev/job": "swe", "app.kubernetes.io/component": "sandbox"}
    with pytest.raises(ValidationError, match="lack the selector"):
        wire.SandboxPods(name_prefix="swe-sbx-", selector=selector, template=template)
    two = copy.deepcopy(template)
    two["spec"]["containers"].append({"name": "sidecar"})
    with pytest.raises(ValidationError, match="exactly one container"):
        wire.SandboxPods(name_prefix="swe-sbx-", selector={"agentrl.dev/job": "swe"}, template=two)


def test_runtime_yaml_has_a_pod_template_exactly_for_provider_kubernetes() -> None:
    job = make_job("swe").with_sandbox(provider="local").obj()
    text = config_map(job, BuildContext.for_job(job, uid="0000"), workload_scale(job))["data"][
        wire.CONFIG_RUNTIME_KEY
    ]
    doc = yaml.safe_load(text)
    assert doc["sandbox"]["pods"] is None
    doc["sandbox"]["provider"] = "kubernetes"  # a kubernetes runtime without a template
    with pytest.raises(ValidationError, match=r"exactly when sandbox\.provider is kubernetes"):
        RuntimeConfig.model_validate(doc)


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
    # written without a version: read as 1.0, the contract before it carried one
    assert pod.watchdog == WatchdogReport(wire_version="1.0", state="Ready", ready=True)
    garbage = pod_from_object(
        {"metadata": {"name": "p", "annotations": {wire.ANNOTATION_WATCHDOG: "{"}}}
    )
    assert garbage.watchdog is None


_TOOLS = wire.ToolHealth(
    episodes=40,
    replies=160,
    calls_per_episode=3.5,
    parse_failure_rate=0.0625,
    no_tool_call_rate=0.125,
    submit_rate=0.75,
    prefix_break_rate=0.025,
    end_reasons=wire.EndReasonCounts(
        submitted=30, turn_cap=6, token_cap=3, wall_clock=1, infra_error=2
    ),
)


async def test_the_trainers_progress_with_tool_health_is_read_back_equal_by_the_operator() -> None:
    from agentrl.trainer.progress import LightkubeProgressReporter

    progress = wire.TrainerProgress(step=12, truncated_rate=0.15, tools=_TOOLS)
    client = _PatchRecorder()
    await LightkubeProgressReporter(pod_name="swe-trainer-0", namespace="ns", client=client).report(
        progress
    )
    (patch,) = client.patches
    raw = patch["metadata"]["annotations"][wire.ANNOTATION_PROGRESS]
    tools = json.loads(raw)["tools"]
    assert (tools["noToolCallRate"], tools["endReasons"]["turnCap"]) == (0.125, 6)
    pod = pod_from_object(
        {"metadata": {"name": "swe-trainer-0", "annotations": patch["metadata"]["annotations"]}}
    )
    assert pod.progress == progress


def test_an_older_trainers_progress_without_tool_health_still_parses() -> None:
    raw = json.dumps({"step": 3, "lastCheckpointStep": 2, "truncatedRate": 0.5})
    pod = pod_from_object(
        {"metadata": {"name": "p", "annotations": {wire.ANNOTATION_PROGRESS: raw}}}
    )
    assert pod.progress == wire.TrainerProgress(
        wire_version="1.0", step=3, last_checkpoint_step=2, truncated_rate=0.5
    )
    assert pod.progress.tools is None
    # and a newer trainer's unknown keys inside it are ignored, not the whole report
    newer = {"step": 3, "tools": {"episodes": 1, "newerRate": 0.5, "endReasons": {"x": 1}}}
    pod = pod_from_object(
        {"metadata": {"name": "p", "annotations": {wire.ANNOTATION_PROGRESS: json.dumps(newer)}}}
    )
    assert pod.progress is not None and pod.progress.tools == wire.ToolHealth(episodes=1)
