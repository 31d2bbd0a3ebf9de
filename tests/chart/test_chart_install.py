"""``helm install`` of charts/agentrl on the real local control plane: the CRD registered and
Established, the operator Deployment available (kwok runs its pod), its RBAC bound, and the
API server's own answers on what the operator's ServiceAccount may and may not do.

The CRD is cluster-wide and other suites apply it from crds/ with kubectl;
:func:`charting.adopt_crd` hands it to the release the way docs/install.md tells users to.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from agentrl.devcluster.testing import ClusterHandle, Kubectl, wait_for
from tests.chart.access import can_i, review, service_account_user
from tests.chart.charting import (
    CHART,
    CLUSTER_NEEDS,
    CRD_NAME,
    MUST_NOT,
    NAMESPACED_NEEDS,
    Helm,
    adopt_crd,
    unique_release,
)

pytestmark = [pytest.mark.apiserver, pytest.mark.slow]


@dataclass
class Release:
    name: str
    namespace: str

    @property
    def fullname(self) -> str:
        return f"{self.name}-agentrl"

    @property
    def user(self) -> str:
        return service_account_user(self.namespace, self.fullname)


def install(helm: Helm, admin: Kubectl, release: Release, *extra: str) -> None:
    adopt_crd(admin, release.name, release.namespace)
    helm.run("install", release.name, str(CHART), "--namespace", release.namespace,
             "--wait", "--timeout", "120s", *extra, timeout=180)


@pytest.fixture(scope="module")
def release(cluster: ClusterHandle, cluster_helm: Helm) -> Iterator[Release]:
    admin = cluster.kubectl()
    rel = Release(unique_release(), admin.create_namespace("agentrl-system"))
    install(cluster_helm, admin, rel)
    yield rel
    cluster_helm.run("uninstall", rel.name, "--namespace", rel.namespace, "--wait", check=False)
    admin.run("delete", "namespace", rel.namespace, "--wait=false", check=False)


def test_install_registers_the_crd_established_with_the_keep_policy(
    cluster: ClusterHandle, release: Release,
) -> None:
    crd = cluster.kubectl().json("get", "crd", CRD_NAME)
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions["Established"] == "True"
    assert conditions["NamesAccepted"] == "True"
    annotations = crd["metadata"]["annotations"]
    assert annotations["helm.sh/resource-policy"] == "keep"
    assert annotations["meta.helm.sh/release-name"] == release.name
    assert crd["spec"]["names"]["shortNames"] == ["arj"]


def test_install_creates_the_operator_deployment_and_it_becomes_available(
    cluster: ClusterHandle, release: Release,
) -> None:
    kubectl = cluster.kubectl(release.namespace)
    deployment = kubectl.json("get", "deployment", release.fullname)
    assert deployment["status"]["availableReplicas"] == 1
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "ghcr.io/agentrl/operator:0.1.0"
    assert container["args"][0] == "--standalone"
    # the API server admitted the hardened pod as rendered; kwok runs it on a simulated node
    pods = kubectl.json("get", "pods", "-l", f"app.kubernetes.io/instance={release.name}")
    (pod,) = pods["items"]
    assert pod["status"]["phase"] == "Running"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["serviceAccountName"] == release.fullname


def test_install_creates_the_jobs_priority_classes_in_order_and_the_operator_uses_them(
    cluster: ClusterHandle, release: Release,
) -> None:
    admin = cluster.kubectl()
    classes = {kind: admin.json("get", "priorityclass", f"{release.fullname}-{kind}")
               for kind in ("trainer", "engines", "rollout", "sandboxes")}
    # as the API server stored them: the values.yaml defaults, none the global default
    assert {k: c["value"] for k, c in classes.items()} == {
        "trainer": 1000000, "engines": 100000, "rollout": 10000, "sandboxes": 1000}
    assert {k: c["preemptionPolicy"] for k, c in classes.items()} == {
        "trainer": "PreemptLowerPriority", "engines": "PreemptLowerPriority",
        "rollout": "PreemptLowerPriority", "sandboxes": "Never"}
    assert not any(c.get("globalDefault") for c in classes.values())
    deployment = admin.in_namespace(release.namespace).json("get", "deployment",
                                                            release.fullname)
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--trainer-priority-class={release.fullname}-trainer" in args
    assert f"--sandbox-priority-class={release.fullname}-sandboxes" in args


def test_install_binds_the_service_account_to_its_cluster_role(
    cluster: ClusterHandle, release: Release,
) -> None:
    admin = cluster.kubectl()
    binding = admin.json("get", "clusterrolebinding", release.fullname)
    assert binding["roleRef"]["name"] == release.fullname
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": release.fullname,
                                    "namespace": release.namespace}]
    admin.in_namespace(release.namespace).run("get", "serviceaccount", release.fullname)
    assert admin.run("get", "service", f"{release.fullname}-metrics", "-n",
                     release.namespace).returncode == 0


def test_operator_service_account_is_allowed_everything_it_uses_in_any_namespace(
    cluster: ClusterHandle, release: Release,
) -> None:
    admin = cluster.kubectl()
    # a namespace the operator has never seen: cluster-wide mode covers every namespace
    assert review(admin, release.user, NAMESPACED_NEEDS, "some-team")["denied"] == []
    assert review(admin, release.user, CLUSTER_NEEDS, None)["denied"] == []


def test_operator_service_account_is_refused_what_it_must_not_do(
    cluster: ClusterHandle, release: Release,
) -> None:
    admin = cluster.kubectl()
    assert review(admin, release.user, MUST_NOT, "some-team")["allowed"] == []
    assert review(admin, release.user, MUST_NOT, None)["allowed"] == []


def test_kubectl_auth_can_i_as_the_operator_answers_yes_and_no(
    cluster: ClusterHandle, release: Release,
) -> None:
    admin = cluster.kubectl()
    for verb, resource in [("watch", "agentrljobs.agentrl.dev"),
                           ("patch", "agentrljobs.agentrl.dev/status"),
                           ("update", "agentrljobs.agentrl.dev/scale"),
                           ("create", "statefulsets.apps"),
                           ("create", "roles.rbac.authorization.k8s.io"),
                           ("create", "pods/exec")]:
        assert can_i(admin, release.user, verb, resource, "team-x"), (verb, resource)
    for verb, resource in [("get", "secrets"),
                           ("create", "serviceaccounts/token"),
                           ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
                           ("patch", "nodes")]:
        assert not can_i(admin, release.user, verb, resource, "team-x"), (verb, resource)


def test_release_notes_say_how_to_check_the_installation(
    cluster_helm: Helm, release: Release,
) -> None:
    notes = cluster_helm.run("get", "notes", release.name, "-n", release.namespace).stdout
    assert (f"kubectl -n {release.namespace} rollout status deployment/{release.fullname}"
            in notes)
    assert "The operator watches every namespace (one replica, standalone)." in notes
    assert "Uninstalling keeps the AgentRLJob CRD" in notes


def test_operator_pod_restarts_cleanly_from_what_the_chart_installed(
    cluster: ClusterHandle, release: Release,
) -> None:
    # deleting the pod: the Deployment (Recreate) brings exactly one back
    kubectl = cluster.kubectl(release.namespace)
    selector = f"app.kubernetes.io/instance={release.name}"
    (old,) = kubectl.json("get", "pods", "-l", selector)["items"]
    kubectl.run("delete", "pod", old["metadata"]["name"], "--wait=false")

    def replaced() -> bool:
        pods = kubectl.json("get", "pods", "-l", selector)["items"]
        running = [p for p in pods if p["status"].get("phase") == "Running"
                   and "deletionTimestamp" not in p["metadata"]]
        return len(running) == 1 and running[0]["metadata"]["uid"] != old["metadata"]["uid"]

    wait_for(replaced, timeout=60, what="a replacement operator pod")

