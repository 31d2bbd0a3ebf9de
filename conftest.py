"""Fixtures shared by tests/ and e2e/: a real Kubernetes API for tests that need one.

``cluster`` starts the local control plane once per session (or uses the cluster named by
``AGENTRL_TEST_KUBECONFIG``); ``namespace`` gives each test its own namespace and deletes it
afterwards; ``kubectl`` is the real kubectl bound to that namespace.

The suite's tiers (the marker ``prepared``, which ``make test-fast`` deselects) and its per-test
time budget (``tests/slow_tests.txt``) are the plugin :mod:`tests.tiers`, loaded here.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentrl.devcluster.testing import ClusterHandle, Kubectl, session_cluster

pytest_plugins = ("tests.tiers",)


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
    from tests.chart.charting import apply_crds

    apply_crds(cluster.kubectl())


@pytest.fixture(scope="session")
def cluster_helm(cluster: ClusterHandle):  # type: ignore[no-untyped-def]
    """The real helm aimed at the test cluster (KUBECONFIG and PATH from ``cluster``)."""
    from tests.chart.charting import Helm

    return Helm(cluster.bins.helm, cluster.env())


@pytest.fixture
def operator_on_real_node(cluster, cluster_helm, kubectl, crd_installed, tmp_path):  # type: ignore[no-untyped-def]
    """The chart installed with ``examples/helm/local-cluster-values.yaml`` (the operator as a
    pod on the real node, from the image built here) into the test's namespace, watching only
    it; the CRD comes from the suite's fixture. Yields the release name."""
    import json
    from pathlib import Path

    from tests.chart.charting import CHART, unique_release

    from agentrl.devcluster import images
    from agentrl.devcluster.cluster import project_archives

    # the node runs what `agentrl dev prepare` built from this tree: an archive older than the
    # source is not imported, and its pods would only say ErrImageNeverPull after helm's timeout
    stale = images.missing()
    if stale:
        pytest.fail(
            f"images absent or older than the source: {', '.join(stale)}; "
            "run `agentrl dev images` (make test runs `agentrl dev prepare` first)"
        )
    if cluster.local is not None:  # a kept cluster may hold an earlier build: import the current
        cluster.local.load(project_archives(), echo=lambda _m: None)
    values = Path(__file__).resolve().parent / "examples" / "helm" / "local-cluster-values.yaml"
    release = unique_release("op")
    extra = tmp_path / "values.json"
    extra.write_text(
        json.dumps({"crds": {"install": False}, "watchNamespaces": [kubectl.namespace]})
    )
    cluster_helm.run(
        "install", release, str(CHART), "--namespace", str(kubectl.namespace),
        "--values", str(values), "--values", str(extra), "--wait", "--timeout", "240s",
        timeout=300,
    )  # fmt: skip
    yield release
    cluster_helm.run(
        "uninstall", release, "--namespace", str(kubectl.namespace), "--wait", check=False,
        timeout=180,
    )  # fmt: skip
