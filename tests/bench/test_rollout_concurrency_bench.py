"""``bench/rollout_concurrency.py`` runs the same episodes through both rollout paths: the
trainer's driver admitting the whole concurrency over Ray worker actors that hold slots (the
default: what the cluster runs), and worker processes each scheduling a share (the comparison).
Run as a user runs it (a subprocess printing one JSON object), at a size where nothing is timed:
every episode must end, each with its LLM calls, on the processes asked for, and the live
sandboxes the fake service counted never exceed the in-effect concurrency. The figures
themselves are the bench's business, not asserted here."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentrl.engine_client.client import CONTROL_CONNECTIONS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # Ray starts slowly on 2 busy cores

BENCH = Path(__file__).resolve().parents[2] / "bench" / "rollout_concurrency.py"
N, TURNS, ROUNDS, WORKERS, ENGINES = 16, 2, 2, 2, 2
REQUIRED = (
    "configured",
    "achieved_ratio",
    "ideal_throughput_ratio",
    "overhead_p50_ms",
    "overhead_p99_ms",
    "max_live_sandboxes",
    "driver_cpu_seconds_per_1k_episodes",
    "worker_cpu_seconds_per_1k_episodes",
)


def _bench(
    path: str | None, *extra: str, rounds: int = ROUNDS, llm: float = 0.05
) -> dict[str, Any]:
    argv = [
        sys.executable,
        str(BENCH),
        *(["--path", path] if path is not None else []),
        "--concurrency",
        str(N),
        "--turns",
        str(TURNS),
        "--rounds",
        str(rounds),
        "--workers",
        str(WORKERS),
        "--engines",
        str(ENGINES),
        "--llm-latency",
        str(llm),
        "--tool-latency",
        str(llm / 2),
        "--json",
        *extra,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def _every_episode_ran(report: dict[str, Any], rounds: int = ROUNDS) -> None:
    episodes = N * rounds
    assert all(key in report for key in REQUIRED)
    assert report["configured"] == N
    assert report["episodes_completed"] == episodes
    assert report["terminal_classes"] == {"completed": episodes}
    # every episode: TURNS LLM calls, each timed once by the client
    assert report["llm_calls"] == episodes * TURNS
    # one sandbox per episode, each closed, as the fake service counted them
    assert report["sandboxes_created_closed"] == [episodes, episodes]


def test_processes_path_runs_every_episode_and_a_baseline() -> None:
    report = _bench("processes")
    assert report["path"] == "processes"
    _every_episode_ran(report)
    assert report["pools"]["episodes_in_flight"] == [N // WORKERS] * WORKERS
    assert 1 <= report["max_live_sandboxes"] <= N
    # the baseline: one process at library defaults, over the ideal wall time
    assert "baseline_achieved_ratio" in report


def test_ray_path_is_the_default_and_runs_every_episode_in_the_actors_under_one_driver(
    tmp_path: Path,
) -> None:
    pytest.importorskip("ray", reason="the ray extra")
    profile = tmp_path / "driver.prof"
    report = _bench(None, "--skip-baseline", "--ray-cpus", "2", "--profile-driver", str(profile))
    assert report["path"] == "ray"
    _every_episode_ran(report)
    # the slots the driver granted: never more sandboxes than the concurrency, none stopped
    assert 1 <= report["max_live_sandboxes"] <= N
    assert report["episodes_killed"] == 0
    # the actors imported the bench's parts: their samples came back, and they ran everything
    assert sum(report["episodes_per_worker"]) == N * ROUNDS
    assert all(n > 0 for n in report["episodes_per_worker"])
    pools = report["pools"]
    assert len(pools["episodes_in_flight"]) == WORKERS
    assert all(1 <= n <= N for n in pools["episodes_in_flight"])
    # an actor's pool per engine: 2 × maxRunningRequests (the bench: N over the engines) + control
    max_running = math.ceil(N / ENGINES)
    assert (
        pools["engine_connections_per_engine"] == [2 * max_running + CONTROL_CONNECTIONS] * WORKERS
    )
    assert set(report["cpu_seconds"]) >= {"driver", "workers", "ray_system"}
    assert report["ray_startup_seconds"]["init_seconds"] > 0
    assert report["ray_startup_seconds"]["workers_open_seconds"] > 0
    assert profile.stat().st_size > 0


def test_scale_at_changes_the_concurrency_mid_run_without_stopping_an_episode() -> None:
    pytest.importorskip("ray", reason="the ray extra")
    # episodes of 2 × (0.2 + 0.1) s: down to 4 after one, back up to 24 a little later
    report = _bench(
        None, "--skip-baseline", "--ray-cpus", "2", "--scale-at", "0.7:24", "--scale-at", "0.3:4",
        rounds=3, llm=0.2,
    )  # fmt: skip
    _every_episode_ran(report, rounds=3)
    assert report["scale_at"] == [[0.3, 4], [0.7, 24]]  # applied in time order
    assert report["in_effect_max"] == 24
    down, up = report["scale"]
    assert (down["to"], down["direction"]) == (4, "down")
    assert (up["to"], up["direction"]) == (24, "up")
    # never more live sandboxes than the largest figure in effect, and none was stopped
    assert report["max_live_sandboxes"] <= 24
    assert report["episodes_killed"] == 0
