"""``agentrl operator``: run the operator against the current kubeconfig (or in-cluster)."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket

import click
from pydantic import ValidationError

from agentrl.controller.settings import OperatorSettings
from agentrl.reconcile.context import Images
from agentrl.reconcile.priority import PriorityClasses


def _priority(value: str) -> int:
    if value == "random":
        return random.SystemRandom().randint(1, 2**31 - 1)
    try:
        return int(value)
    except ValueError:
        raise click.BadParameter("an integer or 'random'", param_hint="--priority") from None


def peering_identity() -> str:
    """Who this operator is among its peers: the pod's name (its hostname) and process id.

    kopf's own default asks the password database for the user's name, and an image's numeric
    USER (65532 in ours, or the arbitrary uid some clusters assign) has no entry there: the
    operator then crashed at start with ``getpwuid(): uid not found``, on the first real node
    it ever ran on."""
    return f"{socket.gethostname()}/{os.getpid()}"


def priority_classes(**names: str | None) -> PriorityClasses:
    """The ``--*-priority-class`` options as :class:`PriorityClasses`; an empty name is none.
    A name Kubernetes would refuse fails here, naming the option."""
    try:
        return PriorityClasses(**{kind: name or None for kind, name in names.items()})
    except ValidationError as exc:
        error = exc.errors()[0]
        kind = str(error["loc"][0])
        option = f"--{_OPTION_OF[kind]}-priority-class"
        raise click.BadParameter(
            f"{names[kind]!r} is not a PriorityClass name (a DNS subdomain: lower-case "
            "letters, digits, '-' and '.', at most 253 characters)",
            param_hint=option,
        ) from None


#: The option name's prefix per :class:`PriorityClasses` field.
_OPTION_OF = {
    "trainer": "trainer",
    "engines": "engine",
    "rollout": "rollout",
    "sandboxes": "sandbox",
}


@click.command()
@click.option(
    "--namespace",
    "namespaces",
    multiple=True,
    help="Watch this namespace (repeatable). None: every namespace.",
)
@click.option(
    "--standalone/--peering",
    "standalone",
    default=True,
    show_default=True,
    help="Run alone, or coordinate with standby replicas through kopf peering.",
)
@click.option(
    "--peering-name",
    default="agentrl",
    show_default=True,
    help="Peering object name when --peering.",
)
@click.option(
    "--priority",
    default="0",
    show_default=True,
    help="Peering priority: the highest running peer reconciles, the others stand by. "
    "'random' draws one at start (replicas of one Deployment).",
)
@click.option(
    "--workers",
    type=click.IntRange(1, 256),
    default=8,
    show_default=True,
    help="Jobs reconciled concurrently.",
)
@click.option(
    "--resync-seconds",
    type=click.FloatRange(1, 86400),
    default=60.0,
    show_default=True,
    help="Reconcile every job at least this often.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=8080,
    show_default=True,
    help="Prometheus /metrics port (0 disables).",
)
@click.option(
    "--health-port",
    type=click.IntRange(0, 65535),
    default=8081,
    show_default=True,
    help="Liveness endpoint port, /healthz (0 disables).",
)
@click.option(
    "--rollout-image",
    default=None,
    help="Rollout worker image [default: the trainer image of each job].",
)
@click.option(
    "--watchdog-image",
    default=None,
    help="Engine watchdog image [default: the engine image of each job].",
)
@click.option(
    "--trainer-priority-class",
    default=None,
    help="PriorityClass of trainer pods whose job sets no spec.trainer.priorityClassName.",
)
@click.option(
    "--engine-priority-class",
    default=None,
    help="PriorityClass of engine pods whose job sets no spec.inference.priorityClassName.",
)
@click.option(
    "--rollout-priority-class",
    default=None,
    help="PriorityClass of rollout worker pods whose job sets no spec.rollout.priorityClassName.",
)
@click.option(
    "--sandbox-priority-class",
    default=None,
    help="PriorityClass of sandbox pods whose job sets no spec.sandbox.priorityClassName.",
)
@click.option(
    "--test-synthetic-engine-metrics",
    "synthetic_engine_metrics",
    is_flag=True,
    hidden=True,
    help="Test only: let a job's agentrl.dev/synthetic-engine-metrics annotation stand in for "
    "the engines' /metrics (simulated engines serve none). Never in production.",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Log format (json for log collectors).",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning"]),
    default="info",
    show_default=True,
)
def operator(
    namespaces: tuple[str, ...],
    standalone: bool,
    peering_name: str,
    priority: str,
    workers: int,
    resync_seconds: float,
    metrics_port: int,
    health_port: int,
    rollout_image: str | None,
    watchdog_image: str | None,
    trainer_priority_class: str | None,
    engine_priority_class: str | None,
    rollout_priority_class: str | None,
    sandbox_priority_class: str | None,
    synthetic_engine_metrics: bool,
    log_format: str,
    log_level: str,
) -> None:
    """Run the AgentRLJob operator (kopf) until interrupted."""
    import kopf

    from agentrl.controller.handlers import register

    kopf.configure(
        verbose=log_level == "debug",
        debug=False,
        log_format=kopf.LogFormat.JSON if log_format == "json" else kopf.LogFormat.FULL,
    )
    logging.getLogger().setLevel(log_level.upper())
    # one line per HTTP request is noise at info level; the request counter has the figures
    for noisy in ("httpx", "httpx2", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    settings = OperatorSettings(
        namespaces=tuple(namespaces),
        images=Images(rollout=rollout_image, watchdog=watchdog_image),
        priority_classes=priority_classes(
            trainer=trainer_priority_class,
            engines=engine_priority_class,
            rollout=rollout_priority_class,
            sandboxes=sandbox_priority_class,
        ),
        workers=workers,
        resync_seconds=resync_seconds,
        metrics_port=metrics_port,
        synthetic_engine_metrics=synthetic_engine_metrics,
    )
    if synthetic_engine_metrics:
        logging.getLogger("agentrl.operator").warning(
            "--test-synthetic-engine-metrics: jobs' synthetic-engine-metrics annotations stand "
            "in for the engines' /metrics (a test flag; never in production)"
        )
    registry, _ = register(settings)
    asyncio.run(
        kopf.operator(
            registry=registry,
            identity=peering_identity(),
            standalone=standalone,
            peering_name=None if standalone else peering_name,
            priority=_priority(priority),
            clusterwide=not namespaces,
            namespaces=list(namespaces),
            liveness_endpoint=f"http://0.0.0.0:{health_port}/healthz" if health_port else None,
        )
    )
