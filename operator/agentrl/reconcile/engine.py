"""The engines: StatefulSet ``NAME-engine`` (one SGLang engine per pod), its headless Service
(stable DNS per engine), a PodDisruptionBudget, and the watchdog's RBAC.

Each pod runs two containers in one process namespace (``shareProcessNamespace``):

* ``engine`` — the engine image's entrypoint (``agentrl engine launch``) with the SGLang flags
  of ``engine_flags.launch_args`` as its arguments, so the pod shows exactly the flags the engine
  starts with and a changed flag rolls the StatefulSet. With ``spec.inference.server: tiny`` the
  same container runs ``agentrl engine serve-tiny`` (``engine_flags.tiny_args``) on CPU instead:
  the rest of the pod is the same. It requests
  ``spec.inference.gpuResource`` × ``gpusPerEngine``; ``/dev/shm`` is memory-backed; its log goes
  to an emptyDir the watchdog reads.
* ``watchdog`` — ``agentrl engine watchdog``: it reads the engine log for GPU fault signatures,
  probes ``/health_generate``, restarts the engine process and holds readiness down meanwhile.
  The engine container's readiness probe asks the watchdog (``/readyz``), so a pod is taken out
  of the Service as soon as the watchdog sees a fault.

Probes are sized for slow starts: the startup probe allows ``spec.inference.startupTimeoutSeconds``
for weight loading and HIP graph capture before the kubelet gives up; liveness only starts after
it. ``podManagementPolicy: Parallel``: engines are independent, so all start at once instead of
one by one (loads of many minutes each).

Called by ``children.desired_children``.
"""

from __future__ import annotations

import math
from typing import Any, Final

from agentrl.api import AgentRLJob
from agentrl.api.engine import EngineServer
from agentrl.api.engine_flags import launch_args, rocm_env, tiny_args
from agentrl.api.wire import (
    ENGINE_PORT,
    LOG_VOLUME_PATH,
    TINY_COMMAND,
    WATCHDOG_LIVE_PATH,
    WATCHDOG_PORT,
    WATCHDOG_READY_PATH,
)
from agentrl.reconcile import names
from agentrl.reconcile.constants import Component
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.labels import component_labels, selector
from agentrl.reconcile.meta import object_meta
from agentrl.reconcile.pods import (
    checkpoint_mount,
    checkpoint_volume,
    config_mount,
    config_volume,
    env_list,
    gpu_resources,
    identity_env,
    model_volumes,
    priority_class,
    pull_secrets,
    shm_mount,
    shm_volume,
)
from agentrl.reconcile.rbac import rbac_objects, watchdog_rules

LOG_VOLUME = "engine-log"
#: The watchdog's command (a verb of the agentrl CLI installed in the engine image).
WATCHDOG_COMMAND: Final = ["agentrl", "engine", "watchdog"]
#: SGLang's cheap health endpoint (``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false``).
HEALTH_PATH: Final = "/health"
#: Startup probe period; ``failureThreshold`` is derived from the startup timeout with it.
STARTUP_PERIOD_SECONDS: Final = 10
#: Probe timeouts: SGLang's /health takes about a second under load, so the kubelet's default
#: of 1 s would flap.
PROBE_TIMEOUT_SECONDS: Final = 5
#: Liveness: a hung HTTP server is restarted after 5 × 30 s. Hangs of the model itself (the
#: server answering but generating nothing) are the watchdog's to catch, not liveness's.
LIVENESS_PERIOD_SECONDS: Final = 30
LIVENESS_FAILURES: Final = 5
#: Give SGLang time to release the GPU cleanly on a rolling update.
TERMINATION_GRACE_SECONDS: Final = 60
#: The watchdog is a small Python process.
WATCHDOG_RESOURCES: Final = {"requests": {"cpu": "100m", "memory": "256Mi"}}


def _node_affinity(node_selector: dict[str, str]) -> dict[str, Any] | None:
    """Required node affinity, one ``In`` expression per label (keys sorted: deterministic)."""
    if not node_selector:
        return None
    expressions = [
        {"key": key, "operator": "In", "values": [node_selector[key]]}
        for key in sorted(node_selector)
    ]
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": expressions}]
            }
        }
    }


def tolerations(job: AgentRLJob) -> list[dict[str, Any]]:
    """``spec.inference.tolerations`` as pod tolerations (GPU nodes' taints)."""
    return [t.to_manifest() for t in job.spec.inference.tolerations]


