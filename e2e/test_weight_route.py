"""An engine whose weight route breaks, on the real node: ``kubectl get arj`` shows it.

``examples/quickstart-cluster.yaml`` with one engine whose tiny server takes one weight update
and then answers 503 on its weight route (``--fault-weight-updates-after=1`` in
``spec.inference.extraArgs``: generation, health and ``/model_info`` go on, as behind a loader
that broke). The trainer's pushes to it fail from its second step on (``pushAttempts: 2``, 0.5 s
apart: a 503 comes at once), one failure per step, counted in a row in its progress annotation.

The test watches the trainer pod's annotation (what the trainer reports) and ``kubectl get arj
NAME`` (what a user reads), each about once a second, and asserts: the job Ready and
WeightsSynced first; ``Degraded`` never True while the trainer reports one or two failures in
a row; the printed ``Degraded`` column ``WeightPushFailing`` within one reconcile of the third
(the operator's resync, :data:`RESYNC_SECONDS`, plus :data:`SLACK`; the operator's watch of the
trainer pod enqueues the job on the annotation's change, so it is usually sooner); and
``WeightsSynced=False`` naming the engine and its answer. It prints the delay it measured:
at most 0.7 and 1.4 s in two runs, the test 129 and 137 s in all (setup 16 s), on an idle
2-core host with the real node to itself (2026-12-06). The real node's 2 CPUs fit one such
job: a job of another test beside it leaves its pods Pending.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from tests.factories import from_manifest

from agentrl.devcluster.testing import ClusterHandle, Kubectl, wait_for
from e2e.test_cluster_run import (
    EXAMPLE,
    RESYNC_SECONDS,
    condition,
    job_checkpoint_volume,
    status,
    trainer_pod,
)

pytestmark = [pytest.mark.apiserver, pytest.mark.realnode, pytest.mark.e2e, pytest.mark.slow]

JOB = "weight-route"
#: Weight updates the engine takes before its weight route fails.
TAKEN = 1
#: Allowed beyond one resync: the test's polling (about 1 s per round of two kubectl calls)
#: and the operator's reconcile itself on 2 shared cores.
SLACK = 5.0

#: The example, smaller and quicker: one engine breaking after TAKEN updates, one rollout
#: worker, 8 trajectories per step, no evaluation, the watchdog reading the served weight
#: version every 2 s (so WeightsSynced catches up between two steps), a failed push tried twice.
MANIFEST = (
    from_manifest(yaml.safe_load(EXAMPLE.read_text()))
    .with_metadata("name", JOB)
    .with_inference(engines=1, extraArgs=[f"--fault-weight-updates-after={TAKEN}"])
    .with_spec("inference.watchdog.healthIntervalSeconds", 2)
    .with_rollout(workers=1, groupSize=4, maxTurns=4)
    .with_trainer(
        trajectoriesPerStep=8,
        maxSteps=100,
        evaluation={"tasks": 0},
        weightSync={
            "mode": "disk",
            "intervalSteps": 1,
            "pushAttempts": 2,
            "retryBackoffSeconds": 0.5,
        },
        checkpoint={"intervalSteps": 100, "size": "1Gi"},
    )
    .manifest()
)


@pytest.fixture
def weight_route_volume(cluster: ClusterHandle, kubectl: Kubectl) -> Iterator[str]:
    yield from job_checkpoint_volume(cluster, kubectl, JOB)


def printed(kubectl: Kubectl) -> dict[str, str]:
    """``kubectl get arj JOB`` as a user reads it: column → value (blank: empty)."""
    header, row = kubectl.run("get", "arj", JOB).stdout.splitlines()[:2]
    starts = [i for i, c in enumerate(header) if c != " " and (i == 0 or header[i - 1] == " ")]
    ends = [*starts[1:], None]
    return {header[s:e].strip(): row[s:e].strip() for s, e in zip(starts, ends, strict=True)}


def failures_in_a_row(kubectl: Kubectl) -> int:
    """The trainer's failed pushes in a row to the (one) engine, from its progress annotation."""
    raw = trainer_pod(kubectl, JOB)["metadata"].get("annotations", {}).get("agentrl.dev/progress")
    failing = (json.loads(raw).get("weightPushFailures") or []) if raw else []
    return max((int(f["failures"]) for f in failing), default=0)


