"""The chart on the real control plane in namespaced mode (``watchNamespaces``), and a values
file the schema refuses at ``helm install``: the API server's answers show the operator's
permissions stop at the watched namespaces, and a bad value installs nothing."""

from __future__ import annotations

import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from agentrl.devcluster.testing import ClusterHandle, wait_for
from tests.chart.access import review, service_account_user
from tests.chart.charting import (
    CHART,
    CLUSTER_NEEDS,
    NAMESPACE_DISCOVERY,
    NAMESPACED_NEEDS,
    REPO,
    Helm,
    unique_release,
)

pytestmark = [pytest.mark.apiserver, pytest.mark.slow]


@dataclass
class NamespacedRelease:
    name: str
    namespace: str
    watched: str

    @property
    def fullname(self) -> str:
        return f"{self.name}-agentrl"

    @property
    def user(self) -> str:
        return service_account_user(self.namespace, self.fullname)


@pytest.fixture(scope="module")
def release(cluster: ClusterHandle, cluster_helm: Helm) -> Iterator[NamespacedRelease]:
    """The chart installed watching one namespace. The last test of this module uninstalls it
    (tests run in file order); the teardown only makes sure."""
    admin = cluster.kubectl()
    rel = NamespacedRelease(unique_release(), admin.create_namespace("agentrl-system"),
                            admin.create_namespace("team"))
    # crds.install=false: the CRD belongs to whichever release installed it cluster-wide
    # peering on: the operator test below then also exercises the KopfPeering and its RBAC
    cluster_helm.run("install", rel.name, str(CHART), "-n", rel.namespace,
                     "--set", f"watchNamespaces={{{rel.watched}}}",
                     "--set", "crds.install=false", "--set", "peering.enabled=true",
                     timeout=180)
    yield rel
    cluster_helm.run("uninstall", rel.name, "-n", rel.namespace, check=False)
    for name in (rel.watched, rel.namespace):
        admin.run("delete", "namespace", name, "--wait=false", check=False)


def test_namespaced_mode_grants_the_operator_its_work_only_in_watched_namespaces(
    cluster: ClusterHandle, release: NamespacedRelease,
) -> None:
    admin = cluster.kubectl()
    assert review(admin, release.user, NAMESPACED_NEEDS, release.watched)["denied"] == []
    # another namespace: nothing at all
    assert review(admin, release.user, NAMESPACED_NEEDS, "elsewhere")["allowed"] == []
    # cluster-wide: only kopf's discovery reads
    assert review(admin, release.user, CLUSTER_NEEDS | NAMESPACE_DISCOVERY,
                  None)["denied"] == []
    assert review(admin, release.user, NAMESPACED_NEEDS, None)["allowed"] == []
    deployment = admin.in_namespace(release.namespace).json("get", "deployment",
                                                            release.fullname)
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == f"--namespace={release.watched}"