#: Weight of the preferred (pod) affinities that pack engines onto as few nodes as possible.
PACKING_WEIGHT: Final = 100


def _packing(job: AgentRLJob, component: Component) -> dict[str, Any]:
    """Preferred pod (anti-)affinity that keeps whole GPU nodes free for the trainer.

    The default scheduler spreads pods (LeastAllocated): 24 one-GPU engines would land 6 per
    node on four 8-GPU nodes and leave no node with the 8 free GPUs a trainer pod needs, though
    the cluster has exactly enough GPUs. Engines therefore prefer nodes that already run this
    job's engines, and trainer pods prefer nodes that do not.
    """
    term = {
        "weight": PACKING_WEIGHT,
        "podAffinityTerm": {
            "labelSelector": {"matchLabels": selector(job, Component.ENGINE)},
            "topologyKey": "kubernetes.io/hostname",
        },
    }
    key = "podAffinity" if component is Component.ENGINE else "podAntiAffinity"
    return {key: {"preferredDuringSchedulingIgnoredDuringExecution": [term]}}


def gpu_node_placement(job: AgentRLJob, component: Component) -> dict[str, Any]:
    """``affinity`` and ``tolerations`` of pods that run on GPU nodes (engines, trainer)."""
    placement: dict[str, Any] = {}
    affinity = _node_affinity(job.spec.inference.node_selector) or {}
    affinity.update(_packing(job, component))
    placement["affinity"] = affinity
    if job.spec.inference.tolerations:
        placement["tolerations"] = tolerations(job)
    return placement


def _http_probe(path: str, port: int, *, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": PROBE_TIMEOUT_SECONDS,
        "failureThreshold": failures,
    }


def startup_probe(job: AgentRLJob) -> dict[str, Any]:
    """Allows ``startupTimeoutSeconds`` for model load and graph capture (rounded up to whole
    periods)."""
    failures = math.ceil(job.spec.inference.startup_timeout_seconds / STARTUP_PERIOD_SECONDS)
    return _http_probe(HEALTH_PATH, ENGINE_PORT, period=STARTUP_PERIOD_SECONDS, failures=failures)


def readiness_probe(job: AgentRLJob) -> dict[str, Any]:
    """The watchdog's verdict when it runs; SGLang's /health otherwise."""
    if job.spec.inference.watchdog.enabled:
        return _http_probe(WATCHDOG_READY_PATH, WATCHDOG_PORT, period=5, failures=1)
    return _http_probe(HEALTH_PATH, ENGINE_PORT, period=10, failures=3)


def liveness_probe() -> dict[str, Any]:
    """Restarts an engine whose HTTP server stopped answering."""
    return _http_probe(
        HEALTH_PATH, ENGINE_PORT, period=LIVENESS_PERIOD_SECONDS, failures=LIVENESS_FAILURES
    )


def _job_identity_env(job: AgentRLJob, ctx: BuildContext) -> list[dict[str, Any]]:
    return [
        *identity_env(),
        {"name": "AGENTRL_JOB_NAME", "value": job.metadata.name},
        {"name": "AGENTRL_JOB_UID", "value": ctx.uid},
    ]


def engine_container(job: AgentRLJob, ctx: BuildContext) -> dict[str, Any]:
    """The SGLang container."""
    inference = job.spec.inference
    _, model_mounts = model_volumes(job)
    if inference.server == EngineServer.TINY:
        # the tiny CPU engine: no GPU, so no ROCm environment
        run: dict[str, Any] = {"command": list(TINY_COMMAND), "args": tiny_args(job, ENGINE_PORT)}
        env = _job_identity_env(job, ctx)
    else:
        # No command: the image's entrypoint (`agentrl engine launch`) receives the flags.
        run = {"args": launch_args(job, ENGINE_PORT)}
        env = [*_job_identity_env(job, ctx), *env_list(rocm_env(job))]
    return {
        "name": "engine",
        "image": inference.image,
        **run,
        "env": env,
        "ports": [{"name": "http", "containerPort": ENGINE_PORT, "protocol": "TCP"}],
        "resources": gpu_resources(
            cpu=inference.cpu,
            memory=inference.memory,
            gpu_resource=inference.gpu_resource,
            gpus=inference.gpus_per_engine,
        ),
        "startupProbe": startup_probe(job),
        "readinessProbe": readiness_probe(job),
        "livenessProbe": liveness_probe(),
        "volumeMounts": [
            shm_mount(),
            {"name": LOG_VOLUME, "mountPath": LOG_VOLUME_PATH},
            config_mount(),
            checkpoint_mount(read_only=True),
            *model_mounts,
        ],
    }


