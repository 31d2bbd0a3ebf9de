"""What a trainer backend reports for one step, as plain pydantic models (no torch).

:class:`StepStats` is the backend surface's return value: :mod:`agentrl.trainer.loop` turns it
into a ``StepRecord`` (and :mod:`agentrl.trainer.step_metrics` into Prometheus series), and
:mod:`agentrl.trainer.ranks` carries it across the Ray actor boundary as JSON. The loss
statistics inside it are computed by :mod:`agentrl.trainer.loss`, which needs torch; the types
live here so that the driver and everything that reads a step's figures import without it
(an import-linter contract in ``pyproject.toml`` keeps it so).
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class LossStats(BaseModel):
    """What one loss evaluation reports (logged per step)."""

    clip_fraction: float
    """Share of loss tokens whose clipped term won the PPO minimum (they get no gradient from
    the surrogate): ratio above 1 + clipHigh with a positive advantage, or below 1 − clipLow
    with a negative one."""
    mismatch_abs_mean: float
    """Mean |logp_old − logp_engine| over loss tokens (trainer vs engine)."""
    ess: float
    """Normalised effective sample size of the mismatch weights."""
    correction_fraction: float
    """Share of loss tokens whose weight TIS clamped or ICEPOP dropped."""
    kl: float
    """Mean low-variance KL to the reference policy (0 when not computed)."""
    tokens: int
    """Tokens that carry loss."""
    ratio_min: float = 1.0
    """Smallest PPO ratio over loss tokens (1 when there are none)."""
    ratio_max: float = 1.0
    """Largest PPO ratio over loss tokens (1 when there are none)."""


class MismatchStats(BaseModel):
    """Train/inference mismatch over a set of tokens: depends on ``logp_old`` and the engine's
    logprobs only, so it is the same for every update of a step."""

    mismatch_abs_mean: float
    ess: float
    correction_fraction: float
    tokens: int
    """Tokens of the mask."""


class StepStats(BaseModel):
    """What a backend reports for one step."""

    loss: float
    """Mean of the updates' losses."""
    grad_norm: float
    """Mean of the updates' gradient norms (before clipping)."""
    loss_stats: LossStats
    """The step's statistics (:func:`~agentrl.trainer.loss.combine_updates`)."""
    recompute_seconds: float
    update_seconds: float
    updates: list[LossStats] = Field(default_factory=list)
    """Each optimizer update's statistics, in order: mini-batch by mini-batch, pass by pass."""
