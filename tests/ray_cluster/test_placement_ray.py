"""Placement on a real local Ray: the groups become ready, every rank, the driver and every
rollout worker runs in the bundle Ray reserved for it (as the raylet reports it to the actor), an
infeasible plan fails within its timeout naming the spec field and the fix, rank 0's actor steps
the torch backend for the driver, and nothing is left behind."""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrl.api import AgentRLJob
from agentrl.api.validation import load_job
from agentrl.ray_cluster import placement
from agentrl.trainer.pod import TrainerDriver
from agentrl.trainer.ranks import TrainerRank
from tests.api.cases import merge
from tests.trainer.tiny_engine import tiny_engine

ray = pytest.importorskip("ray", reason="the ray extra")
pytestmark = pytest.mark.slow  # a local Ray and a few actor processes: about a minute

QUICKSTART = Path(__file__).parents[2] / "examples" / "quickstart.yaml"
#: Logical CPUs of the test's Ray (a 2-core host runs it: the actors are idle most of the time).
CPUS = 4


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    # the machine is the trainer node: it offers room for every trainer bundle of these tests
    ray.init(
        num_cpus=CPUS,
        resources={placement.TRAINER_NODE_RESOURCE: 8, placement.ROLLOUT_NODE_RESOURCE: 4},
        include_dashboard=False,
        log_to_driver=False,
    )
    yield
    ray.shutdown()


def _quickstart(patch: dict[str, Any] | None = None) -> AgentRLJob:
    doc = yaml.safe_load(QUICKSTART.read_text())
    return load_job(yaml.safe_dump(merge(doc, {"spec": patch or {}})))


def _cpu_ranks(nodes: int) -> AgentRLJob:
    """The quickstart with ``nodes`` CPU-only ranks, for the placement mechanics alone. The
    torch backend runs one rank (``nodes > 1`` is refused at apply time: its other ranks would
    have nothing to follow), so this is built from the model without the cross-field rules."""
    doc = yaml.safe_load(QUICKSTART.read_text())
    return AgentRLJob.model_validate(merge(doc, {"spec": {"trainer": {"nodes": nodes}}}))


def _states() -> dict[str, str]:
    from ray.util.placement_group import placement_group_table

    return {pg_id: row["state"] for pg_id, row in placement_group_table().items()}


@pytest.mark.timeout(300)
def test_ranks_and_the_driver_run_in_the_bundles_ray_reserved_and_are_removed_after(
    local_ray: None,
) -> None:
    # two CPU-only trainer nodes: ranks in bundles 0 and 1, the driver in bundle 2 (3 CPUs)
    plan = placement.plan_placement(_cpu_ranks(2))
    placed = placement.place(plan, timeout_s=60, rollout=False)
    pg_id = placed.trainer.id.hex()
    try:
        assert _states()[pg_id] == "CREATED"
        ranks = placement.start_trainer_ranks(placed, TrainerRank)
        driver = placement.start_driver(placed, TrainerDriver)
        where = ray.get([r.where.remote() for r in ranks])
        at_driver = ray.get(driver.where.remote())
    finally:
        placed.remove()

    assert [w["rank"] for w in where] == [0, 1]
    assert [w["bundle_index"] for w in where] == [0, 1]
    assert at_driver["bundle_index"] == 2
    assert {w["placement_group_id"] for w in [*where, at_driver]} == {pg_id}
    pids = {w["pid"] for w in [*where, at_driver]}
    assert len(pids) == 3 and os.getpid() not in pids

    assert _states()[pg_id] == "REMOVED"
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(ranks[0].where.remote(), timeout=60)


@pytest.mark.timeout(300)
def test_rollout_workers_run_in_their_bundles_of_the_rollout_group(local_ray: None) -> None:
    from agentrl.rollout.ray_workers import RolloutWorkerConfig, start_workers_in

    job = _quickstart({"rollout": {"workers": 2}})
    placed = placement.place(placement.plan_placement(job), timeout_s=60, rollout=True)
    try:
        workers = start_workers_in(
            placed,
            RolloutWorkerConfig(
                job=job.to_manifest(), engine_urls=["http://127.0.0.1:9"], workers=2
            ),
        )
        where = ray.get([w.where.remote() for w in workers])
        rollout_id = placed.rollout.id.hex()
    finally:
        placed.remove()
    assert [w["bundle_index"] for w in where] == [0, 1]
    assert {w["placement_group_id"] for w in where} == {rollout_id}
    assert _states()[rollout_id] == "REMOVED"


@pytest.mark.timeout(120)
def test_a_plan_larger_than_the_node_fails_in_time_naming_the_field_and_the_fix(
    local_ray: None,
) -> None:
    # 4 CPU-only ranks and the driver: 5 CPUs on a Ray of 4
    plan = placement.plan_placement(_cpu_ranks(4))
    before = set(_states())
    started = time.monotonic()
    with pytest.raises(placement.PlacementError) as caught:
        placement.place(plan, timeout_s=3, rollout=False)
    elapsed = time.monotonic() - started
    message = str(caught.value)
    assert "quickstart-trainer was not ready within 3s" in message
    assert "needs 5 CPU" in message and f"{CPUS:g} CPU" in message
    assert "spec.trainer.nodes (4)" in message
    assert "Fix:" in message and "--num-cpus" in message
    assert elapsed < 3 + 10  # the timeout, plus removing the group
    assert all(_states()[pg] == "REMOVED" for pg in set(_states()) - before)


