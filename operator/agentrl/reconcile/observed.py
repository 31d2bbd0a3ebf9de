"""What the controller saw of a job's children: a typed snapshot, the input of the status
computation.

The controller reads the engine StatefulSet, the trainer Job, the rollout Deployment (each by
name; None when absent) and lists the job's pods by ``agentrl.dev/job`` once, then calls
:func:`observe` with the raw objects as the API server returned them. Only the fields the
status needs are kept; everything else is dropped here, so ``status`` never reaches into raw
dicts.

Two annotations carry what only the workloads know: the engine watchdog writes
:class:`WatchdogReport` as JSON under ``agentrl.dev/watchdog`` on its own pod, and the trainer's
driver writes :class:`TrainerProgress` under ``agentrl.dev/progress`` on its pod. Both are read
under the wire contract's skew policy (``api.wire.receive_annotation``). A malformed annotation,
or one written in a contract version this operator does not read, is ignored (the status then
says nothing from it) rather than failing the reconcile; ``reconcile.wire_skew`` names the
second in the WireCompatible condition.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from agentrl.api.wire import (
    ANNOTATION_PROGRESS,
    ANNOTATION_WATCHDOG,
    TrainerProgress,
    WatchdogReport,
    receive_annotation,
)
from agentrl.reconcile.constants import ANNOTATION_TRAINER_ATTEMPT, LABEL_COMPONENT, Component
from agentrl.reconcile.nodes import NodesSeen
from agentrl.reconcile.quotas import ResourceQuotaUsage, quota_from_object

_AnnotationT = TypeVar("_AnnotationT", bound=BaseModel)


class _Snapshot(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ObservedCondition(_Snapshot):
    """A condition of a pod, Job or Deployment."""

    type: str
    status: str
    reason: str | None = None
    message: str | None = None


class ObservedContainer(_Snapshot):
    """A container's status."""

    name: str
    ready: bool = False
    restart_count: int = 0
    waiting_reason: str | None = None
    waiting_message: str | None = None
    terminated_reason: str | None = None
    terminated_exit_code: int | None = None
    terminated_message: str | None = None
    last_terminated_reason: str | None = None
    last_terminated_exit_code: int | None = None


class ObservedPod(_Snapshot):
    """A pod of the job."""

    name: str
    component: str | None = None
    phase: str = "Pending"
    deleting: bool = False
    deletion_timestamp: datetime | None = None
    """``metadata.deletionTimestamp`` of a deleted pod: the deletion time plus its grace period,
    after which the kubelet kills what still runs."""
    conditions: tuple[ObservedCondition, ...] = ()
    containers: tuple[ObservedContainer, ...] = ()
    """Init containers first, then the regular ones."""
    annotations: dict[str, str] = Field(default_factory=dict)

    def condition(self, type_: str) -> ObservedCondition | None:
        """The pod condition of that type, if present."""
        return next((c for c in self.conditions if c.type == type_), None)

    @property
    def ready(self) -> bool:
        """Whether the pod is Ready (every container ready)."""
        cond = self.condition("Ready")
        return cond is not None and cond.status == "True"

    @property
    def watchdog(self) -> WatchdogReport | None:
        """The watchdog's report, when the annotation is present and well-formed."""
        return _parse_annotation(self.annotations, ANNOTATION_WATCHDOG, WatchdogReport)

    @property
    def progress(self) -> TrainerProgress | None:
        """The driver's progress, when the annotation is present and well-formed."""
        return _parse_annotation(self.annotations, ANNOTATION_PROGRESS, TrainerProgress)


class ObservedStatefulSet(_Snapshot):
    """The engine StatefulSet."""

    replicas: int = 0
    """``spec.replicas``."""
    ready_replicas: int = 0
    updated_replicas: int = 0
    current_revision: str | None = None
    update_revision: str | None = None


