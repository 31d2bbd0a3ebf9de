"""The engine pod's two containers as the operator renders them for a tiny-engine job
(``examples/quickstart-cluster.yaml``), run as processes on this machine: the watchdog, started
with no argument but the spec it reads from the job's ConfigMap, finds the tiny engine's
process, probes it and turns its readiness (the pod's readiness probe, ``/readyz``) to 200.
Both run in a PID namespace of their own, as the pod's containers share one
(``shareProcessNamespace``), so engines of other pods on this machine are not in sight.

On the local cluster's real node the watchdog looked for SGLang's process instead — its
``--engine-cmdline`` option defaulted to SGLang's module and overrode the spec's engine server
— so tiny engine pods were never Ready. Only the ports and paths that are container-specific
are replaced here (a free port, files under tmp)."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from agentrl.api import wire
from agentrl.api.validation import load_job
from agentrl.api.wire import CONFIG_JOB_KEY
from agentrl.reconcile import engine
from agentrl.reconcile.configmap import config_map
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.policies.suspend import workload_scale

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart-cluster.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _with(args: list[str], flag: str, value: str) -> list[str]:
    """``args`` with the value after ``flag`` replaced."""
    out = list(args)
    out[out.index(flag) + 1] = value
    return out


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_tiny_engine_pods_watchdog_finds_its_engine_and_reports_ready(tmp_path: Path) -> None:
    job = load_job(EXAMPLE.read_text())
    ctx = BuildContext.for_job(job)
    pod = engine.engine_pod_spec(job, ctx)
    containers = {c["name"]: c for c in pod["containers"]}
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(config_map(job, ctx, workload_scale(job))["data"][CONFIG_JOB_KEY])

    engine_port, watchdog_port = _free_port(), _free_port()
    log_file = tmp_path / "engine.log"
    served = containers["engine"]
    engine_argv = [
        *served["command"],
        *_with(_with(served["args"], "--port", str(engine_port)), "--log-file", str(log_file)),
    ]
    watchdog = containers["watchdog"]
    assert "args" not in watchdog  # the pod gives the watchdog nothing but its spec
    watchdog_argv = [
        *watchdog["command"],
        "--engine-url", f"http://127.0.0.1:{engine_port}",
        "--log-file", str(log_file),
        "--weights-file", str(tmp_path / "current-weights.json"),
        "--port", str(watchdog_port),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("POD_NAME", "POD_NAMESPACE")} | {
        wire.SPEC_ENV: str(spec_file)
    }
    # the pod's shared PID namespace: unshare as root, in a user namespace of its own otherwise
    user_ns = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    script = (
        f"{shlex.join(engine_argv)} >{tmp_path / 'engine.out'} 2>&1 & "
        f"exec {shlex.join(watchdog_argv)} >{tmp_path / 'watchdog.out'} 2>&1"
    )
    pod_ns = subprocess.Popen(
        ["unshare", *user_ns, "--pid", "--fork", "--mount-proc", "sh", "-c", script],
        env=env,
        start_new_session=True,
    )
    try:
        ready = f"http://127.0.0.1:{watchdog_port}{wire.WATCHDOG_READY_PATH}"
        deadline = time.monotonic() + 120
        out = tmp_path / "watchdog.out"
        while _status(ready) != 200:
            assert pod_ns.poll() is None, out.read_text()
            assert time.monotonic() < deadline, out.read_text()[-3000:]
            time.sleep(0.5)
        # in the pod's PID namespace the engine started right after the watchdog's shell: pid 2
        assert "engine process 2 started" in out.read_text()
    finally:
        if pod_ns.poll() is None:
            os.killpg(pod_ns.pid, signal.SIGTERM)
            try:
                pod_ns.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(pod_ns.pid, signal.SIGKILL)
                pod_ns.wait()
