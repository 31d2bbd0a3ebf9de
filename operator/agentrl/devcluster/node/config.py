"""Pure builders for one real node: its addresses, and the configuration files of containerd,
the CNI network, the kubelet and kube-proxy.

Each real node lives in a network namespace of its own (``agentrl-<cluster>-<node>``), joined to
the machine by one veth pair on a /30 of :data:`LINK_NET`: the machine's end (``host_ip``) is
where the node reaches the API server (a DNAT to the loopback address it listens on), the
node's end (``node_ip``) is the node's InternalIP, where the API server reaches the kubelet.
Pods get a /24 of the cluster's pod CIDR on a bridge inside the node's namespace, with routes to
the pod and service CIDRs only: the namespace has no default route, so nothing a pod sends can
leave the machine.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

#: Point-to-point links between the machine and its real nodes (one /30 each).
LINK_NET = ipaddress.ip_network("10.253.0.0/16")
#: The part of the pod CIDR the real nodes take (node i gets 10.244.(128 + i).0/24); kwok's
#: simulated pods get the lower half (``--cidr`` of kwok).
REAL_POD_OFFSET = 128
#: The kube-dns Service's fixed ClusterIP (passed to every kubelet as --cluster-dns).
CLUSTER_DNS_IP = "10.96.0.10"
CLUSTER_DOMAIN = "cluster.local"
KUBELET_PORT = 10250
# the kubelet taints the node disk-pressure when less than this share of its disk is free
EVICTION_DISK_PERCENT = 1
#: Taint keeping pods off the real node unless they ask for it (the control-plane tests'
#: pods are simulated: they must keep landing on kwok nodes).
REAL_NODE_TAINT = {"key": "agentrl.dev/real-node", "value": "true", "effect": "NoSchedule"}
#: Labels of a real node. Its pool is not the simulated CPU nodes' ``sandbox`` pool: jobs (and
#: tests) that select ``agentrl.dev/node-pool: sandbox`` without tolerating the taint count
#: those nodes, and a DaemonSet there must not wait for a node it cannot run on.
REAL_NODE_LABELS = {
    "agentrl.dev/real-node": "true",
    "agentrl.dev/node-pool": "real",
    "node.kubernetes.io/instance-type": "local-real",
}


@dataclass(frozen=True)
class NodePlan:
    """Names, addresses and paths of one real node (all derived, nothing chosen at random)."""

    cluster: str
    index: int
    state_dir: Path
    apiserver_port: int
    pod_cidr: str
    service_cidr: str

    @property
    def name(self) -> str:
        return f"real-{self.index}"

    @property
    def netns(self) -> str:
        return f"agentrl-{self.cluster}-{self.name}"

    @property
    def _hash(self) -> str:
        return hashlib.sha256(f"{self.cluster}/{self.name}".encode()).hexdigest()

    @property
    def host_veth(self) -> str:
        """The machine's end of the link (at most 15 characters)."""
        return f"ar{self._hash[:8]}"

    @property
    def link(self) -> ipaddress.IPv4Network:
        slots = LINK_NET.num_addresses // 4
        slot = int(self._hash[8:16], 16) % slots
        net = ipaddress.ip_network(f"{LINK_NET.network_address + slot * 4}/30")
        assert isinstance(net, ipaddress.IPv4Network)
        return net

    @property
    def host_ip(self) -> str:
        return str(self.link.network_address + 1)

    @property
    def node_ip(self) -> str:
        return str(self.link.network_address + 2)

    @property
    def api_ip(self) -> str:
        """Where pods reach the API server: the machine's end of node 0's link. The API server
        advertises it as the endpoint of the ``kubernetes`` Service (so in-cluster clients,
        the operator's pod among them, reach it at 10.96.0.1 through kube-proxy), and a DNAT on
        every node's link leads it to the loopback port the API server listens on."""
        return replace(self, index=0).host_ip

    @property
    def pod_subnet(self) -> str:
        net = ipaddress.ip_network(self.pod_cidr)
        third = REAL_POD_OFFSET + self.index
        base = ipaddress.ip_address(int(net.network_address) + third * 256)
        return f"{base}/24"

    @property
    def pod_gateway(self) -> str:
        return str(ipaddress.ip_network(self.pod_subnet).network_address + 1)

    @property
    def cgroup_root(self) -> str:
        """The kubelet's --cgroup-root: its pods' cgroups live under it (cgroupfs driver)."""
        return f"/agentrl-{self.cluster}-{self.name}"

    # ---------------------------------------------------------------------------- paths
    @property
    def dir(self) -> Path:
        return self.state_dir / "nodes" / self.name

    @property
    def containerd_dir(self) -> Path:
        return self.dir / "containerd"

    @property
    def containerd_socket(self) -> Path:
        return self.containerd_dir / "containerd.sock"

    @property
    def kubelet_dir(self) -> Path:
        return self.dir / "kubelet"

    @property
    def cni_conf_dir(self) -> Path:
        return self.dir / "cni" / "net.d"

    @property
    def cni_network(self) -> str:
        return f"agentrl-{self.cluster}-{self.name}"

    def component(self, what: str) -> str:
        """Process-table name of one of this node's processes."""
        return f"{what}-{self.name}"


