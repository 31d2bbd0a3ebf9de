"""Day two on the real node: a job started by the previous release keeps training through
``helm upgrade`` to this tree's chart and through the move to this tree's images.

The previous release is the tag :data:`agentrl.devcluster.release.PREVIOUS` names, built by
``agentrl dev prepare`` from that tag's own tree: its chart, its CRD, its example and its
images (``localhost/agentrl/<name>:<tag>``). The test does what docs/install.md (Upgrade,
"The upgrade order") tells an operator of a cluster to do, in that order:

1. the release is installed and its cluster quickstart trains (its images, its operator);
2. ``helm upgrade`` to this tree's chart mid-run (and the CRD as it installs it): the new operator
   takes over the running job without restarting its trainer;
3. the job's images are moved to this tree's: the engines and the rollout workers roll, and
   the trainer's next attempt (its pod deleted, as install.md says to do when leaving v0.1.0,
   whose driver may give up on replaced rollout workers) resumes from the last checkpoint in
   the new image, with sandbox pods of the new sandbox image.

Throughout, the job trains: ``steps.jsonl`` holds every step exactly once and in order, the
counters of the resumed checkpoint count each trajectory once, the new operator pod is never
preempted by the job's rolling pods, and the status never claims a step that was not logged,
never goes back before the trainer's restart, never says Failed, and keeps WireCompatible.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.factories import from_manifest

from agentrl.devcluster import images, release
from agentrl.devcluster.testing import ClusterHandle, Kubectl, wait_for
from e2e.test_cluster_run import (
    condition,
    job_checkpoint_volume,
    operator_selector,
    progress_step,
    resumed_trainer,
    status,
    step,
    step_log,
    trainer_pod,
    wait_step,
)

pytestmark = [pytest.mark.apiserver, pytest.mark.realnode, pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
JOB = "quickstart-cluster"
VALUES = ROOT / "examples" / "helm" / "local-cluster-values.yaml"
PREVIOUS = release.PREVIOUS


def old_tree() -> Path:
    return release.tree(PREVIOUS)


def previous_job() -> dict[str, Any]:
    """The release's own cluster quickstart on the release's images, checkpointing every 2
    steps of 16 trajectories, with more steps than the test waits for."""
    example = yaml.safe_load((old_tree() / "examples" / "quickstart-cluster.yaml").read_text())
    return (
        from_manifest(example)
        .with_spec("trainer.checkpoint.intervalSteps", 2)
        .with_inference(image=release.ref("sglang-engine", PREVIOUS))
        .with_sandbox(image=release.ref("sandbox", PREVIOUS))
        .with_trainer(
            image=release.ref("rocm-trainer", PREVIOUS), trajectoriesPerStep=16, maxSteps=100
        )
        .manifest()
    )


@pytest.fixture
def previous_release_on_real_node(  # type: ignore[no-untyped-def]
    cluster: ClusterHandle, cluster_helm, kubectl: Kubectl, crd_installed: None, tmp_path: Path
) -> Iterator[str]:
    """The previous release's chart (its operator image, its CRD) installed into the test's
    namespace, watching only it; yields the release name. The current CRD is put back after."""
    from tests.chart.charting import apply_crds, unique_release

    from agentrl.devcluster.cluster import project_archives

    stale = images.missing() + [f"{n} of {PREVIOUS.tag}" for n in release.missing(PREVIOUS)]
    if stale:
        pytest.fail(
            f"images absent or older than their source: {', '.join(stale)}; "
            "run `agentrl dev prepare` (make test runs it first)"
        )
    if cluster.local is not None:
        # this tree's images first: the release's thin archives leave out the base layers
        cluster.local.load(project_archives(), echo=lambda _m: None)
        cluster.local.load(release.archives(PREVIOUS), echo=lambda _m: None)
    admin = cluster.kubectl()
    apply_crds(admin, old_tree())  # as the release's chart installs it
    name = unique_release("up")
    extra = tmp_path / "previous-values.json"
    extra.write_text(
        json.dumps(
            {
                "crds": {"install": False},
                "watchNamespaces": [kubectl.namespace],
                "operator": {"image": {"tag": PREVIOUS.tag}},
            }
        )
    )
    try:
        cluster_helm.run(
            "install", name, str(old_tree() / "charts" / "agentrl"),
            "--namespace", str(kubectl.namespace),
            "--values", str(old_tree() / "examples" / "helm" / "local-cluster-values.yaml"),
            "--values", str(extra), "--wait", "--timeout", "240s",
            timeout=300,
        )  # fmt: skip
        yield name
    finally:
        cluster_helm.run(
            "uninstall", name, "--namespace", str(kubectl.namespace), "--wait", check=False,
            timeout=180,
        )  # fmt: skip
        apply_crds(admin)


@pytest.fixture
def checkpoint_volume(cluster: ClusterHandle, kubectl: Kubectl) -> Iterator[str]:
    yield from job_checkpoint_volume(cluster, kubectl, JOB)


# ---- what the test watches ---------------------------------------------------------------------


@dataclass
class StatusLog:
    """The job's status every 2 s while the test runs: what it claimed, in order."""

    samples: list[dict[str, Any]] = field(default_factory=list)
    error: BaseException | None = None
    stop: threading.Event = field(default_factory=threading.Event)

    finished: threading.Event = field(default_factory=threading.Event)

    def run(self, kubectl: Kubectl) -> None:
        try:
            while not self.stop.wait(2.0):
                obj = kubectl.json("get", "arj", JOB)
                self.samples.append(dict(obj.get("status") or {}))
        except BaseException as exc:  # surfaced by the test
            self.error = exc
        finally:
            self.finished.set()

    def halt(self) -> None:
        """Stop sampling, and wait until the last sample is taken."""
        self.stop.set()
        self.finished.wait(60)

    def conditions(self, type_: str) -> list[tuple[str, str, str]]:
        """(status, reason, message) of condition ``type_`` in every sample that has it."""
        return [
            (c["status"], c.get("reason", ""), c.get("message", ""))
            for s in self.samples
            for c in s.get("conditions", [])
            if c["type"] == type_
        ]

    def steps(self) -> list[int]:
        return [int(s.get("trainer", {}).get("step", 0)) for s in self.samples]


