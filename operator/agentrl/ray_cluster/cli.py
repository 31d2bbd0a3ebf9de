"""``agentrl ray join``: the rollout worker pods' command (``reconcile.rollout.worker_command``).

Callers: the CLI root (``agentrl.cli`` names ``agentrl.ray_cluster.cli:ray``).
"""

from __future__ import annotations

import json
import logging
import signal
import sys

import click

from agentrl.ray_cluster.node import NodeOffer, follow_head


def _head(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise click.BadParameter(f"{value!r} is not HOST:PORT")
    return host, int(port)


@click.group()
def ray() -> None:
    """This pod's Ray node."""


@ray.command()
@click.option(
    "--address", required=True, help="The job's Ray head, HOST:PORT (trainer pod 0, port 6379)."
)
@click.option("--num-cpus", type=click.IntRange(min=1), required=True, help="CPUs offered.")
@click.option("--num-gpus", type=click.IntRange(min=0), default=0, show_default=True)
@click.option(
    "--resources", default="{}", show_default=True, help="Custom resources offered, as JSON."
)
def join(address: str, num_cpus: int, num_gpus: int, resources: str) -> None:
    """Join the job's Ray head and follow it: wait until it is up, join it, and join the next
    head when it restarts; exit only when this node fails while its head is up."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    host, port = _head(address)
    try:
        custom = {str(k): float(v) for k, v in json.loads(resources).items()}
    except (ValueError, AttributeError) as exc:
        raise click.BadParameter(
            f"not a JSON object of numbers: {exc}", param_hint="--resources"
        ) from None
    offer = NodeOffer(cpu=num_cpus, gpu=num_gpus, custom=custom)
    # The kubelet stops the pod with SIGTERM: leave through follow_head's cleanup, which stops
    # this pod's Ray processes (they run in a process group of their own).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sys.exit(follow_head(host, offer, port=port))
