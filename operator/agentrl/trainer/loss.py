"""The GRPO policy loss in torch: clipped surrogate with separate low/high clip, train/inference
mismatch correction (TIS or ICEPOP), optional low-variance KL to the reference policy, and the
aggregation of per-token losses into one number.

Called by the trainer backends (:mod:`agentrl.trainer.torch_backend`, the megatron backend) on a
flat batch: every generated token of every trajectory in the step, with the index of the
trajectory it belongs to. Three logprobs per token:

* ``logp`` — the current policy, with gradient;
* ``logp_old`` — the trainer's recomputation with the weights at the start of the step (the
  PPO "old" policy; no gradient);
* ``logp_engine`` — what the engine reported while sampling (the behaviour policy).

The PPO ratio is ``exp(logp − logp_old)``; the mismatch weight is ``exp(logp_old − logp_engine)``
(stale weights, kernels that differ between engine and trainer). TIS multiplies each token's
loss by that weight clamped into ``[low, high]``; ICEPOP drops tokens whose weight falls outside.

With ``algorithm.miniBatches`` / ``epochs`` above 1 a step makes several optimizer updates
against the same ``logp_old``: the first update's ratio is exactly 1, later ones are off-policy
and may be clipped. :func:`combine_updates` turns the updates' statistics into the step's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agentrl.api.trainer import Algorithm, CorrectionMode, LossAggregation, OffPolicyCorrection
from agentrl.trainer.stats import LossStats, MismatchStats


def mismatch_weights(logp_old: torch.Tensor, logp_engine: torch.Tensor) -> torch.Tensor:
    """The train/inference importance weight ``exp(logp_old − logp_engine)`` per token, without
    gradient."""
    return torch.exp(logp_old - logp_engine).detach()


def outside_bounds(weights: torch.Tensor, correction: OffPolicyCorrection) -> torch.Tensor:
    """True for tokens whose weight lies outside ``[low, high]``: those TIS clamps and ICEPOP
    drops. The one place the bounds are compared: the loss, its statistics and the megatron
    backend's micro-batch weights all count ICEPOP's tokens with it."""
    return (weights < correction.low) | (weights > correction.high)


def icepop_keep(weights: torch.Tensor, correction: OffPolicyCorrection) -> torch.Tensor:
    """ICEPOP's mask in the weights' dtype: 1 for tokens whose weight lies in ``[low, high]``,
    0 for the others (they get no gradient and leave the aggregation)."""
    return 1.0 - outside_bounds(weights, correction).to(weights.dtype)


def tis_weights(weights: torch.Tensor, correction: OffPolicyCorrection) -> torch.Tensor:
    """TIS: each weight clamped into ``[low, high]`` (the factor on its token's loss)."""
    return torch.clamp(weights, correction.low, correction.high)


def effective_sample_size(weights: torch.Tensor, mask: torch.Tensor) -> float:
    """Normalised effective sample size ``(Σw)² / (N·Σw²)`` of the weights of the ``N`` tokens
    of ``mask``, in (0, 1]: 1 when every weight is equal, 1/N when one dominates."""
    n = float(mask.sum().clamp_min(1.0))
    w_masked = weights * mask
    ess = float(w_masked.sum() ** 2 / (n * (w_masked**2).sum().clamp_min(1e-30)))
    return min(ess, 1.0)


def mismatch_statistics(
    *,
    logp_old: torch.Tensor,
    logp_engine: torch.Tensor,
    mask: torch.Tensor,
    correction: OffPolicyCorrection,
) -> MismatchStats:
    """Mean |logp_old − logp_engine|, the normalised ESS of the importance weights and the share
    of tokens TIS clamps or ICEPOP drops, over the tokens of ``mask``."""
    mask = mask.to(logp_old.dtype)
    n = float(mask.sum().clamp_min(1.0))
    weights = mismatch_weights(logp_old, logp_engine)
    outside = outside_bounds(weights, correction).to(logp_old.dtype)
    return MismatchStats(
        mismatch_abs_mean=float(((logp_old - logp_engine).abs() * mask).sum()) / n,
        ess=effective_sample_size(weights, mask),
        correction_fraction=float((outside * mask).sum()) / n
        if correction.mode != CorrectionMode.NONE
        else 0.0,
        tokens=int(mask.sum()),
    )


def combine_updates(updates: Sequence[LossStats], mismatch: MismatchStats) -> LossStats:
    """A step's statistics from its updates' (one per mini-batch and epoch): clip fraction and
    KL weighted by each update's loss tokens, the ratio's extremes over all updates, and the
    mismatch of the whole step (its tokens counted once, not once per epoch)."""
    tokens = sum(u.tokens for u in updates)
    return LossStats(
        clip_fraction=sum(u.clip_fraction * u.tokens for u in updates) / max(tokens, 1),
        mismatch_abs_mean=mismatch.mismatch_abs_mean,
        ess=mismatch.ess,
        correction_fraction=mismatch.correction_fraction,
        kl=sum(u.kl * u.tokens for u in updates) / max(tokens, 1),
        tokens=mismatch.tokens,
        ratio_min=min((u.ratio_min for u in updates), default=1.0),
        ratio_max=max((u.ratio_max for u in updates), default=1.0),
    )


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    seq_index: torch.Tensor,
    num_seqs: int,
    mode: LossAggregation,
) -> torch.Tensor:
    """Per-token losses → one loss.

    * ``token-mean``: every loss token counts equally (long trajectories weigh more);
    * ``seq-mean-token-mean``: mean within a trajectory, then over trajectories;
    * ``seq-mean-token-sum``: sum within a trajectory, then mean over trajectories.

    Trajectories without loss tokens are left out of the sequence means.
    """
    masked = per_token * mask
    if mode == LossAggregation.TOKEN_MEAN:
        return masked.sum() / mask.sum().clamp_min(1.0)
    zeros = torch.zeros(num_seqs, dtype=per_token.dtype, device=per_token.device)
    seq_sum = zeros.index_add(0, seq_index, masked)
    seq_count = zeros.index_add(0, seq_index, mask)
    present = seq_count > 0
    if not bool(present.any()):
        return masked.sum() * 0.0
    if mode == LossAggregation.SEQ_MEAN_TOKEN_MEAN:
        per_seq = seq_sum[present] / seq_count[present]
    else:
        per_seq = seq_sum[present]
    return per_seq.mean()