def watchdog_container(job: AgentRLJob, ctx: BuildContext) -> dict[str, Any]:
    """The watchdog sidecar."""
    return {
        "name": "watchdog",
        "image": ctx.watchdog_image(job),
        "command": list(WATCHDOG_COMMAND),
        "env": _job_identity_env(job, ctx),
        "ports": [{"name": "watchdog", "containerPort": WATCHDOG_PORT, "protocol": "TCP"}],
        "resources": {k: dict(v) for k, v in WATCHDOG_RESOURCES.items()},
        "livenessProbe": _http_probe(WATCHDOG_LIVE_PATH, WATCHDOG_PORT, period=20, failures=3),
        "volumeMounts": [
            {"name": LOG_VOLUME, "mountPath": LOG_VOLUME_PATH, "readOnly": True},
            config_mount(),
            checkpoint_mount(read_only=True),
        ],
    }


def engine_pod_spec(job: AgentRLJob, ctx: BuildContext) -> dict[str, Any]:
    """The engine pod's spec."""
    inference = job.spec.inference
    watchdog = inference.watchdog.enabled
    model_vols, _ = model_volumes(job)
    containers = [engine_container(job, ctx)]
    if watchdog:
        containers.append(watchdog_container(job, ctx))
    return {
        "serviceAccountName": names.engine(job.metadata.name),
        # Only the watchdog talks to the API server.
        "automountServiceAccountToken": watchdog,
        "shareProcessNamespace": True,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        **gpu_node_placement(job, Component.ENGINE),
        **priority_class(inference.priority_class_name),
        **pull_secrets(job),
        "containers": containers,
        "volumes": [
            shm_volume(inference.shm_size),
            {"name": LOG_VOLUME, "emptyDir": {}},
            config_volume(job),
            checkpoint_volume(job),
            *model_vols,
        ],
    }


def statefulset(job: AgentRLJob, ctx: BuildContext, *, replicas: int) -> dict[str, Any]:
    """The engine StatefulSet at ``replicas`` (the spec's, or 0 when suspended)."""
    name = names.engine(job.metadata.name)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": object_meta(job, ctx, name=name, component=Component.ENGINE),
        "spec": {
            "serviceName": name,
            "replicas": replicas,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector(job, Component.ENGINE)},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {
                "metadata": {"labels": component_labels(job, Component.ENGINE)},
                "spec": engine_pod_spec(job, ctx),
            },
        },
    }


def headless_service(job: AgentRLJob, ctx: BuildContext) -> dict[str, Any]:
    """``NAME-engine``: DNS ``NAME-engine-<i>.NAME-engine`` per ready engine."""
    name = names.engine(job.metadata.name)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(job, ctx, name=name, component=Component.ENGINE),
        "spec": {
            "clusterIP": "None",
            # Only ready engines resolve: the rollout tier never sends work to an engine the
            # watchdog holds unready.
            "publishNotReadyAddresses": False,
            "selector": selector(job, Component.ENGINE),
            "ports": [
                {"name": "http", "port": ENGINE_PORT, "targetPort": ENGINE_PORT, "protocol": "TCP"},
                {
                    "name": "watchdog",
                    "port": WATCHDOG_PORT,
                    "targetPort": WATCHDOG_PORT,
                    "protocol": "TCP",
                },
            ],
        },
    }


def disruption_budget(job: AgentRLJob, ctx: BuildContext) -> dict[str, Any]:
    """At most one engine evicted at a time by a node drain; pods that are not ready may always
    be evicted (a stuck engine must not block the drain)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": object_meta(
            job, ctx, name=names.engine(job.metadata.name), component=Component.ENGINE
        ),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector(job, Component.ENGINE)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def engine_rbac(job: AgentRLJob, ctx: BuildContext) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding ``NAME-engine`` for the watchdog."""
    return rbac_objects(
        job,
        ctx,
        name=names.engine(job.metadata.name),
        component=Component.ENGINE,
        rules=watchdog_rules(job),
    )
