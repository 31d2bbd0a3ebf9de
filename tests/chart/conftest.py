"""Fixtures of the chart tests: the real helm, offline (rendering, lint). helm aimed at the test
cluster (``cluster_helm``: install, upgrade, uninstall) is in the repository's conftest.py."""

from __future__ import annotations

import pytest

from agentrl.devcluster import binaries
from tests.chart.charting import Helm


@pytest.fixture(scope="session")
def helm() -> Helm:
    """helm for offline work; the same pinned binary the cluster fixture uses (built if missing,
    without starting a cluster)."""
    return Helm(binaries.prepared().helm)
