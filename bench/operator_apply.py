"""Benchmark: apply N AgentRLJobs at once and time until every one is Ready, with the API
requests the operator spends per reconcile — side by side with the floor: ``kubectl apply`` of
the very children ``agentrl render`` produces (no operator), timed until the same workloads are
ready.

    python bench/operator_apply.py --jobs 100 --json

Runs on its own local cluster (``bench``, base port 56443, enough simulated GPU nodes for N
jobs) unless ``--kubeconfig`` names one. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from agentrl.api import AgentRLJob
from agentrl.devcluster import binaries
from agentrl.devcluster.cluster import LocalCluster
from agentrl.devcluster.profile import ClusterProfile
from agentrl.devcluster.testing import Kubectl
from agentrl.reconcile.children import desired_children
from agentrl.reconcile.context import BuildContext


def job_manifest(i: int) -> dict[str, Any]:
    """A small job: 1 one-GPU engine, a 1-GPU trainer, 1 rollout worker, a shared volume."""
    return {
        "apiVersion": "agentrl.dev/v1alpha1",
        "kind": "AgentRLJob",
        "metadata": {"name": f"bench-{i:03d}"},
        "spec": {
            "model": {"source": {"path": "/models/Qwen3-8B"}},
            "inference": {
                "engines": 1,
                "contextLength": 32768,
                "maxRunningRequests": 32,
                "cpu": "1",
                "memory": "4Gi",
            },
            "rollout": {"groupSize": 4, "maxTrajectoryTokens": 32768, "maxTokensPerTurn": 4096},
            "sandbox": {"concurrency": 8},
            "trainer": {
                "nodes": 1,
                "gpusPerNode": 1,
                "trajectoriesPerStep": 8,
                "cpu": "1",
                "memory": "4Gi",
                "checkpoint": {"volume": "bench-checkpoints"},
            },
        },
    }


def all_ready(k: Kubectl, n: int) -> bool:
    items = k.json("get", "agentrljobs")["items"]
    ready = sum(
        1
        for j in items
        for c in (j.get("status") or {}).get("conditions", [])
        if c["type"] == "Ready" and c["status"] == "True"
    )
    return ready == n


def workloads_ready(k: Kubectl, n: int) -> bool:
    """The floor's equivalent of Ready: engines ready, trainer pod running, rollout available."""
    sts = k.json("get", "statefulsets")["items"]
    deps = k.json("get", "deployments")["items"]
    jobs = k.json("get", "jobs")["items"]
    ok_sts = sum(1 for s in sts if s["status"].get("readyReplicas", 0) == s["spec"]["replicas"])
    ok_dep = sum(
        1 for d in deps if d["status"].get("availableReplicas", 0) == d["spec"]["replicas"]
    )
    ok_job = sum(1 for j in jobs if j["status"].get("ready", 0) >= 1)
    return ok_sts == n and ok_dep == n and ok_job == n


