"""Test helpers for a real Kubernetes API: a cluster for a test session and a kubectl wrapper.

The pytest fixtures in the repository's ``conftest.py`` are thin wrappers over these, and users'
own tests can use them the same way (as ``kopf.testing`` serves kopf users):

- :func:`session_cluster` yields a kubeconfig: the local control plane (started for the session
  and stopped after it) with one real node (``AGENTRL_TEST_REAL_NODES``, default 1), or an
  existing cluster when ``AGENTRL_TEST_KUBECONFIG`` names one;
- :class:`Kubectl` runs the real ``kubectl`` against it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.devcluster import binaries
from agentrl.devcluster.cluster import ClusterError, LocalCluster
from agentrl.devcluster.profile import ClusterProfile

#: Name and base port of the cluster the test suite starts (apart from ``agentrl dev``'s 16443).
TEST_CLUSTER_NAME = "pytest"
TEST_CLUSTER_PORT = 26443


@dataclass
class ClusterHandle:
    """What a test session gets: a kubeconfig and the binaries to talk to it."""

    kubeconfig: Path
    bins: binaries.Binaries
    local: LocalCluster | None = None
    """The local cluster when the session started one (None for an existing cluster)."""

    def kubectl(self, namespace: str | None = None) -> Kubectl:
        return Kubectl(self.bins.kubectl, self.kubeconfig, namespace)

    def env(self) -> dict[str, str]:
        """Environment for subprocesses (operator, helm) aimed at this cluster."""
        path = ":".join([*self.bins.bin_dirs(), os.environ.get("PATH", "")])
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PATH": path}


@contextmanager
def session_cluster(profile: ClusterProfile | None = None) -> Iterator[ClusterHandle]:
    """A cluster for a test session; started (and stopped) only when none is given."""
    existing = os.environ.get("AGENTRL_TEST_KUBECONFIG")
    if existing:
        yield ClusterHandle(
            Path(existing),
            binaries.ensure(build_missing=False, echo=False, names=binaries.CONTROL_PLANE_BINARIES),
        )
        return
    bins = binaries.prepared()
    local = LocalCluster(TEST_CLUSTER_NAME, port=TEST_CLUSTER_PORT)
    if not local.apiserver_ready():
        # a fresh control plane: nothing a crashed earlier session left in etcd leaks in
        local.delete(keep_images=True)
    # one real node (kubelet + containerd) beside the simulated ones, unless the machine
    # cannot run containers and AGENTRL_TEST_REAL_NODES=0 says to do without
    real_nodes = int(os.environ.get("AGENTRL_TEST_REAL_NODES", "1"))
    try:
        started = local.up(
            profile or ClusterProfile(), bins=bins, timeout=240, real_nodes=real_nodes
        )
    except ClusterError as exc:
        if real_nodes and "cannot run a real node" in str(exc):
            raise ClusterError(
                f"{exc}\n(For the test session: AGENTRL_TEST_REAL_NODES=0.)"
            ) from exc
        raise
    try:
        yield ClusterHandle(local.kubeconfig, bins, local)
    finally:
        # stop only what this session started: another session may be using a cluster that
        # was already running
        if started and not os.environ.get("AGENTRL_TEST_KEEP_CLUSTER"):
            local.down()


class KubectlError(RuntimeError):
    """kubectl exited non-zero; ``stderr`` holds the API server's words."""

    def __init__(self, args: list[str], stderr: str, returncode: int) -> None:
        super().__init__(f"kubectl {' '.join(args)} failed ({returncode}): {stderr.strip()}")
        self.stderr = stderr
        self.returncode = returncode


@dataclass
class Kubectl:
    """The real kubectl against one cluster (and optionally one namespace)."""

    binary: Path
    kubeconfig: Path
    namespace: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)

    def run(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.binary), "--kubeconfig", str(self.kubeconfig)]
        if self.namespace:
            cmd += ["--namespace", self.namespace]
        cmd += list(args)
        proc = subprocess.run(
            cmd,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={**os.environ, **self.extra_env},
        )
        if check and proc.returncode != 0:
            raise KubectlError(list(args), proc.stderr, proc.returncode)
        return proc

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "-o", "json").stdout)

    def apply(self, manifest: str | dict[str, Any], *extra: str) -> str:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        return self.run("apply", "-f", "-", *extra, stdin=text).stdout

    def create_namespace(self, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.run("create", "namespace", name)
        # the namespace's default ServiceAccount comes from kube-controller-manager
        wait_for(
            lambda: (
                self.run("get", "serviceaccount", "default", "-n", name, check=False).returncode
                == 0
            ),
            timeout=60,
            what=f"ServiceAccount default in {name}",
        )
        return name

    def in_namespace(self, namespace: str) -> Kubectl:
        return Kubectl(self.binary, self.kubeconfig, namespace, dict(self.extra_env))


def wait_for(
    check: Callable[[], Any],
    *,
    timeout: float = 60.0,
    interval: float = 0.25,
    what: str = "condition",
) -> Any:
    """Poll ``check`` until it returns something truthy; fail with ``what`` after ``timeout``.

    Each wait prints how long it took (pytest shows it with ``-s`` or beside a failure): where
    a long e2e test spends its time, wait by wait."""
    start = time.monotonic()
    deadline = start + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            print(f"waited {time.monotonic() - start:6.1f} s for {what}", flush=True)
            return last
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")
