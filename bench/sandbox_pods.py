"""Sandbox pods on the local cluster's real node: create -> exec-ready latency.

Each sandbox goes through the project's ``kubernetes`` sandbox provider
(:class:`agentrl.sandbox.kubernetes.KubernetesProvider` with :class:`KubeApiTransport`), built
from an AgentRLJob stored in a fresh namespace, exactly as a rollout worker builds it: the job's
hardened pod template (non-root, seccomp RuntimeDefault, no capabilities, resources from
``spec.sandbox``), placed on the real node by ``spec.sandbox.nodeSelector``/``tolerations``. One
sample is the time from ``provider.create`` to the first ``exec`` that returns (``true``, exit 0)
through the API server, the kubelet and containerd; the sandbox is then closed (pod deleted).
``--concurrency`` sandboxes are in flight at once, ``--pods`` samples in all.

    python3 bench/sandbox_pods.py [--pods 200] [--concurrency 8] [--json]

Needs a running cluster with a real node (``agentrl dev cluster up``; ``--name``/``--kubeconfig``
pick another) and the busybox image the ``node`` prepare step builds (``--image`` another image
imported with ``agentrl dev cluster load``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any


def _kubectl(kubeconfig: str, *args: str, stdin: str | None = None) -> str:
    from agentrl.devcluster import binaries

    proc = subprocess.run(
        [str(binaries.prepared().kubectl), "--kubeconfig", kubeconfig, *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


async def _run(args: argparse.Namespace, kubeconfig: str, namespace: str) -> dict[str, Any]:
    from agentrl.api import AgentRLJob
    from agentrl.reconcile.context import BuildContext
    from agentrl.reconcile.sandbox import sandbox_pods
    from agentrl.sandbox.kubernetes import (
        KubeApiTransport,
        KubernetesProvider,
    )
    from agentrl.sandbox.provider import SandboxRequest

    manifest = {
        "apiVersion": "agentrl.dev/v1alpha1",
        "kind": "AgentRLJob",
        "metadata": {"name": "bench", "namespace": namespace},
        "spec": {
            "model": {"source": {"path": "tiny"}},
            "sandbox": {
                "image": args.image,
                "cpu": args.cpu,
                "memory": args.memory,
                "ephemeralStorage": "256Mi",
                "concurrency": args.concurrency,
                "maxCreatesPerSecond": args.creates_per_second,
                "startupTimeoutSeconds": 300,
                "nodeSelector": {"agentrl.dev/real-node": "true"},
                "tolerations": [
                    {"key": "agentrl.dev/real-node", "operator": "Exists", "effect": "NoSchedule"}
                ],
            },
        },
    }
    _kubectl(kubeconfig, "apply", "-f", "-", stdin=json.dumps(manifest))
    job = AgentRLJob.model_validate(
        json.loads(_kubectl(kubeconfig, "get", "arj", "bench", "-n", namespace, "-o", "json"))
    )
    provider = KubernetesProvider(
        transport=KubeApiTransport(namespace, kubeconfig=kubeconfig),
        pods=sandbox_pods(job, BuildContext.for_job(job, namespace=namespace)),
        worker_id="bench",
        creates_per_second=args.creates_per_second,
        poll_seconds=0.1,
    )
    samples: list[float] = []
    running: list[float] = []
    failures: list[str] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(args.pods):
        queue.put_nowait(i)

    async def worker() -> None:
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            t0 = time.monotonic()
            try:
                sandbox = await provider.create(SandboxRequest(episode_id=f"bench-{i}"))
            except Exception as exc:  # an infra error: counted, never a sample
                failures.append(f"create: {exc}")
                continue
            t_running = time.monotonic()
            try:
                result = await sandbox.exec("true", timeout=60)
                if result.exit_code == 0:
                    samples.append(time.monotonic() - t0)
                    running.append(t_running - t0)
                else:
                    failures.append(f"exec exit {result.exit_code}: {result.stderr[-200:]}")
            finally:
                await sandbox.close()

    started = time.monotonic()
    try:
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    finally:
        await provider.aclose()
    wall = time.monotonic() - started
    report: dict[str, Any] = {
        "pods": args.pods,
        "concurrency": args.concurrency,
        "image": args.image,
        "ok": len(samples),
        "failed": len(failures),
        "wall_seconds": round(wall, 2),
        "pods_per_second": round(len(samples) / wall, 2) if wall else None,
    }
    if samples:
        report["create_to_exec_ready_seconds"] = {
            "p50": round(statistics.median(samples), 3),
            "p99": round(_percentile(samples, 0.99), 3),
            "max": round(max(samples), 3),
        }
        report["create_to_running_seconds"] = {
            "p50": round(statistics.median(running), 3),
            "p99": round(_percentile(running, 0.99), 3),
        }
    if failures:
        report["first_failures"] = failures[:5]
    return report


def main(argv: list[str] | None = None) -> int:
    from agentrl.devcluster.cluster import DEFAULT_NAME, LocalCluster
    from agentrl.devcluster.node import artifacts

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=200, help="sandboxes in all")
    parser.add_argument("--concurrency", type=int, default=8, help="sandboxes in flight at once")
    parser.add_argument("--image", default=artifacts.BUSYBOX.name)
    parser.add_argument("--cpu", default="50m", help="spec.sandbox.cpu of each sandbox")
    parser.add_argument("--memory", default="64Mi", help="spec.sandbox.memory of each sandbox")
    parser.add_argument("--creates-per-second", type=float, default=50.0)
    parser.add_argument("--name", default=DEFAULT_NAME, help="the local cluster's name")
    parser.add_argument("--kubeconfig", default=None, help="another cluster with a real node")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    kubeconfig = args.kubeconfig or str(LocalCluster(args.name).kubeconfig)
    if not Path(kubeconfig).exists():
        raise SystemExit(f"no cluster: {kubeconfig} does not exist (agentrl dev cluster up)")
    root = Path(__file__).resolve().parents[1]
    for crd in sorted((root / "crds").glob("*.yaml")):
        _kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(crd))
    _kubectl(
        kubeconfig,
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/agentrljobs.agentrl.dev",
    )
    namespace = f"bench-sbx-{uuid.uuid4().hex[:6]}"
    _kubectl(kubeconfig, "create", "namespace", namespace)
    try:
        report = asyncio.run(_run(args, kubeconfig, namespace))
    finally:
        _kubectl(kubeconfig, "delete", "namespace", namespace, "--wait=false")
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for key, value in report.items():
            print(f"{key:<28} {value}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
