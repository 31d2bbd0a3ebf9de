"""Real worker nodes for the local cluster: a kubelet, containerd and kube-proxy per node, each
node in a network namespace of its own, registered with the local control plane beside kwok's
simulated nodes.

Modules: ``artifacts`` (the ``node`` step of ``agentrl dev prepare``: Debian packages and the
local images), ``oci`` (OCI image archives from local files), ``config`` (pure: addresses and
configuration files), ``addons`` (pure: CoreDNS), ``host`` (the machine: namespace, link,
iptables, cgroups, mounts, cleanup), ``realnode`` (start, import images, stop).
"""
