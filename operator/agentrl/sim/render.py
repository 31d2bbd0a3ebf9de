"""Human-readable output of ``agentrl plan``: rich tables for a plan and for the calibration.

Called by ``agentrl.sim.cli`` only.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from agentrl.sim.calibration import CalibrationFigure
from agentrl.sim.plan import Plan


def _fmt(value: float | str | None, unit: str = "") -> str:
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    if unit == "share":
        return f"{value:.1%}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _trainer_memory(plan: Plan) -> str:
    est = plan.trainer_memory.estimate
    if est is None:
        return plan.trainer_memory.message
    stage = "" if est.worst.stage == "only" else f", {est.worst.stage} pipeline stage"
    verdict = "fits" if est.fits else "DOES NOT FIT"
    return (f"{est.total_bytes / 2**30:.1f} of {est.gpu_bytes / 2**30:.0f} GiB ({est.gpu}"
            f"{stage}) at {est.tokens:,} tokens: {verdict} (up to {est.max_tokens:,} tokens)")


def print_plan(plan: Plan, console: Console) -> None:
    """The plan of one manifest as three tables and the warnings."""
    st, sim = plan.static, plan.simulation
    static = Table(title=f"{plan.name}: static plan", show_header=False)
    rows = [
        ("model", f"{st.architecture} ({st.total_params / 1e9:.1f}B params, "
                  f"{st.active_params / 1e9:.1f}B active; {st.architecture_source})"),
        ("GPU", f"{st.gpu} ({st.gpu_source})"),
        ("KV per token", f"{st.kv_bytes_per_token:,.0f} B"),
        ("weights per GPU", f"{st.weight_bytes_per_gpu / 1e9:.1f} GB"),
        ("KV pool per engine", f"{st.kv_pool_tokens_per_engine:,} tokens "
                               f"({st.kv_pool_bytes_per_engine / 1e9:.0f} GB)"),
        ("full-context trajectories per engine", str(st.full_context_trajectories_per_engine)),
        ("KV of one max-length trajectory", f"{st.kv_bytes_per_max_trajectory / 1e9:.2f} GB"),
        ("concurrency", f"{st.effective_concurrency} of {st.requested_concurrency}"
                        + (f" (limited by {st.concurrency_limited_by})"
                           if st.concurrency_limited_by else "")),
        ("LLM calls in flight per engine", f"{st.concurrent_llm_calls_per_engine:.1f}"),
        ("sandbox footprint", f"{st.sandbox_cpu_cores:g} CPU, {st.sandbox_memory_gib:g} GiB, "
                              f"{st.sandbox_nodes_needed} node(s)"),
        ("GPUs", f"{st.engine_gpus} engines + {st.trainer_gpus} trainer"),
        ("trainer memory per GPU", _trainer_memory(plan)),
    ]
    volume = plan.checkpoint_volume
    if volume is not None:
        size = "an existing volume" if volume.size_bytes is None \
            else f"{volume.size_bytes / 1e9:,.0f} GB"
        rows.append(("checkpoint volume", f"{volume.steady_bytes / 1e9:,.0f} GB steady, "
                                          f"{volume.peak_bytes / 1e9:,.0f} GB peak, of {size}"))
    for key, value in rows:
        static.add_row(key, value)
    console.print(static)

    dyn = Table(title=f"simulation ({sim.loop_mode.value}, "
                      f"{sim.simulated_seconds / 3600:.1f} h simulated)", show_header=False)
    bd = sim.step_breakdown
    dyn_rows = [
        ("trajectories / hour", _fmt(sim.trajectories_per_hour)),
        ("step time", _fmt(sim.step_seconds) + " s"),
        ("  wait for rollout", _fmt(bd.wait_for_rollout if bd else None) + " s"),
        ("  log-prob recompute", _fmt(bd.logprob_recompute if bd else None) + " s"),
        ("  actor update", _fmt(bd.actor_update if bd else None) + " s"),
        ("  weight sync (apart)", _fmt(bd.weight_sync if bd else None) + " s"),
        ("episode duration", _fmt(sim.episode_seconds_mean) + " s"),
        ("tokens per trajectory", _fmt(sim.tokens_per_trajectory_mean)),
        ("LLM call latency", f"{sim.llm_latency_mean:.2f} s"),
        ("GPU (engine) idle", _fmt(sim.engine_idle_share, "share")),
        ("trainer waiting", _fmt(sim.trainer_idle_share, "share")),
        ("KV usage mean / peak", f"{sim.kv_usage_mean:.1%} / {sim.kv_usage_peak:.1%}"),
        ("rollout after 90% of batch", _fmt(sim.rollout_tail_share, "share")),
        ("hit turn cap / token cap", f"{sim.turn_cap_share:.0%} / {sim.token_cap_share:.0%}"),
    ]
    for key, value in dyn_rows:
        dyn.add_row(key, value)
    console.print(dyn)
    console.print(f"[bold]bottleneck:[/bold] {plan.bottleneck} — {plan.bottleneck_reason}")
    for note in st.notes:
        console.print(f"[dim]note:[/dim] {note}")
    for warning in plan.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}")


def print_calibration(figures: list[CalibrationFigure], console: Console) -> None:
    """The calibration table."""
    table = Table(title="the report's figures vs the planner")
    table.add_column("figure", no_wrap=True)
    for col in ("reported", "simulated", "unit", "kind"):
        table.add_column(col)
    for f in figures:
        table.add_row(f.figure, _fmt(f.reported, f.unit), _fmt(f.simulated, f.unit), f.unit,
                      f.kind)
    console.print(table)
