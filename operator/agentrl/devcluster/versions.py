"""Pinned versions of the control-plane components.

Each binary is built from these module versions with the machine's Go and cached under a
directory keyed by the version, so bumping a pin here rebuilds exactly what changed. These
versions build with Go 1.24 and later (checked with Go 1.26).
"""

from __future__ import annotations

#: k8s.io/kubernetes (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl); its
#: staging modules (k8s.io/api, ...) are pinned to the matching v0.x version.
KUBERNETES = "1.34.4"
#: etcd server, built through go.etcd.io/etcd/server/v3/etcdmain at the version
#: k8s.io/kubernetes itself requires (so both share one module graph).
ETCD = "3.6.4"
#: sigs.k8s.io/kwok: simulated nodes and pod lifecycles.
KWOK = "0.7.0"
#: helm.sh/helm/v3.
HELM = "3.19.0"
#: github.com/coredns/coredns: cluster DNS on the real node (the release kubeadm v1.34 installs).
COREDNS = "1.12.1"


def staging_version(kubernetes: str = KUBERNETES) -> str:
    """The staging modules' version for a Kubernetes release: 1.34.4 -> v0.34.4."""
    major, minor, patch = kubernetes.split(".")
    if major != "1":
        raise ValueError(f"unexpected Kubernetes version {kubernetes!r}")
    return f"v0.{minor}.{patch}"
