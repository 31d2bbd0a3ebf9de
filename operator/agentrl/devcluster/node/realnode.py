"""One real worker node beside the simulated ones: containerd, the kubelet and kube-proxy in a
network namespace of their own, registered with the local control plane.

:class:`RealNode` writes the node's configuration (:mod:`.config`), prepares the machine
(:mod:`.host`), starts the three processes through the cluster's process table, imports the
local images, and on :meth:`RealNode.stop` removes everything it made: containers, mounts, the
namespace with its bridge, veths and iptables chains, the DNAT rule, cgroups, the CNI cache
entries, and the kernel settings the kubelet changed (when no other real node still runs).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.devcluster import pki
from agentrl.devcluster.binaries import Binaries
from agentrl.devcluster.node import artifacts, config, host, oci
from agentrl.devcluster.processes import Component, ProcessTable


class RealNodeError(RuntimeError):
    """The real node could not be brought up; the message says why and what to do."""


def unavailable_message(missing: list[str]) -> str:
    return (
        "this machine cannot run a real node; it lacks:\n  - "
        + "\n  - ".join(missing)
        + "\nFix those, or continue with simulated nodes only: "
        "`agentrl dev cluster up --real-nodes 0`."
    )


class RealNode:
    """One real node of a local cluster."""

    def __init__(self, plan: config.NodePlan, *, pki_dir: Path, procs: ProcessTable) -> None:
        self.plan = plan
        self.pki_dir = pki_dir
        self.procs = procs

    @property
    def name(self) -> str:
        return self.plan.name

    # --------------------------------------------------------------------------- processes
    @property
    def process_names(self) -> tuple[str, str, str]:
        p = self.plan
        return (p.component("containerd"), p.component("kubelet"), p.component("kube-proxy"))

    def pids(self) -> dict[str, int | None]:
        return {n: self.procs.pid(n) for n in self.process_names}

    def running(self) -> bool:
        return all(pid is not None for pid in self.pids().values())

    # ------------------------------------------------------------------------------ config
    def _write_configs(self, bins: Binaries) -> dict[str, Path]:
        p, k = self.plan, self.pki_dir
        for directory in (p.dir, p.containerd_dir, p.kubelet_dir, p.cni_conf_dir):
            directory.mkdir(parents=True, exist_ok=True)
        (p.dir / "pod-logs").mkdir(exist_ok=True)
        ca = k / "ca.crt"
        kubelet_cert, kubelet_key = pki.ensure_client(k, pki.node_identity(p.name))
        serving_cert, serving_key = pki.ensure_serving(
            k,
            f"kubelet-{p.name}-serving",
            common_name=p.name,
            names=(p.name,),
            ips=(p.node_ip,),
        )
        proxy_cert, proxy_key = pki.ensure_client(k, pki.KUBE_PROXY)
        files = {
            "containerd": p.dir / "containerd.toml",
            "cni": p.cni_conf_dir / "10-agentrl.conflist",
            "kubelet": p.dir / "kubelet.yaml",
            "kubelet-kubeconfig": p.dir / "kubelet.kubeconfig",
            "kube-proxy": p.dir / "kube-proxy.yaml",
            "kube-proxy-kubeconfig": p.dir / "kube-proxy.kubeconfig",
        }
        files["containerd"].write_text(
            config.containerd_toml(
                p, pause_image=artifacts.PAUSE.name, cni_bin_dir=artifacts.CNI_BIN_DIR
            )
        )
        files["cni"].write_text(config.dump_json(config.cni_conflist(p)))
        files["kubelet"].write_text(
            config.dump_json(config.kubelet_config(p, ca=ca, cert=serving_cert, key=serving_key))
        )
        files["kubelet-kubeconfig"].write_text(
            config.kubeconfig(p, user=p.name, ca=ca, cert=kubelet_cert, key=kubelet_key)
        )
        files["kube-proxy-kubeconfig"].write_text(
            config.kubeconfig(p, user="kube-proxy", ca=ca, cert=proxy_cert, key=proxy_key)
        )
        files["kube-proxy"].write_text(
            config.dump_json(
                config.kube_proxy_config(p, kubeconfig_path=files["kube-proxy-kubeconfig"])
            )
        )
        # pods with dnsPolicy Default get this: no resolver outside the cluster
        (p.dir / "resolv.conf").write_text("# agentrl real node: no resolver outside the cluster\n")
        return files

    # ---------------------------------------------------------------------------------- up
    def start(
        self,
        bins: Binaries,
        *,
        archives: Iterable[Path] = (),
        echo: Callable[[str], None] = lambda _m: None,
        timeout: float = 120.0,
    ) -> float:
        """Start the node's processes (those not running) and import the node's images and
        ``archives`` (those it lacks, by digest: on a running node too); returns seconds spent
        starting (0 when it was running)."""
        started = time.monotonic()
        missing = host.missing_requirements()
        if missing:
            raise RealNodeError(unavailable_message(missing))
        if bins.kubelet is None or bins.kube_proxy is None:
            raise RealNodeError(
                "kubelet and kube-proxy are not built: run `agentrl dev prepare`, or use "
                "--real-nodes 0"
            )
        p = self.plan
        if self.running():
            self.import_images(list(archives), echo=echo)
            return 0.0
        # a half-running node (one process died) is restarted from a clean machine state
        if any(pid is not None for pid in self.pids().values()):
            self.stop()
        files = self._write_configs(bins)
        try:
            host.ensure_cgroup_root(p)
            host.note_cni_cache(p)
            host.setup_network(p)
        except (host.HostError, OSError) as exc:
            raise RealNodeError(f"node {p.name}: {exc}") from exc
        ns = str(host.NETNS_DIR / p.netns)
        containerd, kubelet, proxy = self.process_names
        self.procs.start(
            Component(
                containerd,
                [shutil.which("containerd") or "containerd", "--config", str(files["containerd"])],
                ns,
            )
        )
        self._wait(f"containerd of {p.name}", self._containerd_ready, timeout, containerd)
        self.import_images([img.archive for img in artifacts.IMAGES], echo=echo)
        extra = list(archives)
        if extra:
            self.import_images(extra, echo=echo)
        host.save_tunables()
        self.procs.start(
            Component(
                kubelet,
                config.kubelet_args(
                    p,
                    bins.kubelet,
                    config=files["kubelet"],
                    kubeconfig_path=files["kubelet-kubeconfig"],
                ),
                ns,
            )
        )
        self.procs.start(
            Component(
                proxy,
                [
                    str(bins.kube_proxy),
                    f"--config={files['kube-proxy']}",
                    f"--hostname-override={p.name}",
                    "--v=1",
                ],
                ns,
            )
        )
        return time.monotonic() - started

    def _wait(self, what: str, check: Callable[[], bool], timeout: float, proc: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            if self.procs.pid(proc) is None:
                raise RealNodeError(
                    f"{proc} exited while waiting for {what}:\n{_tail(self.procs.log_path(proc))}"
                )
            time.sleep(0.1)
        raise RealNodeError(f"timed out waiting for {what}; see {self.procs.log_path(proc)}")

    def ctr(
        self, *args: str, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """``ctr`` against this node's containerd, namespace ``k8s.io`` (the CRI's)."""
        cmd = ["ctr", "--address", str(self.plan.containerd_socket), "-n", "k8s.io", *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise RealNodeError(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")
        return proc

    def _containerd_ready(self) -> bool:
        if not self.plan.containerd_socket.exists():
            return False
        return self.ctr("version", check=False, timeout=10).returncode == 0

    # ------------------------------------------------------------------------------ images
    def images(self) -> dict[str, str]:
        """Image name -> target digest of every image in the node's ``k8s.io`` namespace."""
        out = self.ctr("images", "ls").stdout.splitlines()
        found = {}
        for line in out[1:]:
            fields = line.split()
            if len(fields) >= 3:
                found[fields[0]] = fields[2]
        return found

    def content_digests(self) -> set[str]:
        """Digests of the blobs in the node's content store."""
        out = self.ctr("content", "ls", "-q", check=False, timeout=60).stdout.split()
        return {d for d in out if d.startswith("sha256:")}

    def import_images(
        self, archives: Iterable[Path], *, echo: Callable[[str], None] = lambda _m: None
    ) -> list[Path]:
        """Import each archive whose images the node does not have at the same digest;
        returns the archives imported. Refuses before importing anything when the disk
        cannot hold them (a half-imported image would fill it and taint the node)."""
        have = self.images()
        missing = []
        for archive in archives:
            refs = oci.archive_refs(archive)
            if not (refs and all(have.get(name) == digest for name, digest in refs.items())):
                missing.append(archive)
        if missing:
            self._check_disk(missing)
        imported = []
        for archive in missing:
            echo(f"importing {archive.name} into {self.name}")
            # a trainer image is ~6 GB (torch's CUDA build): unpacking it on a busy 2-core
            # machine takes minutes, so the limit grows with the archive
            gib = archive.stat().st_size / 2**30
            self.ctr("images", "import", str(archive), timeout=120 + 180 * gib)
            imported.append(archive)
        return imported

    def _check_disk(self, archives: list[Path]) -> None:
        blobs: dict[str, int] = {}
        for archive in archives:
            blobs.update(oci.archive_blobs(archive))
        usage = shutil.disk_usage(self.plan.containerd_dir)
        short = disk_shortfall(blobs, self.content_digests(), free=usage.free, total=usage.total)
        if short is None:
            return
        clusters_dir = self.plan.dir.parents[2]
        others = (
            sorted(
                d.name
                for d in clusters_dir.iterdir()
                if d.is_dir() and d != self.plan.dir.parents[1] and (d / "nodes").is_dir()
            )
            if clusters_dir.is_dir()
            else []
        )
        fixes = [f"`agentrl dev cluster down --name {n} --purge`" for n in others]
        names = ", ".join(a.name for a in archives)
        raise RealNodeError(
            f"importing {names} into {self.name} needs {short.needed / 2**30:.1f} GiB free on "
            f"the disk of {self.plan.containerd_dir} ({short.layers / 2**30:.1f} GiB of new "
            f"blobs, stored and unpacked, and the kubelet's "
            f"{config.EVICTION_DISK_PERCENT}% reserve); {short.free / 2**30:.1f} GiB is free.\n"
            "Free space"
            + (f" (other local clusters hold images: {', '.join(fixes)})" if fixes else "")
            + ", or start the node without the project's images: "
            "`agentrl dev cluster up --no-project-images`."
        )

    # -------------------------------------------------------------------------------- down
    def stop(self) -> list[str]:
        """Stop the node and remove what it made; returns the processes that were running."""
        p = self.plan
        containerd, kubelet, proxy = self.process_names
        stopped = [n for n in (kubelet, proxy) if self.procs.stop(n)]
        sandboxes = host.sandbox_ids(p)
        if self.procs.pid(containerd) is not None:
            self._remove_containers()
        host.kill_pids(host.cgroup_pids(p))
        if self.procs.stop(containerd):
            stopped.append(containerd)
        # shims outlive containerd; each names our socket in its command line
        host.kill_pids(host.shims_of(p.containerd_socket))
        host.unmount_all(p.dir)
        # the CRI's per-sandbox and per-container directories of what was just removed
        cri = p.containerd_dir / "root" / "io.containerd.grpc.v1.cri"
        for sub in ("sandboxes", "containers"):
            shutil.rmtree(cri / sub, ignore_errors=True)
        host.teardown_network(p)
        host.remove_cgroups(p)
        host.clean_cni_cache(p, sandboxes)
        if not _other_kubelets(p):
            host.restore_tunables()
        return stopped

    def _remove_containers(self) -> None:
        host.kill_pids(host.cgroup_pids(self.plan))
        ids = self.ctr("containers", "ls", "-q", check=False, timeout=30).stdout.split()
        if ids:
            self.ctr("tasks", "delete", "-f", *ids, check=False, timeout=60)
            self.ctr("containers", "delete", *ids, check=False, timeout=60)

    # ------------------------------------------------------------------------------ status
    def status(self) -> dict[str, Any]:
        p = self.plan
        return {
            "name": p.name,
            "netns": p.netns,
            "node_ip": p.node_ip,
            "pod_cidr": p.pod_subnet,
            "processes": self.pids(),
            "containerd_socket": str(p.containerd_socket),
        }


def _other_kubelets(plan: config.NodePlan) -> bool:
    """Whether a kubelet of another real node (any cluster) still runs on this machine."""
    mine = str(plan.kubelet_dir)
    for pid in host.processes_mentioning("--root-dir="):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if Path(argv[0].decode(errors="replace")).name != "kubelet":
            continue
        if f"--root-dir={mine}".encode() not in argv:
            return True
    return False


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def dumps(data: Any) -> str:
    return json.dumps(data, indent=2)


@dataclass(frozen=True)
class DiskShortfall:
    needed: int
    layers: int
    free: int


def disk_shortfall(
    blobs: dict[str, int], present: set[str], *, free: int, total: int
) -> DiskShortfall | None:
    """What importing ``blobs`` (digest -> size) needs when the content store already holds
    ``present``: each new blob is stored once and unpacked once (about its size again), and
    the kubelet's eviction threshold must stay free; None when ``free`` covers it."""
    layers = sum(size for digest, size in blobs.items() if digest not in present)
    needed = 2 * layers + total * config.EVICTION_DISK_PERCENT // 100
    return None if needed <= free else DiskShortfall(needed=needed, layers=layers, free=free)
