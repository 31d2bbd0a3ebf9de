"""`agentrl dev cluster` as a user drives it: up twice is safe, down leaves no process or port,
a port in use is reported at once, bad flags get clear errors."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentrl.devcluster import binaries
from agentrl.devcluster.cli import dev
from agentrl.devcluster.cluster import LocalCluster
from agentrl.devcluster.node import artifacts
from agentrl.devcluster.processes import port_free

LIFECYCLE_PORT = 25443  # below the ephemeral range (32768+): no outgoing connection holds it


def _invoke(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(dev, ["cluster", *args], catch_exceptions=False)


def test_bad_flags_name_the_flag_and_the_allowed_range() -> None:
    result = _invoke("up", "--gpu-nodes", "-1")
    assert result.exit_code == 2
    assert "--gpu-nodes" in result.output and "0<=x<=1000" in result.output
    result = _invoke("up", "--port", "80")
    assert result.exit_code == 2
    assert "--port" in result.output


def test_a_profile_file_with_a_typo_is_refused_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "profile.yaml"
    bad.write_text("gpu: {count: 1, gpuss: 8}\n")
    result = _invoke("up", "--name", "badprofile", "--profile", str(bad))
    assert result.exit_code == 1
    assert "gpu.gpuss" in result.output


def test_a_port_in_use_is_reported_not_hung_on() -> None:
    binaries.prepared()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 46443))
        sock.listen()
        started = time.monotonic()
        result = _invoke("up", "--name", "busyport", "--port", "46443")
        elapsed = time.monotonic() - started
    assert result.exit_code == 1
    assert "46443 (kube-apiserver" in result.output
    assert "--port" in result.output
    # reported before any component started: nothing was left running
    assert all(pid is None for pid in LocalCluster("busyport").running().values())
    assert elapsed < 60


@pytest.mark.apiserver
@pytest.mark.slow
# without the project's images (the session cluster holds those: two copies of ~13 GB filled
# CI's disk); the node's own images are imported and purged all the same
@pytest.mark.timeout(600)
def test_up_twice_is_safe_and_down_leaves_no_process_or_port() -> None:
    name = "lifecycle"
    try:
        first = _invoke(
            "up",
            "--name",
            name,
            "--port",
            str(LIFECYCLE_PORT),
            "--gpu-nodes",
            "1",
            "--cpu-nodes",
            "0",
            "--no-project-images",
        )
        assert first.exit_code == 0, first.output
        (real,) = LocalCluster(name).real_nodes()
        names = set(real.images())
        assert artifacts.PAUSE.name in names and artifacts.BUSYBOX.name in names
        assert not any(n.startswith("localhost/agentrl/") for n in names), names
        pids = LocalCluster(name).running()
        assert all(pids.values()), pids
        # without the project's images again: an up on a running node imports what it lacks
        second = _invoke(
            "up", "--name", name, "--gpu-nodes", "1", "--cpu-nodes", "0", "--no-project-images"
        )
        assert second.exit_code == 0, second.output
        assert "already running" in second.output
        assert LocalCluster(name).running() == pids  # the same processes, nothing restarted
        assert set(real.images()) == names  # and nothing imported
        status = _invoke("status", "--name", name)
        assert status.exit_code == 0 and "ready" in status.output
        # the default real node, with its processes
        assert "real node real-0: Ready" in status.output
        report = json.loads(_invoke("status", "--name", name, "--json").output)
        (node,) = report["real_nodes"]
        assert node["ready"] is True and node["registered_pod_cidr"] == "10.244.128.0/24"
        assert all(node["processes"].values())
        env = _invoke("env", "--name", name).output
        assert f"CONTAINERD_ADDRESS={node['containerd_socket']}" in env
    finally:
        down = _invoke("down", "--name", name, "--purge")
    assert down.exit_code == 0
    assert all(pid is None for pid in LocalCluster(name).running().values())
    assert not LocalCluster(name).real_nodes()  # purged with the state
    for port in range(LIFECYCLE_PORT, LIFECYCLE_PORT + 6):
        assert port_free(port), f"port {port} still taken after down"
    status = _invoke("status", "--name", name)
    assert status.exit_code == 3


def test_env_prints_kubeconfig_and_path_exports() -> None:
    binaries.prepared()
    result = _invoke("env", "--name", "envcheck")
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0].startswith("export KUBECONFIG=") and lines[0].endswith("envcheck/kubeconfig")
    assert lines[1].startswith("export PATH=")
