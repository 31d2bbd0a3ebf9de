"""GRPO arithmetic against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from agentrl.trainer import grpo


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
    assert grpo.zero_variance_groups([1.0, 1.0, 0.0, 1.0, 0.0, 0.0], 2) == [True, False, True]


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
    assert grpo.effective_sample_size(weights) == pytest.approx(expected)


def test_importance_weights_are_exponentiated_logprob_differences() -> None:
    got = grpo.importance_weights([math.log(2.0), 0.0], [0.0, math.log(4.0)])
    assert got == pytest.approx([2.0, 0.25])


def test_tis_clamps_and_icepop_masks_weights_outside_the_bounds() -> None:
    weights = [0.1, 1.0, 5.0]
    assert grpo.truncated_weights(weights, 0.5, 2.0) == [0.5, 1.0, 2.0]
    assert grpo.icepop_mask(weights, 0.5, 2.0) == [False, True, False]
