"""The trainer driver's per-step Prometheus series (:mod:`agentrl.trainer.step_metrics`) hold the
last step's figures, checked against values worked out here from what the backend was given and
what it returned, and the counters add up every step's trajectories and tokens."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from prometheus_client import REGISTRY

from agentrl.rollout.tasks.model import Task
from agentrl.rollout.trajectory import Trajectory
from agentrl.trainer import step_metrics
from agentrl.trainer.batching import TrainSample
from agentrl.trainer.loop import StepRecord, StepTimes
from agentrl.trainer.stats import StepStats
from tests.trainer.factories import FakeBackend, make_trajectory, step_stats, toy_driver


def _value(name: str) -> float:
    value = REGISTRY.get_sample_value(name)
    assert value is not None, name
    return value


class _Backend(FakeBackend):
    """Returns different, exactly representable figures at every step; keeps what it saw."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[list[Trajectory]] = []

    def observe(self, samples: Sequence[TrainSample]) -> None:
        self.seen.append([s.trajectory for s in samples])

    def stats(self, k: int) -> StepStats:
        return step_stats(
            loss=0.25 * k,
            grad_norm=1.5 * k,
            clip_fraction=0.125 / k,
            mismatch_abs_mean=0.0625 * k,
            ess=1.0 - 0.125 * k,
            correction_fraction=0.03125 * k,
            recompute_seconds=0.5,
            update_seconds=2.0,
        )


class _Runner:
    """Groups of 2; the n-th episode has reward 1 when n % 3 == 0 and n + 2 tokens (some
    groups are all 0, some mixed), so the figures differ from step to step."""

    def __init__(self) -> None:
        self.started = 0

    async def run(self, task: Task, *, group_id: str, policy_version: int) -> Trajectory:
        n = self.started
        self.started += 1
        await asyncio.sleep(0)
        size = n + 2
        tokens = (list(range(size)), [0.0] * size, [0] + [1] * (size - 1))
        return make_trajectory(
            group_id, float(n % 3 == 0), version=policy_version, tokens=tokens, n=n
        )


async def test_the_trainer_series_hold_the_last_steps_figures(tmp_path: Path) -> None:
    backend = _Backend()
    records: list[StepRecord] = []
    driver, scheduler = toy_driver(
        tmp_path, _Runner(), backend, per_step=4, max_steps=3, on_step=records.append
    )
    trajectories_before = _value("agentrl_trainer_trajectories_total")
    tokens_before = _value("agentrl_trainer_tokens_total")
    try:
        await asyncio.wait_for(driver.run(), timeout=10)
    finally:
        await scheduler.cancel()

    assert [r.step for r in records] == [1, 2, 3]
    last = backend.seen[-1]
    k = len(backend.seen)
    rewards = [t.reward for t in last]
    assert rewards and all(r is not None for r in rewards)
    staleness = [(k - 1) - t.policy_version for t in last]
    expected = {
        "agentrl_trainer_reward_mean": sum(r or 0.0 for r in rewards) / len(rewards),
        "agentrl_trainer_pass_rate": sum(r == 1.0 for r in rewards) / len(rewards),
        "agentrl_trainer_loss": 0.25 * k,
        "agentrl_trainer_grad_norm": 1.5 * k,
        "agentrl_trainer_clip_fraction": 0.125 / k,
        "agentrl_trainer_mismatch_abs_mean": 0.0625 * k,
        "agentrl_trainer_ess": 1.0 - 0.125 * k,
        "agentrl_trainer_correction_fraction": 0.03125 * k,
        "agentrl_trainer_staleness_mean": sum(staleness) / len(staleness),
        "agentrl_trainer_staleness_max": max(staleness),
        "agentrl_trainer_step": 3,
    }
    assert {name: _value(name) for name in expected} == expected
    # the share the driver worked out (dropped groups are the batching tests' subject)
    assert _value("agentrl_trainer_zero_variance_share") == records[-1].zero_variance_share
    assert _value("agentrl_trainer_episodes_in_flight") == records[-1].in_flight
    # counters: every step, not only the last
    trained = [t for step in backend.seen for t in step]
    assert _value("agentrl_trainer_trajectories_total") - trajectories_before == len(trained)
    assert _value("agentrl_trainer_tokens_total") - tokens_before == sum(
        len(t.token_ids) for t in trained
    )


def test_observe_sets_every_gauge_from_the_record() -> None:
    record = StepRecord(
        step=7, wall_seconds=1.0, trajectories=5, tokens=40, reward_mean=0.375, pass_rate=0.25,
        classes={}, infra_errors=0, loss=-0.5, grad_norm=3.0, clip_fraction=0.0625,
        mismatch_abs_mean=0.015625, ess=0.875, correction_fraction=0.125,
        zero_variance_share=0.5, staleness_mean=0.75, staleness_max=2, in_flight=9,
        weight_version=7,
        times=StepTimes(
            actor_update=1.0, waiting_for_rollout=2.0, logprob_recompute=0.5, weight_sync=0.25
        ),
    )  # fmt: skip
    before = _value("agentrl_trainer_trajectories_total")
    step_metrics.observe(record)
    assert {
        name: _value(f"agentrl_trainer_{name}")
        for name in ("reward_mean", "pass_rate", "loss", "grad_norm", "clip_fraction",
                     "mismatch_abs_mean", "ess", "correction_fraction", "zero_variance_share",
                     "staleness_mean")
    } == {
        "reward_mean": 0.375, "pass_rate": 0.25, "loss": -0.5, "grad_norm": 3.0,
        "clip_fraction": 0.0625, "mismatch_abs_mean": 0.015625, "ess": 0.875,
        "correction_fraction": 0.125, "zero_variance_share": 0.5, "staleness_mean": 0.75,
    }  # fmt: skip
    assert _value("agentrl_trainer_episodes_in_flight") == 9
    assert _value("agentrl_trainer_trajectories_total") - before == 5
