"""Cluster add-ons the real node runs (pure manifests): CoreDNS.

CoreDNS serves ``cluster.local`` from the API (the kubernetes plugin) and nothing else: there is
no ``forward``, so no name outside the cluster is ever resolved. It runs on the host network of
real node 0 (the node's own namespace, not the machine's) because the API server listens only on
the machine's loopback: a pod on the pod network cannot reach it, the node's namespace can,
through the DNAT on its link (see :mod:`.config`). It reads the API with its ServiceAccount's
token through a kubeconfig that names that address.
"""

from __future__ import annotations

from typing import Any

from agentrl.devcluster.node.config import (
    CLUSTER_DNS_IP,
    CLUSTER_DOMAIN,
    REAL_NODE_TAINT,
    NodePlan,
)

NAMESPACE = "kube-system"
NAME = "coredns"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
HEALTH_PORT = 8080
READY_PORT = 8181


def corefile(plan: NodePlan) -> str:
    ip = plan.node_ip
    return f"""\
{CLUSTER_DOMAIN}:53 {{
    errors
    health {ip}:{HEALTH_PORT}
    ready {ip}:{READY_PORT}
    kubernetes {CLUSTER_DOMAIN} {{
        kubeconfig /etc/coredns/kubeconfig
        pods insecure
        ttl 5
    }}
    cache 5
    loop
    loadbalance
}}
"""


def coredns_kubeconfig(plan: NodePlan) -> str:
    return f"""\
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: https://{plan.host_ip}:{plan.apiserver_port}
    certificate-authority: {SA_DIR}/ca.crt
    tls-server-name: kubernetes
users:
- name: coredns
  user:
    tokenFile: {SA_DIR}/token
contexts:
- name: local
  context: {{cluster: local, user: coredns}}
current-context: local
"""


def coredns_manifests(
    plan: NodePlan, *, image: str, image_digest: str = ""
) -> list[dict[str, Any]]:
    """ServiceAccount, ClusterRole and binding, ConfigMap, Deployment (one replica on
    ``plan``'s node) and the ``kube-dns`` Service at :data:`CLUSTER_DNS_IP`. The pod template
    carries the image's digest, so a rebuilt image (same name) rolls the Deployment."""
    labels = {"k8s-app": "kube-dns"}
    meta = {"namespace": NAMESPACE, "labels": dict(labels)}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, **meta}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "agentrl:coredns", "labels": dict(labels)},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "agentrl:coredns", "labels": dict(labels)},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "agentrl:coredns",
            },
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": NAME, **meta},
            "data": {"Corefile": corefile(plan), "kubeconfig": coredns_kubeconfig(plan)},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": NAME, **meta},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": dict(labels)},
                "strategy": {"type": "Recreate"},
                "template": {
                    "metadata": {
                        "labels": dict(labels),
                        "annotations": {"agentrl.dev/image-digest": image_digest},
                    },
                    "spec": {
                        "serviceAccountName": NAME,
                        "priorityClassName": "system-cluster-critical",
                        "hostNetwork": True,
                        "dnsPolicy": "Default",
                        "nodeSelector": {"kubernetes.io/hostname": plan.name},
                        "tolerations": [
                            {
                                "key": REAL_NODE_TAINT["key"],
                                "operator": "Exists",
                                "effect": REAL_NODE_TAINT["effect"],
                            }
                        ],
                        "containers": [
                            {
                                "name": NAME,
                                "image": image,
                                "imagePullPolicy": "Never",
                                "args": ["-conf", "/etc/coredns/Corefile"],
                                "ports": [
                                    {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                                    {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"},
                                ],
                                "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns"}],
                                "readinessProbe": {
                                    "httpGet": {"path": "/ready", "port": READY_PORT},
                                    "periodSeconds": 2,
                                },
                                "livenessProbe": {
                                    "httpGet": {"path": "/health", "port": HEALTH_PORT},
                                    "periodSeconds": 10,
                                    "failureThreshold": 5,
                                },
                                "resources": {
                                    "requests": {"cpu": "50m", "memory": "64Mi"},
                                    "limits": {"memory": "170Mi"},
                                },
                            }
                        ],
                        "volumes": [{"name": "config", "configMap": {"name": NAME}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", **meta},
            "spec": {
                "clusterIP": CLUSTER_DNS_IP,
                "selector": dict(labels),
                "ports": [
                    {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                    {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
                ],
            },
        },
    ]
