"""The ConfigMap ``NAME-config``: the one source of truth the workloads read.

Two keys:

* ``job.yaml`` — the resolved manifest (every default filled in, the job's uid included so the
  sandbox provider can set ownerReferences on sandbox pods).
* ``runtime.yaml`` — :class:`RuntimeConfig`: what the spec does not say directly — the engine
  URLs behind the headless Service, the trainer's rendezvous and Ray head addresses, and the
  sandbox concurrency *in effect* (0 while suspended, capped by provider limits).

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
from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from agentrl.api import AgentRLJob
from agentrl.reconcile import names
from agentrl.reconcile.constants import (
    CONFIG_JOB_KEY,
    CONFIG_RUNTIME_KEY,
    RAY_HEAD_PORT,
    TRAINER_MASTER_PORT,
    Component,
)
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.engine_flags import CHECKPOINT_MOUNT_PATH, ENGINE_PORT
from agentrl.reconcile.labels import sandbox_selector, selector_string
from agentrl.reconcile.meta import object_meta
from agentrl.reconcile.policies.suspend import WorkloadScale


class _Config(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class EngineEndpoints(_Config):
    """Where the engines answer."""

    service: str
    """The headless Service governing the StatefulSet."""
    port: int
    """SGLang's port."""
    urls: list[str]
    """One base URL per engine pod (stable DNS names), in ordinal order."""


class TrainerEndpoints(_Config):
    """Trainer rendezvous."""

    master_addr: str
    """Rank 0's stable DNS name (``MASTER_ADDR``)."""
    master_port: int
    """torch.distributed rendezvous port (``MASTER_PORT``)."""
    ray_head_address: str
    """``host:port`` of the Ray head on rank 0; rollout workers join it."""
    nodes: int
    """Trainer pods."""


class SandboxRuntime(_Config):
    """The sandbox pool as the rollout tier must run it."""

    provider: str
    """``kubernetes``, ``e2b`` or ``local``."""
    concurrency: int
    """Sandboxes (episodes) in flight at once, in effect now."""
    desired: int
    """``spec.sandbox.concurrency``."""
    limited_by: str | None
    """What holds ``concurrency`` below ``desired``."""
    selector: str
    """Label selector of the job's sandbox pods."""
    pod_name_prefix: str
    """Sandbox pods are named this plus random characters."""
    network_policy: str
    """The NetworkPolicy that confines sandbox pods."""


class RolloutRuntime(_Config):
    """The rollout workers."""

    workers: int
    """Rollout worker pods in effect: each runs its share of ``sandbox.concurrency``
    (``rollout.concurrency_source.split_concurrency``)."""


class RuntimeConfig(_Config):
    """``runtime.yaml``: endpoints and in-effect settings."""

    job: str
    namespace: str
    uid: str
    suspended: bool
    engines: EngineEndpoints
    trainer: TrainerEndpoints
    sandbox: SandboxRuntime
    rollout: RolloutRuntime
    checkpoint_dir: str
    """Where the checkpoint volume is mounted."""


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
            selector=selector_string(sandbox_selector(job)),
            pod_name_prefix=names.sandbox_pod_prefix(name),
            network_policy=names.sandbox_policy(name),
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
            job, ctx, name=names.config_map(job.metadata.name), component=Component.CONFIG
        ),
        "data": {
            CONFIG_JOB_KEY: _dump(resolved_manifest(job, ctx)),
            CONFIG_RUNTIME_KEY: _dump(runtime),
        },
    }
