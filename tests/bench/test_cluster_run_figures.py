"""The pure figures of ``bench/cluster_run.py``, against values worked out by hand."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "cluster_run", Path(__file__).resolve().parents[2] / "bench" / "cluster_run.py"
)
assert spec is not None and spec.loader is not None
cluster_run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cluster_run)

# cumulative: 2 samples ≤ 0.5 s, 6 ≤ 1 s, 8 ≤ 2 s, 10 in all
BUCKETS = [(0.5, 2.0), (1.0, 6.0), (2.0, 8.0), (math.inf, 10.0)]


def test_quantiles_interpolate_within_the_bucket_like_prometheus() -> None:
    # rank 5 of 10 falls in (0.5, 1]: 0.5 + 0.5 * (5 - 2) / (6 - 2)
    assert cluster_run.histogram_quantile(0.5, BUCKETS) == 0.875
    # rank 1 in the lowest bucket, interpolated from 0: 0.5 * 1 / 2
    assert cluster_run.histogram_quantile(0.1, BUCKETS) == 0.25
    # rank 9.9 lies in +Inf: the highest finite bound
    assert cluster_run.histogram_quantile(0.99, BUCKETS) == 2.0
    assert cluster_run.histogram_quantile(0.5, [(1.0, 0.0), (math.inf, 0.0)]) is None


def test_buckets_are_summed_over_providers_and_workers() -> None:
    text = "\n".join(
        [
            "# TYPE agentrl_sandbox_startup_seconds histogram",
            'agentrl_sandbox_startup_seconds_bucket{le="1.0",provider="kubernetes",w="a"} 1.0',
            'agentrl_sandbox_startup_seconds_bucket{le="+Inf",provider="kubernetes",w="a"} 3.0',
            'agentrl_sandbox_startup_seconds_bucket{le="1.0",provider="kubernetes",w="b"} 2.0',
            'agentrl_sandbox_startup_seconds_bucket{le="+Inf",provider="kubernetes",w="b"} 2.0',
            'agentrl_sandbox_startup_seconds_count{provider="kubernetes",w="a"} 3.0',
        ]
    )
    assert cluster_run.startup_buckets(text) == [(1.0, 3.0), (math.inf, 5.0)]


def test_step_rates_run_from_step_one_to_the_last() -> None:
    records = [
        {"wall_seconds": 10.0, "trajectories": 16},
        {"wall_seconds": 40.0, "trajectories": 16},
        {"wall_seconds": 70.0, "trajectories": 16},
    ]
    # 2 steps and 32 trajectories in 60 s
    assert cluster_run.step_figures(records) == {
        "steps_per_minute": 2.0,
        "trajectories_per_hour": 1920.0,
    }
    assert cluster_run.step_figures(records[:1])["steps_per_minute"] is None
