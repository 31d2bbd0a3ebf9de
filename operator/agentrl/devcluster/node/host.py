"""Machine-side operations for a real node: its network namespace and link, iptables, cgroups,
mounts, leftover processes, and the kernel settings the kubelet changes. Every operation is
scoped to one node's names and directories, and every setup has a teardown that leaves the
machine as it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from agentrl.devcluster.node.config import NodePlan

NETNS_DIR = Path("/run/netns")
CNI_CACHE = Path("/var/lib/cni")
#: Where the machine's values of the kernel settings the kubelet changes are kept while any
#: real node runs (machine-wide: several clusters may run real nodes at once).
TUNABLES_FILE = Path("/run/agentrl/kernel-tunables.json")

#: The sysctls the kubelet sets at start (``setupKernelTunables``, protectKernelDefaults off).
KUBELET_TUNABLES = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)

#: The chain (in the node's namespace) that drops pod traffic to anything but the pod and
#: service CIDRs.
EGRESS_CHAIN = "AGENTRL-POD-EGRESS"


class HostError(RuntimeError):
    """A machine operation failed; the message says which and why."""


def run(
    cmd: list[str], *, netns: str | None = None, check: bool = True, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` (inside the named network namespace when given)."""
    full = ["nsenter", f"--net={NETNS_DIR / netns}", "--", *cmd] if netns else cmd
    proc = subprocess.run(full, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise HostError(f"{' '.join(full)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


# ------------------------------------------------------------------------------ requirements
def missing_requirements() -> list[str]:
    """What this machine lacks to run a real node (empty when it can), each with the fix."""
    from agentrl.devcluster.node import artifacts

    out: list[str] = []
    if os.geteuid() != 0:
        out.append("root (the node creates a network namespace, cgroups and mounts)")
    commands = artifacts.missing_commands()
    if commands:
        out.append(
            "the commands " + ", ".join(commands) + " (`agentrl dev prepare --only node` "
            "installs the Debian packages " + " ".join(artifacts.PACKAGES) + ")"
        )
    images = artifacts.missing_images()
    if images:
        out.append("the local images " + ", ".join(images) + " (`agentrl dev prepare --only node`)")
    filesystems = (
        Path("/proc/filesystems").read_text() if Path("/proc/filesystems").exists() else ""
    )
    if "overlay" not in filesystems:
        out.append("the overlay file system (containerd's overlayfs snapshotter)")
    if not cgroup_mounts():
        out.append("cgroups mounted under /sys/fs/cgroup")
    if os.geteuid() == 0 and "nsfs" not in _mount_types() and not _can_netns():
        out.append("network namespaces (unshare --net)")
    return out


def _mount_types() -> set[str]:
    with contextlib.suppress(OSError):
        return {line.split()[2] for line in Path("/proc/mounts").read_text().splitlines()}
    return set()


def _can_netns() -> bool:
    proc = subprocess.run(["unshare", "--net", "true"], capture_output=True, check=False)
    return proc.returncode == 0


# ------------------------------------------------------------------------------------ cgroups
def cgroup_mounts() -> list[Path]:
    """Mount points of every cgroup hierarchy (v1 controllers, the v2 unified one)."""
    out = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if fields[2] in ("cgroup", "cgroup2"):
                out.append(Path(fields[1]))
    return out


def cgroup_version() -> int:
    """2 on a cgroup v2-only machine, else 1 (v1 or hybrid: the kubelet uses v1)."""
    out = subprocess.run(
        ["stat", "-fc", "%T", "/sys/fs/cgroup"], capture_output=True, text=True, check=False
    )
    return 2 if out.stdout.strip() == "cgroup2fs" else 1


def ensure_cgroup_root(plan: NodePlan) -> None:
    """Create the kubelet's --cgroup-root in every hierarchy (the kubelet requires it to
    exist); a v1 cpuset child gets its parent's cpus and mems, as it starts empty."""
    rel = plan.cgroup_root.strip("/")
    for mount in cgroup_mounts():
        path = mount / rel
        path.mkdir(exist_ok=True)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            mine, parent = path / knob, mount / knob
            if mine.exists() and parent.exists() and not mine.read_text().strip():
                mine.write_text(parent.read_text())


def cgroup_pids(plan: NodePlan) -> set[int]:
    """Every process in the node's cgroups (its containers)."""
    rel = plan.cgroup_root.strip("/")
    pids: set[int] = set()
    for mount in cgroup_mounts():
        root = mount / rel
        if not root.is_dir():
            continue
        for procs in root.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(p) for p in procs.read_text().split())
    return pids


def remove_cgroups(plan: NodePlan) -> list[str]:
    """Remove the node's cgroup tree in every hierarchy (deepest first); returns what could
    not be removed."""
    rel = plan.cgroup_root.strip("/")
    left = []
    for mount in cgroup_mounts():
        root = mount / rel
        if not root.is_dir():
            continue
        dirs = sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        for directory in [*dirs, root]:
            for _ in range(20):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
            else:
                left.append(str(directory))
    return left


# ---------------------------------------------------------------------------------- processes
def kill_pids(pids: set[int], *, timeout: float = 10.0) -> None:
    """SIGKILL each pid and wait until every one is gone."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return False
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def shims_of(socket: Path) -> set[int]:
    """containerd shims started by the containerd listening on ``socket`` (each names it with
    ``-address``); they outlive containerd."""
    found = set()
    for pid in processes_mentioning(str(socket)):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if Path(argv[0].decode(errors="replace")).name.startswith("containerd-shim"):
                found.add(pid)
    return found


def processes_mentioning(needle: str) -> set[int]:
    """Pids whose command line contains ``needle`` (a path unique to one node)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle.encode() in (entry / "cmdline").read_bytes():
                found.add(int(entry.name))
    return found


# ------------------------------------------------------------------------------------- mounts
def mounts_under(directory: Path) -> list[str]:
    """Mount points at or below ``directory``, deepest first."""
    prefix = str(directory).rstrip("/")
    points = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if point == prefix or point.startswith(prefix + "/"):
                points.append(point)
    return sorted(set(points), key=lambda p: -p.count("/"))


def unmount_all(directory: Path) -> list[str]:
    """Lazily unmount everything at or below ``directory``; returns what is still mounted."""
    for _ in range(3):
        points = mounts_under(directory)
        if not points:
            return []
        for point in points:
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    return mounts_under(directory)


# ------------------------------------------------------------------------------------ network
def _dnat_rules(plan: NodePlan) -> list[list[str]]:
    """The node reaches the API server at its own link address (the kubelet, kube-proxy) and
    its pods at :attr:`NodePlan.api_ip` (the ``kubernetes`` Service's endpoint): both lead to
    the loopback port the API server listens on, for traffic that comes in on this link only."""
    return [
        [
            "PREROUTING",
            "-i",
            plan.host_veth,
            "-d",
            f"{dst}/32",
            "-p",
            "tcp",
            "--dport",
            str(plan.apiserver_port),
            "-m",
            "comment",
            "--comment",
            f"agentrl {plan.netns}: the API server for the node",
            "-j",
            "DNAT",
            "--to-destination",
            f"127.0.0.1:{plan.apiserver_port}",
        ]
        for dst in dict.fromkeys((plan.host_ip, plan.api_ip))
    ]


def _link_exists(name: str, netns: str | None = None) -> bool:
    return run(["ip", "link", "show", name], netns=netns, check=False).returncode == 0


def _address_in_use(address: str, veth: str) -> str | None:
    out = run(["ip", "-o", "-4", "addr", "show"], check=False).stdout
    for line in out.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[3].split("/")[0] == address and fields[1] != veth:
            return fields[1]
    return None


def setup_network(plan: NodePlan) -> None:
    """The node's namespace, its link to the machine, forwarding inside it, the egress guard,
    and the DNAT that lets the node reach the API server's loopback port. Idempotent."""
    for address in (plan.host_ip, plan.node_ip):
        other = _address_in_use(address, plan.host_veth)
        if other:
            raise HostError(
                f"{address} (the link of node {plan.name} of cluster {plan.cluster}) is already "
                f"on interface {other}: remove it, or rename the cluster (--name)"
            )
    if not (NETNS_DIR / plan.netns).exists():
        run(["ip", "netns", "add", plan.netns])
    ns = plan.netns
    if not _link_exists("eth0", ns):
        if _link_exists(plan.host_veth):
            run(["ip", "link", "del", plan.host_veth])
        peer = plan.host_veth + "n"
        run(["ip", "link", "add", plan.host_veth, "type", "veth", "peer", "name", peer])
        run(["ip", "link", "set", peer, "netns", ns])
        run(["ip", "link", "set", peer, "name", "eth0"], netns=ns)
        run(["ip", "addr", "add", f"{plan.node_ip}/30", "dev", "eth0"], netns=ns)
        run(["ip", "addr", "add", f"{plan.host_ip}/30", "dev", plan.host_veth])
    run(["ip", "link", "set", "lo", "up"], netns=ns)
    run(["ip", "link", "set", "eth0", "up"], netns=ns)
    run(["ip", "link", "set", plan.host_veth, "up"])
    # the DNAT to 127.0.0.1 is routed only where route_localnet allows loopback addresses on
    # a non-loopback interface: this one link, which disappears with the node
    Path(f"/proc/sys/net/ipv4/conf/{plan.host_veth}/route_localnet").write_text("1\n")
    for rule in _dnat_rules(plan):
        if run(["iptables", "-t", "nat", "-C", *rule], check=False).returncode != 0:
            run(["iptables", "-t", "nat", "-A", *rule])
    if plan.api_ip != plan.host_ip:
        # node 0's link address, where this node's pods reach the API server, is via this link
        run(["ip", "route", "replace", f"{plan.api_ip}/32", "via", plan.host_ip], netns=ns)
    # inside the node's namespace only: forwarding between pods and to services
    run(["sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"], netns=ns)
    _egress_guard(plan)
    _api_masquerade(plan)


def _api_server_match(plan: NodePlan) -> list[str]:
    return ["-d", f"{plan.api_ip}/32", "-p", "tcp", "--dport", str(plan.apiserver_port)]


def _api_masquerade(plan: NodePlan) -> None:
    """Pods' connections to the API server leave the node from its link address, so the
    machine answers them on the link (it has no route to the pod network, and needs none)."""
    rule = ["POSTROUTING", "-s", plan.pod_cidr, *_api_server_match(plan), "-j", "MASQUERADE"]
    if run(["iptables", "-t", "nat", "-C", *rule], netns=plan.netns, check=False).returncode:
        run(["iptables", "-t", "nat", "-A", *rule], netns=plan.netns)


def _egress_guard(plan: NodePlan) -> None:
    ns = plan.netns
    if run(["iptables", "-n", "-L", EGRESS_CHAIN], netns=ns, check=False).returncode != 0:
        run(["iptables", "-N", EGRESS_CHAIN], netns=ns)
    run(["iptables", "-F", EGRESS_CHAIN], netns=ns)
    for dst in (plan.pod_cidr, plan.service_cidr):
        run(["iptables", "-A", EGRESS_CHAIN, "-d", dst, "-j", "RETURN"], netns=ns)
    # the one address outside them a pod may reach: the API server's port, as in any cluster
    run(["iptables", "-A", EGRESS_CHAIN, *_api_server_match(plan), "-j", "RETURN"], netns=ns)
    run(["iptables", "-A", EGRESS_CHAIN, "-j", "DROP"], netns=ns)
    jump = ["FORWARD", "-s", plan.pod_cidr, "-j", EGRESS_CHAIN]
    if run(["iptables", "-C", *jump], netns=ns, check=False).returncode != 0:
        run(["iptables", "-I", *jump[:1], "1", *jump[1:]], netns=ns)


def teardown_network(plan: NodePlan) -> None:
    """Remove the DNAT, the link and the namespace (with every bridge, veth, route and
    iptables rule inside it: kube-proxy's chains and ours live only there)."""
    for rule in _dnat_rules(plan):
        while run(["iptables", "-t", "nat", "-C", *rule], check=False).returncode == 0:
            run(["iptables", "-t", "nat", "-D", *rule])
    if _link_exists(plan.host_veth):
        run(["ip", "link", "del", plan.host_veth], check=False)
    if (NETNS_DIR / plan.netns).exists():
        run(["ip", "netns", "del", plan.netns], check=False)


# ---------------------------------------------------------------------------------- CNI cache
def cni_cache_marker(plan: NodePlan) -> Path:
    return plan.dir / "created-var-lib-cni"


def note_cni_cache(plan: NodePlan) -> None:
    """Remember whether /var/lib/cni (libcni's result cache, not configurable in containerd
    1.6) existed before this node: if not, teardown removes it again."""
    if not CNI_CACHE.exists() and not cni_cache_marker(plan).exists():
        plan.dir.mkdir(parents=True, exist_ok=True)
        cni_cache_marker(plan).write_text("1\n")


def sandbox_ids(plan: NodePlan) -> set[str]:
    """Ids of every pod sandbox the node's containerd has made (its CRI keeps a directory per
    sandbox, so this holds after a crash too)."""
    root = plan.containerd_dir / "root" / "io.containerd.grpc.v1.cri" / "sandboxes"
    return {p.name for p in root.iterdir()} if root.is_dir() else set()


def clean_cni_cache(plan: NodePlan, ids: set[str]) -> None:
    """Remove libcni's cached results of the node's sandbox ids (bridge and loopback), the
    node's host-local leases, and /var/lib/cni itself when this node created it."""
    import shutil

    results = CNI_CACHE / "results"
    if results.is_dir():
        for entry in results.iterdir():
            if entry.name.startswith(plan.cni_network + "-") or any(
                f"-{i}-" in entry.name for i in ids
            ):
                entry.unlink(missing_ok=True)
    shutil.rmtree(plan.dir / "cni" / "ipam", ignore_errors=True)
    marker = cni_cache_marker(plan)
    if marker.exists():
        for directory in (results, CNI_CACHE):
            with contextlib.suppress(OSError):
                directory.rmdir()
        if not CNI_CACHE.exists():
            marker.unlink()


# ----------------------------------------------------------------------------- kernel tunables
def read_tunables() -> dict[str, str]:
    out = {}
    for key in KUBELET_TUNABLES:
        with contextlib.suppress(OSError):
            out[key] = (Path("/proc/sys") / key).read_text().strip()
    return out


def save_tunables() -> None:
    """Record the machine's values before the first kubelet on this machine changes them."""
    if TUNABLES_FILE.exists():
        return
    TUNABLES_FILE.parent.mkdir(parents=True, exist_ok=True)
    partial = TUNABLES_FILE.with_suffix(".partial")
    partial.write_text(json.dumps(read_tunables(), indent=2) + "\n")
    partial.rename(TUNABLES_FILE)


def restore_tunables() -> None:
    """Put back the recorded values (called when the last real node on the machine stops)."""
    try:
        saved = json.loads(TUNABLES_FILE.read_text())
    except (OSError, ValueError):
        return
    for key, value in saved.items():
        with contextlib.suppress(OSError):
            (Path("/proc/sys") / key).write_text(f"{value}\n")
    TUNABLES_FILE.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        TUNABLES_FILE.parent.rmdir()
