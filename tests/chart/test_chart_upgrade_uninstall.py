"""``helm upgrade`` and ``helm uninstall`` on the real control plane: an upgrade to a chart whose
CRD changed updates the CRD in the cluster (the CRD lives in templates/, not crds/), and
uninstall removes every object of the release but keeps the CRD and the jobs in it
(``helm.sh/resource-policy: keep``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agentrl.devcluster.testing import ClusterHandle, wait_for
from tests.chart.charting import CHART, CRD_NAME, REPO, Helm, adopt_crd, unique_release

pytestmark = [pytest.mark.apiserver, pytest.mark.slow]

EXTRA_COLUMN = "ChartTest"


def changed_chart(tmp_path: Path) -> Path:
    """A copy of the chart, version 0.1.1, whose CRD has one more printer column."""
    chart = tmp_path / "agentrl"
    shutil.copytree(CHART, chart)
    meta = chart / "Chart.yaml"
    meta.write_text(meta.read_text().replace("version: 0.1.0", "version: 0.1.1", 1))
    template = chart / "templates" / "crds" / "agentrl.dev_agentrljobs.yaml"
    lines = template.read_text().splitlines(keepends=True)
    (at,) = [i for i, line in enumerate(lines) if line.strip() == "additionalPrinterColumns:"]
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    lines[at + 1:at + 1] = [
        f"{indent}- name: {EXTRA_COLUMN}\n",
        f"{indent}  type: string\n",
        f"{indent}  jsonPath: .spec.sandbox.provider\n",
        f"{indent}  priority: 1\n",
    ]
    template.write_text("".join(lines))
    return chart


def printer_columns(cluster: ClusterHandle) -> list[str]:
    crd = cluster.kubectl().json("get", "crd", CRD_NAME)
    (version,) = crd["spec"]["versions"]
    return [c["name"] for c in version["additionalPrinterColumns"]]


def test_upgrade_updates_the_crd_and_uninstall_keeps_it_and_leaves_nothing_else(
    cluster: ClusterHandle, cluster_helm: Helm, tmp_path: Path,
) -> None:
    admin = cluster.kubectl()
    release = unique_release()
    ns = admin.create_namespace("agentrl-system")
    users = admin.create_namespace("team")
    fullname = f"{release}-agentrl"
    try:
        adopt_crd(admin, release, ns)
        # no --wait: a CRD is updated synchronously; the Deployment is checked elsewhere
        cluster_helm.run("install", release, str(CHART), "-n", ns, timeout=180)
        assert EXTRA_COLUMN not in printer_columns(cluster)
        # a user's job, created while the chart is installed
        admin.in_namespace(users).run("apply", "-f", str(REPO / "examples" / "quickstart.yaml"))

        cluster_helm.run("upgrade", release, str(changed_chart(tmp_path)), "-n", ns,
                         timeout=180)
        assert EXTRA_COLUMN in printer_columns(cluster)
        deployment = admin.in_namespace(ns).json("get", "deployment", fullname)
        assert deployment["metadata"]["labels"]["helm.sh/chart"] == "agentrl-0.1.1"
        # the new column is served: kubectl -o wide prints it for the job
        wide = admin.in_namespace(users).run("get", "arj", "quickstart", "-o", "wide").stdout
        assert EXTRA_COLUMN.upper() in wide.splitlines()[0]
        assert wide.splitlines()[1].split()[0] == "quickstart"

        # back to the chart as shipped: the CRD follows again
        cluster_helm.run("upgrade", release, str(CHART), "-n", ns, timeout=180)
        assert EXTRA_COLUMN not in printer_columns(cluster)

        cluster_helm.run("uninstall", release, "-n", ns, "--wait", timeout=180)
        assert_uninstalled(cluster, cluster_helm, release, ns, users)
    finally:
        cluster_helm.run("uninstall", release, "-n", ns, check=False)
        for name in (users, ns):
            admin.run("delete", "namespace", name, "--wait=false", check=False)


def assert_uninstalled(cluster: ClusterHandle, cluster_helm: Helm, release: str, ns: str,
                       users: str) -> None:
    admin = cluster.kubectl()
    fullname = f"{release}-agentrl"
    # kept: the CRD and the job in it
    crd = admin.json("get", "crd", CRD_NAME)
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert admin.in_namespace(users).json("get", "arj", "quickstart")["metadata"]["name"] == (
        "quickstart")
    # gone: every object of the release, namespaced and cluster-scoped, and helm's own record
    selector = f"app.kubernetes.io/instance={release}"
    for kinds, scope in [
        ("deployments,replicasets,services,serviceaccounts,configmaps,roles,rolebindings",
         ["-n", ns]),
        ("clusterroles,clusterrolebindings,priorityclasses", []),
    ]:
        left = admin.run("get", kinds, *scope, "-l", selector, "-o", "name").stdout.split()
        assert left == [], left
    assert admin.run("get", "clusterrole", fullname, check=False).returncode != 0
    assert admin.run("get", "secrets", "-n", ns, "-l", f"owner=helm,name={release}",
                     "-o", "name").stdout.split() == []
    assert cluster_helm.run("status", release, "-n", ns, check=False).returncode != 0
    # the operator pod goes with its ReplicaSet (garbage collector)
    wait_for(lambda: admin.run("get", "pods", "-n", ns, "-l", selector, "-o", "name")
             .stdout.split() == [], timeout=60, what="the operator pod to be deleted")