def wait(check: Any, timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():
            return time.monotonic() - start
        time.sleep(0.5)
    raise TimeoutError("benchmark did not converge")


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def shared_volume(k: Kubectl) -> None:
    k.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "bench-checkpoints"},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "volumeName": f"pv-{k.namespace}",
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--kubeconfig", default=None)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    n = args.jobs

    bins = binaries.ensure(echo=False)
    local = None
    if args.kubeconfig:
        kubeconfig = Path(args.kubeconfig)
    else:
        local = LocalCluster("bench", port=56443)
        gpu_nodes = max(4, (2 * n + 7) // 8)  # 2 GPUs per job, 8 per node
        profile = ClusterProfile().with_counts(gpu_nodes=gpu_nodes, cpu_nodes=2)
        profile.gpu.pods = 500
        local.up(profile, bins=bins, timeout=300)
        kubeconfig = local.kubeconfig
    admin = Kubectl(bins.kubectl, kubeconfig)
    admin.run("apply", "--server-side", "--force-conflicts", "-f", "crds/")
    admin.run("wait", "--for=condition=Established", "crd/agentrljobs.agentrl.dev")
    manifests = [job_manifest(i) for i in range(n)]
    result: dict[str, Any] = {"jobs": n}
    try:
        # ---- A: through the operator
        ns_a = admin.create_namespace("bench-op")
        k_a = admin.in_namespace(ns_a)
        for ns in (ns_a,):
            admin.apply(
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolume",
                    "metadata": {"name": f"pv-{ns}"},
                    "spec": {
                        "capacity": {"storage": "1Ti"},
                        "accessModes": ["ReadWriteMany"],
                        "hostPath": {"path": f"/tmp/{ns}"},
                    },
                }
            )
        shared_volume(k_a)
        port = 58080
        log_path = Path(tempfile.mkdtemp(prefix="bench-operator-")) / "operator.log"
        log = log_path.open("ab")
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        op = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentrl.cli",
                "operator",
                "--namespace",
                ns_a,
                "--metrics-port",
                str(port),
                "--health-port",
                "0",
                "--resync-seconds",
                "600",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        time.sleep(3)
        stream = "\n---\n".join(yaml.safe_dump(m) for m in manifests)
        started = time.monotonic()
        k_a.run("apply", "-f", "-", stdin=stream, timeout=300)
        wait(lambda: all_ready(k_a, n), args.timeout)
        result["operator_seconds_to_all_ready"] = round(time.monotonic() - started, 1)
        metrics = scrape(port)
        os.killpg(op.pid, signal.SIGTERM)
        op.wait(30)
        requests = sum(
            v
            for k, v in metrics.items()
            if k.startswith("agentrl_operator_api_requests_total{") and 'verb="watch"' not in k
        )
        reconciles = sum(
            v for k, v in metrics.items() if k.startswith("agentrl_operator_reconciles_total{")
        )
        writes = sum(
            v
            for k, v in metrics.items()
            if k.startswith("agentrl_operator_api_requests_total{")
            and (
                'verb="apply"' in k
                or 'verb="patch"' in k
                or 'verb="create"' in k
                or 'verb="delete"' in k
            )
        )
        result["reconciles"] = int(reconciles)
        result["api_requests"] = int(requests)
        result["api_requests_per_reconcile"] = round(requests / max(reconciles, 1), 2)
        result["api_writes_per_job"] = round(writes / n, 2)
        print(json.dumps(result), file=sys.stderr, flush=True)
        # free the simulated GPUs for the floor run (the cluster is sized for N jobs)
        k_a.run("delete", "agentrljobs", "--all", "--wait=true", timeout=600)
        wait(lambda: not k_a.json("get", "pods")["items"], args.timeout)

        # ---- B: the floor, kubectl apply of the rendered children
        ns_b = admin.create_namespace("bench-floor")
        k_b = admin.in_namespace(ns_b)
        admin.apply(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": f"pv-{ns_b}"},
                "spec": {
                    "capacity": {"storage": "1Ti"},
                    "accessModes": ["ReadWriteMany"],
                    "hostPath": {"path": f"/tmp/{ns_b}"},
                },
            }
        )
        shared_volume(k_b)
        children: list[dict[str, Any]] = []
        for m in manifests:
            job = AgentRLJob.model_validate(m)
            ctx = BuildContext.for_job(job, namespace=ns_b, uid="00000000-0000-0000-0000-0")
            for child in desired_children(job, ctx):
                child["metadata"].pop("ownerReferences", None)  # no owner: it is not applied
                children.append(child)
        stream = "\n---\n".join(yaml.safe_dump(c) for c in children)
        started = time.monotonic()
        k_b.run("apply", "--server-side", "-f", "-", stdin=stream, timeout=600)
        wait(lambda: workloads_ready(k_b, n), args.timeout)
        result["floor_seconds_to_all_ready"] = round(time.monotonic() - started, 1)
        result["floor_children"] = len(children)
        result["ratio_operator_to_floor"] = round(
            result["operator_seconds_to_all_ready"] / result["floor_seconds_to_all_ready"], 2
        )
    finally:
        if local is not None:
            local.down()
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
