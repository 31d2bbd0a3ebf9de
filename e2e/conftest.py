"""Fixtures of the end-to-end suites: the operator as a real process, and storage.

The local control plane has no volume provisioner, so :func:`storage` creates, per test,
PersistentVolumes the PV controller (kube-controller-manager) binds to the job's claims, and the
``models`` claim the examples mount.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentrl.devcluster.testing import ClusterHandle, Kubectl, wait_for


@dataclass
class OperatorProcess:
    """``agentrl operator`` running as a subprocess against the test cluster."""

    namespace: str
    log: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    metrics_port: int = 0
    health_port: int = 0

    def start(self) -> None:
        out = self.log.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentrl.cli",
                "operator",
                "--namespace",
                self.namespace,
                "--metrics-port",
                str(self.metrics_port),
                "--health-port",
                str(self.health_port),
                "--resync-seconds",
                "5",
                # simulated engines serve no /metrics: the autoscaler test feeds its load
                # through the job's annotation, which only this test flag lets through
                "--test-synthetic-engine-metrics",
                "--log-level",
                "info",
            ],
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()

    def kill(self) -> None:
        """SIGKILL: no cleanup, as when a node dies under the operator."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def text(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def operator(
    cluster: ClusterHandle, namespace: str, crd_installed: None, tmp_path: Path
) -> Iterator[OperatorProcess]:
    env = {**cluster.env(), "PYTHONUNBUFFERED": "1"}
    op = OperatorProcess(namespace, tmp_path / "operator.log", env)
    op.start()
    yield op
    op.stop()
    if os.environ.get("AGENTRL_E2E_SHOW_LOGS"):
        print(op.text()[-5000:])


@pytest.fixture
def storage(cluster: ClusterHandle, namespace: str) -> Iterator[None]:
    """PersistentVolumes for the job's claims plus a bound ``models`` claim."""
    admin = cluster.kubectl()
    tag = uuid.uuid4().hex[:6]
    pvs = []
    for i in range(4):
        name = f"pv-{namespace}-{tag}-{i}"
        pvs.append(name)
        admin.apply(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": name, "labels": {"agentrl-test": namespace}},
                "spec": {
                    "capacity": {"storage": "10Ti"},
                    "accessModes": ["ReadWriteMany", "ReadWriteOnce", "ReadOnlyMany"],
                    "persistentVolumeReclaimPolicy": "Delete",
                    "hostPath": {"path": f"/tmp/agentrl-test/{name}"},
                },
            }
        )
    cluster.kubectl(namespace).apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "models"},
            "spec": {
                "accessModes": ["ReadOnlyMany"],
                "storageClassName": "",
                "resources": {"requests": {"storage": "1Ti"}},
            },
        }
    )
    yield
    admin.run("delete", "pv", *pvs, "--wait=false", check=False)


def condition(kubectl: Kubectl, name: str, type_: str) -> dict[str, str] | None:
    """The condition ``type_`` of AgentRLJob ``name`` (None until written)."""
    obj = kubectl.json("get", "arj", name)
    for cond in (obj.get("status") or {}).get("conditions", []):
        if cond["type"] == type_:
            return dict(cond)
    return None


def wait_condition(
    kubectl: Kubectl, name: str, type_: str, status: str, timeout: float = 90
) -> dict[str, str]:
    def check() -> dict[str, str] | None:
        cond = condition(kubectl, name, type_)
        return cond if cond and cond["status"] == status else None

    result: dict[str, str] = wait_for(check, timeout=timeout, what=f"{name} {type_}={status}")
    return result


def settle(seconds: float) -> None:
    time.sleep(seconds)
