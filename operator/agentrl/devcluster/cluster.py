"""Bring a local control plane up, report on it, and take it down.

``up`` is idempotent: on a running cluster it only re-applies the nodes. Ports are fixed
offsets from one base port (``--port``, default 16443) so several clusters can coexist and a
port already in use is reported at once rather than hung on.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agentrl.devcluster import binaries as binaries_mod
from agentrl.devcluster import nodes, pki, stages, versions
from agentrl.devcluster.node import addons, artifacts, host
from agentrl.devcluster.node import config as node_config
from agentrl.devcluster.node.realnode import RealNode, RealNodeError
from agentrl.devcluster.processes import (
    Component,
    PortInUseError,
    ProcessTable,
    port_free,
    port_owner,
)
from agentrl.devcluster.profile import ClusterProfile

DEFAULT_NAME = "dev"
DEFAULT_PORT = 16443
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"
POD_CIDR = "10.244.0.0/16"
#: kwok's simulated pods take the lower half of the pod CIDR; real nodes' pods the upper
KWOK_POD_CIDR = "10.244.0.0/17"
#: Real nodes by default (``--real-nodes``); 0 keeps the cluster simulated only.
DEFAULT_REAL_NODES = 1
MAX_REAL_NODES = 8

#: Start order; ``down`` stops in reverse.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")

#: kwok's optional resources the cluster serves (exec/logs/port-forward answered locally),
#: by kind -> the CRD file in kwok's module.
KWOK_CRDS = {
    "Exec": "execs",
    "ClusterExec": "clusterexecs",
    "Logs": "logs",
    "ClusterLogs": "clusterlogs",
    "PortForward": "portforwards",
    "ClusterPortForward": "clusterportforwards",
    "Attach": "attaches",
    "ClusterAttach": "clusterattaches",
}


class ClusterError(RuntimeError):
    """The cluster could not be brought up or reached; the message says why and what to do."""


@dataclass(frozen=True)
class Ports:
    """Every port of one cluster, from its base port."""

    base: int

    @property
    def apiserver(self) -> int:
        return self.base

    @property
    def etcd_client(self) -> int:
        return self.base + 1

    @property
    def etcd_peer(self) -> int:
        return self.base + 2

    @property
    def controller_manager(self) -> int:
        return self.base + 3

    @property
    def scheduler(self) -> int:
        return self.base + 4

    @property
    def kwok(self) -> int:
        """kwok's kubelet-like server: exec, logs, port-forward."""
        return self.base + 5

    def all(self) -> dict[str, int]:
        return {
            "kube-apiserver": self.apiserver,
            "etcd (client)": self.etcd_client,
            "etcd (peer)": self.etcd_peer,
            "kube-controller-manager": self.controller_manager,
            "kube-scheduler": self.scheduler,
            "kwok": self.kwok,
        }


