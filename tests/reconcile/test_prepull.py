"""The image pre-pull DaemonSets: which images, on which nodes, paced within the registry's pull
budget, and their progress in words."""

from __future__ import annotations

from typing import Any

from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.prepull import (
    DEFAULT_TOOL_IMAGE,
    PrePullProgress,
    prepull_daemonsets,
    prepull_images,
    prepull_progress,
)
from tests.factories import make_job

CTX = BuildContext(namespace="team", uid="uid-1")
BUSYBOX = "/agentrl-prepull/busybox"


def prepull_job(**pre_pull: Any) -> Any:
    return (
        make_job()
        .with_sandbox(prePull={"enabled": True, **pre_pull}, nodeSelector={"pool": "sandbox"})
        .with_spec("dataset.imagePullSecrets", ["registry-creds"])
        .obj()
    )


def test_nothing_is_pre_pulled_unless_enabled() -> None:
    job = make_job().obj()
    assert prepull_daemonsets(job, CTX, ["swe/a:1"], nodes=4) == []


def test_nothing_is_pre_pulled_for_sandboxes_that_do_not_run_on_the_nodes() -> None:
    job = make_job().with_e2b(max_concurrent=10).with_sandbox(prePull={"enabled": True}).obj()
    assert prepull_daemonsets(job, CTX, ["swe/a:1"], nodes=4) == []


def test_the_sandbox_image_the_task_images_and_the_extra_images_are_pulled_once_each() -> None:
    job = prepull_job(images=["extra:1", "swe/a:1"])
    assert prepull_images(job, ["swe/a:1", "swe/b:1", "swe/a:1"]) == [
        "python:3.11-slim",  # spec.sandbox.image's default
        "swe/a:1",
        "swe/b:1",
        "extra:1",
    ]


def test_the_daemonset_pulls_each_image_in_an_init_container_on_sandbox_nodes() -> None:
    job = prepull_job()
    [ds] = prepull_daemonsets(job, CTX, ["swe/a:1", "swe/b:1"], nodes=3)
    assert ds["kind"] == "DaemonSet" and ds["apiVersion"] == "apps/v1"
    meta = ds["metadata"]
    assert (meta["name"], meta["namespace"]) == ("demo-prepull-0", "team")
    assert meta["ownerReferences"][0]["uid"] == "uid-1"
    assert meta["annotations"] == {
        "agentrl.dev/prepull-images": "3",
        "agentrl.dev/prepull-interval-seconds": "0",
    }
    assert ds["spec"]["selector"]["matchLabels"] == {
        "agentrl.dev/job": "demo",
        "app.kubernetes.io/component": "prepull",
        "agentrl.dev/prepull-chunk": "0",
    }
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "sandbox"}
    assert pod["imagePullSecrets"] == [{"name": "registry-creds"}]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    inits = pod["initContainers"]
    # busybox is copied first, so images without a shell can still run a command
    assert inits[0]["image"] == DEFAULT_TOOL_IMAGE
    assert inits[0]["command"] == ["/bin/busybox", "cp", "/bin/busybox", BUSYBOX]
    # 3 images × 3 nodes = 9 pulls ≤ 100 per hour: no pacing, each pull just runs `true`
    assert [(c["name"], c["image"], c["command"], c["imagePullPolicy"]) for c in inits[1:]] == [
        ("pull-0", "python:3.11-slim", [BUSYBOX, "true"], "IfNotPresent"),
        ("pull-1", "swe/a:1", [BUSYBOX, "true"], "IfNotPresent"),
        ("pull-2", "swe/b:1", [BUSYBOX, "true"], "IfNotPresent"),
    ]
    assert [c["name"] for c in pod["containers"]] == ["done"]
    # the template's labels match the selector
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_pulls_beyond_one_hours_budget_are_paced() -> None:
    job = prepull_job(maxPullsPerHour=10)
    [ds] = prepull_daemonsets(job, CTX, ["swe/a:1", "swe/b:1", "swe/c:1"], nodes=3)
    # 4 images × 3 nodes = 12 > 10: 3 nodes pulling once per interval must stay ≤ 10 per hour,
    # so the interval is ceil(3600 × 1 chunk × 3 nodes / 10) = 1080 s.
    pulls = ds["spec"]["template"]["spec"]["initContainers"][1:]
    assert {tuple(c["command"]) for c in pulls} == {(BUSYBOX, "sleep", "1080")}
    assert ds["metadata"]["annotations"]["agentrl.dev/prepull-interval-seconds"] == "1080"


