"""The full, ordered list of a job's desired children: what ``agentrl render`` prints and what
the controller applies (server-side apply, field manager ``agentrl-operator``) on every
reconcile.

Order matters only for a first apply, and is chosen so each object finds what it refers to:
ConfigMap and PVC (mounted by pods), RBAC (used by pods), the NetworkPolicy (in place before
any sandbox exists), then the Services, the engine StatefulSet, the trainer Job and the rollout
Deployment. Every child carries the ownerReference to the job and the job's labels.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from agentrl.api import AgentRLJob
from agentrl.reconcile import configmap, engine, pvc, rollout, sandbox, trainer
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.meta import owner_reference
from agentrl.reconcile.observed import Observed
from agentrl.reconcile.policies.placement import engine_replicas
from agentrl.reconcile.policies.suspend import WorkloadScale, workload_scale

__all__ = ["ChildRef", "TrainerJobPlan", "child_ref", "desired_children", "owner_reference"]


class TrainerJobPlan(BaseModel):
    """What to do with the trainer Job in this reconcile."""

    model_config = ConfigDict(frozen=True)

    apply: bool = True
    """Apply it. False leaves a finished Job alone: a completed or failed Job cannot change, and
    a failed attempt waits for its deletion before the next one is created."""
    attempt: int = 0
    """The attempt number (``status.trainer.restarts``)."""


class ChildRef(BaseModel):
    """Identifies one child, e.g. for a delete."""

    model_config = ConfigDict(frozen=True)

    api_version: str
    kind: str
    name: str
    namespace: str


def child_ref(obj: dict[str, Any]) -> ChildRef:
    """The reference of a built child."""
    meta = obj["metadata"]
    return ChildRef(
        api_version=obj["apiVersion"],
        kind=obj["kind"],
        name=meta["name"],
        namespace=meta["namespace"],
    )


def desired_children(
    job: AgentRLJob,
    ctx: BuildContext,
    *,
    scale: WorkloadScale | None = None,
    trainer_job: TrainerJobPlan | None = None,
    observed: Observed | None = None,
) -> list[dict[str, Any]]:
    """Every child of ``job`` in apply order. ``scale``: the workloads' scale and the sandbox
    concurrency in effect, as the reconcile decided them (``StatusResult.scale``; default: the
    spec's, as for a new job, which ``agentrl render`` prints); ``trainer_job``: the trainer
    Job's attempt and whether to apply it (default: apply attempt 0, as for a new job);
    ``observed``: the trainer pods the engines wait for (``policies.placement``)."""
    plan = trainer_job or TrainerJobPlan()
    if scale is None:
        scale = workload_scale(job)
    children: list[dict[str, Any]] = [configmap.config_map(job, ctx, scale)]
    claim = pvc.checkpoint_pvc(job, ctx)
    if claim is not None:
        children.append(claim)
    children += engine.engine_rbac(job, ctx)
    children += rollout.rollout_rbac(job, ctx)
    children += trainer.trainer_rbac(job, ctx)
    children.append(sandbox.network_policy(job, ctx))
    children += [
        engine.headless_service(job, ctx),
        engine.disruption_budget(job, ctx),
        # 0 until the trainer's pods are placed: see policies.placement
        engine.statefulset(job, ctx, replicas=engine_replicas(job, observed, scale.engines)),
        trainer.headless_service(job, ctx),
    ]
    if plan.apply:
        children.append(
            trainer.trainer_job(job, ctx, attempt=plan.attempt, suspend=scale.trainer_suspended)
        )
    children.append(rollout.deployment(job, ctx, replicas=scale.rollout_workers))
    return children