@pytest.mark.timeout(600)
def test_the_third_failed_push_shows_degraded_in_kubectl_get_within_one_reconcile(
    kubectl: Kubectl, operator_on_real_node: str, weight_route_volume: str
) -> None:
    started = time.monotonic()
    kubectl.apply(MANIFEST)
    try:
        _run(kubectl, started)
    except BaseException:
        print(_logs(kubectl))
        kubectl.run("delete", "arj", JOB, "--wait=true", timeout=180, check=False)
        raise
    kubectl.run("delete", "arj", JOB, "--wait=true", timeout=180)
    print(f"test_weight_route: {time.monotonic() - started:.0f} s from apply to deleted")


def _logs(kubectl: Kubectl) -> str:
    """The job's conditions, its pods and the trainer's and the engine's last log lines (for a
    failure)."""
    conditions = status(kubectl, JOB).get("conditions", [])
    out = [f"{c['type']}={c['status']} {c.get('reason')}: {c.get('message')}" for c in conditions]
    out.append(kubectl.run("get", "pods", "-o", "wide", check=False).stdout)
    for component, container in (("trainer", "trainer"), ("engine", "engine")):
        selector = f"agentrl.dev/job={JOB},app.kubernetes.io/component={component}"
        logs = kubectl.run("logs", "-l", selector, "-c", container, "--tail=40", check=False)
        out.append(f"--- {component}\n{logs.stdout}{logs.stderr}")
    return "\n".join(out)


def _run(kubectl: Kubectl, started: float) -> None:
    wait_for(
        lambda: condition(kubectl, "Ready", JOB).get("status") == "True",
        timeout=300, interval=2, what="the job Ready",
    )  # fmt: skip
    # the push the engine takes: every engine serves the trainer's weights (until the next
    # push fails, one step later)
    synced = wait_for(
        lambda: (
            "True" if condition(kubectl, "WeightsSynced", JOB).get("status") == "True"
            else "missed" if failures_in_a_row(kubectl) > 0 else None
        ),
        timeout=300, interval=1, what="WeightsSynced before the weight route breaks",
    )  # fmt: skip
    assert synced == "True", "a push failed before WeightsSynced was seen True"

    # Each round reads the printed columns first, then the annotation: Degraded seen with the
    # annotation read after it still below three would be Degraded before the third failure.
    below_three_at = time.monotonic()  # last read of the annotation below three
    third_seen_at: float | None = None  # first read at three or more
    seen: set[int] = set()
    shown: tuple[int, str, str] | None = None
    deadline = time.monotonic() + 300
    while True:
        assert time.monotonic() < deadline, f"no Degraded within 300 s (failures: {seen})"
        columns = printed(kubectl)
        failures = failures_in_a_row(kubectl)
        now = time.monotonic()
        seen.add(failures)
        if shown != (failures, columns["STEP"], columns["DEGRADED"]):
            shown = (failures, columns["STEP"], columns["DEGRADED"])
            print(f"test_weight_route: {now - started:5.1f} s: failures in a row {failures}, "
                  f"kubectl get arj: {columns}")  # fmt: skip
        degraded = columns["DEGRADED"] == "WeightPushFailing"
        if failures < 3:
            assert not degraded, f"Degraded at {failures} failed pushes in a row: {columns}"
            below_three_at = now
        elif third_seen_at is None:
            third_seen_at = now
        if degraded:
            break
        time.sleep(0.5)
    assert {1, 2} <= seen, f"the first and second failures were not both observed: {seen}"
    assert third_seen_at is not None
    # the third failure came after the last read below three: the delay is at most this
    delay = now - below_three_at
    print(
        f"test_weight_route: Degraded WeightPushFailing in `kubectl get arj` "
        f"{now - third_seen_at:.1f}-{delay:.1f} s after the trainer reported the third failed "
        f"push (bound: resync {RESYNC_SECONDS} s + {SLACK:.0f} s)"
    )
    assert delay <= RESYNC_SECONDS + SLACK, delay

    synced = condition(kubectl, "WeightsSynced", JOB)
    assert (synced["status"], synced["reason"]) == ("False", "WeightPushFailing"), synced
    engine = f"{JOB}-engine-0"
    for words in (engine, "3 weight pushes in a row failed", "HTTP 503",
                  "/update_weights_from_disk is failing"):  # fmt: skip
        assert words in synced["message"], (words, synced)
    degraded_condition: dict[str, Any] = condition(kubectl, "Degraded", JOB)
    assert degraded_condition["reason"] == "WeightPushFailing", degraded_condition
    assert engine in degraded_condition["message"], degraded_condition
    # the trainer kept training through it
    assert int(status(kubectl, JOB).get("trainer", {}).get("step", 0)) >= TAKEN + 3
