"""The long-tail figure: share of a batch's wall time after 90% of its episodes finished."""

from __future__ import annotations

from agentrl.rollout.metrics import long_tail_share


def test_the_share_after_the_ninetieth_percentile_finish() -> None:
    # 10 episodes started at t=0; nine finish by t=10, the last at t=40.
    # 90% point = 9th finish = 10 → (40 - 10) / (40 - 0) = 0.75.
    finishes = [1, 2, 3, 4, 5, 6, 7, 8, 10, 40]
    assert long_tail_share(0.0, finishes) == 0.75


def test_a_batch_that_finishes_together_has_no_tail() -> None:
    assert long_tail_share(0.0, [5.0] * 20) == 0.0


def test_an_empty_batch_has_no_tail() -> None:
    assert long_tail_share(3.0, []) == 0.0
