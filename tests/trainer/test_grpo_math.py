"""GRPO arithmetic against values worked out by hand, through the functions training runs: the
advantages and zero-variance flags :mod:`agentrl.trainer.batching` builds each step from
(:mod:`agentrl.trainer.grpo`), and the per-token importance weights, TIS, ICEPOP and effective
sample size of :mod:`agentrl.trainer.loss` (the loss and its statistics use these)."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.api.trainer import CorrectionMode, OffPolicyCorrection
from agentrl.trainer import grpo, loss


def test_one_success_in_a_group_of_four_gets_advantage_one_and_a_half() -> None:
    # mean 0.25; centred [0.75, -0.25, -0.25, -0.25]; sample std sqrt(0.75 / 3) = 0.5
    got = grpo.group_advantages([1.0, 0.0, 0.0, 0.0], 4)
    assert got == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-5)


def test_without_std_normalisation_advantages_are_centred_rewards() -> None:
    got = grpo.group_advantages([1.0, 0.0, 0.0, 0.0], 4, std_normalize=False)
    assert got == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_groups_are_taken_in_order() -> None:
    # group 1: [1, 0] -> mean 0.5, std sqrt(0.5) -> ±0.5/0.7071 = ±0.7071
    # group 2: [0, 0] -> all equal -> zeros, not NaN
    got = grpo.group_advantages([1.0, 0.0, 0.0, 0.0], 2)
    assert got == pytest.approx([0.70711, -0.70711, 0.0, 0.0], abs=1e-4)


def test_equal_rewards_are_flagged_as_zero_variance_groups() -> None:
    groups = [[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]]
    assert [grpo.zero_variance(g) for g in groups] == [True, False, True]


def test_rewards_that_do_not_split_into_groups_are_refused() -> None:
    with pytest.raises(ValueError, match="groups of 4"):
        grpo.group_advantages([1.0, 0.0, 1.0], 4)


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        ([1.0, 1.0, 1.0, 1.0], 1.0),  # all equal: every sample counts
        ([1.0, 0.0, 0.0, 0.0], 0.25),  # one sample dominates: 1/N
        ([2.0, 1.0], 0.9),  # (2+1)^2 / (2 * (4+1)) = 9/10
    ],
)
def test_effective_sample_size_is_sum_squared_over_n_times_sum_of_squares(
    weights: list[float], expected: float
) -> None:
    w = torch.tensor(weights, dtype=torch.float64)
    assert loss.effective_sample_size(w, torch.ones_like(w)) == pytest.approx(expected)
    # ... and that is the ESS the step reports: weights exp(logp_old − logp_engine) = w.
    stats = loss.mismatch_statistics(
        logp_old=torch.log(w),
        logp_engine=torch.zeros_like(w),
        mask=torch.ones_like(w),
        correction=OffPolicyCorrection(mode=CorrectionMode.NONE),
    )
    assert stats.ess == pytest.approx(expected)


def test_importance_weights_are_exponentiated_logprob_differences() -> None:
    got = loss.mismatch_weights(
        torch.tensor([math.log(2.0), 0.0], dtype=torch.float64),
        torch.tensor([0.0, math.log(4.0)], dtype=torch.float64),
    )
    assert got.tolist() == pytest.approx([2.0, 0.25])


def test_tis_clamps_and_icepop_masks_weights_outside_the_bounds() -> None:
    weights = torch.tensor([0.1, 1.0, 5.0], dtype=torch.float64)
    bounds = OffPolicyCorrection(low=0.5, high=2.0)
    assert loss.tis_weights(weights, bounds).tolist() == [0.5, 1.0, 2.0]
    assert loss.icepop_keep(weights, bounds).tolist() == [0.0, 1.0, 0.0]
    assert loss.outside_bounds(weights, bounds).tolist() == [True, False, True]
