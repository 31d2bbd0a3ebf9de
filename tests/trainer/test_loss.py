"""The torch loss: clipping, correction, KL and aggregation against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.api.trainer import Algorithm, CorrectionMode, LossAggregation, OffPolicyCorrection
from agentrl.trainer.loss import aggregate, grpo_loss, low_variance_kl


def _t(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (LossAggregation.TOKEN_MEAN, 3.0),  # (1+2+3+4+5) / 5
        (LossAggregation.SEQ_MEAN_TOKEN_MEAN, 2.75),  # mean(1.5, 4.0)
        (LossAggregation.SEQ_MEAN_TOKEN_SUM, 7.5),  # mean(3, 12)
    ],
)
def test_aggregation_modes_weigh_tokens_and_sequences_as_named(
    mode: LossAggregation, expected: float
) -> None:
    per_token = _t([1, 2, 3, 4, 5])
    seq_index = torch.tensor([0, 0, 1, 1, 1])
    got = aggregate(per_token, _t([1, 1, 1, 1, 1]), seq_index, 2, mode)
    assert float(got) == pytest.approx(expected)


def _loss(
    logp: list[float],
    old: list[float],
    engine: list[float],
    adv: list[float],
    algorithm: Algorithm,
    ref: list[float] | None = None,
):  # type: ignore[no-untyped-def]
    n = len(logp)
    return grpo_loss(
        logp=_t(logp).requires_grad_(),
        logp_old=_t(old),
        logp_engine=_t(engine),
        advantages=_t(adv),
        mask=_t([1.0] * n),
        seq_index=torch.zeros(n, dtype=torch.long),
        num_seqs=1,
        algorithm=algorithm,
        logp_ref=None if ref is None else _t(ref),
    )


NO_CORRECTION = Algorithm(off_policy_correction=OffPolicyCorrection(mode=CorrectionMode.NONE))


def test_positive_advantage_ratio_above_one_plus_clip_high_is_clipped() -> None:
    # ratio 1.5 > 1 + 0.28: loss = -min(1.5 * 1, 1.28 * 1) = -1.28
    loss, stats = _loss([math.log(1.5)], [0.0], [0.0], [1.0], NO_CORRECTION)
    assert float(loss.detach()) == pytest.approx(-1.28)
    assert stats.clip_fraction == 1.0


def test_negative_advantage_is_not_clipped_above() -> None:
    # ratio 1.5, A = -1: -min(-1.5, -1.28) = 1.5, the pessimistic (unclipped) term
    loss, stats = _loss([math.log(1.5)], [0.0], [0.0], [-1.0], NO_CORRECTION)
    assert float(loss.detach()) == pytest.approx(1.5)
    assert stats.clip_fraction == 0.0


def test_negative_advantage_ratio_below_one_minus_clip_low_is_clipped() -> None:
    # ratio 0.5 < 0.8, A = -1: -min(-0.5, -0.8) = 0.8
    loss, stats = _loss([math.log(0.5)], [0.0], [0.0], [-1.0], NO_CORRECTION)
    assert float(loss.detach()) == pytest.approx(0.8)
    assert stats.clip_fraction == 1.0


def test_gradient_of_on_policy_token_mean_loss_is_minus_advantage_over_tokens() -> None:
    logp = _t([-1.0, -2.0]).requires_grad_()
    loss, _ = grpo_loss(
        logp=logp,
        logp_old=_t([-1.0, -2.0]),
        logp_engine=_t([-1.0, -2.0]),
        advantages=_t([2.0, -1.0]),
        mask=_t([1.0, 1.0]),
        seq_index=torch.tensor([0, 0]),
        num_seqs=1,
        algorithm=NO_CORRECTION,
    )
    loss.backward()
    # d/dlogp of -(ratio * A)/2 at ratio 1 is -A/2
    assert logp.grad is not None
    assert logp.grad.tolist() == pytest.approx([-1.0, 0.5])


def test_tis_multiplies_the_loss_by_the_clamped_mismatch_weight() -> None:
    # weight exp(log 3 - 0) = 3, clamped to 2.0; on-policy ratio 1, A = 1: loss = -1 * 2
    algo = Algorithm(off_policy_correction=OffPolicyCorrection(mode=CorrectionMode.TIS))
    loss, stats = _loss([math.log(3.0)], [math.log(3.0)], [0.0], [1.0], algo)
    assert float(loss.detach()) == pytest.approx(-2.0)
    assert stats.correction_fraction == 1.0
    assert stats.mismatch_abs_mean == pytest.approx(math.log(3.0))


def test_icepop_removes_tokens_whose_weight_falls_outside_the_bounds() -> None:
    # token 1: weight 3 (outside [0.5, 2]) -> dropped; token 2: weight 1 -> loss -A = -1
    algo = Algorithm(off_policy_correction=OffPolicyCorrection(mode=CorrectionMode.ICEPOP))
    loss, stats = _loss([math.log(3.0), 0.0], [math.log(3.0), 0.0], [0.0, 0.0], [5.0, 1.0], algo)
    assert float(loss.detach()) == pytest.approx(-1.0)
    assert stats.correction_fraction == 0.5
    # ESS of weights [3, 1]: 16 / (2 * 10) = 0.8
    assert stats.ess == pytest.approx(0.8)


def test_low_variance_kl_is_zero_at_the_reference_and_k3_elsewhere() -> None:
    assert float(low_variance_kl(_t([-1.0]), _t([-1.0]))[0]) == 0.0
    # r = ref - logp = log 2: e^r - r - 1 = 2 - 0.693147 - 1
    got = float(low_variance_kl(_t([0.0]), _t([math.log(2.0)]))[0])
    assert got == pytest.approx(1.0 - math.log(2.0))


def test_kl_term_is_added_with_its_coefficient() -> None:
    algo = Algorithm(
        kl_coef=0.5, off_policy_correction=OffPolicyCorrection(mode=CorrectionMode.NONE)
    )
    # A = 0 so only the KL acts: 0.5 * (1 - ln 2)
    loss, stats = _loss([0.0], [0.0], [0.0], [0.0], algo, ref=[math.log(2.0)])
    assert float(loss.detach()) == pytest.approx(0.5 * (1.0 - math.log(2.0)))
    assert stats.kl == pytest.approx(1.0 - math.log(2.0))
