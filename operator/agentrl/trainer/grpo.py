"""GRPO arithmetic as plain functions over floats: advantages, zero-variance groups, importance
weights and their effective sample size.

No torch here: users call these from notebooks and reward scripts, the capacity simulator calls
them, and the unit tests check them against values worked out by hand. The differentiable loss
that consumes their output lives in :mod:`agentrl.trainer.loss`.

Conventions
-----------
* A *group* is ``group_size`` consecutive rewards: the attempts at one task.
* ``std_normalize`` divides by the group's **sample** standard deviation (n − 1 in the
  denominator, as ``torch.std`` does in the GRPO implementations we compare with), plus
  :data:`STD_EPS` so a group with equal rewards yields zeros rather than NaN.
* Importance weights are ``w = exp(logp_trainer − logp_engine)`` per token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

#: Added to a group's standard deviation before dividing (equal rewards give advantage 0).
STD_EPS: Final = 1e-6


def _groups(values: Sequence[float], group_size: int) -> list[Sequence[float]]:
    if group_size < 1:
        raise ValueError(f"group_size must be at least 1, got {group_size}")
    if len(values) % group_size:
        raise ValueError(
            f"{len(values)} rewards do not split into groups of {group_size}: "
            "pass whole groups, in order"
        )
    return [values[i : i + group_size] for i in range(0, len(values), group_size)]


def group_advantages(
    rewards: Sequence[float], group_size: int, *, std_normalize: bool = True
) -> list[float]:
    """Group-relative advantages, one per reward, groups taken in order.

    ``A_i = r_i − mean(group)``, divided by ``std(group) + STD_EPS`` when ``std_normalize``
    (GRPO; off gives Dr. GRPO's unscaled form).

    >>> group_advantages([1.0, 0.0, 0.0, 1.0], 2, std_normalize=False)
    [0.5, -0.5, -0.5, 0.5]
    """
    out: list[float] = []
    for group in _groups(rewards, group_size):
        mean = sum(group) / len(group)
        centred = [r - mean for r in group]
        if std_normalize:
            std = group_std(group)
            centred = [c / (std + STD_EPS) for c in centred]
        out.extend(centred)
    return out


def group_std(group: Sequence[float]) -> float:
    """Sample standard deviation (n − 1); 0 for a single value."""
    n = len(group)
    if n < 2:
        return 0.0
    mean = sum(group) / n
    return math.sqrt(sum((r - mean) ** 2 for r in group) / (n - 1))


def zero_variance_groups(rewards: Sequence[float], group_size: int) -> list[bool]:
    """One flag per group: True when all its rewards are equal (it carries no signal)."""
    return [max(g) == min(g) for g in _groups(rewards, group_size)]


def effective_sample_size(weights: Sequence[float]) -> float:
    """Normalised effective sample size ``(Σw)² / (N·Σw²)`` of importance weights, in (0, 1].

    1 means every sample counts fully (all weights equal); 1/N means one sample dominates.
    """
    if not weights:
        raise ValueError("effective_sample_size needs at least one weight")
    if any(w < 0 for w in weights):
        raise ValueError("importance weights are non-negative")
    total = sum(weights)
    squares = sum(w * w for w in weights)
    if squares == 0.0:
        raise ValueError("all importance weights are zero")
    return total * total / (len(weights) * squares)


def importance_weights(
    trainer_logprobs: Sequence[float], engine_logprobs: Sequence[float]
) -> list[float]:
    """``exp(logp_trainer − logp_engine)`` per token."""
    if len(trainer_logprobs) != len(engine_logprobs):
        raise ValueError("trainer and engine logprobs differ in length")
    return [math.exp(t - e) for t, e in zip(trainer_logprobs, engine_logprobs, strict=False)]


def truncated_weights(weights: Sequence[float], low: float, high: float) -> list[float]:
    """TIS: each weight clamped into ``[low, high]``."""
    return [min(max(w, low), high) for w in weights]


def icepop_mask(weights: Sequence[float], low: float, high: float) -> list[bool]:
    """ICEPOP: True for tokens whose weight lies in ``[low, high]`` (the others get no
    gradient)."""
    return [low <= w <= high for w in weights]
