"""Fixtures shared by tests/ and e2e/: a real Kubernetes API for tests that need one.

``cluster`` starts the local control plane once per session (or uses the cluster named by
``AGENTRL_TEST_KUBECONFIG``); ``namespace`` gives each test its own namespace and deletes it
afterwards; ``kubectl`` is the real kubectl bound to that namespace.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentrl.devcluster.testing import ClusterHandle, Kubectl, session_cluster


@pytest.fixture(scope="session")
def cluster() -> Iterator[ClusterHandle]:
    with session_cluster() as handle:
        yield handle


@pytest.fixture(scope="session")
def kubeconfig(cluster: ClusterHandle) -> str:
    return str(cluster.kubeconfig)


@pytest.fixture
def namespace(cluster: ClusterHandle) -> Iterator[str]:
    admin = cluster.kubectl()
    name = admin.create_namespace()
    yield name
    admin.run("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def kubectl(cluster: ClusterHandle, namespace: str) -> Kubectl:
    return cluster.kubectl(namespace)


@pytest.fixture(scope="session")
def crd_installed(cluster: ClusterHandle) -> None:
    """The AgentRLJob CRD from crds/, applied server-side and Established."""
    from pathlib import Path

    admin = cluster.kubectl()
    for path in sorted(Path("crds").glob("*.yaml")):
        admin.run("apply", "--server-side", "--force-conflicts", "-f", str(path))
    admin.run("wait", "--for=condition=Established", "--timeout=60s", "crd/agentrljobs.agentrl.dev")


@pytest.fixture(scope="session")
def cluster_helm(cluster: ClusterHandle):  # type: ignore[no-untyped-def]
    """The real helm aimed at the test cluster (KUBECONFIG and PATH from ``cluster``)."""
    from tests.chart.charting import Helm

    return Helm(cluster.bins.helm, cluster.env())
