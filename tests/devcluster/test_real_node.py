"""The real node of the session's cluster: a kubelet with containerd and kube-proxy, so pods
there run real containers (our busybox image). Each test asserts what a user of the node would
see: logs, exec, port-forward, DNS through CoreDNS, a ClusterIP through kube-proxy, restarts
and probes acted on by the kubelet, the node Ready with its labels, and simulated pods kept off
it. The node's down is tested on a cluster of its own (test_real_node_down.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agentrl.devcluster.cli import dev
from agentrl.devcluster.node import artifacts, config, oci
from agentrl.devcluster.testing import ClusterHandle, Kubectl, wait_for

pytestmark = [pytest.mark.apiserver, pytest.mark.realnode]

IMAGE = artifacts.BUSYBOX.name
PACKAGE_ROOT = Path(artifacts.__file__).resolve().parents[3]
# (Debian's busybox-static 1.35 wget segfaults on its own -T option: time-outs use `timeout`)


def _pod(name: str, command: str, **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": IMAGE,
        "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", command],
    }
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "nodeSelector": {"agentrl.dev/real-node": "true"},
            "tolerations": [{"key": "agentrl.dev/real-node", "operator": "Exists"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
            **spec,
        },
    }


def _running(kubectl: Kubectl, name: str, timeout: float = 90) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        pod = kubectl.json("get", "pod", name)
        conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
        return pod if conditions.get("Ready") == "True" else None

    return wait_for(ready, timeout=timeout, what=f"pod {name} Ready")  # type: ignore[no-any-return]


def test_the_real_node_is_ready_with_its_labels_taint_and_pod_cidr(cluster: ClusterHandle) -> None:
    node = cluster.kubectl().json("get", "node", "real-0")
    labels = node["metadata"]["labels"]
    for key, value in config.REAL_NODE_LABELS.items():
        assert labels[key] == value
    assert "amd.com/gpu.product-name" not in labels
    assert node["spec"]["taints"] == [config.REAL_NODE_TAINT]
    assert node["spec"]["podCIDR"] == "10.244.128.0/24"
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True"
    info = node["status"]["nodeInfo"]
    # a kubelet, not kwok: the pinned release and Debian's containerd
    assert info["kubeletVersion"] == "v1.34.4"
    assert info["containerRuntimeVersion"].startswith("containerd://1.6.")
    # kwok manages nodes by annotation: the real node does not carry it
    assert "kwok.x-k8s.io/node" not in node["metadata"].get("annotations", {})
    assert "amd.com/gpu" not in node["status"]["capacity"]


def test_a_pod_runs_in_a_container_and_its_logs_are_read(kubectl: Kubectl) -> None:
    token = uuid.uuid4().hex
    kubectl.apply(_pod("logs", f"echo started {token}; echo second line; exec sleep 3600"))
    pod = _running(kubectl, "logs")
    assert pod["spec"]["nodeName"] == "real-0"
    assert pod["status"]["podIP"].startswith("10.244.128.")
    logs = wait_for(
        lambda: (out := kubectl.run("logs", "logs").stdout) and "second line" in out and out,
        what="the container's output",
    )
    assert logs.splitlines() == [f"started {token}", "second line"]


def test_exec_runs_a_command_in_the_container(kubectl: Kubectl) -> None:
    kubectl.apply(_pod("exec", "echo from-the-image > /tmp/marker; exec sleep 3600"))
    pod = _running(kubectl, "exec")
    out = kubectl.run("exec", "exec", "--", "sh", "-c", "cat /tmp/marker; hostname; id -u")
    assert out.stdout.split() == ["from-the-image", "exec", "0"]
    # the pod's own address is on its eth0 in its network namespace
    addr = kubectl.run("exec", "exec", "--", "ip", "-4", "-o", "addr", "show", "eth0").stdout
    assert pod["status"]["podIP"] in addr
    failed = kubectl.run("exec", "exec", "--", "sh", "-c", "exit 7", check=False)
    assert failed.returncode == 7


def test_port_forward_reaches_a_port_in_the_pod(kubectl: Kubectl) -> None:
    token = uuid.uuid4().hex
    kubectl.apply(
        _pod(
            "pf",
            f"mkdir -p /www && echo {token} > /www/index.html && exec httpd -f -p 8080 -h /www",
        )
    )
    _running(kubectl, "pf")
    proc = subprocess.Popen(
        [
            str(kubectl.binary),
            "--kubeconfig",
            str(kubectl.kubeconfig),
            "-n",
            str(kubectl.namespace),
            "port-forward",
            "pod/pf",
            ":8080",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"127\.0\.0\.1:(\d+) -> 8080", line)
        assert match, line
        with urllib.request.urlopen(f"http://127.0.0.1:{match.group(1)}/", timeout=20) as resp:
            assert resp.read().decode().strip() == token
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_service_name_resolves_through_coredns_and_its_cluster_ip_answers(
    kubectl: Kubectl,
) -> None:
    token = uuid.uuid4().hex
    kubectl.apply(
        _pod(
            "web",
            f"mkdir -p /www && echo {token} > /www/index.html && exec httpd -f -p 8080 -h /www",
        )
    )
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        }
    )
    kubectl.apply(_pod("client", "exec sleep 3600"))
    _running(kubectl, "web")
    _running(kubectl, "client")
    cluster_ip = kubectl.json("get", "service", "web")["spec"]["clusterIP"]
    fqdn = f"web.{kubectl.namespace}.svc.cluster.local"

    def resolved() -> str | None:
        out = kubectl.run("exec", "client", "--", "nslookup", fqdn, check=False).stdout
        return out if cluster_ip in out else None

    wait_for(resolved, timeout=60, what=f"{fqdn} -> {cluster_ip}")
    # the short name through the pod's search path, and the ClusterIP through kube-proxy
    body = wait_for(
        lambda: kubectl.run(
            "exec",
            "client",
            "--",
            "timeout",
            "5",
            "wget",
            "-q",
            "-O",
            "-",
            "http://web/",
            check=False,
        ).stdout.strip(),
        timeout=60,
        what="the service answering",
    )
    assert body == token
    direct = kubectl.run("exec", "client", "--", "wget", "-q", "-O", "-", f"http://{cluster_ip}/")
    assert direct.stdout.strip() == token
    # nothing outside the cluster resolves: CoreDNS forwards nowhere
    outside = kubectl.run("exec", "client", "--", "nslookup", "example.com", check=False)
    assert outside.returncode != 0


def test_pods_cannot_send_anything_outside_the_pod_and_service_cidrs(kubectl: Kubectl) -> None:
    kubectl.apply(_pod("egress", "exec sleep 3600"))
    _running(kubectl, "egress")
    routes = kubectl.run("exec", "egress", "--", "ip", "route").stdout
    assert "default" not in routes
    # an address outside the cluster is unreachable (no route), whatever listens there
    out = kubectl.run(
        "exec",
        "egress",
        "--",
        "timeout",
        "3",
        "wget",
        "-q",
        "-O",
        "-",
        "http://192.0.2.1/",
        check=False,
    )
    assert out.returncode != 0


def test_a_container_that_exits_is_restarted_by_the_kubelet(kubectl: Kubectl) -> None:
    kubectl.apply(_pod("crash", "echo run; exit 3"))

    def restarted() -> dict[str, Any] | None:
        # The kubelet records the previous container's end in lastState on a best-effort basis:
        # a status written between a restart and the next sync can carry restartCount with an
        # empty lastState (kubernetes/kubernetes#101044). While the container is down, its end
        # is in state instead. Wait for a status that holds the end, wherever it is.
        statuses = kubectl.json("get", "pod", "crash")["status"].get("containerStatuses", [])
        if not statuses or statuses[0]["restartCount"] < 2:
            return None
        ended = statuses[0]["lastState"].get("terminated") or statuses[0]["state"].get("terminated")
        return ended  # type: ignore[no-any-return]

    ended = wait_for(restarted, timeout=120, what="two restarts and the last one's end")
    assert ended["exitCode"] == 3
    # the previous container's output (read again if it was just replaced by a newer one)
    previous = wait_for(
        lambda: kubectl.run("logs", "crash", "--previous", check=False).stdout.strip() == "run",
        timeout=30,
        what="the previous container's log",
    )
    assert previous


def test_probes_gate_readiness_and_restart_a_dead_container(kubectl: Kubectl) -> None:
    probe = {"periodSeconds": 1, "failureThreshold": 1}
    kubectl.apply(
        _pod(
            "probed",
            "touch /tmp/alive; exec sleep 3600",
            container={
                "readinessProbe": {"exec": {"command": ["test", "-f", "/tmp/ready"]}, **probe},
                "livenessProbe": {"exec": {"command": ["test", "-f", "/tmp/alive"]}, **probe},
            },
        )
    )

    def status() -> dict[str, Any]:
        return kubectl.json("get", "pod", "probed")["status"]  # type: ignore[no-any-return]

    wait_for(lambda: status().get("containerStatuses", [{}])[0].get("started"), what="started")
    assert status()["containerStatuses"][0]["ready"] is False  # no /tmp/ready yet
    kubectl.run("exec", "probed", "--", "touch", "/tmp/ready")
    _running(kubectl, "probed", timeout=30)
    kubectl.run("exec", "probed", "--", "rm", "/tmp/alive")
    wait_for(
        lambda: status()["containerStatuses"][0]["restartCount"] >= 1,
        timeout=60,
        what="the liveness probe restarting the container",
    )
    events = kubectl.run("get", "events", "--field-selector", "involvedObject.name=probed").stdout
    assert "Liveness probe failed" in events
    # the new container has no /tmp/ready: not Ready again until it has
    assert status()["containerStatuses"][0]["ready"] is False


def test_pods_that_do_not_ask_for_the_real_node_stay_on_simulated_nodes(kubectl: Kubectl) -> None:
    plain = _pod("plain", "true")
    del plain["spec"]["nodeSelector"], plain["spec"]["tolerations"]
    kubectl.apply(plain)
    pod = wait_for(
        lambda: kubectl.json("get", "pod", "plain")["spec"].get("nodeName"), what="scheduled"
    )
    assert pod.startswith(("cpu-", "gpu-"))


def test_load_imports_a_new_archive_once_and_a_pod_runs_it(
    cluster: ClusterHandle, kubectl: Kubectl, tmp_path: Path
) -> None:
    assert cluster.local is not None, "needs the local cluster (not AGENTRL_TEST_KUBECONFIG)"
    token = uuid.uuid4().hex
    (tmp_path / "token").write_text(token + "\n")
    busybox = shutil.which("busybox")
    assert busybox
    name = f"agentrl.local/loadtest:{token[:12]}"
    spec = oci.ImageSpec(
        name=name,
        entries=[
            *artifacts.busybox_entries(Path(busybox), ["sh", "cat", "sleep"]),
            oci.Entry("token", tmp_path / "token", 0o644),
        ],
    )
    archive = tmp_path / "loadtest.tar"
    digest = oci.write_archive(spec, archive)
    # the node's own images are there already at their digests: nothing to import
    assert cluster.local.load([artifacts.BUSYBOX.archive]) == []
    assert cluster.local.load([archive]) == [archive]
    assert cluster.local.load([archive]) == []  # same digest: skipped
    # the same through the command line
    result = CliRunner().invoke(
        dev, ["cluster", "load", "--name", cluster.local.name, str(archive)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    assert "imported 0 archive(s), 1 already present" in result.output
    node = cluster.local.real_node(0)
    assert node.images()[name] == digest
    pod = _pod("loaded", "cat /token; exec sleep 3600")
    pod["spec"]["containers"][0]["image"] = name
    kubectl.apply(pod)
    _running(kubectl, "loaded")
    logs = wait_for(lambda: kubectl.run("logs", "loaded").stdout.strip(), what="its output")
    assert logs == token
    kubectl.run("delete", "pod", "loaded", "--wait=true")
    # the image and the CRI's own reference to it (by config digest)
    refs = [ref for ref, target in node.images().items() if target == digest]
    node.ctr("images", "rm", *refs)


def test_a_machine_that_cannot_run_containers_is_told_what_is_missing() -> None:
    # an unprivileged user is such a machine's view: no namespaces, cgroups or mounts
    probe = (
        "from agentrl.devcluster.node import host, realnode;"
        "print(realnode.unavailable_message(host.missing_requirements()))"
    )
    proc = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            sys.executable,
            "-c",
            probe,
        ],
        capture_output=True,
        text=True,
        check=True,
        # the package's own directory: the editable install's finder is not readable by nobody
        env={**os.environ, "HOME": "/nonexistent", "PYTHONPATH": str(PACKAGE_ROOT)},
    )
    assert "root (the node creates a network namespace" in proc.stdout
    assert "--real-nodes 0" in proc.stdout