def containerd_toml(plan: NodePlan, *, pause_image: str, cni_bin_dir: Path) -> str:
    """containerd 1.6's config (version 2): everything under the node's directory, the CRI
    plugin's sandbox image our own, overlayfs, runc with cgroupfs, pod netns under the state
    dir, no TCP listener but the CRI streaming server on the namespace's loopback."""
    d = plan.containerd_dir
    lines = [
        "version = 2",
        f'root = "{d / "root"}"',
        f'state = "{d / "state"}"',
        "oom_score = 0",
        'disabled_plugins = ["io.containerd.snapshotter.v1.aufs", '
        '"io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", '
        '"io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]',
        "",
        "[grpc]",
        f'  address = "{plan.containerd_socket}"',
        "",
        "[ttrpc]",
        f'  address = "{d / "containerd.sock.ttrpc"}"',
        "",
        "[debug]",
        '  address = ""',
        '  level = "info"',
        "",
        "[metrics]",
        '  address = ""',
        "",
        '[plugins."io.containerd.internal.v1.opt"]',
        f'  path = "{d / "opt"}"',
        "",
        '[plugins."io.containerd.grpc.v1.cri"]',
        f'  sandbox_image = "{pause_image}"',
        '  stream_server_address = "127.0.0.1"',
        '  stream_server_port = "0"',
        "  enable_selinux = false",
        "  disable_apparmor = true",
        # runc cannot lower a process's oom_score_adj without CAP_SYS_RESOURCE, which some
        # machines (this project's VMs) do not grant even to root: clamp to containerd's own
        "  restrict_oom_score_adj = true",
        "  netns_mounts_under_state_dir = true",
        "  max_container_log_line_size = 16384",
        "",
        '[plugins."io.containerd.grpc.v1.cri".containerd]',
        '  snapshotter = "overlayfs"',
        '  default_runtime_name = "runc"',
        "",
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]',
        '  runtime_type = "io.containerd.runc.v2"',
        "",
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]',
        "  SystemdCgroup = false",
        f'  Root = "{d / "runc"}"',
        "",
        '[plugins."io.containerd.grpc.v1.cri".cni]',
        f'  bin_dir = "{cni_bin_dir}"',
        f'  conf_dir = "{plan.cni_conf_dir}"',
        "  max_conf_num = 1",
        "",
        '[plugins."io.containerd.grpc.v1.cri".registry]',
        '  config_path = ""',
        "",
    ]
    return "\n".join(lines)


