"""PNG charts for ``agentrl plan --plot DIR``: throughput against concurrency with the
bottleneck marked, the step-time breakdown, and the trajectory length distribution.

matplotlib (extra ``plots``) is imported inside ``write_plots`` so ``agentrl.sim`` stays light.
Called by ``agentrl.sim.cli``.
"""

from __future__ import annotations

from pathlib import Path

from agentrl.api import AgentRLJob
from agentrl.sim.params import SimControl, SimOverrides, SimParams
from agentrl.sim.plan import Plan, plan_job

#: Concurrencies of the sweep, as multiples of the manifest's.
SWEEP = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0)


def concurrency_sweep(job: AgentRLJob, params: SimParams, overrides: SimOverrides | None = None,
                      config_path: str | Path | None = None) -> list[tuple[int, Plan]]:
    """Plans of ``job`` at several concurrencies (shorter windows: this is a chart)."""
    quick = params.model_copy(update={"sim": SimControl(
        seed=params.sim.seed, warmup_seconds=600, measure_seconds=1800, measure_steps=2,
        measure_steps_async=1)})
    out: list[tuple[int, Plan]] = []
    base = job.spec.sandbox.concurrency
    for factor in SWEEP:
        conc = max(1, round(base * factor))
        variant = job.model_copy(deep=True)
        variant.spec.sandbox.concurrency = conc
        if variant.spec.sandbox.autoscale.enabled:
            variant.spec.sandbox.autoscale.max = max(variant.spec.sandbox.autoscale.max, conc)
            variant.spec.sandbox.autoscale.min = min(variant.spec.sandbox.autoscale.min, conc)
        out.append((conc, plan_job(variant, quick, overrides, config_path)))
    return out


def write_plots(plan: Plan, sweep: list[tuple[int, Plan]], out_dir: str | Path) -> list[Path]:
    """Write the three charts; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []

    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [c for c, _ in sweep]
    ys = [p.simulation.trajectories_per_hour for _, p in sweep]
    ax.plot(xs, ys, marker="o")
    for x, y, (_, p) in zip(xs, ys, sweep, strict=True):
        ax.annotate(p.bottleneck, (x, y), textcoords="offset points", xytext=(4, 6), fontsize=7)
    ax.axvline(plan.static.requested_concurrency, linestyle="--", color="grey")
    ax.set_xlabel("sandbox.concurrency")
    ax.set_ylabel("trajectories / hour")
    ax.set_title(f"{plan.name}: throughput vs concurrency (bottleneck: {plan.bottleneck})")
    paths.append(out / "throughput_vs_concurrency.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 4.5))
    bd = plan.simulation.step_breakdown
    parts = ([("actor update", bd.actor_update), ("log-prob recompute", bd.logprob_recompute),
              ("wait for rollout", bd.wait_for_rollout), ("weight sync", bd.weight_sync)]
             if bd else [])
    bottom = 0.0
    for label, value in parts:
        ax.bar(["step"], [value], bottom=bottom, label=f"{label} ({value:.0f} s)")
        bottom += value
    ax.set_ylabel("seconds")
    ax.set_title("step-time breakdown" if bd else "step-time breakdown (no full step ran)")
    if parts:
        ax.legend(fontsize=8)
    paths.append(out / "step_breakdown.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.hist(plan.simulation.trajectory_tokens, bins=40)
    ax1.set_xlabel("tokens per trajectory")
    ax1.set_ylabel("trajectories")
    ax2.hist([t / 60 for t in plan.simulation.completion_times], bins=40)
    ax2.set_xlabel("episode duration (min)")
    fig.suptitle("trajectory length distribution")
    paths.append(out / "length_distribution.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths
