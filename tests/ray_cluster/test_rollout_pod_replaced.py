"""A rollout worker pod replaced mid-run (a rolling update of the rollout Deployment, as a new
``spec.trainer.image`` makes): its Ray node leaves, another joins. Ray places the rollout
group's bundle again on the new node and restarts the worker actor there; the driver holds its
episodes back meanwhile, opens the restarted actor and the run ends with every episode scored.
And a rollout pod that leaves for good (the job deleted: every pod goes at once) does not hold
the stopping trainer: its episodes are cancelled, not waited for.

The nodes are raylets of Ray's own multi-node test cluster (``ray.cluster_utils.Cluster``) on
this machine: a head without the rollout-node resource (the trainer pod) and a node offering it
(a rollout pod), as the placement asks of them (:mod:`agentrl.ray_cluster.placement`). The
engine is the real tiny engine over HTTP, the sandboxes local ones."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrl.api import AgentRLJob
from agentrl.api.rollout import TerminalClass
from agentrl.api.wire import ROLLOUT_NODE_RESOURCE
from agentrl.ray_cluster.placement import in_bundle
from agentrl.rollout.ray_workers import (
    RemoteEpisodes,
    open_remote_rollout,
    start_workers,
)
from agentrl.rollout.tasks import generate_toy_tasks
from tests.rollout.remote_parts import tiny_engine_url, worker_config

ray = pytest.importorskip("ray", reason="the ray extra")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # three raylets on two cores

ROLLOUT_POD = {"num_cpus": 1, "resources": {ROLLOUT_NODE_RESOURCE: 1}}


@pytest.fixture
def ray_nodes() -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture
async def engine_url() -> AsyncIterator[str]:
    async with tiny_engine_url() as url:
        yield url


async def test_a_replaced_rollout_pod_gets_the_worker_back_and_the_run_ends_scored(
    ray_nodes: Any, engine_url: str, tmp_path: Path
) -> None:
    from ray.util.placement_group import placement_group

    old_pod = ray_nodes.add_node(**ROLLOUT_POD)
    group = placement_group([{"CPU": 1, ROLLOUT_NODE_RESOURCE: 1}])
    await group.ready()
    config = worker_config(engine_url, tmp_path, workers=1, concurrency=2)
    spec = AgentRLJob.model_validate(config.job).spec
    (actor,) = start_workers(config, cpus_per_worker=1.0, strategies=[in_bundle(group, 0)])
    first_node = (await actor.where.remote())["node_id"]
    assert first_node == old_pod.node_id
    episodes = RemoteEpisodes([actor], spec)
    got = []
    new_pod = None
    try:
        async with open_remote_rollout(spec, episodes, tasks=generate_toy_tasks()[:4]) as scheduler:
            async for trajectory in scheduler.trajectories():
                got.append(trajectory)
                if new_pod is not None:
                    continue
                # the pod goes while its worker holds episodes
                assert episodes.outstanding() != [0]
                # (in this thread: Ray's node handles install signal handlers; the loop
                # waits meanwhile, the engine with it, which nobody can reach then anyway)
                ray_nodes.remove_node(old_pod)
                for _ in range(300):
                    if episodes.alive == 0:
                        break
                    await asyncio.sleep(0.1)
                assert episodes.alive == 0
                await asyncio.sleep(3)  # no worker, none placed: the episodes wait, none fails
                assert all(t.terminal_class != TerminalClass.INFRA_ERROR for t in got)
                new_pod = ray_nodes.add_node(**ROLLOUT_POD)
        # the restarted actor runs on the new pod's node, in the same bundle
        where = await actor.where.remote()
    finally:
        ray.kill(actor)
    assert where["node_id"] == new_pod.node_id != first_node
    assert where["bundle_index"] == 0
    assert new_pod is not None
    assert len(got) == 8
    assert all(t.terminal_class != TerminalClass.INFRA_ERROR for t in got), [
        t.infra_reason for t in got
    ]
    assert episodes.lost_episodes >= 1  # what the old pod's worker held ...
    assert sum(t.attempt for t in got) == episodes.lost_episodes  # ... ran again once each
    (worker,) = episodes.workers
    assert worker.restarts == 1 and episodes.alive == 1
    assert episodes.final_stats[0].pid == worker.pid == where["pid"]


async def test_a_rollout_pod_gone_for_good_does_not_hold_the_stopping_trainer(
    ray_nodes: Any, engine_url: str, tmp_path: Path
) -> None:
    """The session as the trainer pod runs it (:func:`open_session` over the worker actors):
    the rollout pod's node leaves while its worker holds episodes and never comes back, then
    the driver is done. Leaving the session returns at once, every episode cancelled and the
    worker's reopening given up (before the fix it drained the episodes, waiting for a worker
    Ray would restart on a rollout pod that never comes, until the grace period's SIGKILL)."""
    from ray.util.placement_group import placement_group

    from agentrl.trainer.assembly import SessionOptions, TaskSplit, build_parts, open_session
    from agentrl.trainer.checkpoint import CheckpointStore, DriverState

    pod = ray_nodes.add_node(**ROLLOUT_POD)
    group = placement_group([{"CPU": 1, ROLLOUT_NODE_RESOURCE: 1}])
    await group.ready()
    config = worker_config(engine_url, tmp_path, workers=1, concurrency=2)
    spec = AgentRLJob.model_validate(config.job).spec
    (actor,) = start_workers(config, cpus_per_worker=1.0, strategies=[in_bundle(group, 0)])
    episodes = RemoteEpisodes([actor], spec)
    parts = build_parts(
        spec,
        tasks=TaskSplit.of(spec),
        backend=None,
        checkpoints=CheckpointStore(tmp_path / "checkpoints"),
        state=DriverState(),
        weight_sync=None,
    )

    def tier(stream: Any, admission: Any) -> Any:
        return open_remote_rollout(spec, episodes, tasks=stream, admission=admission)

    options = SessionOptions(steps_log=tmp_path / "steps.jsonl")
    try:
        async with open_session(parts, tier, options) as session:
            scheduler = session.scheduler
            async for _ in scheduler.trajectories():
                break  # the run is under way
            assert episodes.outstanding() != [0]
            ray_nodes.remove_node(pod)  # (in this thread: see the test above)
            for _ in range(300):
                if episodes.alive == 0:
                    break
                await asyncio.sleep(0.1)
            assert episodes.alive == 0 and episodes.workers[0].reopening
            leaving = asyncio.get_running_loop().time()
        left = asyncio.get_running_loop().time() - leaving
    finally:
        ray.kill(actor)
    # not a timing claim: a drain would never return (the test's timeout would end it)
    print(f"left the session {left:.1f} s after the driver was done")
    assert scheduler.in_flight == 0
    assert not episodes.workers[0].reopening
    assert episodes.outstanding() == [0]
