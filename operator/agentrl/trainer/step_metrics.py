"""The trainer driver's per-step Prometheus series, set from each step's
:class:`~agentrl.trainer.loop.StepRecord` (the same figures ``steps.jsonl`` records).

The driver calls :func:`observe` once per finished step; the gauges hold the last step's value
and the counters add the step's trajectories and tokens. They are served by trainer rank 0 on
its ``metrics`` port (and by ``agentrl run --metrics-port``) with the rest of the default
registry, and the chart's Grafana dashboard reads them.

Declared elsewhere in the trainer, not here: ``agentrl_trainer_step``,
``agentrl_trainer_step_seconds_total{part}`` (the step-time breakdown),
``agentrl_trainer_staleness_max``, the buffer and staleness-gate series and
``agentrl_trainer_eval_pass_at_1`` (:mod:`agentrl.trainer.loop`). Infra errors by class are
the rollout tier's ``agentrl_rollout_infra_retries_total{reason}`` and
``agentrl_rollout_infra_dropped_total{reason}`` (:mod:`agentrl.rollout.metrics`), not repeated
here.
"""

from __future__ import annotations

from typing import Protocol

from prometheus_client import Counter, Gauge


class StepFigures(Protocol):
    """What :func:`observe` reads of a step: :class:`agentrl.trainer.loop.StepRecord` (named
    structurally, so that this module, which the driver imports, imports nothing of it)."""

    trajectories: int
    tokens: int


REWARD_MEAN = Gauge("agentrl_trainer_reward_mean", "Mean reward of the last step's trajectories.")
PASS_RATE = Gauge(
    "agentrl_trainer_pass_rate", "Share of the last step's trajectories with reward 1."
)
LOSS = Gauge("agentrl_trainer_loss", "Policy loss of the last step.")
GRAD_NORM = Gauge(
    "agentrl_trainer_grad_norm",
    "Gradient norm of the last step (mean over its optimizer steps, before clipping).",
)
CLIP_FRACTION = Gauge(
    "agentrl_trainer_clip_fraction", "Share of the last step's loss tokens the PPO ratio clipped."
)
MISMATCH = Gauge(
    "agentrl_trainer_mismatch_abs_mean",
    "Mean |logprob trainer - engine| over the last step's loss tokens.",
)
ESS = Gauge(
    "agentrl_trainer_ess",
    "Normalised effective sample size (0-1) of the last step's importance weights.",
)
CORRECTION_FRACTION = Gauge(
    "agentrl_trainer_correction_fraction",
    "Share of the last step's loss tokens whose mismatch weight TIS clamped or ICEPOP dropped.",
)
ZERO_VARIANCE_SHARE = Gauge(
    "agentrl_trainer_zero_variance_share",
    "Share of the groups considered for the last step whose rewards were all equal.",
)
STALENESS_MEAN = Gauge(
    "agentrl_trainer_staleness_mean", "Mean staleness (versions) of the last step's trajectories."
)
IN_FLIGHT = Gauge("agentrl_trainer_episodes_in_flight", "Episodes running when the step ended.")
TRAJECTORIES = Counter("agentrl_trainer_trajectories_total", "Trajectories trained on.")
TOKENS = Counter("agentrl_trainer_tokens_total", "Trajectory tokens trained on.")


#: Each gauge and the :class:`StepRecord` field it shows.
_GAUGE_FIELDS: tuple[tuple[Gauge, str], ...] = (
    (REWARD_MEAN, "reward_mean"),
    (PASS_RATE, "pass_rate"),
    (LOSS, "loss"),
    (GRAD_NORM, "grad_norm"),
    (CLIP_FRACTION, "clip_fraction"),
    (MISMATCH, "mismatch_abs_mean"),
    (ESS, "ess"),
    (CORRECTION_FRACTION, "correction_fraction"),
    (ZERO_VARIANCE_SHARE, "zero_variance_share"),
    (STALENESS_MEAN, "staleness_mean"),
    (IN_FLIGHT, "in_flight"),
)


def observe(record: StepFigures) -> None:
    """Set the gauges to ``record``'s figures and add its trajectories and tokens."""
    for gauge, name in _GAUGE_FIELDS:
        gauge.set(getattr(record, name))
    TRAJECTORIES.inc(record.trajectories)
    TOKENS.inc(record.tokens)
