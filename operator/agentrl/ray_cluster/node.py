"""Starting, joining and following a Ray head from a pod.

Callers: ``agentrl.trainer.pod`` (pod 0's head, the other trainer pods' :func:`join_head`),
``agentrl.ray_cluster.cli`` (``agentrl ray join``: the rollout worker pods' command, which
:func:`follow_head`).

Why a rollout worker needs more than ``ray start --block --address=HEAD``: its Deployment starts
with the job, before the trainer's pod 0 exists, so the head's DNS name does not resolve yet and
``ray start`` gives up at once (exit 1: a crash loop until the trainer is up). And a trainer pod
that restarts (a deleted pod, a retried Job attempt) starts a new head with a new cluster id at
the same name: the old node cannot rejoin it and dies only once its GCS reconnect timeout ends.
So a rollout worker waits for the head, joins it, and when the head goes away or is replaced
(its name resolves to another address) it stops its node and joins the next head; the pod keeps
running throughout. KubeRay does the same with its ``wait-gcs-ready`` init container and worker
restarts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

#: Seconds between a node's checks that the head is still there (and still the same one).
HEAD_POLL_SECONDS = 5.0
#: A joined node that exits sooner than this while its head is still there failed: the pod
#: exits with its status (the kubelet restarts it with back-off) instead of rejoining at once.
MIN_HEALTHY_NODE_SECONDS = 30.0
#: How often a waiting node says it is still waiting.
WAIT_LOG_SECONDS = 60.0
#: Ray's drain on SIGTERM (``RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S``, 30 s by default), off unless
#: the pod sets it: it lets Ray Serve proxies quiesce and then waits for the raylet to go idle. On
#: our nodes it can only wait: :func:`stop_ray_node` stops a head together with its GCS, which the
#: drain asks (it times out), and a node holding actors (the trainer's ranks, a rollout worker)
#: never goes idle. Measured: a head took 33 s to stop with the drain, 3 s without.
DRAIN_ENV = {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}


@dataclass(frozen=True)
class NodeOffer:
    """What a Ray node offers: whole CPUs, GPUs and custom resources (Ray's spelling)."""

    cpu: int
    gpu: int = 0
    custom: Mapping[str, float] = field(default_factory=dict)

    def args(self) -> list[str]:
        """``ray start`` flags for this offer."""
        return [
            f"--num-cpus={self.cpu}",
            f"--num-gpus={self.gpu}",
            f"--resources={json.dumps(dict(self.custom), sort_keys=True)}",
        ]


def agree_on_ray_auth(environ: dict[str, str] | None = None) -> str | None:
    """Make the Ray head, the nodes that join it and the driver agree on authentication, before
    any of them starts: token mode whenever this pod has a token — ``RAY_AUTH_TOKEN`` or
    ``RAY_AUTH_TOKEN_PATH`` (on a cluster: one Secret shared by the trainer and rollout pods),
    or Ray's default token file — and Ray's default (none) otherwise. Left alone when
    ``RAY_AUTH_MODE`` is set. Returns the mode now in effect (None: Ray's default).

    Without this, a head started where a token file exists turns token mode on while a client
    that was given no mode connects without the token and is refused."""
    env = os.environ if environ is None else environ
    if "RAY_AUTH_MODE" not in env and (
        env.get("RAY_AUTH_TOKEN")
        or env.get("RAY_AUTH_TOKEN_PATH")
        or (Path.home() / ".ray" / "auth_token").is_file()
    ):
        env["RAY_AUTH_MODE"] = "token"
        if environ is None and "ray" in sys.modules:
            # Ray reads the mode once per process: refresh it the way Ray does when it turns
            # token mode on for a local cluster.
            from ray._raylet import Config

            Config.initialize("")
    return env.get("RAY_AUTH_MODE")


def reachable(host: str, port: int) -> bool:
    """Whether something accepts TCP connections at ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=HEAD_POLL_SECONDS):
            return True
    except OSError:
        return False


def resolve(host: str) -> str | None:
    """The address ``host`` resolves to now (None while it does not resolve)."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        return None


def wait_reachable(
    host: str,
    port: int,
    *,
    timeout_s: float | None,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Poll :func:`reachable` for up to ``timeout_s`` seconds (None: until it is), saying every
    :data:`WAIT_LOG_SECONDS` that it is still waiting."""
    start = time.monotonic()
    next_log = start + WAIT_LOG_SECONDS
    while not reachable(host, port):
        now = time.monotonic()
        if timeout_s is not None and now - start > timeout_s:
            return False
        if now >= next_log:
            log.info("waiting for the Ray head %s:%d (%.0f s so far)", host, port, now - start)
            next_log = now + WAIT_LOG_SECONDS
        sleep(min(HEAD_POLL_SECONDS, 0.5))
    return True


def start_ray_node(
    offer: NodeOffer, *, port: int, head: str | None = None, temp_dir: str | None = None
) -> subprocess.Popen[bytes]:
    """``ray start --block`` offering ``offer``: the head listening on ``port`` when ``head``
    is None, else a node joining the head at ``head:port``. It runs in its own process group,
    so :func:`stop_ray_node` stops exactly the Ray processes started here.

    ``temp_dir``: Ray's session directory (default ``/tmp/ray``, where the head also records
    itself as the machine's default cluster for ``ray.init()``; a pod has its own ``/tmp``)."""
    where = (
        [f"--address={head}:{port}"]
        if head
        else ["--head", f"--port={port}", "--include-dashboard=false"]
    )
    return subprocess.Popen(
        [
            "ray",
            "start",
            "--block",
            *where,
            *offer.args(),
            "--disable-usage-stats",
            *([f"--temp-dir={temp_dir}"] if temp_dir else []),
        ],
        env={**DRAIN_ENV, **os.environ},
        start_new_session=True,
    )


def stop_ray_node(node: subprocess.Popen[bytes], *, grace_seconds: float = 30.0) -> None:
    """Stop a node of :func:`start_ray_node` and every process it started (its group)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(node.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        node.wait(timeout=grace_seconds)
    # The raylet, the GCS and the workers share the group and may outlive ``ray start``.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(node.pid, signal.SIGKILL)
    node.wait()


def _run_joined(
    node: subprocess.Popen[bytes],
    host: str,
    port: int,
    address: str | None,
    stop: Callable[[], bool] = lambda: False,
) -> tuple[str, float]:
    """Watch a joined node until it exits, the head goes away, or the head's name resolves to
    another address (a new head). Returns why it stopped and how long it ran."""
    started = time.monotonic()
    while True:
        if node.poll() is not None:
            return "exited", time.monotonic() - started
        if stop():
            return "stopped", time.monotonic() - started
        time.sleep(HEAD_POLL_SECONDS)
        if not reachable(host, port):
            return "head-gone", time.monotonic() - started
        now = resolve(host)
        if address is not None and now is not None and now != address:
            return "head-replaced", time.monotonic() - started


def join_head(
    host: str,
    offer: NodeOffer,
    *,
    port: int,
    timeout_s: float | None,
    temp_dir: str | None = None,
) -> int:
    """Be a Ray node of the head at ``host:port`` until the head goes away — the job is over
    (0) — or this node's Ray fails while the head is still there (its status). 1 when the head
    did not come up within ``timeout_s``. For the trainer pods other than 0."""
    agree_on_ray_auth()
    if not wait_reachable(host, port, timeout_s=timeout_s):
        log.error("the Ray head %s:%d did not come up within %gs", host, port, timeout_s or 0)
        return 1
    node = start_ray_node(offer, port=port, head=host, temp_dir=temp_dir)
    try:
        why, _ = _run_joined(node, host, port, resolve(host))
        if why == "exited" and reachable(host, port):
            return int(node.returncode or 1)
        return 0
    finally:
        stop_ray_node(node)


def follow_head(
    host: str,
    offer: NodeOffer,
    *,
    port: int,
    temp_dir: str | None = None,
    stop: Callable[[], bool] = lambda: False,
) -> int:
    """Be a Ray node of whichever head runs at ``host:port``, for as long as the pod lives: wait
    for the head (without a limit: the trainer's pods may be waiting for GPUs, and a waiting
    rollout pod costs nothing), join it, and when it goes away or is replaced by a new head,
    stop this node and join the next one. Returns only when this node fails while its head is
    still there (the node's status, so the kubelet restarts the pod with back-off) or when
    ``stop()`` says so (0; tests)."""
    agree_on_ray_auth()
    joins = 0
    while not stop():
        wait_reachable(host, port, timeout_s=None)
        address = resolve(host)
        joins += 1
        log.info("joining the Ray head %s:%d at %s (join %d)", host, port, address, joins)
        node = start_ray_node(offer, port=port, head=host, temp_dir=temp_dir)
        try:
            why, ran = _run_joined(node, host, port, address, stop)
        finally:
            stop_ray_node(node)
        log.info("left the Ray head %s after %.0f s: %s", address, ran, why)
        if why == "exited" and ran < MIN_HEALTHY_NODE_SECONDS and reachable(host, port):
            code = node.returncode or 1
            log.error("this Ray node exited with status %d while its head was up", code)
            return int(code)
    return 0


def init_ray(*, num_cpus: int, address: str | None = None) -> None:
    """Join the Ray cluster at ``address`` (the trainer's head), or start a local one with an
    explicit CPU count (never Ray's guess of the machine) and no dashboard."""
    import ray

    if ray.is_initialized():
        return
    if address is not None:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
        return
    ray.init(
        num_cpus=num_cpus,
        include_dashboard=False,
        log_to_driver=False,
        # The object store only carries task lists and trajectories: a small one leaves the
        # memory to the sandboxes.
        object_store_memory=100 * 1024 * 1024,
    )
