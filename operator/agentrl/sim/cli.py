"""``agentrl plan``: capacity plan and rollout simulation of a manifest, or the report's
calibration.

    agentrl plan FILE                    readable tables, bottleneck and warnings
    agentrl plan FILE --json             machine-readable summary plus the whole plan
    agentrl plan FILE --plot DIR         also write PNG charts (extra ``plots``)
    agentrl plan --reproduce-report      the report's figures next to the simulated ones

Registered in ``agentrl.cli.COMMANDS`` as ``agentrl.sim.cli:plan``, and ``agentrl validate`` as
``agentrl.sim.cli:validate``: the API's offline validation (``agentrl.api.cli.make_validate``)
plus the trainer memory estimate of :mod:`agentrl.sim.memory`, which refuses a job whose trainer
cannot fit its GPUs (the API package cannot import the planner).
"""

from __future__ import annotations

import json
import sys

import click
import yaml
from pydantic import ValidationError
from rich.console import Console

from agentrl.api import AgentRLJob
from agentrl.api.cli import make_validate
from agentrl.sim.architectures import UnsupportedArchitectureError
from agentrl.sim.hardware import UnknownGPUError
from agentrl.sim.memory import validate_trainer_memory
from agentrl.sim.params import REPORT_SCENARIOS, SimControl, SimParams, load_params
from agentrl.sim.plan import Plan, plan_job
from agentrl.sim.static_plan import PlanInputError

#: ``agentrl validate``: the API server's rules and the trainer's memory.
validate = make_validate([validate_trainer_memory])

#: Fields of the plan left out of ``--json`` (per-trajectory lists: charts only).
_LONG_FIELDS = {"simulation": {"completion_times", "trajectory_tokens"}}


def _load_job(path: str) -> AgentRLJob:
    with open(path, encoding="utf-8") as fh:
        docs = [d for d in yaml.safe_load_all(fh) if d]
    jobs = [d for d in docs if isinstance(d, dict) and d.get("kind") == "AgentRLJob"]
    if not jobs:
        raise click.ClickException(f"{path}: no AgentRLJob document")
    try:
        return AgentRLJob.model_validate(jobs[0])
    except ValidationError as exc:
        raise click.ClickException(f"{path}: not a valid AgentRLJob:\n{exc}") from exc


def _write_plots(plan: Plan, job: AgentRLJob, params: SimParams, config: str | None,
                 plot_dir: str) -> list[str]:
    from agentrl.sim import plots  # matplotlib itself is imported inside write_plots

    try:
        sweep = plots.concurrency_sweep(job, params, None, config)
        paths = plots.write_plots(plan, sweep, plot_dir)
    except ModuleNotFoundError as exc:
        raise click.ClickException(
            f"--plot needs {exc.name}: pip install 'agentrl[plots]'") from exc
    return [str(p) for p in paths]


@click.command("plan")
@click.argument("file", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False),
              help="Write PNG charts into this directory (needs the 'plots' extra).")
@click.option("--reproduce-report", is_flag=True,
              help="Print the report's figures next to the simulated ones.")
@click.option("--params", "params_file", type=click.Path(exists=True, dir_okay=False),
              help="YAML overriding any of the planner's parameters (see docs/plan.md).")
@click.option("--config", "config_path", type=click.Path(exists=True),
              help="A HF config.json (or model directory) to read the architecture from.")
@click.option("--seed", type=int, default=None, help="Seed of the simulation.")
def plan(file: str | None, as_json: bool, plot_dir: str | None, reproduce_report: bool,
         params_file: str | None, config_path: str | None, seed: int | None) -> None:
    """Capacity plan and rollout simulation for an AgentRLJob manifest.

    Prints KV-cache figures, the simulated trajectories/hour and training step time, what
    limits throughput, and manifest settings at odds with the plan.
    """
    console = Console()
    params = load_params(params_file)
    if seed is not None:
        params = params.model_copy(update={"sim": SimControl(
            **{**params.sim.model_dump(), "seed": seed})})
    if reproduce_report:
        from agentrl.sim import calibration, render

        plans = calibration.run_scenarios(params)
        figures = calibration.reproduce_report(params, plans)
        if as_json:
            click.echo(json.dumps([f.model_dump(mode="json") for f in figures], indent=2))
        else:
            render.print_calibration(figures, console)
        if plot_dir:
            name = "throughput-report"
            job = AgentRLJob.model_validate(REPORT_SCENARIOS[name].manifest)
            written = _write_plots(plans[name], job, params, None, plot_dir)
            if not as_json:
                console.print("wrote " + ", ".join(written))
        return
    if file is None:
        raise click.UsageError("give a manifest FILE or --reproduce-report")
    job = _load_job(file)
    try:
        result = plan_job(job, params, None, config_path)
    except (PlanInputError, UnsupportedArchitectureError, UnknownGPUError) as exc:
        raise click.ClickException(str(exc)) from exc
    paths: list[str] = []
    if plot_dir:
        paths = _write_plots(result, job, params, config_path, plot_dir)
    if as_json:
        out = result.summary()
        out["plots"] = paths
        out["plan"] = result.model_dump(mode="json", exclude=_LONG_FIELDS)
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    from agentrl.sim import render

    render.print_plan(result, console)
    if paths:
        console.print("wrote " + ", ".join(paths))

