{{/*
The operator's permissions: what it calls (operator/agentrl/controller/kube.py and watches.py,
and kopf), and full control of the object kinds it applies as a job's children. tests/chart/
checks each verb against the API server with the ServiceAccount's identity, a sample of what it
must not do, and runs the real operator with exactly these rules.

"agentrl.rbac.namespacedRules": everything in the namespaces it reconciles jobs in. It must hold
every rule of the Roles it creates for a job's rollout workers and engine watchdogs
(operator/agentrl/reconcile/rbac.py), or RBAC escalation prevention refuses to create them.
*/}}
{{- define "agentrl.rbac.namespacedRules" -}}
# The jobs: watched, deleted once ttlSecondsAfterFinished has passed (patch/update: kopf
# annotates objects it runs change handlers for); status and /scale written; finalizers
# updated (children carry ownerReferences with blockOwnerDeletion, which needs update on
# agentrljobs/finalizers where the OwnerReferencesPermissionEnforcement plugin is on).
- apiGroups: ["agentrl.dev"]
  resources: ["agentrljobs"]
  verbs: ["get", "list", "watch", "patch", "update", "delete"]
- apiGroups: ["agentrl.dev"]
  resources: ["agentrljobs/status", "agentrljobs/scale"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["agentrl.dev"]
  resources: ["agentrljobs/finalizers"]
  verbs: ["update"]
# Children applied server-side (create and patch) and deleted when a policy says so.
- apiGroups: [""]
  resources: ["configmaps", "services", "serviceaccounts", "persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["statefulsets", "deployments", "daemonsets"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
# The job's Ray token Secret: created once, never read (no get, list or watch on Secrets).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
# Pods: read for status, leaked sandboxes deleted; create/patch, exec and logs because the
# rollout and watchdog Roles the operator creates grant them.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["pods/exec"]
  verbs: ["create", "get"]
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
# Events on the jobs (the operator and kopf both post core/v1 Events).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
# Quotas, read to explain why engines or sandboxes are not scheduled.
- apiGroups: [""]
  resources: ["resourcequotas"]
  verbs: ["get", "list", "watch"]
{{- end -}}

{{/* Cluster-scoped reads in every mode: kopf lists and watches CRDs to discover the resources
it serves; the operator lists nodes to size the image pre-pull DaemonSets (nodes matching
spec.sandbox.nodeSelector) and for the GPU preflight (the GPUsAvailable condition: do the nodes
matching the job's GPU placement have the allocatable GPUs it needs). Without list on nodes the
preflight reports GPUsAvailable=Unknown/NodesUnreadable instead of failing the reconcile. */}}
{{- define "agentrl.rbac.clusterReadRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list"]
{{- end -}}

{{/* Namespaced mode only: kopf lists and watches namespaces to match the ones it serves
(cluster-wide it never does). */}}
{{- define "agentrl.rbac.namespaceRules" -}}
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["get", "list", "watch"]
{{- end -}}

{{/* kopf peering: the operator keeps itself alive in the peering object's status. */}}
{{- define "agentrl.rbac.clusterPeeringRules" -}}
- apiGroups: ["kopf.dev"]
  resources: ["clusterkopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end -}}

{{- define "agentrl.rbac.namespacedPeeringRules" -}}
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end -}}
