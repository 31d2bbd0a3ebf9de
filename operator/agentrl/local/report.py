"""The report of a local run: ``summary.json`` and PNG plots, computed from the run's own step
log so the figures can be checked against it.

Callers: :mod:`agentrl.local.cli` (``--report DIR``) and ``bench/local_learning.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrl.local.runner import RunResult, dump_json
from agentrl.trainer.loop import StepRecord

#: Step-time parts, in the order the LMSYS/AMD report lists them.
PARTS = ("actor_update", "waiting_for_rollout", "logprob_recompute", "weight_sync")


def _evaluation_share(result: RunResult) -> float | None:
    """The evaluations' share of the rollout tier's time: their episodes' wall seconds over
    those plus the training episodes' (summed per episode, so overlap counts for both)."""
    spent = sum(r.episode_seconds for r in result.evaluations)
    total = spent + result.train_episode_seconds
    return spent / total if total > 0 else None


def _warm_start(result: RunResult) -> dict[str, Any] | None:
    """The warm-start stage's figures (None: the job has none)."""
    w = result.warm_start
    if w is None:
        return None
    return {
        "done": w.done,
        "updates": w.updates,
        "trained_tokens": w.trained_tokens,
        "loss_first": w.first_loss,
        "loss_last": w.loss,
    }


def _tools(result: RunResult) -> dict[str, Any] | None:
    """The run's tool health (the window of ``status.rollout.tools``); None: no trajectory."""
    health = result.state.counters.tools.health()
    return None if health is None else health.model_dump(mode="json")


def summarize(result: RunResult) -> dict[str, Any]:
    """Every headline figure of the run (the content of ``summary.json``)."""
    records = result.records
    counters = result.state.counters
    totals = {p: sum(getattr(r.times, p) for r in records) for p in PARTS}
    grand = sum(totals.values()) or 1.0
    hours = result.state.elapsed_seconds / 3600.0
    before = result.before.pass_at_1 if result.before else None
    after = result.after.pass_at_1 if result.after else None
    warm = result.after_warm_start.pass_at_1 if result.after_warm_start else None
    return {
        "job": result.job_name,
        "steps": result.state.step,
        "restarts": result.state.restarts,
        "interrupted": result.interrupted,
        "pass_at_1_before": before,
        "pass_at_1_after": after,
        "pass_at_1_gain_points": None
        if before is None or after is None
        else round(100 * (after - before), 2),
        # the three points of a job with a warm start: base → after it → after RL
        "pass_at_1_after_warm_start": warm,
        "warm_start": _warm_start(result),
        "held_out_tasks": result.held_out_tasks,
        "train_tasks": result.train_tasks,
        "eval_before": result.before.model_dump() if result.before else None,
        "eval_after": result.after.model_dump() if result.after else None,
        "evaluations": [
            {
                "step": r.step,
                "stage": r.stage,
                "pass_at_1": r.pass_at_1,
                "episodes": r.episodes,
                "infra_errors": r.infra_errors,
                "seconds": r.seconds,
                "episode_seconds": r.episode_seconds,
            }
            for r in result.evaluations
        ],
        "evaluation_share_of_rollout": _evaluation_share(result),
        "trajectories": counters.trajectories,
        "trained_trajectories": counters.trained_trajectories,
        "trajectories_per_hour": counters.trajectories / hours if hours > 0 else 0.0,
        "classes": dict(counters.classes),
        # tool health over every trajectory received (agentrl.rollout.tool_health)
        "tools": _tools(result),
        "infra_errors": result.infra_error_attempts,
        "infra_errors_dropped": counters.infra_errors,
        "infra_errors_in_training": counters.infra_errors_in_training,
        "engine_restarts": result.engine_restarts,
        "zero_variance_groups": counters.zero_variance_groups,
        "dropped_groups": counters.dropped_groups,
        "long_tail_share": sum(result.long_tail_shares) / len(result.long_tail_shares)
        if result.long_tail_shares
        else None,
        "reward_mean_first_step": records[0].reward_mean if records else None,
        "reward_mean_last_step": records[-1].reward_mean if records else None,
        "staleness_max": max((r.staleness_max for r in records), default=0),
        "step_time_seconds": totals,
        "step_time_share": {p: totals[p] / grand for p in PARTS},
        "training_seconds": result.state.elapsed_seconds,
        "wall_seconds": result.wall_seconds,
    }


def write_report(result: RunResult, directory: Path) -> dict[str, Any]:
    """Write ``summary.json`` and the plots into ``directory``; returns the summary."""
    directory.mkdir(parents=True, exist_ok=True)
    summary = summarize(result)
    dump_json(directory / "summary.json", summary)
    write_plots(result.records, result.caps, directory)
    return summary


def write_plots(records: list[StepRecord], caps: dict[str, int], directory: Path) -> None:
    """reward.png (reward and pass rate per step), lengths.png (trajectory lengths with the
    caps marked), step_time.png (step-time breakdown per step)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r.step for r in records]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [r.reward_mean for r in records], label="reward mean")
    ax.plot(steps, [r.pass_rate for r in records], label="pass rate")
    ax.set_xlabel("step")
    ax.set_ylim(0, 1.05)
    ax.legend()
    fig.tight_layout()
    fig.savefig(directory / "reward.png")
    plt.close(fig)

    lengths = [n for r in records for n in r.trajectory_lengths]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if lengths:
        ax.hist(lengths, bins=30)
    for name, value in caps.items():
        ax.axvline(value, linestyle="--", color="red")
        ax.text(value, ax.get_ylim()[1] * 0.9, name, rotation=90, ha="right", fontsize=7)
    ax.set_xlabel("trajectory tokens")
    fig.tight_layout()
    fig.savefig(directory / "lengths.png")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    bottom = [0.0] * len(records)
    for part in PARTS:
        values = [getattr(r.times, part) for r in records]
        ax.bar(steps, values, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, values, strict=False)]
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(directory / "step_time.png")
    plt.close(fig)