def low_variance_kl(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """The k3 estimator of KL(π‖π_ref) per token: ``exp(r) − r − 1`` with ``r = ref − logp``;
    non-negative and unbiased."""
    r = logp_ref - logp
    return torch.exp(r) - r - 1.0


def grpo_loss(
    *,
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    logp_engine: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    seq_index: torch.Tensor,
    num_seqs: int,
    algorithm: Algorithm,
    logp_ref: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """The step's loss and its statistics. All tensors are flat, one entry per token."""
    mask = loss_mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - logp_old)
    low, high = 1.0 - algorithm.clip_low, 1.0 + algorithm.clip_high
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, low, high) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    was_clipped = (clipped < unclipped).to(logp.dtype)

    correction = algorithm.off_policy_correction
    weights = mismatch_weights(logp_old, logp_engine)
    if correction.mode == CorrectionMode.TIS:
        per_token = per_token * tis_weights(weights, correction)
    elif correction.mode == CorrectionMode.ICEPOP:
        mask = mask * icepop_keep(weights, correction).to(logp.dtype)

    kl_value = torch.zeros(())
    if logp_ref is not None and algorithm.kl_coef > 0.0:
        kl = low_variance_kl(logp, logp_ref.detach())
        per_token = per_token + algorithm.kl_coef * kl
        kl_value = (kl * mask).sum() / mask.sum().clamp_min(1.0)

    loss = aggregate(per_token, mask, seq_index, num_seqs, algorithm.loss_aggregation)

    # Statistics over the tokens that were meant to carry loss (before ICEPOP removed any).
    n = float(loss_mask.sum().clamp_min(1.0))
    mismatch = mismatch_statistics(
        logp_old=logp_old, logp_engine=logp_engine, mask=loss_mask, correction=correction
    )
    ratios = ratio.detach()[loss_mask > 0]
    stats = LossStats(
        clip_fraction=float((was_clipped * loss_mask).sum()) / n,
        mismatch_abs_mean=mismatch.mismatch_abs_mean,
        ess=mismatch.ess,
        correction_fraction=mismatch.correction_fraction,
        kl=float(kl_value.detach()),
        tokens=mismatch.tokens,
        ratio_min=float(ratios.min()) if ratios.numel() else 1.0,
        ratio_max=float(ratios.max()) if ratios.numel() else 1.0,
    )
    return loss, stats