def test_many_images_are_split_into_daemonsets_that_share_the_budget() -> None:
    job = prepull_job()
    dataset = [f"swe/task-{i}:1" for i in range(249)]  # + the sandbox image = 250
    sets = prepull_daemonsets(job, CTX, dataset, nodes=2)
    assert [d["metadata"]["name"] for d in sets] == [
        "demo-prepull-0", "demo-prepull-1", "demo-prepull-2"
    ]
    pulls = [len(d["spec"]["template"]["spec"]["initContainers"]) - 1 for d in sets]
    assert pulls == [100, 100, 50]
    assert [d["spec"]["selector"]["matchLabels"]["agentrl.dev/prepull-chunk"] for d in sets] == [
        "0", "1", "2"
    ]
    # 250 × 2 = 500 > 100: 3 chunks × 2 nodes pull once per interval → ceil(3600 × 6 / 100) = 216
    assert {d["metadata"]["annotations"]["agentrl.dev/prepull-interval-seconds"] for d in sets} \
        == {"216"}


def daemonset(
    images: int, *, desired: int, ready: int, updated: int | None = None, interval: int = 0,
    generation: int = 1, observed: int = 1,
) -> dict[str, Any]:
    return {
        "metadata": {
            "generation": generation,
            "annotations": {
                "agentrl.dev/prepull-images": str(images),
                "agentrl.dev/prepull-interval-seconds": str(interval),
            },
        },
        "status": {
            "observedGeneration": observed,
            "desiredNumberScheduled": desired,
            "numberReady": ready,
            "updatedNumberScheduled": desired if updated is None else updated,
        },
    }


def test_progress_counts_the_nodes_that_hold_every_image() -> None:
    progress = prepull_progress([
        daemonset(100, desired=4, ready=3, interval=216),
        daemonset(50, desired=4, ready=1, interval=216),
    ])
    # pulled: 100 × 3 + 50 × 1 = 350 of 150 × 4 = 600 → 58%; every image on min(3, 1) = 1 node
    assert progress == PrePullProgress(
        images=150,
        nodes=4,
        nodes_done=1,
        done=False,
        message="pre-pulling 150 images on 4 sandbox nodes: 58% done, 1 of 4 nodes hold every "
        "image; paced at one pull per node every 216 s (prePull.maxPullsPerHour)",
    )


def test_progress_is_done_when_every_node_is_ready_on_the_current_template() -> None:
    progress = prepull_progress([daemonset(12, desired=2, ready=2)])
    assert progress is not None and progress.done
    assert progress.message == "12 images pre-pulled on all 2 sandbox nodes"


def test_ready_pods_of_an_older_template_are_not_done() -> None:
    # the image list changed (generation 2) and the DaemonSet controller has not caught up
    stale = prepull_progress([daemonset(12, desired=2, ready=2, generation=2, observed=1)])
    assert stale is not None and stale.nodes_done == 0 and not stale.done
    rolling = prepull_progress([daemonset(12, desired=2, ready=2, updated=1)])
    assert rolling is not None and rolling.nodes_done == 1


def test_progress_says_when_no_node_matches_the_sandbox_node_selector() -> None:
    progress = prepull_progress([daemonset(5, desired=0, ready=0)])
    assert progress is not None and not progress.done
    assert "no node matches spec.sandbox.nodeSelector" in progress.message
    assert prepull_progress([]) is None
