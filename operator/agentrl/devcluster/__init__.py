"""A real local Kubernetes control plane for development and tests.

``agentrl dev cluster up`` runs etcd, kube-apiserver, kube-controller-manager, kube-scheduler
and kwok on loopback, built from pinned upstream Go modules into the user's cache directory
(:mod:`.binaries`), with generated certificates (:mod:`.pki`), RBAC on, and simulated MI355X GPU
nodes and CPU sandbox nodes (:mod:`.nodes`) that kwok keeps Ready while it moves scheduled pods
through per-test stages (:mod:`.stages`). Nothing here mocks the API: tests get the real thing.

Modules: ``versions`` (pins), ``binaries`` (find or build), ``pki`` (certificates),
``profile`` (cluster shape), ``nodes``/``stages`` (pure manifests), ``processes`` (start/stop),
``cluster`` (up/down/status orchestration), ``cli`` (the ``agentrl dev`` verbs).
"""