def cni_conflist(plan: NodePlan) -> dict[str, Any]:
    """A bridge on the node's pod /24, host-local IPAM (state under the node's directory),
    routes only to the pod and service CIDRs, no masquerading, portmap for hostPorts."""
    return {
        "cniVersion": "0.4.0",
        "name": plan.cni_network,
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "isDefaultGateway": False,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": plan.pod_subnet, "gateway": plan.pod_gateway}]],
                    "routes": [{"dst": plan.pod_cidr}, {"dst": plan.service_cidr}],
                    "dataDir": str(plan.dir / "cni" / "ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubeconfig(plan: NodePlan, *, user: str, ca: Path, cert: Path, key: Path) -> str:
    """A kubeconfig for a process in the node's namespace: the API server through the
    machine's end of the link (DNAT to its loopback port), verified as ``kubernetes``."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {
                    "server": f"https://{plan.host_ip}:{plan.apiserver_port}",
                    "certificate-authority": str(ca),
                    "tls-server-name": "kubernetes",
                },
            }
        ],
        "users": [
            {"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}
        ],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
        "current-context": "local",
    }
    return yaml.safe_dump(config, sort_keys=False)


def kubelet_config(plan: NodePlan, *, ca: Path, cert: Path, key: Path) -> dict[str, Any]:
    """The KubeletConfiguration: cgroupfs driver under the node's own cgroup root, state
    under the node's directory, serving TLS on the node IP with webhook authn/z, swap
    tolerated, no image garbage collection (images cannot be pulled again), cluster DNS."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": plan.node_ip,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "tlsCertFile": str(cert),
        "tlsPrivateKeyFile": str(key),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{plan.containerd_socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": plan.cgroup_root,
        "cgroupsPerQOS": True,
        "failSwapOn": False,
        "failCgroupV1": False,
        "clusterDNS": [CLUSTER_DNS_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(plan.dir / "resolv.conf"),
        "podLogsDir": str(plan.dir / "pod-logs"),
        "staticPodPath": "",
        "maxPods": 250,
        "serializeImagePulls": False,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": f"{EVICTION_DISK_PERCENT}%",
            "nodefs.inodesFree": f"{EVICTION_DISK_PERCENT}%",
            "imagefs.available": f"{EVICTION_DISK_PERCENT}%",
        },
        "protectKernelDefaults": False,
        "makeIPTablesUtilChains": False,
        "nodeStatusReportFrequency": "1m",
        "nodeStatusUpdateFrequency": "10s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "20s",
        "runtimeRequestTimeout": "2m",
        "registerNode": True,
        "registerWithTaints": [dict(REAL_NODE_TAINT)],
        "shutdownGracePeriod": "0s",
        "logging": {"format": "text", "verbosity": 1},
    }


def kubelet_args(plan: NodePlan, binary: Path, *, config: Path, kubeconfig_path: Path) -> list[str]:
    labels = ",".join(f"{k}={v}" for k, v in sorted(REAL_NODE_LABELS.items()))
    return [
        str(binary),
        f"--config={config}",
        f"--kubeconfig={kubeconfig_path}",
        f"--root-dir={plan.kubelet_dir}",
        f"--cert-dir={plan.kubelet_dir / 'pki'}",
        f"--hostname-override={plan.name}",
        f"--node-ip={plan.node_ip}",
        f"--node-labels={labels}",
        "--v=1",
    ]


def kube_proxy_config(plan: NodePlan, *, kubeconfig_path: Path) -> dict[str, Any]:
    """kube-proxy in iptables mode, in the node's namespace: conntrack sysctls left alone
    (they are the machine's, not the namespace's), health and metrics on the namespace's
    loopback."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig_path)},
        "hostnameOverride": plan.name,
        "bindAddress": plan.node_ip,
        "clusterCIDR": plan.pod_cidr,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "iptables": {"masqueradeAll": False, "syncPeriod": "10s", "minSyncPeriod": "1s"},
        "nodePortAddresses": [f"{plan.node_ip}/32"],
    }


def dump_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2) + "\n"