def state_root() -> Path:
    """``$XDG_STATE_HOME/agentrl/clusters`` (``~/.local/state/agentrl/clusters``)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "agentrl" / "clusters"


class LocalCluster:
    """One named local cluster and its state directory."""

    def __init__(self, name: str = DEFAULT_NAME, *, port: int | None = None) -> None:
        if not name or not name.replace("-", "").isalnum():
            raise ClusterError(f"--name {name!r}: use letters, digits and dashes")
        self.name = name
        self.state_dir = state_root() / name
        self.pki_dir = self.state_dir / "pki"
        self.procs = ProcessTable(self.state_dir)
        recorded = self._recorded()
        base = port if port is not None else recorded.get("port", DEFAULT_PORT)
        if not 1024 <= base <= 65535 - 6:
            raise ClusterError(f"--port {base}: choose a base port between 1024 and 65529")
        self.ports = Ports(int(base))

    # ----------------------------------------------------------------- paths & kubeconfigs
    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig users and tests point KUBECONFIG at."""
        return self.state_dir / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    def _recorded(self) -> dict[str, Any]:
        try:
            data = json.loads((self.state_dir / "cluster.json").read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _write_kubeconfig(self, path: Path, user: str) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": f"agentrl-{self.name}",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority": str(self.pki_dir / "ca.crt"),
                    },
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate": str(self.pki_dir / f"{user}.crt"),
                        "client-key": str(self.pki_dir / f"{user}.key"),
                    },
                }
            ],
            "contexts": [
                {
                    "name": f"agentrl-{self.name}",
                    "context": {"cluster": f"agentrl-{self.name}", "user": user},
                }
            ],
            "current-context": f"agentrl-{self.name}",
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)

    # -------------------------------------------------------------------------- checks
    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki_dir / "ca.crt"))
        ctx.load_cert_chain(str(self.pki_dir / "admin.crt"), str(self.pki_dir / "admin.key"))
        return ctx

    def _get(self, path: str, timeout: float = 2.0) -> tuple[int, str]:
        req = urllib.request.Request(self.server + path)
        try:
            with urllib.request.urlopen(req, context=self._ssl_context(), timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")
        except (OSError, ssl.SSLError) as exc:
            return 0, str(exc)

    def apiserver_ready(self) -> bool:
        """Whether kube-apiserver answers /readyz with ok."""
        if not (self.pki_dir / "complete").exists():
            return False
        status, _ = self._get("/readyz")
        return status == 200

    def running(self) -> dict[str, int | None]:
        """Pid of each component (None when not running)."""
        return {name: self.procs.pid(name) for name in COMPONENTS}

    # ------------------------------------------------------------------------ real nodes
    def node_plan(self, index: int) -> node_config.NodePlan:
        return node_config.NodePlan(
            cluster=self.name,
            index=index,
            state_dir=self.state_dir,
            apiserver_port=self.ports.apiserver,
            pod_cidr=POD_CIDR,
            service_cidr=SERVICE_CIDR,
        )

    def real_node(self, index: int) -> RealNode:
        return RealNode(self.node_plan(index), pki_dir=self.pki_dir, procs=self.procs)

    def real_nodes(self) -> list[RealNode]:
        """Every real node this cluster has state for (recorded or found on disk)."""
        count = int(self._recorded().get("real_nodes", 0) or 0)
        found = {
            int(d.name.split("-", 1)[1])
            for d in (self.state_dir / "nodes").glob("real-*")
            if d.name.split("-", 1)[1].isdigit()
        }
        return [self.real_node(i) for i in sorted(found | set(range(count)))]

    # ------------------------------------------------------------------------------ up
    def _wait(self, what: str, check: Callable[[], bool], timeout: float, log: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            if self.procs.pid(log) is None:
                tail = _tail(self.procs.log_path(log))
                raise ClusterError(f"{log} exited while waiting for {what}:\n{tail}")
            time.sleep(0.2)
        raise ClusterError(
            f"timed out after {timeout:.0f}s waiting for {what}; see {self.procs.log_path(log)}"
        )

    def _check_ports(self) -> None:
        busy = [
            f"{port} ({what}, used by {port_owner(port)})"
            for what, port in self.ports.all().items()
            if not port_free(port)
        ]
        if busy:
            raise PortInUseError(
                "ports needed by the cluster are in use: "
                + ", ".join(busy)
                + f". Stop what uses them or choose another base port with --port "
                f"(this cluster needs {self.ports.base}..{self.ports.base + 5})."
            )

    def _kubectl(self, bins: binaries_mod.Binaries, *args: str, stdin: str | None = None) -> str:
        proc = subprocess.run(
            [str(bins.kubectl), "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if proc.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def up(
        self,
        profile: ClusterProfile,
        *,
        bins: binaries_mod.Binaries,
        echo: Callable[[str], None] = lambda _msg: None,
        timeout: float = 120.0,
        real_nodes: int | None = None,
        project_images: bool = True,
    ) -> bool:
        """Start every component (those not already running), apply the simulated nodes and
        start ``real_nodes`` real ones (default: as recorded, else 1) with the node's own images
        and, with ``project_images``, every finished archive of :mod:`.images`; returns False
        when the control plane was already running (only nodes were applied or started)."""
        if real_nodes is None:
            real_nodes = int(self._recorded().get("real_nodes", DEFAULT_REAL_NODES))
        if not 0 <= real_nodes <= MAX_REAL_NODES:
            raise ClusterError(f"--real-nodes {real_nodes}: choose 0..{MAX_REAL_NODES}")
        if real_nodes:
            missing = host.missing_requirements()
            if missing:
                from agentrl.devcluster.node.realnode import unavailable_message

                raise ClusterError(unavailable_message(missing))
        alive = {n: p for n, p in self.running().items() if p is not None}
        if len(alive) == len(COMPONENTS) and self.apiserver_ready():
            echo(f"cluster '{self.name}' is already running at {self.server}")
            self._apply_nodes(bins, profile, real_nodes)
            self._record(profile, real_nodes)
            self._up_real_nodes(
                bins, real_nodes, echo=echo, timeout=timeout, project_images=project_images
            )
            return False
        if alive:
            echo(f"cluster '{self.name}' is partly running ({', '.join(alive)}): restarting it")
            self.down()
        self._check_ports()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        pki.ensure_pki(self.pki_dir, service_ip=SERVICE_IP)
        self._write_kubeconfig(self.kubeconfig, "admin")
        for user in ("kube-controller-manager", "kube-scheduler", "kwok"):
            self._write_kubeconfig(self.state_dir / f"{user}.kubeconfig", user)
        (self.state_dir / "kwok.yaml").write_text(stages.stages_yaml())
        self._record(profile, real_nodes)

        started = time.monotonic()
        self.procs.start(self._etcd(bins))
        self._wait("etcd", self._etcd_healthy, timeout, "etcd")
        self.procs.start(self._apiserver(bins))
        self._wait("kube-apiserver /readyz", self.apiserver_ready, timeout, "kube-apiserver")
        self.procs.start(self._controller_manager(bins))
        self.procs.start(self._scheduler(bins))
        self._install_kwok_crds(bins)
        self.procs.start(self._kwok(bins))
        self._apply_nodes(bins, profile, real_nodes)
        self._apply_local_exec(bins)
        self._wait_nodes_ready(bins, profile, timeout)
        self._wait(
            "the default ServiceAccount (kube-controller-manager running)",
            lambda: (
                "default"
                in self._kubectl(bins, "get", "serviceaccounts", "-n", "default", "-o", "name")
            ),
            timeout,
            "kube-controller-manager",
        )
        self._up_real_nodes(
            bins, real_nodes, echo=echo, timeout=timeout, project_images=project_images
        )
        echo(f"cluster '{self.name}' up in {time.monotonic() - started:.1f}s at {self.server}")
        return True

    def _up_real_nodes(
        self,
        bins: binaries_mod.Binaries,
        count: int,
        *,
        echo: Callable[[str], None],
        timeout: float,
        project_images: bool = True,
    ) -> None:
        """Start real nodes 0..count-1 (those not running), stop any beyond, wait until each
        is Ready with its pod CIDR, and run CoreDNS on node 0. Serialised by a lock: several
        test sessions may bring up the same shared cluster at once."""
        with self._nodes_lock():
            self._up_real_nodes_locked(
                bins, count, echo=echo, timeout=timeout, project_images=project_images
            )

    @contextlib.contextmanager
    def _nodes_lock(self) -> Iterator[None]:
        import fcntl

        self.state_dir.mkdir(parents=True, exist_ok=True)
        with (self.state_dir / "nodes.lock").open("w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _up_real_nodes_locked(
        self,
        bins: binaries_mod.Binaries,
        count: int,
        *,
        echo: Callable[[str], None],
        timeout: float,
        project_images: bool,
    ) -> None:
        for node in self.real_nodes():
            if node.plan.index >= count:
                node.stop()
                if not host.mounts_under(node.plan.dir):
                    shutil.rmtree(node.plan.dir, ignore_errors=True)
                self._kubectl(
                    bins, "delete", "node", node.name, "--ignore-not-found", "--wait=false"
                )
        if not count:
            return
        archives = project_archives() if project_images else []
        if project_images:
            echo_stale_images(echo)
        for index in range(count):
            node = self.real_node(index)
            t0 = time.monotonic()
            since = time.time() - 1  # the API's times have whole seconds
            try:
                spent = node.start(bins, archives=archives, echo=echo, timeout=timeout)
            except RealNodeError as exc:
                raise ClusterError(str(exc)) from exc
            self._wait(
                f"real node {node.name} Ready",
                lambda n=node, t=(since if spent else 0): self._node_ready(bins, n.name, t),
                timeout,
                node.plan.component("kubelet"),
            )
            self._set_pod_cidr(bins, node)
            # the kubelet sets its --node-labels only when it registers: keep them current
            labels = [f"{k}={v}" for k, v in sorted(node_config.REAL_NODE_LABELS.items())]
            self._kubectl(bins, "label", "node", node.name, "--overwrite", *labels)
            if spent:
                echo(f"real node {node.name} Ready in {time.monotonic() - t0:.1f}s")
        plan = self.node_plan(0)
        manifests = addons.coredns_manifests(
            plan, image=artifacts.COREDNS.name, image_digest=artifacts.COREDNS.digest() or ""
        )
        stream = "\n---\n".join(yaml.safe_dump(m, sort_keys=False) for m in manifests)
        self._kubectl(bins, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=stream)
        self._wait(
            "CoreDNS available on the real node",
            lambda: self._coredns_available(bins),
            timeout,
            plan.component("kubelet"),
        )

    def _node_ready(self, bins: binaries_mod.Binaries, name: str, since: float = 0) -> bool:
        """Whether node ``name`` is Ready, by a heartbeat at or after ``since`` (a restarted
        node's object keeps its old Ready condition until the kubelet reports again)."""
        import datetime

        out = self._kubectl(bins, "get", "nodes", "--ignore-not-found", name, "-o", "json")
        if not out.strip():
            return False
        for cond in json.loads(out).get("status", {}).get("conditions", []):
            if cond.get("type") != "Ready" or cond.get("status") != "True":
                continue
            beat = datetime.datetime.fromisoformat(cond["lastHeartbeatTime"].replace("Z", "+00:00"))
            return beat.timestamp() >= since
        return False

    def _set_pod_cidr(self, bins: binaries_mod.Binaries, node: RealNode) -> None:
        """Record the node's pod /24 in ``spec.podCIDR`` (the node IPAM controller is off;
        the field can be set once, so only when unset)."""
        current = self._kubectl(bins, "get", "node", node.name, "-o", "jsonpath={.spec.podCIDR}")
        if not current.strip():
            subnet = node.plan.pod_subnet
            patch = json.dumps({"spec": {"podCIDR": subnet, "podCIDRs": [subnet]}})
            self._kubectl(bins, "patch", "node", node.name, "--type=merge", "-p", patch)

    def _coredns_available(self, bins: binaries_mod.Binaries) -> bool:
        """The CoreDNS Deployment rolled out: its current generation observed, and its one
        replica updated and available (a changed image replaces the pod first)."""
        out = self._kubectl(
            bins, "get", "deployment", "-n", addons.NAMESPACE, addons.NAME, "-o", "json"
        )
        obj = json.loads(out)
        status = obj.get("status", {})
        return bool(
            status.get("observedGeneration", 0) >= obj["metadata"].get("generation", 1)
            and status.get("updatedReplicas") == 1
            and status.get("availableReplicas") == 1
            and status.get("replicas") == 1
        )

    def load(self, archives: list[Path], *, echo: Callable[[str], None] = print) -> list[Path]:
        """Import OCI archives into every running real node (skipping images it already has
        at the same digest); returns the archives imported anywhere."""
        nodes_up = [n for n in self.real_nodes() if n.running()]
        if not nodes_up:
            flag = "" if self.name == DEFAULT_NAME else f" --name {self.name}"
            raise ClusterError(
                f"cluster '{self.name}' has no running real node: `agentrl dev cluster up{flag}`"
            )
        imported: list[Path] = []
        for node in nodes_up:
            try:
                imported += node.import_images(archives, echo=echo)
            except RealNodeError as exc:
                raise ClusterError(str(exc)) from exc
        return imported

    def _record(self, profile: ClusterProfile, real_nodes: int = 0) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "cluster.json").write_text(
            json.dumps(
                {
                    "name": self.name,
                    "port": self.ports.base,
                    "server": self.server,
                    "kubeconfig": str(self.kubeconfig),
                    "kubernetes": versions.KUBERNETES,
                    "kwok": versions.KWOK,
                    "profile": profile.model_dump(),
                    "real_nodes": real_nodes,
                },
                indent=2,
            )
        )

    def _etcd_healthy(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.ports.etcd_client}/health"
            with urllib.request.urlopen(url, timeout=1) as resp:
                return bool(json.loads(resp.read()).get("health") == "true")
        except (OSError, ValueError):
            return False

    def _etcd(self, bins: binaries_mod.Binaries) -> Component:
        p = self.ports
        return Component(
            "etcd",
            [
                str(bins.etcd),
                "--name=default",
                f"--data-dir={self.state_dir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{p.etcd_client}",
                f"--advertise-client-urls=http://127.0.0.1:{p.etcd_client}",
                f"--listen-peer-urls=http://127.0.0.1:{p.etcd_peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{p.etcd_peer}",
                f"--initial-cluster=default=http://127.0.0.1:{p.etcd_peer}",
                "--unsafe-no-fsync=true",  # a throwaway dev cluster: trade durability for speed
                "--quota-backend-bytes=4294967296",
                "--log-level=warn",
            ],
        )

    def _advertise_address(self) -> str:
        """The ``kubernetes`` Service's endpoint. The API server listens on loopback only, and
        writes no endpoint for a loopback address: with a real node it advertises the machine's
        end of node 0's link, which pods reach (see :attr:`NodePlan.api_ip`)."""
        if int(self._recorded().get("real_nodes", 0) or 0):
            return self.node_plan(0).api_ip
        return "127.0.0.1"

    def _apiserver(self, bins: binaries_mod.Binaries) -> Component:
        k = self.pki_dir
        return Component(
            "kube-apiserver",
            [
                str(bins.kube_apiserver),
                f"--etcd-servers=http://127.0.0.1:{self.ports.etcd_client}",
                "--bind-address=127.0.0.1",
                f"--advertise-address={self._advertise_address()}",
                f"--secure-port={self.ports.apiserver}",
                f"--cert-dir={self.state_dir / 'apiserver-certs'}",
                f"--tls-cert-file={k / 'apiserver.crt'}",
                f"--tls-private-key-file={k / 'apiserver.key'}",
                f"--client-ca-file={k / 'ca.crt'}",
                f"--kubelet-client-certificate={k / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={k / 'apiserver-kubelet-client.key'}",
                # kubelets' (and kwok's) serving certificates are signed by the cluster CA
                f"--kubelet-certificate-authority={k / 'ca.crt'}",
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={k / 'sa.pub'}",
                f"--service-account-signing-key-file={k / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                # the default plugin set plus NodeRestriction, as kubeadm configures
                "--enable-admission-plugins=NodeRestriction",
                "--allow-privileged=true",
                "--profiling=false",
                "--v=1",
            ],
        )

    def _controller_manager(self, bins: binaries_mod.Binaries) -> Component:
        k = self.pki_dir
        kubeconfig = self.state_dir / "kube-controller-manager.kubeconfig"
        return Component(
            "kube-controller-manager",
            [
                str(bins.kube_controller_manager),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports.controller_manager}",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={k / 'sa.key'}",
                f"--root-ca-file={k / 'ca.crt'}",
                f"--cluster-signing-cert-file={k / 'ca.crt'}",
                f"--cluster-signing-key-file={k / 'ca.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--controllers=*,-nodeipam,-cloud-node-lifecycle,-service,-route",
                "--concurrent-gc-syncs=20",
                "--v=1",
            ],
        )

    def _scheduler(self, bins: binaries_mod.Binaries) -> Component:
        kubeconfig = self.state_dir / "kube-scheduler.kubeconfig"
        return Component(
            "kube-scheduler",
            [
                str(bins.kube_scheduler),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports.scheduler}",
                "--leader-elect=false",
                "--v=1",
            ],
        )

    def _kwok(self, bins: binaries_mod.Binaries) -> Component:
        k = self.pki_dir
        return Component(
            "kwok",
            [
                str(bins.kwok),
                f"--kubeconfig={self.state_dir / 'kwok.kubeconfig'}",
                f"--config={self.state_dir / 'kwok.yaml'}",
                f"--manage-nodes-with-annotation-selector={nodes.KWOK_ANNOTATION}=fake",
                "--node-ip=127.0.0.1",
                f"--node-port={self.ports.kwok}",
                f"--server-address=127.0.0.1:{self.ports.kwok}",
                f"--tls-cert-file={k / 'kwok-server.crt'}",
                f"--tls-private-key-file={k / 'kwok-server.key'}",
                f"--cidr={KWOK_POD_CIDR}",
                "--node-lease-duration-seconds=40",
                "--enable-crds=" + ",".join(KWOK_CRDS),
            ],
        )

    def _install_kwok_crds(self, bins: binaries_mod.Binaries) -> None:
        crd_dir = _kwok_crd_dir()
        docs = [
            (crd_dir / f"kwok.x-k8s.io_{plural}.yaml").read_text() for plural in KWOK_CRDS.values()
        ]
        self._kubectl(bins, "apply", "--server-side", "-f", "-", stdin="\n---\n".join(docs))
        self._kubectl(
            bins,
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            *[f"crd/{plural}.kwok.x-k8s.io" for plural in KWOK_CRDS.values()],
        )

    def _apply_local_exec(self, bins: binaries_mod.Binaries) -> None:
        """Answer ``kubectl exec`` (the exec subresource) on every simulated pod by running the
        command on this machine, in ``<state>/exec``: simulated pods have no container, and the
        sandbox provider's create → exec → delete path must still go through the API server.
        Tests that need a per-pod directory create a namespaced kwok ``Exec`` for that pod."""
        workdir = self.state_dir / "exec"
        workdir.mkdir(parents=True, exist_ok=True)
        cluster_exec = {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "ClusterExec",
            "metadata": {"name": "agentrl-local-exec"},
            "spec": {"execs": [{"local": {"workDir": str(workdir)}}]},
        }
        self._kubectl(
            bins,
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            "-",
            stdin=json.dumps(cluster_exec),
        )

    def _apply_nodes(
        self, bins: binaries_mod.Binaries, profile: ClusterProfile, real_nodes: int = 0
    ) -> None:
        manifests = nodes.nodes_for(profile)
        stream = "\n---\n".join(yaml.safe_dump(m, sort_keys=False) for m in manifests)
        if stream:
            self._kubectl(
                bins, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=stream
            )
        wanted = {m["metadata"]["name"] for m in manifests}
        wanted |= {self.node_plan(i).name for i in range(real_nodes)}
        existing = self._kubectl(
            bins, "get", "nodes", "-o", "jsonpath={.items[*].metadata.name}"
        ).split()
        extra = [n for n in existing if n not in wanted]
        if extra:
            self._kubectl(bins, "delete", "node", *extra, "--wait=false")

    def _wait_nodes_ready(
        self, bins: binaries_mod.Binaries, profile: ClusterProfile, timeout: float
    ) -> None:
        want = profile.gpu.count + profile.cpu.count

        def ready() -> bool:
            out = self._kubectl(
                bins,
                "get",
                "nodes",
                "-o",
                'jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].status}'
                '{"\\n"}{end}',
            )
            return out.split().count("True") >= want

        self._wait(f"{want} nodes Ready", ready, timeout, "kwok")

    # ---------------------------------------------------------------------- down & status
    def down(self) -> list[str]:
        """Stop every real node (removing what it made on the machine) and every component;
        returns the names that were running."""
        stopped = []
        if self.state_dir.exists():
            with self._nodes_lock():
                for node in reversed(self.real_nodes()):
                    stopped += node.stop()
        for name in reversed(COMPONENTS):
            if self.procs.stop(name):
                stopped.append(name)
        return stopped

    def delete(self, *, keep_images: bool = False) -> None:
        """Stop everything and remove the state directory (certificates, etcd data, real
        nodes). ``keep_images``: keep each real node's containerd root (its image store, no
        containers are left in it), so a fresh cluster of the same name does not import
        gigabytes of images again (the test session's cluster starts fresh every time)."""

        self.down()
        left = host.mounts_under(self.state_dir)
        if left:
            # never delete through a mount (a volume of a pod could be a directory elsewhere)
            raise ClusterError(
                f"cannot delete {self.state_dir}: still mounted: {', '.join(left)}; "
                "unmount them (umount -l) and retry"
            )
        if not keep_images:
            shutil.rmtree(self.state_dir, ignore_errors=True)
            return
        keep = {n.plan.containerd_dir / "root" for n in self.real_nodes()}

        def prune(directory: Path) -> None:
            for child in directory.iterdir():
                if child in keep:
                    continue
                if any(child in k.parents for k in keep):
                    prune(child)  # a directory above a kept root
                elif child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)

        if self.state_dir.exists():
            prune(self.state_dir)

    def status(self) -> dict[str, Any]:
        """A report of components, readiness and nodes."""
        procs = self.running()
        ready = self.apiserver_ready() if procs.get("kube-apiserver") else False
        return {
            "name": self.name,
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "apiserver_ready": ready,
            "components": procs,
            "state_dir": str(self.state_dir),
            "real_nodes": [self._real_node_status(n, ready) for n in self.real_nodes()],
        }

    def _real_node_status(self, node: RealNode, api_ready: bool) -> dict[str, Any]:
        report = node.status()
        report["ready"] = False
        report["registered_pod_cidr"] = None
        if api_ready:
            code, body = self._get(f"/api/v1/nodes/{node.name}")
            if code == 200:
                obj = json.loads(body)
                conditions = obj.get("status", {}).get("conditions", [])
                report["ready"] = any(
                    c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
                )
                report["registered_pod_cidr"] = obj.get("spec", {}).get("podCIDR")
        return report


def project_archives() -> list[Path]:
    """The project's image archives (built by :mod:`agentrl.devcluster.images`); none when
    that module is absent."""
    try:
        from agentrl.devcluster import images
    except ImportError:
        return []
    return list(images.archives())


def echo_stale_images(echo: Callable[[str], None]) -> None:
    """Say which project images are not imported (absent, or built from older source)."""
    try:
        from agentrl.devcluster import images
    except ImportError:
        return
    stale = images.missing()
    if stale:
        echo(
            f"not importing {', '.join(stale)}: absent or older than the source "
            "(`agentrl dev images`, then `agentrl dev cluster load`)"
        )


def _kwok_crd_dir() -> Path:
    """The CRD manifests shipped in the kwok module (downloaded by the kwok build)."""
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"sigs.k8s.io/kwok@v{versions.KWOK}"],
        capture_output=True,
        text=True,
        check=False,
        cwd=str(binaries_mod.cache_root()),
    )
    if out.returncode != 0:
        raise ClusterError(f"cannot locate kwok's CRDs: {out.stderr.strip()}")
    return Path(json.loads(out.stdout)["Dir"]) / "kustomize" / "crd" / "bases"


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