def test_install_with_a_values_file_violating_the_schema_is_refused_naming_the_field(
    cluster: ClusterHandle, cluster_helm: Helm, tmp_path: Path,
) -> None:
    admin = cluster.kubectl()
    release = unique_release()
    ns = admin.create_namespace("agentrl-system")
    bad = tmp_path / "values.yaml"
    bad.write_text("operator:\n  logLevel: verbose\n  replicas: 1\nwatchNamespaces: [Team_A]\n")
    try:
        proc = cluster_helm.run("install", release, str(CHART), "-n", ns, "-f", str(bad),
                                check=False, timeout=120)
        assert proc.returncode == 1
        assert "at '/operator/logLevel': value must be one of 'debug', 'info', 'warning'" in (
            proc.stderr)
        assert "at '/watchNamespaces/0'" in proc.stderr
        # nothing was installed
        assert cluster_helm.run("status", release, "-n", ns, check=False).returncode != 0
        assert admin.run("get", "deployments", "-n", ns, "-o", "name").stdout.split() == []
    finally:
        admin.run("delete", "namespace", ns, "--wait=false", check=False)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def token_kubeconfig(cluster: ClusterHandle, namespace: str, service_account: str,
                     path: Path) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount (a token from the TokenRequest
    API), pointing at the same API server as the admin one."""
    admin = cluster.kubectl()
    token = admin.run("create", "token", service_account, "-n", namespace,
                      "--duration", "20m").stdout.strip()
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])
    server = next(c for c in config["clusters"] if c["name"] == context["context"]["cluster"])
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "operator",
        "clusters": [{"name": "local", "cluster": server["cluster"]}],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "local", "user": "operator",
                                                      "namespace": namespace}}],
    }))
    return path


def _metric(text: str, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(sample.value for family in text_string_to_metric_families(text)
               for sample in family.samples if sample.name == name)


def test_operator_run_with_the_charts_permissions_reconciles_the_mi355x_job(
    cluster: ClusterHandle, release: NamespacedRelease, tmp_path: Path,
) -> None:
    """The real `agentrl operator`, run locally with the command line of the chart's
    Deployment (namespaced mode, kopf peering) and authenticated as the chart's ServiceAccount,
    reconciles the report's job: children created (the Roles among them, which RBAC
    escalation prevention would refuse if the operator lacked any rule they grant), status
    written, its peering kept alive, nothing Forbidden."""
    admin = cluster.kubectl()
    users = release.watched
    deployment = admin.in_namespace(release.namespace).json("get", "deployment",
                                                            release.fullname)
    chart_args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert chart_args[:3] == [f"--namespace={users}", "--peering", "--peering-name=agentrl"]
    kubeconfig = token_kubeconfig(cluster, release.namespace, release.fullname,
                                  tmp_path / "operator.kubeconfig")
    port = _free_port()
    # the ports are the pod's; a local process takes a free one and no health endpoint
    args = [a for a in chart_args if not a.startswith(("--metrics-port=", "--health-port=",
                                                       "--log-format="))]
    args += [f"--metrics-port={port}", "--health-port=0", "--log-format=text"]
    log_path = tmp_path / "operator.log"
    env = {**cluster.env(), "KUBECONFIG": str(kubeconfig)}
    with log_path.open("w") as log:
        proc = subprocess.Popen(["agentrl", "operator", *args],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        job = "qwen3-swe-mi355x"
        manifest = yaml.safe_load((REPO / "examples" / "mi355x-report.yaml").read_text())
        # pre-pull on: the operator then also counts the sandbox nodes and applies a DaemonSet
        manifest["spec"]["sandbox"]["prePull"] = {"enabled": True,
                                                  "images": ["python:3.11-slim"]}
        admin.in_namespace(users).apply(manifest)
        kubectl = admin.in_namespace(users)

        def children_exist() -> bool:
            return all(kubectl.run("get", kind, name, check=False).returncode == 0
                       for kind, name in [("statefulset", f"{job}-engine"),
                                          ("service", f"{job}-engine"),
                                          ("configmap", f"{job}-config"),
                                          ("role", f"{job}-rollout"),
                                          ("role", f"{job}-engine"),
                                          ("rolebinding", f"{job}-rollout"),
                                          ("networkpolicy", f"{job}-sandbox"),
                                          ("daemonset", f"{job}-prepull-0")])

        try:
            wait_for(lambda: proc.poll() is not None or children_exist(), timeout=90,
                     what=f"the operator to create {job}'s children")
            wait_for(lambda: kubectl.json("get", "arj", job).get("status", {}).get(
                "conditions"), timeout=60, what="the job's status conditions")
        except TimeoutError as exc:
            pytest.fail(f"{exc}\noperator log:\n{log_path.read_text()[-4000:]}")
        # the chart's PriorityClasses reach the job's pods: the engines' template names its
        # class, and the API server gave the trainer's pods (made by the Job controller) the
        # priority of theirs
        engines = kubectl.json("get", "statefulset", f"{job}-engine")
        assert engines["spec"]["template"]["spec"]["priorityClassName"] == (
            f"{release.fullname}-engines")

        def trainer_pods() -> list[dict[str, object]]:
            items: list[dict[str, object]] = kubectl.json(
                "get", "pods", "-l", f"agentrl.dev/job={job},app.kubernetes.io/component=trainer"
            )["items"]
            return items

        wait_for(lambda: bool(trainer_pods()), timeout=60, what="the trainer's pods")
        for pod in trainer_pods():
            spec = pod["spec"]
            assert isinstance(spec, dict)
            assert (spec["priorityClassName"], spec["priority"]) == (
                f"{release.fullname}-trainer", 1000000)
        # kopf keeps this operator alive in the chart's KopfPeering (patch permission)
        peering = kubectl.json("get", "kopfpeering", "agentrl")
        assert len(peering.get("status") or {}) == 1, peering
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
        text = metrics.read().decode()
        assert _metric(text, "agentrl_operator_reconciles_total") >= 1
        assert _metric(text, "agentrl_operator_reconcile_errors_total") == 0
        log_text = log_path.read_text()
        for refusal in ("Forbidden", "forbidden", "Not enough permissions"):
            assert refusal not in log_text, log_text[-4000:]
        assert proc.poll() is None, log_text[-3000:]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_uninstall_in_namespaced_mode_removes_the_roles_in_the_watched_namespaces(
    cluster: ClusterHandle, cluster_helm: Helm, release: NamespacedRelease,
) -> None:
    admin = cluster.kubectl()
    selector = f"app.kubernetes.io/instance={release.name}"
    before = admin.run("get", "roles,rolebindings", "-n", release.watched, "-l", selector,
                       "-o", "name").stdout.split()
    assert sorted(before) == [
        f"role.rbac.authorization.k8s.io/{release.fullname}",
        f"rolebinding.rbac.authorization.k8s.io/{release.fullname}",
    ]
    cluster_helm.run("uninstall", release.name, "-n", release.namespace, "--wait", timeout=180)
    left = admin.run("get", "roles,rolebindings", "-n", release.watched, "-l", selector,
                     "-o", "name").stdout.split()
    assert left == []
    assert admin.run("get", "clusterrole", f"{release.fullname}-discovery",
                     check=False).returncode != 0
    assert admin.run("get", "kopfpeering", "agentrl", "-n", release.watched,
                     check=False).returncode != 0
