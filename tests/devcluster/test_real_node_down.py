"""``down`` leaves the machine as it was: a cluster of its own (so the session's cluster is not
disturbed) is brought up with one real node running a pod, then taken down; interfaces,
network namespaces, host iptables, mounts, cgroups, processes, libcni's cache and the kernel
settings the kubelet changes are compared with a snapshot taken before it came up."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from agentrl.devcluster import binaries
from agentrl.devcluster.cluster import LocalCluster
from agentrl.devcluster.node import artifacts, host
from agentrl.devcluster.profile import ClusterProfile
from agentrl.devcluster.testing import Kubectl, wait_for

pytestmark = [pytest.mark.apiserver, pytest.mark.realnode, pytest.mark.slow]

NAME = "realdown"
PORT = 24443  # below the ephemeral range (32768+)


def _lines(cmd: list[str]) -> set[str]:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    # counters and comments change on their own
    return {
        re.sub(r"\[\d+:\d+\]", "", line)
        for line in out.splitlines()
        if line and not line.startswith("#")
    }


def _snapshot(local: LocalCluster) -> dict[str, object]:
    plan = local.node_plan(0)
    state = str(local.state_dir)
    links = {line.split(":")[1].strip().split("@")[0] for line in _lines(["ip", "-o", "link"])}
    cgroups = sorted(
        str(m / plan.cgroup_root.strip("/"))
        for m in host.cgroup_mounts()
        if (m / plan.cgroup_root.strip("/")).exists()
    )
    results = Path("/var/lib/cni/results")
    return {
        "links": links,
        "netns": sorted(p.name for p in host.NETNS_DIR.glob("*"))
        if host.NETNS_DIR.exists()
        else [],
        "iptables": _lines(["iptables-save"]),
        "routes": _lines(["ip", "-4", "route"]),
        "addresses": _lines(["ip", "-4", "-o", "addr"]),
        "mounts": host.mounts_under(local.state_dir),
        "cgroups": cgroups,
        "processes": sorted(host.processes_mentioning(state)),
        "cni_results": sorted(
            p.name for p in results.glob("*") if p.name.startswith(f"agentrl-{NAME}-")
        ),
        "var_lib_cni": Path("/var/lib/cni").exists(),
        "tunables": host.read_tunables(),
    }


@pytest.mark.timeout(900)  # a whole cluster up and down, on a machine shared with builds
def test_down_leaves_the_machine_as_it_was() -> None:
    bins = binaries.prepared()
    local = LocalCluster(NAME, port=PORT)
    local.delete()
    before = _snapshot(local)
    profile = ClusterProfile().with_counts(gpu_nodes=0, cpu_nodes=0)
    try:
        # the node's own images are enough here (the project's would only add import time)
        local.up(profile, bins=bins, real_nodes=1, timeout=240, project_images=False)
        kubectl = Kubectl(bins.kubectl, local.kubeconfig, "default")
        kubectl.apply(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "held"},
                "spec": {
                    "tolerations": [{"key": "agentrl.dev/real-node", "operator": "Exists"}],
                    "containers": [
                        {
                            "name": "main",
                            "image": artifacts.BUSYBOX.name,
                            "command": ["sleep", "3600"],
                            "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                        }
                    ],
                    "volumes": [{"name": "scratch", "emptyDir": {"medium": "Memory"}}],
                },
            }
        )
        wait_for(
            lambda: kubectl.json("get", "pod", "held")["status"].get("phase") == "Running",
            timeout=120,
            what="the pod running",
        )
        during = _snapshot(local)
        plan = local.node_plan(0)
        # the node did leave its marks, so the comparison below can fail
        assert plan.host_veth in during["links"]  # type: ignore[operator]
        assert plan.netns in during["netns"]  # type: ignore[operator]
        assert during["mounts"] and during["cgroups"] and during["processes"]
        assert any(plan.host_veth in rule for rule in during["iptables"])  # type: ignore[attr-defined]
        report = local.status()["real_nodes"][0]
        assert report["ready"] is True and all(report["processes"].values())
        json.dumps(report)
    finally:
        stopped = local.down()
    assert {"kubelet-real-0", "containerd-real-0", "kube-proxy-real-0"} <= set(stopped)
    after = _snapshot(local)
    for key in before:
        assert after[key] == before[key], key
    local.delete()