class ObservedTrainerJob(_Snapshot):
    """The trainer Job."""

    uid: str | None = None
    attempt: int = 0
    """``agentrl.dev/trainer-attempt`` of this Job (0 when absent)."""
    suspended: bool = False
    deleting: bool = False
    active: int = 0
    ready: int = 0
    succeeded: int = 0
    failed: int = 0
    conditions: tuple[ObservedCondition, ...] = ()

    def condition(self, type_: str) -> ObservedCondition | None:
        """The True condition of that type, if present (Job conditions are only ever True
        when they matter)."""
        return next((c for c in self.conditions if c.type == type_ and c.status == "True"), None)

    @property
    def complete(self) -> bool:
        """The Job succeeded."""
        return self.condition("Complete") is not None

    @property
    def failed_condition(self) -> ObservedCondition | None:
        """The Job's Failed condition when it failed."""
        return self.condition("Failed")


class ObservedDeployment(_Snapshot):
    """The rollout Deployment."""

    replicas: int = 0
    ready_replicas: int = 0
    available_replicas: int = 0
    conditions: tuple[ObservedCondition, ...] = ()


class Observed(_Snapshot):
    """Everything the status computation reads about a job's children."""

    engine_set: ObservedStatefulSet | None = None
    trainer_job: ObservedTrainerJob | None = None
    rollout: ObservedDeployment | None = None
    pods: tuple[ObservedPod, ...] = ()
    quotas: tuple[ResourceQuotaUsage, ...] = ()
    """The namespace's ResourceQuotas (they cap sandbox concurrency, see ``quotas``)."""
    nodes: NodesSeen | None = None
    """The cluster's Nodes, for the GPU preflight; None when the controller did not list them
    (``preflight.needs_nodes`` said there was no need)."""

    def pods_of(self, component: Component) -> list[ObservedPod]:
        """The live (not deleting) pods of one component, by name."""
        return sorted(
            (p for p in self.pods if p.component == component.value and not p.deleting),
            key=lambda p: p.name,
        )


def _parse_annotation(
    annotations: Mapping[str, str], key: str, model: type[_AnnotationT]
) -> _AnnotationT | None:
    raw = annotations.get(key)
    if not raw:
        return None
    try:
        return receive_annotation(raw, model, key=key).value
    except ValueError:  # malformed, or a WireSkewError: reconcile.wire_skew names that one
        return None


def _get(obj: Mapping[str, Any] | None, *path: str) -> Any:
    """``obj[path[0]][path[1]]...`` with None for anything missing."""
    cur: Any = obj
    for key in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | str) and str(value).isdigit() else 0


def _conditions(raw: Iterable[Mapping[str, Any]] | None) -> tuple[ObservedCondition, ...]:
    return tuple(
        ObservedCondition(
            type=str(c.get("type", "")),
            status=str(c.get("status", "Unknown")),
            reason=c.get("reason"),
            message=c.get("message"),
        )
        for c in raw or ()
    )


def _container(raw: Mapping[str, Any]) -> ObservedContainer:
    return ObservedContainer(
        name=str(raw.get("name", "")),
        ready=bool(raw.get("ready", False)),
        restart_count=_int(raw.get("restartCount")),
        waiting_reason=_get(raw, "state", "waiting", "reason"),
        waiting_message=_get(raw, "state", "waiting", "message"),
        terminated_reason=_get(raw, "state", "terminated", "reason"),
        terminated_exit_code=_get(raw, "state", "terminated", "exitCode"),
        terminated_message=_get(raw, "state", "terminated", "message"),
        last_terminated_reason=_get(raw, "lastState", "terminated", "reason"),
        last_terminated_exit_code=_get(raw, "lastState", "terminated", "exitCode"),
    )


