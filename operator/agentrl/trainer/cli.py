"""``agentrl trainer``: the trainer pod's entry point (the ENTRYPOINT of ``images/rocm-trainer``).

Parses the options and the environment the operator sets (:class:`~agentrl.trainer.config.
TrainerEnv`), reads the mounted configuration (:func:`~agentrl.trainer.config.load_config`) and
hands over to :mod:`agentrl.trainer.pod`, which runs this pod's processes (see there for what
one pod does); the run itself is wired by :mod:`agentrl.trainer.assembly`, as for
``agentrl run``.

``--dry-run`` builds everything of the run on this process without starting ranks, contacting
engines or training, then prints what it built as JSON.

Callers: :mod:`agentrl.cli` (the ``trainer`` verb).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import click

from agentrl.api.wire import WireSkewError
from agentrl.trainer.config import DEFAULT_PLACEMENT_TIMEOUT_S, TrainerEnv, load_config


@click.command("trainer")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Resolved manifest (default: $AGENTRL_CONFIG, else the ConfigMap mount).",
)
@click.option("--dry-run", is_flag=True, help="Build everything, print it as JSON, and exit.")
@click.option(
    "--ray/--no-ray",
    "use_ray",
    default=None,
    help="Place the driver and the ranks with Ray (default: when ray is installed); --no-ray "
    "starts one rank process per GPU of this pod.",
)
@click.option(
    "--placement-timeout",
    type=click.FloatRange(min=1.0),
    default=DEFAULT_PLACEMENT_TIMEOUT_S,
    show_default=True,
    help="Seconds for the trainer pods to join Ray and the placement group to be ready.",
)
def trainer(
    config_path: Path | None, dry_run: bool, use_ray: bool | None, placement_timeout: float
) -> None:
    """Run the GRPO trainer of the job (the trainer pod's entry point)."""
    from agentrl.trainer import pod

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    env = TrainerEnv.from_environ()
    if config_path is not None:
        env = env.model_copy(update={"config": config_path})
    try:
        config = load_config(env)
    except WireSkewError as exc:
        # One line, the log's last: the termination message the operator lifts into the
        # job's WireCompatible condition (and the Failed one: no restart can read it either).
        raise click.ClickException(str(exc)) from exc
    if dry_run:
        built = pod.dry_run(config)
        click.echo(json.dumps(built.model_dump(), indent=2))
        return
    sys.exit(pod.run_trainer(config, use_ray=use_ray, placement_timeout=placement_timeout))
