"""What the cluster path costs: the quickstart job through the operator on the local cluster's
real node, against ``agentrl run`` of the same job on this machine, in one run.

Cluster side: the chart installs the operator as a pod (``examples/helm/local-cluster-values.yaml``)
in a fresh namespace, a hostPath volume backs the checkpoint claim, and
``examples/quickstart-cluster.yaml`` is applied with ``trainer.maxSteps`` set to ``--steps`` and
``trainer.evaluation.tasks`` to 0 (training only, as the local side's ``--skip-eval``).
Local side: the same manifest with ``sandbox.provider: local`` (the only field ``agentrl run``
needs changed) run by ``agentrl run --max-steps --skip-eval``. Figures, each side:

* ``apply_to_ready_s`` (cluster only): apply → the job's ``Ready`` condition True;
* ``to_first_step_s``: apply (cluster) or process start (local) → step 1 recorded;
* ``steps_per_minute`` and ``trajectories_per_hour``: from the steps log (``steps.jsonl``, the
  same record on both sides), between step 1 and the last step;
* ``sandbox_ready_p50_s`` / ``_p99_s``: sandbox create → exec-ready, from the
  ``agentrl_sandbox_startup_seconds`` histogram the rollout tier exports (the trainer's metrics
  port on the cluster, ``--metrics-port`` locally), quantiles interpolated within buckets as
  Prometheus' ``histogram_quantile`` does;

and ``ratio_*``: cluster / local. The two sides run one after the other (cluster first), never
at once: on 2 cores they would slow each other.

    python3 bench/cluster_run.py [--steps 5] [--name dev | --kubeconfig FILE] [--json]

Needs a running local cluster with a real node and the project's images
(``agentrl dev prepare`` then ``agentrl dev cluster up``); docs/cluster-run.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "quickstart-cluster.yaml"
VALUES = ROOT / "examples" / "helm" / "local-cluster-values.yaml"
STARTUP = "agentrl_sandbox_startup_seconds"


class Cluster:
    """kubectl and helm against one cluster and namespace."""

    def __init__(self, kubeconfig: str, namespace: str) -> None:
        from agentrl.devcluster import binaries

        bins = binaries.prepared()
        self.kubectl_bin, self.helm_bin = str(bins.kubectl), str(bins.helm)
        self.kubeconfig, self.namespace = kubeconfig, namespace
        self.env = {**os.environ, "KUBECONFIG": kubeconfig}

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        proc = subprocess.run(
            [self.kubectl_bin, "-n", self.namespace, *args],
            input=stdin, capture_output=True, text=True, env=self.env, check=False, timeout=300,
        )  # fmt: skip
        if check and proc.returncode != 0:
            raise SystemExit(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))

    def helm(self, *args: str) -> None:
        proc = subprocess.run(
            [self.helm_bin, *args], capture_output=True, text=True, env=self.env, timeout=600
        )
        if proc.returncode != 0:
            raise SystemExit(f"helm {' '.join(args)}: {proc.stderr.strip()}")


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' ``histogram_quantile`` over cumulative ``(le, count)`` buckets: linear
    interpolation within the bucket the rank falls in (the lowest bucket from 0)."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] == 0:
        return None
    rank = q * buckets[-1][1]
    lower_le, lower_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower_le  # above the highest finite bound: its value
            if count == lower_count:
                return le
            return lower_le + (le - lower_le) * (rank - lower_count) / (count - lower_count)
        lower_le, lower_count = le, count
    return None


def startup_buckets(text: str) -> list[tuple[float, float]]:
    """``agentrl_sandbox_startup_seconds`` buckets summed over every label set but ``le``."""
    sums: dict[float, float] = {}
    for line in text.splitlines():
        if not line.startswith(f"{STARTUP}_bucket{{"):
            continue
        labels, _, value = line.rpartition(" ")
        match = re.search(r'le="([^"]+)"', labels)
        if match:
            le = float(match.group(1).replace("+Inf", "inf"))
            sums[le] = sums.get(le, 0.0) + float(value)
    return sorted(sums.items())


def step_figures(records: list[dict[str, Any]]) -> dict[str, float | None]:
    """Steps per minute and trajectories per hour between step 1 and the last step."""
    if len(records) < 2:
        return {"steps_per_minute": None, "trajectories_per_hour": None}
    first, last = records[0], records[-1]
    seconds = last["wall_seconds"] - first["wall_seconds"]
    trajectories = sum(r["trajectories"] for r in records[1:])
    return {
        "steps_per_minute": round(60 * (len(records) - 1) / seconds, 3),
        "trajectories_per_hour": round(3600 * trajectories / seconds, 1),
    }


def sandbox_figures(buckets: list[tuple[float, float]]) -> dict[str, Any]:
    p50, p99 = histogram_quantile(0.5, buckets), histogram_quantile(0.99, buckets)
    return {
        "sandboxes": int(buckets[-1][1]) if buckets else 0,
        "sandbox_ready_p50_s": None if p50 is None else round(p50, 3),
        "sandbox_ready_p99_s": None if p99 is None else round(p99, 3),
    }


def wait(check: Any, timeout: float, what: str, interval: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := check():
            return result
        time.sleep(interval)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


# ---- the cluster side --------------------------------------------------------------------------


def run_cluster(kubeconfig: str, steps: int, say: Any) -> dict[str, Any]:
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    admin = Cluster(kubeconfig, "default")
    cluster = Cluster(kubeconfig, namespace)
    admin.kubectl("create", "namespace", namespace)
    pv = f"bench-ckpt-{namespace}"
    job = yaml.safe_load(EXAMPLE.read_text())
    name = job["metadata"]["name"]
    job["spec"]["trainer"]["maxSteps"] = steps
    # no held-out evaluation, as `agentrl run --skip-eval` on the local side: training only
    job["spec"]["trainer"]["evaluation"] = {"tasks": 0}
    release = "bench"
    forward: subprocess.Popen[str] | None = None
    try:
        say(f"cluster: helm install the operator into {namespace}")
        # the CRD from crds/, not the chart's copy: helm keeps the CRD it installs and would
        # refuse it to the next run's release
        for crd in sorted((ROOT / "crds").glob("*.yaml")):
            admin.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
        overrides = json.dumps({"watchNamespaces": [namespace], "crds": {"install": False}})
        with tempfile.NamedTemporaryFile("w", suffix=".json") as extra:
            extra.write(overrides)
            extra.flush()
            cluster.helm(
                "install", release, str(ROOT / "charts" / "agentrl"), "-n", namespace,
                "-f", str(VALUES), "-f", extra.name, "--wait", "--timeout", "300s",
            )  # fmt: skip
        admin.kubectl(
            "apply", "-f", "-",
            stdin=json.dumps({
                "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
                "spec": {
                    "capacity": {"storage": "10Gi"},
                    "accessModes": ["ReadWriteMany", "ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "claimRef": {"namespace": namespace, "name": f"{name}-checkpoints"},
                    "hostPath": {"path": f"/tmp/agentrl-bench/{pv}", "type": "DirectoryOrCreate"},
                },
            }),
        )  # fmt: skip
        say(f"cluster: kubectl apply {EXAMPLE.name} (maxSteps {steps})")
        applied = time.monotonic()
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(job))

        def status() -> dict[str, Any]:
            return dict(cluster.json("get", "arj", name).get("status") or {})

        def ready() -> bool:
            return any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in status().get("conditions", [])
            )

        wait(ready, 900, "the job Ready")
        to_ready = time.monotonic() - applied
        say(f"cluster: Ready after {to_ready:.0f} s")
        wait(lambda: status().get("trainer", {}).get("step", 0) >= 1, 1800, "step 1")
        to_first = time.monotonic() - applied
        say(f"cluster: step 1 after {to_first:.0f} s")
        pods = cluster.json(
            "get", "pods", "-l", f"agentrl.dev/job={name},app.kubernetes.io/component=trainer"
        )
        trainer = pods["items"][0]["metadata"]["name"]
        forward = subprocess.Popen(
            [cluster.kubectl_bin, "-n", namespace, "port-forward", f"pod/{trainer}", ":9401"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cluster.env,
        )  # fmt: skip
        assert forward.stdout is not None
        port = int(re.search(r"127\.0\.0\.1:(\d+)", forward.stdout.readline()).group(1))  # type: ignore[union-attr]
        metrics: list[str] = [""]

        def scrape() -> None:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                metrics[0] = r.read().decode()

        def last_step() -> int:
            scrape()  # the last scrape before the trainer finishes holds every sandbox
            return int(status().get("trainer", {}).get("step", 0))

        wait(lambda: last_step() >= steps, 3600, f"step {steps}", interval=5)
        say("cluster: done; reading the steps log")
        log = cluster.kubectl("exec", trainer, "--", "cat", "/checkpoints/trainer/steps.jsonl")
        records = [json.loads(line) for line in log.splitlines() if line.strip()]
        return {
            "apply_to_ready_s": round(to_ready, 1),
            "to_first_step_s": round(to_first, 1),
            "steps": len(records),
            **step_figures(records),
            **sandbox_figures(startup_buckets(metrics[0])),
        }
    finally:
        if forward is not None:
            forward.terminate()
        cluster.kubectl("delete", "arj", name, "--wait=true", check=False)
        subprocess.run(
            [cluster.helm_bin, "uninstall", release, "-n", namespace, "--wait"],
            env=cluster.env, capture_output=True, check=False,
        )  # fmt: skip
        admin.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        admin.kubectl("delete", "pv", pv, "--wait=false", check=False)


# ---- the local side ----------------------------------------------------------------------------


def run_local(steps: int, say: Any) -> dict[str, Any]:
    job = yaml.safe_load(EXAMPLE.read_text())
    job["spec"]["sandbox"]["provider"] = "local"
    work = Path(tempfile.mkdtemp(prefix="bench-local-"))
    manifest = work / "quickstart-local.yaml"
    manifest.write_text(yaml.safe_dump(job))
    steps_log = work / "run" / "logs" / "steps.jsonl"
    port = free_port()
    say(f"local: agentrl run (same manifest, sandbox.provider local, {steps} steps)")
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentrl.cli", "run", str(manifest), "--run-dir", str(work / "run"),
         "--max-steps", str(steps), "--skip-eval", "--quiet", "--metrics-port", str(port)],
        stdout=(work / "run.log").open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    metrics: list[str] = [""]
    first: list[float] = []

    def poll() -> None:
        while proc.poll() is None:
            if not first and steps_log.exists() and steps_log.read_text().strip():
                first.append(time.monotonic() - started)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    metrics[0] = r.read().decode()
            except OSError:
                pass
            time.sleep(1)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    code = proc.wait()
    poller.join()
    if code != 0:
        raise SystemExit(f"agentrl run failed ({code}): see {work / 'run.log'}")
    records = [json.loads(line) for line in steps_log.read_text().splitlines() if line.strip()]
    shutil.rmtree(work, ignore_errors=True)
    return {
        "to_first_step_s": round(first[0], 1) if first else None,
        "steps": len(records),
        **step_figures(records),
        **sandbox_figures(startup_buckets(metrics[0])),
    }


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    from agentrl.devcluster.cluster import DEFAULT_NAME, LocalCluster

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5, help="training steps on each side")
    parser.add_argument("--name", default=DEFAULT_NAME, help="the local cluster's name")
    parser.add_argument("--kubeconfig", default=None, help="another cluster with a real node")
    parser.add_argument("--skip-local", action="store_true", help="the cluster side only")
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    args = parser.parse_args(argv)
    kubeconfig = args.kubeconfig or str(LocalCluster(args.name).kubeconfig)
    if not Path(kubeconfig).exists():
        raise SystemExit(f"no cluster: {kubeconfig} does not exist (agentrl dev cluster up)")

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    load = os.getloadavg()[0]
    report: dict[str, Any] = {"steps": args.steps, "load_1m_start": round(load, 2)}
    report["cluster"] = run_cluster(kubeconfig, args.steps, say)
    if not args.skip_local:
        report["local"] = run_local(args.steps, say)
        for key in ("to_first_step_s", "steps_per_minute", "trajectories_per_hour",
                    "sandbox_ready_p50_s", "sandbox_ready_p99_s"):  # fmt: skip
            c, lo = report["cluster"].get(key), report["local"].get(key)
            report[f"ratio_{key}"] = round(c / lo, 3) if c and lo else None
    report["load_1m_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(report, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