def pod_from_object(obj: Mapping[str, Any]) -> ObservedPod:
    """A pod as the API server returns it → :class:`ObservedPod`."""
    status = obj.get("status") or {}
    statuses = [
        *(status.get("initContainerStatuses") or ()),
        *(status.get("containerStatuses") or ()),
    ]
    return ObservedPod(
        name=str(_get(obj, "metadata", "name")),
        component=(_get(obj, "metadata", "labels") or {}).get(LABEL_COMPONENT),
        phase=str(status.get("phase") or "Pending"),
        deleting=_get(obj, "metadata", "deletionTimestamp") is not None,
        deletion_timestamp=_get(obj, "metadata", "deletionTimestamp"),
        conditions=_conditions(status.get("conditions")),
        containers=tuple(_container(c) for c in statuses),
        annotations=dict(_get(obj, "metadata", "annotations") or {}),
    )


def statefulset_from_object(obj: Mapping[str, Any]) -> ObservedStatefulSet:
    """A StatefulSet → :class:`ObservedStatefulSet`."""
    return ObservedStatefulSet(
        replicas=_int(_get(obj, "spec", "replicas")),
        ready_replicas=_int(_get(obj, "status", "readyReplicas")),
        updated_replicas=_int(_get(obj, "status", "updatedReplicas")),
        current_revision=_get(obj, "status", "currentRevision"),
        update_revision=_get(obj, "status", "updateRevision"),
    )


def trainer_job_from_object(obj: Mapping[str, Any]) -> ObservedTrainerJob:
    """A batch/v1 Job → :class:`ObservedTrainerJob`."""
    annotations = _get(obj, "metadata", "annotations") or {}
    return ObservedTrainerJob(
        uid=_get(obj, "metadata", "uid"),
        attempt=_int(annotations.get(ANNOTATION_TRAINER_ATTEMPT)),
        suspended=bool(_get(obj, "spec", "suspend")),
        deleting=_get(obj, "metadata", "deletionTimestamp") is not None,
        active=_int(_get(obj, "status", "active")),
        ready=_int(_get(obj, "status", "ready")),
        succeeded=_int(_get(obj, "status", "succeeded")),
        failed=_int(_get(obj, "status", "failed")),
        conditions=_conditions(_get(obj, "status", "conditions")),
    )


def deployment_from_object(obj: Mapping[str, Any]) -> ObservedDeployment:
    """A Deployment → :class:`ObservedDeployment`."""
    return ObservedDeployment(
        replicas=_int(_get(obj, "spec", "replicas")),
        ready_replicas=_int(_get(obj, "status", "readyReplicas")),
        available_replicas=_int(_get(obj, "status", "availableReplicas")),
        conditions=_conditions(_get(obj, "status", "conditions")),
    )


def observe(
    *,
    statefulset: Mapping[str, Any] | None = None,
    trainer_job: Mapping[str, Any] | None = None,
    deployment: Mapping[str, Any] | None = None,
    pods: Iterable[Mapping[str, Any]] = (),
    resource_quotas: Iterable[Mapping[str, Any]] = (),
    nodes: NodesSeen | None = None,
) -> Observed:
    """The snapshot of a job's children from the raw objects (None for a child not found;
    ``pods``: every pod labelled ``agentrl.dev/job=NAME``; ``resource_quotas``: every
    ResourceQuota in the job's namespace; ``nodes``: the Node list, when it was read)."""
    return Observed(
        engine_set=None if statefulset is None else statefulset_from_object(statefulset),
        trainer_job=None if trainer_job is None else trainer_job_from_object(trainer_job),
        rollout=None if deployment is None else deployment_from_object(deployment),
        pods=tuple(pod_from_object(p) for p in pods),
        quotas=tuple(quota_from_object(q) for q in resource_quotas),
        nodes=nodes,
    )


def sandboxes_charged(observed: Observed) -> int:
    """The job's sandbox pods a quota charges now: every live pod not yet Succeeded or
    Failed."""
    return sum(p.phase not in ("Succeeded", "Failed") for p in observed.pods_of(Component.SANDBOX))
