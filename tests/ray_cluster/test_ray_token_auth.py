"""Ray's token authentication with the environment the operator gives a job's pods, against
real Ray processes: a rollout worker node joins the trainer's head when both resolve
``RAY_AUTH_TOKEN`` from the job's Secret (as the kubelet does), and a client with another token
or none is refused by the head."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from agentrl.ray_cluster.node import NodeOffer, start_ray_node, stop_ray_node
from agentrl.reconcile import ray_auth, rollout, trainer
from agentrl.reconcile.context import BuildContext
from tests.factories import make_job


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _resolved(env: list[dict[str, Any]], secret: dict[str, Any]) -> dict[str, str]:
    """The RAY_AUTH_* variables of a container as the kubelet sets them: values as given,
    secretKeyRefs read from ``secret`` (the only Secret they may name)."""
    out = {}
    for var in env:
        if not var["name"].startswith("RAY_AUTH_"):
            continue
        if "value" in var:
            out[var["name"]] = var["value"]
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            assert ref["name"] == secret["metadata"]["name"]
            out[var["name"]] = secret["stringData"][ref["key"]]
    return out


def _connect(address: str, env: dict[str, str], tmp: Path) -> subprocess.CompletedProcess[str]:
    """A driver process: ray.init against ``address``, printing the alive nodes."""
    code = (
        "import ray\n"
        f"ray.init(address={address!r}, log_to_driver=False)\n"
        "print('alive', sum(1 for n in ray.nodes() if n['Alive']))\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, **env, "HOME": str(tmp)},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_pods_with_the_jobs_token_form_one_ray_cluster_and_others_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = make_job("swe").obj()
    ctx = BuildContext.for_job(job)
    secret = ray_auth.ray_token_secret(job, ctx, "a-token-of-the-job-0123456789abcdef")
    head_env = _resolved(trainer.trainer_env(job, ctx, attempt=0), secret)
    worker_pod = rollout.deployment(job, ctx, replicas=1)["spec"]["template"]["spec"]
    worker_env = _resolved(worker_pod["containers"][0]["env"], secret)
    assert head_env == worker_env == {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": "a-token-of-the-job-0123456789abcdef",
    }

    port = _free_port()
    address = f"127.0.0.1:{port}"
    for key in [k for k in os.environ if k.startswith("RAY_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ray/auth_token of the machine's
    for key, value in head_env.items():
        monkeypatch.setenv(key, value)
    # Ray's socket paths must stay under 108 bytes: a short directory, not pytest's tmp_path
    short = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))
    head = start_ray_node(NodeOffer(cpu=1), port=port, temp_dir=str(short / "h"))
    node = None
    try:
        deadline = time.monotonic() + 90
        while _connect(address, head_env, tmp_path).returncode != 0:
            assert time.monotonic() < deadline, "the head did not come up"
            time.sleep(2)
        # the rollout worker pod's `ray start --address` with its own resolved environment
        for key, value in worker_env.items():
            monkeypatch.setenv(key, value)
        node = start_ray_node(
            NodeOffer(cpu=1), port=port, head="127.0.0.1", temp_dir=str(short / "w")
        )
        deadline = time.monotonic() + 90
        while "alive 2" not in _connect(address, head_env, tmp_path).stdout:
            assert time.monotonic() < deadline, "the worker node did not join the head"
            time.sleep(2)

        # the head answers a refused token at once: two tries (Ray's own 20, a second apart, are
        # for a head still starting; this one has just answered), each refused for its token
        refused = {"RAY_NUM_REDIS_GET_RETRIES": "2"}
        wrong = _connect(
            address, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "other", **refused}, tmp_path
        )
        assert wrong.returncode != 0
        assert "InvalidAuthToken" in wrong.stderr, wrong.stderr[-2000:]
        without = _connect(address, refused, tmp_path)
        assert without.returncode != 0
        assert "InvalidAuthToken" in without.stderr, without.stderr[-2000:]
    finally:
        if node is not None:
            stop_ray_node(node)
        stop_ray_node(head)
        shutil.rmtree(short, ignore_errors=True)
