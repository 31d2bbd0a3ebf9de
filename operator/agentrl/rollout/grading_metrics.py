"""Prometheus metrics of grading an agent's patch in a fresh sandbox, declared once.

``agentrl_rollout_grades_total{status}`` counts graded episodes by
:class:`~agentrl.rollout.verifier.GradeStatus`: ``resolved``, ``unresolved``, ``patch_failed``
(the patch applied to no fresh copy of the task: reward 0, the policy's doing, never an infra
error) and ``empty_patch``. Grading that fails for the infrastructure's sake is no grade: it is
counted as an infra error by terminal class.

Callers: :mod:`agentrl.rollout.episode` records one grade per graded episode.
"""

from __future__ import annotations

from prometheus_client import Counter

GRADES = Counter(
    "agentrl_rollout_grades_total",
    "Episodes whose patch was graded in a fresh sandbox, by grade status (resolved, "
    "unresolved, patch_failed, empty_patch).",
    ["status"],
)
