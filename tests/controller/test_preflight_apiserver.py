"""The GPU preflight on the real API server: the reconciler lists the local cluster's simulated
Nodes (four 8-GPU MI355X nodes, two CPU nodes) and writes GPUsAvailable; run with only the
chart's namespaced Role (no cluster-scoped read of Nodes), it says it could not look, and still
creates the job's children."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from agentrl.devcluster.testing import ClusterHandle, Kubectl
from tests.chart.charting import Helm
from tests.chart.test_chart_namespaced_install import token_kubeconfig
from tests.controller.apiserver import apply_and_reconcile, condition
from tests.factories import from_manifest

pytestmark = [pytest.mark.apiserver]

REPORT = yaml.safe_load(Path("examples/mi355x-report.yaml").read_text())
NAME = REPORT["metadata"]["name"]
LABEL = "amd.com/gpu.product-name=AMD_Instinct_MI355X"


#: The report's job as shipped: 24 single-GPU engines.
REPORT_JOB = from_manifest(REPORT).with_engines(24)


@pytest.mark.usefixtures("crd_installed")
async def test_the_report_fits_the_simulated_mi355x_nodes(
    cluster: ClusterHandle, kubectl: Kubectl, namespace: str
) -> None:
    await apply_and_reconcile(kubectl, REPORT_JOB.manifest(), cluster.kubeconfig, namespace)
    cond = condition(kubectl, NAME, "GPUsAvailable")
    assert (cond["status"], cond["reason"]) == ("True", "GPUCapacitySufficient")
    # 4 nodes × 8 GPUs; 1 trainer pod × 8 + 24 engines × 1 = 32
    assert cond["message"] == (
        "the cluster has 4 matching nodes with 32 amd.com/gpu (at most 8 on one node): room for "
        "1 trainer pod with 8 amd.com/gpu and 24 engines with 1 amd.com/gpu (32 in all)"
    )


@pytest.mark.usefixtures("crd_installed")
async def test_a_job_larger_than_the_nodes_gets_the_shortfall_and_its_children(
    cluster: ClusterHandle, kubectl: Kubectl, namespace: str
) -> None:
    manifest = REPORT_JOB.copy().with_engines(32).manifest()
    await apply_and_reconcile(kubectl, manifest, cluster.kubeconfig, namespace)
    cond = condition(kubectl, NAME, "GPUsAvailable")
    assert (cond["status"], cond["reason"]) == ("False", "GPUCapacityInsufficient")
    # 8 + 32 = 40 GPUs: five 8-GPU nodes; the cluster has four (its CPU nodes do not match)
    assert cond["message"].startswith(
        f"needs 5 nodes with 8 amd.com/gpu labelled {LABEL} for 1 trainer pod with 8 amd.com/gpu "
        "and 32 engines with 1 amd.com/gpu (40 in all); the cluster has 4 matching nodes with "
        f"32 amd.com/gpu (at most 8 on one node); not matching: "
    )
    assert f"not labelled {LABEL} (cpu-0, cpu-1" in cond["message"]
    # the children are created all the same, for a cluster autoscaler to see
    assert kubectl.run("get", "statefulset", f"{NAME}-engine").returncode == 0
    assert kubectl.run("get", "job", f"{NAME}-trainer").returncode == 0
    events = kubectl.json("get", "events", "--field-selector", f"involvedObject.name={NAME}")
    assert any(e["reason"] == "GPUCapacityInsufficient" for e in events["items"])


@pytest.fixture
def namespaced_operator(
    cluster: ClusterHandle, cluster_helm: Helm, namespace: str, tmp_path: Path
) -> Iterator[Path]:
    """A kubeconfig of a ServiceAccount bound only to the chart's namespaced Role for
    ``namespace``: everything the operator does there, nothing cluster-scoped (no Nodes)."""
    admin = cluster.kubectl()
    docs = cluster_helm.template({"watchNamespaces": [namespace]}, release="pf",
                                 namespace=namespace)
    sa = next(d for d in docs if d["kind"] == "ServiceAccount")
    role = next(d for d in docs if d["kind"] == "Role")
    binding = next(d for d in docs if d["kind"] == "RoleBinding")
    for doc in (sa, role, binding):
        doc["metadata"]["namespace"] = namespace
        admin.apply(doc)
    yield token_kubeconfig(cluster, namespace, sa["metadata"]["name"],
                           tmp_path / "operator.kubeconfig")


@pytest.mark.usefixtures("crd_installed")
async def test_without_permission_to_list_nodes_the_preflight_says_so_and_nothing_fails(
    kubectl: Kubectl, namespace: str, namespaced_operator: Path
) -> None:
    own = Kubectl(kubectl.binary, namespaced_operator, namespace)
    assert own.run("get", "nodes", check=False).returncode != 0  # the premise: no Nodes
    await apply_and_reconcile(kubectl, REPORT_JOB.manifest(), namespaced_operator, namespace)
    cond = condition(kubectl, NAME, "GPUsAvailable")
    assert (cond["status"], cond["reason"]) == ("Unknown", "NodesUnreadable")
    assert cond["message"].startswith(
        "could not list the cluster's nodes to check GPU capacity (403 Forbidden: "
    )
    assert "grant the operator list on nodes" in cond["message"]
    assert kubectl.run("get", "statefulset", f"{NAME}-engine").returncode == 0
    assert kubectl.run("get", "job", f"{NAME}-trainer").returncode == 0
