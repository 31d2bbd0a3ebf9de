"""``agentrl engine``: launch SGLang, run the GPU watchdog sidecar, classify logs, serve the
tiny CPU engine.

The ``engine`` group is named in ``agentrl.cli.COMMANDS``. Its sub-commands are imported when
they run (``serve-tiny`` needs torch; the watchdog needs lightkube only in a cluster), so
``agentrl engine watchdog classify`` stays light.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import shlex
import sys
from pathlib import Path
from typing import TextIO

import click

from agentrl.api import engine_flags, wire

#: Sub-commands implemented elsewhere, imported when they run ("module:attribute").
LAZY_COMMANDS = {"serve-tiny": "agentrl.tiny.server:serve_tiny"}
#: Their one-line help, shown without importing them (serve-tiny imports torch).
LAZY_HELP = {"serve-tiny": "Serve the tiny CPU policy behind SGLang's HTTP API."}


class _EngineGroup(click.Group):
    """The ``engine`` group: :data:`LAZY_COMMANDS` are imported on first use. (The runtime
    layer may not import ``agentrl.cli``, so this is not the root's ``LazyGroup``.)"""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(LAZY_COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in LAZY_COMMANDS:
            return super().get_command(ctx, cmd_name)
        module_name, attribute = LAZY_COMMANDS[cmd_name].split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            raise click.ClickException(
                f"'agentrl engine {cmd_name}' needs {exc.name}, which is not installed; "
                "install the extra it belongs to: pip install 'agentrl[training]'"
            ) from exc
        command = getattr(module, attribute)
        assert isinstance(command, click.Command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = None if name in LAZY_COMMANDS else self.get_command(ctx, name)
            rows.append(
                (name, LAZY_HELP.get(name, "") if command is None else command.get_short_help_str())
            )
        with formatter.section("Commands"):
            formatter.write_dl(rows)


_SPEC_OPTION = click.option(
    "--spec",
    "spec_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=wire.SPEC_FILE,
    show_default=True,
    envvar=wire.SPEC_ENV,
    help=f"The resolved AgentRLJob YAML (the ConfigMap the operator mounts). "
    f"Env: {wire.SPEC_ENV}.",
)

_LOG_FILE_OPTION = click.option(
    "--log-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=wire.ENGINE_LOG_FILE,
    show_default=True,
    envvar="AGENTRL_ENGINE_LOG",
    help="The engine's log: launch tees SGLang's output into it, the watchdog tails it. "
    "Env: AGENTRL_ENGINE_LOG.",
)


@click.group(cls=_EngineGroup, name="engine")
def engine() -> None:
    """Engine tools: launch SGLang, the GPU watchdog, the tiny CPU engine."""


@engine.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@_SPEC_OPTION
@click.option(
    "--engine-port",
    "port",
    type=int,
    default=wire.ENGINE_PORT,
    show_default=True,
    help="SGLang's --port when the flags are built from --spec.",
)
@_LOG_FILE_OPTION
@click.option(
    "--log-max-bytes",
    type=click.IntRange(min=1),
    default=256 * 1024 * 1024,
    show_default=True,
    help="A log larger than this at launch is moved to <log-file>.1.",
)
@click.option("--dry-run", is_flag=True, help="Print the environment and command; do not run.")
@click.argument("sglang_args", nargs=-1, type=click.UNPROCESSED)
def launch(
    spec_path: Path,
    port: int,
    log_file: Path,
    log_max_bytes: int,
    dry_run: bool,
    sglang_args: tuple[str, ...],
) -> None:
    """Exec SGLang with graphs on and the ROCm environment set.

    Without SGLANG_ARGS the flags are built from the job in --spec; the operator passes them
    as SGLANG_ARGS (so the pod shows them). Everything from the first option this command
    does not know is passed to SGLang. Graph-disabling flags are refused either way.
    """
    from agentrl.engine import launch as launching

    try:
        job = launching.load_job(spec_path) if spec_path.exists() or not sglang_args else None
        command, env = launching.prepare(job, port, list(sglang_args))
    except engine_flags.EngineFlagError as exc:
        click.echo(f"agentrl engine launch: {exc}", err=True)
        sys.exit(launching.EXIT_REFUSED)
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"cannot read the job spec: {exc}") from exc
    if dry_run:
        extra = engine_flags.rocm_env(job) if job is not None else {}
        for key, value in sorted(extra.items()):
            click.echo(f"{key}={shlex.quote(value)}")
        click.echo(shlex.join(command))
        return
    launching.rotate_log(log_file, log_max_bytes)
    launching.exec_engine(command, env, log_file)


@engine.group(invoke_without_command=True)
@_SPEC_OPTION
@click.option("--engine-url", default=f"http://127.0.0.1:{wire.ENGINE_PORT}")
@_LOG_FILE_OPTION
@click.option(
    "--engine-cmdline",
    default=None,
    help="Substring of the engine process's command line (default: from spec.inference.server: "
    f"{wire.SGLANG_MODULE!r} for sglang, {wire.TINY_CMDLINE!r} for tiny).",
)
@click.option(
    "--weights-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=wire.CURRENT_WEIGHTS_FILE,
    show_default=True,
    help="The trainer's current-weights record, re-pushed after a restart.",
)
@click.option("--port", type=int, default=wire.WATCHDOG_PORT, show_default=True)
@click.option("--pod-name", envvar="POD_NAME", help="This pod (annotated). Env: POD_NAME.")
@click.option("--namespace", envvar="POD_NAMESPACE", help="Its namespace. Env: POD_NAMESPACE.")
@click.option("--job-uid", envvar="AGENTRL_JOB_UID", help="The job's UID (Events). Env.")
@click.option("--poll-interval", type=float, default=0.5, show_default=True)
@click.option("--stop-grace", type=float, default=10.0, show_default=True)
@click.pass_context
def watchdog(
    ctx: click.Context,
    spec_path: Path,
    engine_url: str,
    log_file: Path,
    engine_cmdline: str | None,
    weights_file: Path,
    port: int,
    pod_name: str | None,
    namespace: str | None,
    job_uid: str | None,
    poll_interval: float,
    stop_grace: float,
) -> None:
    """Run the GPU watchdog sidecar next to the engine (see docs/engine.md)."""
    if ctx.invoked_subcommand is not None:
        return
    from agentrl.engine import launch as launching
    from agentrl.engine import watchdog as watching

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        job = launching.load_job(spec_path)
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"cannot read the job spec: {exc}") from exc
    overrides: dict[str, object] = {
        "engine_url": engine_url,
        "log_file": log_file,
        "weights_file": weights_file,
        "poll_interval_seconds": poll_interval,
        "stop_grace_seconds": stop_grace,
    }
    if engine_cmdline is not None:  # else the spec's engine server decides what to look for
        overrides["engine_cmdline"] = engine_cmdline
    config = watching.WatchdogConfig.from_job(job, **overrides)
    asyncio.run(
        watching.serve(
            config,
            port=port,
            job_name=job.metadata.name,
            pod_name=pod_name,
            namespace=namespace or job.metadata.namespace,
            job_uid=job_uid,
        )
    )


@watchdog.command()
@click.argument("file", type=click.File("r", encoding="utf-8", errors="replace"), default="-")
def classify(file: TextIO) -> None:
    """Print `LINE_NUMBER SIGNATURE_NAME` for each fault line of FILE (stdin without FILE)."""
    from agentrl.engine import faults

    for match in faults.classify_lines(file):
        click.echo(f"{match.line_number} {match.signature.name}")