def pods(kubectl: Kubectl, component: str) -> list[dict[str, Any]]:
    selector = f"agentrl.dev/job={JOB},app.kubernetes.io/component={component}"
    items = kubectl.json("get", "pods", "-l", selector)["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def run_on(kubectl: Kubectl, component: str, image: str, count: int) -> bool:
    """Exactly ``count`` pods of ``component``, each Ready with every container on ``image``
    (the engines' watchdog sidecar runs the engine image)."""
    found = pods(kubectl, component)
    return len(found) == count and all(
        all(c["image"] == image for c in p["spec"]["containers"])
        and all(c["ready"] for c in p["status"].get("containerStatuses", [{"ready": False}]))
        for p in found
    )


def images_of(kubectl: Kubectl, component: str) -> set[str]:
    return {c["image"] for p in pods(kubectl, component) for c in p["spec"]["containers"]}


# ---- the run -------------------------------------------------------------------------------------


@pytest.mark.timeout(2400)
def test_a_job_of_the_previous_release_keeps_training_through_helm_upgrade_and_new_images(
    cluster: ClusterHandle,
    cluster_helm,  # type: ignore[no-untyped-def]
    kubectl: Kubectl,
    previous_release_on_real_node: str,
    checkpoint_volume: str,
    tmp_path: Path,
) -> None:
    log = StatusLog()
    watcher = threading.Thread(target=log.run, args=(kubectl,), daemon=True)
    watcher.start()
    try:
        _run(cluster, cluster_helm, kubectl, previous_release_on_real_node, log, tmp_path)
    finally:
        log.stop.set()
        watcher.join(10)
    assert log.error is None, log.error


def _run(  # type: ignore[no-untyped-def]
    cluster: ClusterHandle,
    cluster_helm,
    kubectl: Kubectl,
    name: str,
    log: StatusLog,
    tmp_path: Path,
) -> None:
    from tests.chart.charting import CHART, apply_crds

    # -- 1. the previous release trains ------------------------------------------------------------
    kubectl.apply(previous_job())
    wait_for(
        lambda: condition(kubectl, "Ready").get("status") == "True",
        timeout=600, interval=2, what="the job Ready under the previous release",
    )  # fmt: skip
    wait_step(kubectl, 2, timeout=900)
    assert images_of(kubectl, "trainer") == {release.ref("rocm-trainer", PREVIOUS)}
    selector = operator_selector(name)
    (old_operator,) = kubectl.json("get", "pods", "-l", selector)["items"]
    assert old_operator["spec"]["containers"][0]["image"] == release.ref("operator", PREVIOUS)
    trainer_uid = trainer_pod(kubectl)["metadata"]["uid"]

    # -- 2. helm upgrade to this tree's chart, mid-run ---------------------------------------------
    extra = tmp_path / "values.json"
    extra.write_text(
        json.dumps({"crds": {"install": False}, "watchNamespaces": [kubectl.namespace]})
    )
    cluster_helm.run(
        "upgrade", name, str(CHART), "--namespace", str(kubectl.namespace),
        "--values", str(VALUES), "--values", str(extra), "--wait", "--timeout", "240s",
        timeout=300,
    )  # fmt: skip
    apply_crds(cluster.kubectl())
    (operator,) = [
        p
        for p in kubectl.json("get", "pods", "-l", selector)["items"]
        if not p["metadata"].get("deletionTimestamp")
    ]
    assert operator["spec"]["containers"][0]["image"] == images.OPERATOR_IMAGE
    # above every pod of the job: the rolls below never preempt it (they did without a class)
    assert operator["spec"].get("priorityClassName") == f"{name}-agentrl-operator"
    at_upgrade = step(kubectl)
    # the new operator follows the running job: its steps reach the status, nothing restarted
    wait_step(kubectl, at_upgrade + 1, timeout=900)
    assert trainer_pod(kubectl)["metadata"]["uid"] == trainer_uid
    wire = wait_for(
        lambda: (c := condition(kubectl, "WireCompatible")).get("status") == "True" and c,
        timeout=120, interval=2, what="WireCompatible=True under the new operator",
    )  # fmt: skip
    print(f"after helm upgrade: WireCompatible {wire}")

    # -- 3. the job moves to this tree's images ----------------------------------------------------
    patch = {
        "spec": {
            "inference": {"image": images.ENGINE_IMAGE},
            "sandbox": {"image": images.SANDBOX_IMAGE},
            "trainer": {"image": images.TRAINER_IMAGE},
        }
    }
    kubectl.run("patch", "arj", JOB, "--type=merge", "-p", json.dumps(patch))
    wait_for(
        lambda: run_on(kubectl, "engine", images.ENGINE_IMAGE, 2)
        and run_on(kubectl, "rollout", images.TRAINER_IMAGE, 2),
        timeout=900, interval=3, what="the engines and the rollout workers on the new images",
    )  # fmt: skip
    # the running attempt keeps its pod (Kubernetes never changes a Job's template). Whether
    # it trains on meanwhile is not asked of it: the release's driver may give up on rollout
    # workers whose pods were replaced (a race fixed after it: ActorDiedError taken as final;
    # tests/rollout/test_ray_worker_reopen.py), which its next attempt does not have
    old = trainer_pod(kubectl)
    assert old["metadata"]["uid"] == trainer_uid
    assert images_of(kubectl, "trainer") == {release.ref("rocm-trainer", PREVIOUS)}
    # the trainer's next attempt runs the new image, from the last checkpoint
    wait_for(
        lambda: status(kubectl)["trainer"].get("lastCheckpointStep", 0) >= 2, timeout=600,
        interval=2, what="a checkpoint",
    )  # fmt: skip
    before_restart = len(log.samples)
    kubectl.run("delete", "pod", old["metadata"]["name"], "--wait=false")
    pod, resumed = resumed_trainer(kubectl, after=trainer_uid, timeout=600)
    assert images_of(kubectl, "trainer") == {images.TRAINER_IMAGE}
    # its rollout tier creates sandbox pods of the new image (the running driver kept the
    # sandbox pod template it started with)
    wait_for(
        lambda: any(
            c["image"] == images.SANDBOX_IMAGE
            for p in pods(kubectl, "sandbox")
            for c in p["spec"]["containers"]
        ),
        timeout=300, interval=1, what="a sandbox pod of the new sandbox image",
    )  # fmt: skip
    at = int(resumed.group(1))
    wait_for(
        lambda: progress_step(kubectl, pod) >= at + 2, timeout=900, interval=3,
        what=f"the new trainer's step {at + 2}",
    )  # fmt: skip

    # -- what the run left: every step once, in order; each trajectory counted once ----------------
    log.halt()  # its samples all precede the step log read below
    assert log.error is None, log.error
    lines = step_log(kubectl, pod)
    logged = [line["step"] for line in lines]
    assert len(logged) >= at + 2
    # the checkpoint the resume read was written by the release's driver: its trained
    # trajectories are exactly the steps' own and no infra error was trained on. Its class
    # counts are not bounded by the step windows here: a v0.1.0 driver that gave up on its
    # rollout workers (the race above) ends every episode at once as an infra error, counted
    # and never trained, before any step's window holds them (77,488 in one run)
    saved = json.loads(
        kubectl.run(
            "exec", pod, "--", "cat", f"/checkpoints/trainer/step-{at:08d}/driver.json"
        ).stdout
    )["counters"]
    assert saved["trained_trajectories"] == sum(
        line["trajectories"] for line in lines if line["step"] <= at
    )
    assert saved["infra_errors_in_training"] == 0, saved

    # the operator pod the upgrade started is still the one running: nothing preempted it
    (running,) = [
        p
        for p in kubectl.json("get", "pods", "-l", selector)["items"]
        if not p["metadata"].get("deletionTimestamp")
    ]
    assert running["metadata"]["uid"] == operator["metadata"]["uid"], kubectl.run(
        "get", "events", "--field-selector", "reason=Preempted", check=False
    ).stdout
    assert running["status"]["containerStatuses"][0]["restartCount"] == 0

    # -- the status told the truth throughout ------------------------------------------------------
    final = wait_for(
        lambda: (c := condition(kubectl, "WireCompatible")).get("status") == "True" and c,
        timeout=120, interval=2, what="WireCompatible=True on the new images",
    )  # fmt: skip
    print(f"on the new images: WireCompatible {final}")
    claimed = log.steps()
    assert claimed and max(claimed) <= len(logged), (max(claimed), len(logged))
    # Unknown (VersionsNotReported) until the first pods wrote, then True: never a skew
    wire_states = log.conditions("WireCompatible")
    assert not [c for c in wire_states if c[0] == "False"], set(wire_states)
    assert wire_states[-1][0] == "True", wire_states[-1]
    assert not [c for c in log.conditions("Failed") if c[0] == "True"]
    # through the upgrade and the roll the status's step only rose (until the trainer's own
    # restart, which goes back to its checkpoint)
    upto = claimed[:before_restart]
    assert upto == sorted(upto), upto
    kubectl.run("delete", "arj", JOB, "--wait=true", timeout=300)
    deadline = time.monotonic() + 300
    while pods(kubectl, "trainer") and time.monotonic() < deadline:
        time.sleep(2)
