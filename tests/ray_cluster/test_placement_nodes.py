"""Two trainer pods' Ray nodes on this machine (``ray start`` twice, as ``agentrl trainer`` does on
pod 0 and pod 1; GPUs declared, not real): the trainer group is packed over both, each node holds
``gpusPerNode`` ranks, ranks are numbered node by node from the driver's node, the joined pod
leaves with status 0 when the head goes away, and every Ray process started here is stopped."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from agentrl.api.validation import load_job
from agentrl.ray_cluster import placement
from agentrl.ray_cluster.node import (
    agree_on_ray_auth,
    reachable,
    start_ray_node,
    stop_ray_node,
    wait_reachable,
)
from agentrl.reconcile import configmap
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.policies.suspend import workload_scale
from agentrl.trainer.config import TrainerConfig, TrainerEnv
from agentrl.trainer.pod import TrainerDriver, join_ray
from agentrl.trainer.ranks import TrainerRank
from tests.api.cases import BASE, merge

ray = pytest.importorskip("ray", reason="the ray extra")
pytestmark = pytest.mark.slow  # two Ray nodes and five actor processes: about a minute

#: Outside Ray's default worker port range (10002-19999) and away from the default 6379.
PORT = 26391


@pytest.mark.timeout(300)
def test_two_trainer_nodes_each_hold_their_ranks_numbered_from_the_drivers_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Head, joined node and driver agree on authentication: token mode with this machine's
    # token file when there is one (Ray keeps the mode and token per process, so the test uses
    # the token the other Ray tests of this process use rather than a token of its own).
    monkeypatch.setenv("RAY_AUTH_MODE", "")
    monkeypatch.delenv("RAY_AUTH_MODE")
    has_token = (Path.home() / ".ray" / "auth_token").is_file() or bool(
        os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")
    )
    assert agree_on_ray_auth() == ("token" if has_token else None)

    # 2 pods × 2 GPUs, trainer.cpu 3: ranks of {GPU 1, CPU 1} and the driver's {CPU 1}
    job = load_job(
        yaml.safe_dump(
            merge(
                BASE,
                {"spec": {"trainer": {"nodes": 2, "gpusPerNode": 2, "cpu": "3"}}},
            )
        )
    )
    plan = placement.plan_placement(job)
    offer = placement.trainer_node_resources(job.spec)
    assert offer == placement.Bundle(cpu=3, gpu=2, trainer_node=3)
    follower = TrainerConfig(
        job=job,
        runtime=configmap.runtime_config(job, BuildContext.for_job(job), workload_scale(job)),
        env=TrainerEnv(node_rank=1, nnodes=2, gpus_per_node=2, master_addr="127.0.0.1"),
    )

    # Ray's session directory of its own: the machine's /tmp/ray (where a head records itself
    # as the default cluster of every ray.init() here) is shared with other test runs.
    temp_dir = tempfile.mkdtemp(prefix="arn", dir="/tmp")
    head = start_ray_node(offer.node_offer(), port=PORT, temp_dir=temp_dir)
    joined: list[int] = []
    pod1 = threading.Thread(
        target=lambda: joined.append(
            join_ray(follower, timeout_s=120, port=PORT, temp_dir=temp_dir)
        ),
        daemon=True,
    )
    try:
        assert wait_reachable("127.0.0.1", PORT, timeout_s=120)
        pod1.start()
        ray.init(address=f"127.0.0.1:{PORT}", log_to_driver=False)
        deadline = time.monotonic() + 120
        while len([n for n in ray.nodes() if n["Alive"]]) < 2:
            assert time.monotonic() < deadline, "the second node did not join"
            time.sleep(1)
        placed = placement.place(plan, timeout_s=120, rollout=False)
        try:
            nodes = placement.bundle_nodes(placed.trainer)
            ranks = placement.start_trainer_ranks(placed, TrainerRank)
            driver = placement.start_driver(placed, TrainerDriver)
            where = ray.get([r.where.remote() for r in ranks], timeout=120)
            at_driver = ray.get(driver.where.remote(), timeout=120)
        finally:
            placed.remove()
    finally:
        ray.shutdown()
        stop_ray_node(head)
        pod1.join(timeout=120)
        recorded = (Path(temp_dir) / "ray_current_cluster").read_text().strip()
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert recorded.endswith(f":{PORT}")  # the head and the node recorded themselves there

    # PACK over two nodes of 2 GPUs: two rank bundles on each
    rank_nodes = [nodes[i] for i in range(4)]
    assert sorted(rank_nodes.count(n) for n in set(rank_nodes)) == [2, 2]
    # every rank runs in the bundle the numbering gave it, on that bundle's node
    assert [w["bundle_index"] for w in where] == placed.rank_bundles
    assert [w["node_id"] for w in where] == [nodes[b] for b in placed.rank_bundles]
    # ranks 0 and 1 share the driver's node, ranks 2 and 3 the other one
    assert at_driver["bundle_index"] == plan.driver_bundle
    assert where[0]["node_id"] == where[1]["node_id"] == at_driver["node_id"]
    assert where[2]["node_id"] == where[3]["node_id"] != at_driver["node_id"]
    # one GPU each, distinct on a node
    assert all(len(w["gpu_ids"]) == 1 for w in where)
    assert where[0]["gpu_ids"] != where[1]["gpu_ids"]
    # the joined pod saw the head go away and left cleanly; nothing listens any more
    assert joined == [0]
    assert not reachable("127.0.0.1", PORT)