@pytest.mark.timeout(300)
def test_rank_zeros_actor_steps_the_torch_backend_as_the_driver_would_in_process(
    local_ray: None, tmp_path: Path
) -> None:
    import torch

    from agentrl.reconcile import configmap
    from agentrl.reconcile.context import BuildContext
    from agentrl.reconcile.policies.suspend import workload_scale
    from agentrl.tiny import policy as tiny
    from agentrl.trainer.batching import TrainSample
    from agentrl.trainer.config import TrainerConfig, TrainerEnv
    from agentrl.trainer.factories import build_backend
    from agentrl.trainer.ranks import RemoteBackend
    from tests.trainer.factories import make_trajectory

    # a small random policy on disk (the built-in one trains its prior first: slow)
    tiny.save_policy(tiny.new_policy(0, dim=16), tmp_path / "policy")
    job = _quickstart({"model": {"source": {"path": str(tmp_path / "policy")}}})
    config = TrainerConfig(
        job=job,
        runtime=configmap.runtime_config(job, BuildContext.for_job(job), workload_scale(job)),
        env=TrainerEnv(checkpoint_dir=tmp_path),
    )
    samples = [
        TrainSample(
            trajectory=make_trajectory(
                "a#0",
                float(n % 2),
                n=n,
                tokens=([2, 8, 10, 3], [0.0, 0.0, -1.0, -1.0], [0, 0, 1, 1]),
            ),
            advantage=1.0 if n % 2 else -1.0,
            carries_loss=True,
        )
        for n in range(2)
    ]
    here = build_backend(copy.deepcopy(config))
    expected = here.train_step(samples)

    placed = placement.place(placement.plan_placement(job), timeout_s=60, rollout=False)
    try:
        (rank0,) = placement.start_trainer_ranks(placed, TrainerRank)
        address, port = ray.get(rank0.rendezvous.remote())
        ray.get(rank0.setup.remote(config.model_dump(mode="json", by_alias=True), address, port))
        remote = RemoteBackend(rank0)
        got = remote.train_step(samples)
        remote.save_state(tmp_path / "ckpt")
        ray.get(rank0.close.remote())
    finally:
        placed.remove()

    assert got.loss == pytest.approx(expected.loss)
    assert got.grad_norm == pytest.approx(expected.grad_norm)
    assert got.loss_stats == expected.loss_stats
    # the rank's weights after the step are the in-process backend's
    fresh = build_backend(copy.deepcopy(config))
    fresh.load_state(tmp_path / "ckpt")
    for a, b in zip(here.model.parameters(), fresh.model.parameters(), strict=True):
        assert torch.allclose(a, b)


@pytest.mark.timeout(600)
def test_the_trainer_trains_under_ray_with_the_weight_sync_in_rank_zero(
    local_ray: None, tmp_path: Path
) -> None:
    """``agentrl trainer``'s Ray path on one machine: rank 0, the driver and a rollout worker
    as actors in their bundles, two steps of two mini-batches against a real tiny engine, the
    episodes run by the rollout worker, weights pushed from rank 0 to the engine, checkpoints
    written."""
    import json
    import urllib.request

    from agentrl.reconcile import configmap
    from agentrl.reconcile.context import BuildContext
    from agentrl.reconcile.policies.suspend import workload_scale
    from agentrl.trainer.config import TrainerConfig, TrainerEnv
    from agentrl.trainer.loop import StepRecord
    from agentrl.trainer.pod import run_placed

    policy = tmp_path / "policy"
    with tiny_engine(policy) as url:
        job = _quickstart(
            {
                "model": {"source": {"path": str(policy)}},
                "trainer": {
                    "maxSteps": 2,
                    "trajectoriesPerStep": 8,
                    "algorithm": {"miniBatches": 2},
                    "checkpoint": {"intervalSteps": 1},
                },
            }
        )
        runtime = configmap.runtime_config(job, BuildContext.for_job(job), workload_scale(job))
        engines = runtime.engines.model_copy(update={"urls": [url]})
        runtime = runtime.model_copy(update={"engines": engines})
        config = TrainerConfig(
            job=job, runtime=runtime, env=TrainerEnv(checkpoint_dir=tmp_path / "ckpt")
        )
        placed = placement.place(placement.plan_placement(job), timeout_s=60, rollout=True)
        try:
            built = run_placed(config, placed)
        finally:
            placed.remove()
        with urllib.request.urlopen(f"{url}/get_model_info", timeout=30) as response:
            served = json.loads(response.read())

    assert built.weight_sync == "RemoteWeightSync"
    steps = (tmp_path / "ckpt" / "trainer" / "steps.jsonl").read_text().splitlines()
    records = [StepRecord.model_validate_json(line) for line in steps]
    # the quickstart's one rollout worker ran the episodes, in its own process
    [worker] = built.rollout_workers
    assert worker["worker_index"] == 0 and worker["pid"] not in (0, os.getpid())
    assert worker["episodes"] >= sum(r.trajectories for r in records) == 16
    assert [r.step for r in records] == [1, 2]
    assert [r.weight_version for r in records] == [1, 2]
    assert str(served["weight_version"]) == "2"
    assert (tmp_path / "ckpt" / "v2").is_dir()
    assert (tmp_path / "ckpt" / "trainer" / "step-00000002").is_dir()
    # the held-out evaluation at the start ran through the same rollout worker, beside the
    # steps: the quickstart's 27 held-out tasks × 4 attempts, none lost to the infrastructure
    [evaluation] = [
        json.loads(line)
        for line in (tmp_path / "ckpt" / "trainer" / "evaluations.jsonl").read_text().split()
    ]
    assert evaluation["step"] == 0
    assert (evaluation["episodes"], evaluation["infra_errors"]) == (108, 0)
    assert worker["episodes"] >= 16 + 108
