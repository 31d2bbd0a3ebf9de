"""Episodes spread over Ray actors: each worker actor runs its own tasks' episodes, in its own
process, with its share of the concurrency, against the real tiny engine over HTTP and local
sandboxes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.api.rollout import TerminalClass
from agentrl.rollout.ray_workers import RolloutWorkerConfig, init_ray, run_on_actors, split_tasks
from agentrl.rollout.tasks import generate_toy_tasks


def test_tasks_are_dealt_whole_and_round_robin() -> None:
    tasks = generate_toy_tasks()[:5]
    shares = split_tasks(tasks, 2)
    assert [[t.id for t in share] for share in shares] == [
        [tasks[0].id, tasks[2].id, tasks[4].id],
        [tasks[1].id, tasks[3].id],
    ]


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    ray = pytest.importorskip("ray", reason="the ray extra")
    init_ray(num_cpus=2)
    yield
    ray.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(600)  # starting Ray takes a minute on a busy 2-core host
async def test_two_worker_actors_each_run_their_own_episodes_in_their_own_process(
    ray_cluster: None, tmp_path: Path
) -> None:
    pytest.importorskip("torch", reason="the tiny engine needs the training extra")
    from aiohttp.test_utils import TestServer

    from agentrl.engine import tiny
    from agentrl.engine.tiny_server import TinyEngine, build_app

    model = tiny.initial_policy(0)
    server = TestServer(
        build_app(TinyEngine(model, model_path="tiny", context_length=4096)), host="127.0.0.1"
    )
    await server.start_server()
    job = {
        "apiVersion": "agentrl.dev/v1alpha1",
        "kind": "AgentRLJob",
        "metadata": {"name": "toy"},
        "spec": {
            "model": {"source": {"path": "tiny"}},
            "inference": {"contextLength": 4096},
            "rollout": {
                "groupSize": 2,
                "maxTurns": 2,
                "maxTrajectoryTokens": 4096,
                "maxTokensPerTurn": 8,
                "workers": 2,
            },
            "sandbox": {"provider": "local", "concurrency": 4},
        },
    }
    tasks = generate_toy_tasks()[:2]
    try:
        results = await run_on_actors(
            RolloutWorkerConfig(
                job=job,
                engine_urls=[str(server.make_url("/")).rstrip("/")],
                workers=2,
                sandbox_dir=str(tmp_path),
            ),
            tasks,
        )
    finally:
        await server.close()

    assert [r.worker_index for r in results] == [0, 1]
    # two processes, neither of them this one
    pids = {r.pid for r in results}
    assert len(pids) == 2 and os.getpid() not in pids
    for result, task in zip(results, tasks, strict=True):
        # worker i got task i, whole: its group of 2 episodes
        assert [t.task_id for t in result.trajectories] == [task.id, task.id]
        assert len({t.group_id for t in result.trajectories}) == 1
        # concurrency 4 over 2 workers: 2 each, and both of a group's episodes ran at once
        assert result.concurrency == 2
        assert result.peak_in_flight == 2
        for t in result.trajectories:
            assert t.terminal_class in (TerminalClass.COMPLETED, TerminalClass.TRUNCATED)
            assert t.reward in (0.0, 1.0)
            assert 1 <= len(t.turns) <= 2
