"""Fixtures of the chart tests: the real helm, offline (rendering, lint) or aimed at the test
cluster (install, upgrade, uninstall)."""

from __future__ import annotations

import pytest

from agentrl.devcluster import binaries
from agentrl.devcluster.testing import ClusterHandle
from tests.chart.charting import Helm


@pytest.fixture(scope="session")
def helm() -> Helm:
    """helm for offline work; the same pinned binary the cluster fixture uses (built if missing,
    without starting a cluster)."""
    return Helm(binaries.prepared().helm)


@pytest.fixture(scope="session")
def cluster_helm(cluster: ClusterHandle) -> Helm:
    """helm aimed at the test cluster (KUBECONFIG and PATH from the cluster fixture)."""
    return Helm(cluster.bins.helm, cluster.env())
