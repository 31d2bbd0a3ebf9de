"""The ConfigMap ``NAME-config``: the one source of truth the workloads read.

Two keys:

* ``job.yaml`` — the resolved manifest (every default filled in, the job's uid included so the
  sandbox provider can set ownerReferences on sandbox pods).
* ``runtime.yaml`` — :class:`RuntimeConfig`: what the spec does not say directly — the engine
  URLs behind the headless Service, the trainer's rendezvous and Ray head addresses, the
  sandbox concurrency *in effect* (0 while suspended, capped by provider limits) and, for the
  ``kubernetes`` provider, the pod of one sandbox (:class:`~agentrl.api.wire.SandboxPods`,
  from :func:`agentrl.reconcile.sandbox.sandbox_pods`) that the rollout workers create.

``kubectl scale arj/NAME`` changes ``spec.sandbox.concurrency``, which changes this ConfigMap
and nothing else: no pod template refers to its content, so scaling never restarts a workload
(the kubelet refreshes the mounted files and the rollout tier follows them live). Engine and
trainer settings that need a restart are in their pod templates (flags, env), so changing them
rolls those workloads.

Called by ``children.desired_children``.
"""

from __future__ import annotations

from typing import Any

import yaml

from agentrl.api import AgentRLJob
from agentrl.api.sandbox import SandboxProvider
from agentrl.api.wire import (
    CHECKPOINT_MOUNT_PATH,
    CONFIG_JOB_KEY,
    CONFIG_RUNTIME_KEY,
    ENGINE_PORT,
    RAY_HEAD_PORT,
    TRAINER_MASTER_PORT,
    EngineEndpoints,
    RolloutRuntime,
    RuntimeConfig,
    SandboxRuntime,
    TrainerEndpoints,
    config_map_name,
)
from agentrl.reconcile import names
from agentrl.reconcile.constants import Component
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.meta import object_meta
from agentrl.reconcile.policies.suspend import WorkloadScale
from agentrl.reconcile.sandbox import sandbox_pods


def _svc_host(host: str, service: str, namespace: str) -> str:
    # `<host>.<service>.<namespace>.svc` resolves through the pod's DNS search path, so the
    # cluster domain (often, not always, cluster.local) need not be known.
    return f"{host}.{service}.{namespace}.svc"


def engine_urls(job: AgentRLJob, namespace: str, replicas: int) -> list[str]:
    """Base URLs of engine pods 0..replicas-1 through the headless Service."""
    service = names.engine(job.metadata.name)
    return [
        f"http://{_svc_host(names.engine_pod(job.metadata.name, i), service, namespace)}"
        f":{ENGINE_PORT}"
        for i in range(replicas)
    ]


def trainer_master_addr(job: AgentRLJob, namespace: str) -> str:
    """Rank 0's stable DNS name (Indexed Job hostname under the trainer's headless Service)."""
    name = job.metadata.name
    return _svc_host(names.trainer_hostname(name, 0), names.trainer(name), namespace)


def runtime_config(job: AgentRLJob, ctx: BuildContext, scale: WorkloadScale) -> RuntimeConfig:
    """The runtime config for ``job`` at ``scale``."""
    name = job.metadata.name
    master = trainer_master_addr(job, ctx.namespace)
    return RuntimeConfig(
        job=name,
        namespace=ctx.namespace,
        uid=ctx.uid,
        suspended=job.spec.suspend,
        engines=EngineEndpoints(
            service=names.engine(name),
            port=ENGINE_PORT,
            urls=engine_urls(job, ctx.namespace, scale.engines),
        ),
        trainer=TrainerEndpoints(
            master_addr=master,
            master_port=TRAINER_MASTER_PORT,
            ray_head_address=f"{master}:{RAY_HEAD_PORT}",
            nodes=job.spec.trainer.nodes,
        ),
        sandbox=SandboxRuntime(
            provider=job.spec.sandbox.provider.value,
            concurrency=scale.sandbox_concurrency,
            desired=job.spec.sandbox.concurrency,
            limited_by=scale.concurrency_limited_by,
            network_policy=names.sandbox_policy(name),
            pods=(
                sandbox_pods(job, ctx)
                if job.spec.sandbox.provider == SandboxProvider.KUBERNETES
                else None
            ),
        ),
        rollout=RolloutRuntime(workers=scale.rollout_workers),
        checkpoint_dir=CHECKPOINT_MOUNT_PATH,
    )


def resolved_manifest(job: AgentRLJob, ctx: BuildContext) -> dict[str, Any]:
    """The manifest with defaults filled in and the identity the workloads need; no status."""
    metadata: dict[str, Any] = {"name": job.metadata.name, "namespace": ctx.namespace}
    metadata["uid"] = ctx.uid
    if job.metadata.labels:
        metadata["labels"] = dict(job.metadata.labels)
    return {
        "apiVersion": job.api_version,
        "kind": job.kind,
        "metadata": metadata,
        "spec": job.spec.to_manifest(),
    }


def _dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def config_map(job: AgentRLJob, ctx: BuildContext, scale: WorkloadScale) -> dict[str, Any]:
    """The ConfigMap ``NAME-config``."""
    runtime = runtime_config(job, ctx, scale).model_dump(mode="json", by_alias=True)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(
            job, ctx, name=config_map_name(job.metadata.name), component=Component.CONFIG
        ),
        "data": {
            CONFIG_JOB_KEY: _dump(resolved_manifest(job, ctx)),
            CONFIG_RUNTIME_KEY: _dump(runtime),
        },
    }
