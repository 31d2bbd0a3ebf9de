"""``agentrl run FILE``: train an AgentRLJob on this machine, with a live progress display.

The job itself runs in :func:`agentrl.local.runner.run_local`. With Ray installed (the ``ray``
extra) it runs on a local Ray started with an explicit CPU count and no dashboard, placed by the
code that places the trainer pods' processes (:mod:`agentrl.ray_cluster.placement`): the job's
trainer placement group (one CPU bundle per rank, one for the driver) must be ready within
``--placement-timeout``, and the job runs as the driver actor in the driver's bundle; this
process only draws the display from the run's step log. ``run_local`` steps the torch backend
in the driver's process (a thread), so rank 0's bundle holds the CPU that thread uses; the
rollout tier runs in the driver's process too, so no rollout group is made. ``--no-ray`` runs
the job in this process.

Ctrl-C stops cleanly: running episodes are cancelled, sandboxes closed, engines stopped, and
the last finished step is checkpointed; ``--resume`` continues from it.

``--metrics-port`` serves ``/metrics`` (:mod:`agentrl.rollout.metrics_export`) from the process
that runs the job — the driver actor with Ray, this process without — for the run's duration.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table

from agentrl.trainer.loop import StepRecord

if TYPE_CHECKING:
    from agentrl.rollout.metrics_export import MetricsServer


def _table(records: list[StepRecord], phase: str, max_steps: int) -> Table:
    table = Table(title=f"agentrl run — {phase}", expand=False)
    for col in ("step", "reward", "pass", "traj/h", "in flight", "classes", "stale", "s/step"):
        table.add_column(col, justify="right")
    for r in records[-12:]:
        hours = r.wall_seconds / 3600 or 1e-9
        done = sum(x.trajectories for x in records if x.step <= r.step)
        classes = " ".join(f"{k[:5]}={v}" for k, v in sorted(r.classes.items()))
        table.add_row(
            f"{r.step}/{max_steps}",
            f"{r.reward_mean:.2f}",
            f"{r.pass_rate:.2f}",
            f"{done / hours:.0f}",
            str(r.in_flight),
            classes,
            f"{r.staleness_mean:.1f}/{r.staleness_max}",
            f"{r.times.total:.1f}",
        )
    return table


def _read_steps(path: Path) -> list[StepRecord]:
    if not path.exists():
        return []
    return [StepRecord.model_validate_json(x) for x in path.read_text().splitlines() if x.strip()]


def _serve_metrics(port: int | None) -> MetricsServer | None:
    """Start ``/metrics`` on ``port`` (None: off); the server, or None."""
    if port is None:
        return None
    from agentrl.rollout import metrics_export

    try:
        return metrics_export.serve(port)
    except OSError as exc:
        raise click.ClickException(
            f"--metrics-port {port}: cannot serve metrics there ({exc.strerror or exc})"
        ) from exc


def _run_here(
    manifest: str,
    options_json: str,
    quiet: bool,
    console: Console,
    metrics_port: int | None = None,
) -> dict[str, Any]:
    from agentrl.api.validation import load_job
    from agentrl.local.report import write_report
    from agentrl.local.runner import RunOptions, run_local
    from agentrl.trainer.checkpoint import WarmStartProgress

    job = load_job(manifest)
    options = RunOptions.model_validate_json(options_json)
    records: list[StepRecord] = []
    phase = ["starting"]
    max_steps = options.max_steps or job.spec.trainer.max_steps
    live = (
        None
        if quiet
        else Live(_table(records, phase[0], max_steps), console=console, refresh_per_second=2)
    )

    def on_step(record: StepRecord) -> None:
        records.append(record)
        if live is not None:
            live.update(_table(records, phase[0], max_steps))

    def on_phase(name: str) -> None:
        phase[0] = name
        if live is not None:
            live.update(_table(records, name, max_steps))
        elif not quiet:
            console.print(name)

    def on_warm_start(progress: WarmStartProgress) -> None:
        loss = "" if progress.loss is None else f", loss {progress.loss:.3f}"
        on_phase(f"warm start {progress.updates}/{progress.total_updates}{loss}")

    async def main() -> Any:
        return await run_local(
            job, options, on_step=on_step, on_phase=on_phase, on_warm_start=on_warm_start
        )

    metrics_server = _serve_metrics(metrics_port)
    if live is not None:
        live.start()
    try:
        result = asyncio.run(main())
    finally:
        if live is not None:
            live.stop()
        if metrics_server is not None:
            metrics_server.close()
    report_dir = options.run_dir / "report"
    summary = write_report(result, report_dir)
    return {"summary": summary, "report_dir": str(report_dir)}


def _run_in_ray(
    manifest: str,
    options_json: str,
    quiet: bool,
    console: Console,
    num_cpus: int,
    placement_timeout: float,
    metrics_port: int | None = None,
) -> dict[str, Any]:
    import ray

    from agentrl.api.validation import load_job
    from agentrl.local.runner import RunOptions
    from agentrl.ray_cluster import placement

    options = RunOptions.model_validate_json(options_json)
    plan = placement.plan_placement(load_job(manifest))
    ray.init(
        num_cpus=num_cpus,
        resources=placement.local_resources(plan),
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        namespace="agentrl-local",
    )
    try:
        try:
            placed = placement.place(plan, timeout_s=placement_timeout, rollout=False)
        except placement.PlacementError as exc:
            raise click.ClickException(str(exc)) from exc
        try:
            return _drive_placed(
                placed, manifest, options_json, quiet, console, options, metrics_port
            )
        finally:
            placed.remove()
    finally:
        ray.shutdown()


def _drive_placed(
    placed: Any,
    manifest: str,
    options_json: str,
    quiet: bool,
    console: Console,
    options: Any,
    metrics_port: int | None = None,
) -> dict[str, Any]:
    import ray

    from agentrl.ray_cluster import placement

    job_actor = placement.start_driver(placed, _JobActor)
    ref = job_actor.run.remote(manifest, options_json, metrics_port)
    try:
        steps_log = options.run_dir / "logs" / "steps.jsonl"
        with Live(console=console, refresh_per_second=1, transient=quiet) as live:
            while True:
                ready, _ = ray.wait([ref], timeout=1.0)
                if not quiet:
                    live.update(
                        _table(_read_steps(steps_log), "training (ray)", options.max_steps or 0)
                    )
                if ready:
                    break
        out: dict[str, Any] = ray.get(ref)
        return out
    except KeyboardInterrupt:
        ray.cancel(ref)  # the actor's run is interrupted and checkpoints its last step
        try:
            return dict(ray.get(ref, timeout=120))
        except Exception:
            raise KeyboardInterrupt from None


class _JobActor:
    """The job's driver as a Ray actor (in the driver's bundle of the trainer group)."""

    def run(
        self, manifest: str, options_json: str, metrics_port: int | None = None
    ) -> dict[str, Any]:
        return _run_here(manifest, options_json, True, Console(stderr=True), metrics_port)


@click.command("run")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--report",
    "report_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write summary.json and PNG plots here.",
)
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Weights, checkpoints and logs (default: .agentrl/runs/NAME).",
)
@click.option("--resume", is_flag=True, help="Continue from the newest checkpoint in --run-dir.")
@click.option(
    "--max-steps",
    type=click.IntRange(min=1),
    help="Stop after this many steps (overrides trainer.maxSteps).",
)
@click.option(
    "--chaos",
    type=click.FloatRange(0.0, 0.5),
    default=0.0,
    show_default=True,
    help="Inject sandbox creation failures at this rate, and engine crashes.",
)
@click.option(
    "--eval-samples",
    type=click.IntRange(min=1),
    default=None,
    help="Episodes per held-out task when measuring pass@1 [default: the manifest's "
    "trainer.evaluation.attemptsPerTask].",
)
@click.option("--skip-eval", is_flag=True, help="Do not measure held-out pass@1.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--quiet", is_flag=True, help="No live display (CI); print the summary only.")
@click.option(
    "--ray/--no-ray",
    "use_ray",
    default=None,
    help="Run the job in a local Ray actor (default: when ray is installed).",
)
@click.option(
    "--num-cpus",
    type=click.IntRange(min=1),
    default=None,
    help="CPUs given to the local Ray (default: this machine's).",
)
@click.option(
    "--placement-timeout",
    type=click.FloatRange(min=1.0),
    default=120.0,
    show_default=True,
    help="Seconds the local Ray may take to reserve the job's placement group.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve the run's Prometheus /metrics on this port (default: off).",
)
def run(
    file: Path,
    report_dir: Path | None,
    run_dir: Path | None,
    resume: bool,
    max_steps: int | None,
    chaos: float,
    eval_samples: int | None,
    skip_eval: bool,
    seed: int,
    quiet: bool,
    use_ray: bool | None,
    num_cpus: int | None,
    placement_timeout: float,
    metrics_port: int | None,
) -> None:
    """Run an AgentRLJob manifest on this machine: local sandboxes, the CPU engine and the
    torch trainer, with held-out pass@1 measured before and after."""
    from agentrl.local.runner import RunOptions, load_manifest
    from agentrl.trainer.warm_start import WarmStartDataError

    console = Console(stderr=True)
    try:
        job = load_manifest(file)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    if job.spec.trainer.backend != "torch" or job.spec.sandbox.provider != "local":
        raise click.ClickException(
            "agentrl run needs spec.trainer.backend: torch and spec.sandbox.provider: local "
            f"(got {job.spec.trainer.backend.value} and {job.spec.sandbox.provider.value})"
        )
    run_dir = (run_dir or Path(".agentrl") / "runs" / job.metadata.name).resolve()
    options = RunOptions(
        run_dir=run_dir,
        resume=resume,
        max_steps=max_steps,
        chaos_rate=chaos,
        eval_samples=eval_samples,
        skip_eval=skip_eval,
        seed=seed,
    )
    manifest = file.read_text(encoding="utf-8")
    if use_ray is None:
        try:
            import ray  # noqa: F401

            use_ray = True
        except ImportError:
            use_ray = False
    started = time.monotonic()
    try:
        if use_ray:
            out = _run_in_ray(
                manifest,
                options.model_dump_json(),
                quiet,
                console,
                num_cpus or os.cpu_count() or 2,
                placement_timeout,
                metrics_port,
            )
        else:
            out = _run_here(manifest, options.model_dump_json(), quiet, console, metrics_port)
    except KeyboardInterrupt:
        console.print("interrupted: the last finished step is checkpointed; --resume continues")
        raise SystemExit(130) from None
    except WarmStartDataError as exc:  # refused lines of spec.trainer.warmStart.dataset
        raise click.ClickException(str(exc)) from exc
    summary = out["summary"]
    if report_dir is not None:
        import shutil

        shutil.copytree(out["report_dir"], report_dir, dirs_exist_ok=True)
    click.echo(json.dumps(summary, indent=2, sort_keys=True))
    if not quiet:
        console.print(f"done in {time.monotonic() - started:.0f}s; run directory {run_dir}")
