"""GRPO arithmetic as plain functions over floats: group-relative advantages and zero-variance
groups.

No torch here: users call these from notebooks and reward scripts, and
:mod:`agentrl.trainer.batching` calls them to build every step's samples; the unit tests check
them against values worked out by hand. The per-token arithmetic (importance weights, TIS,
ICEPOP, their effective sample size) is in :mod:`agentrl.trainer.loss`, on the tensors the
backends train on, with the differentiable loss.

Conventions
-----------
* A *group* is ``group_size`` consecutive rewards: the attempts at one task.
* ``std_normalize`` divides by the group's **sample** standard deviation (n − 1 in the
  denominator, as ``torch.std`` does in the GRPO implementations we compare with), plus
  :data:`STD_EPS` so a group with equal rewards yields zeros rather than NaN.
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


def zero_variance(group: Sequence[float]) -> bool:
    """True when all the group's rewards are equal (it carries no relative signal)."""
    return len(set(group)) <= 1
