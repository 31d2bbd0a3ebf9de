"""The Kubernetes API as the reconciler needs it: a small Protocol, and its lightkube
implementation that counts every request (``agentrl_operator_api_requests_total``), so the
benchmark can report API requests per reconcile.

Objects cross this boundary as plain dicts in wire form: the pure layer builds and reads them,
nothing here interprets them.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any, Protocol

from lightkube import AsyncClient, codecs
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import DaemonSet, Deployment, StatefulSet
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import ConfigMap, Event, Node, Pod, ResourceQuota
from lightkube.types import CascadeType, PatchType

from agentrl.api import job as job_api
from agentrl.controller import metrics
from agentrl.reconcile.children import ChildRef
from agentrl.reconcile.constants import FIELD_MANAGER

log = logging.getLogger(__name__)

AgentRLJobResource = create_namespaced_resource(
    job_api.GROUP, job_api.VERSION, job_api.KIND, job_api.PLURAL
)

_CHILD_KINDS: dict[str, Any] = {
    "StatefulSet": StatefulSet,
    "Job": Job,
    "Deployment": Deployment,
    "ConfigMap": ConfigMap,
}


class KubeAPI(Protocol):
    """What one reconcile reads and writes."""

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def list_jobs(self, namespace: str | None) -> list[dict[str, Any]]: ...

    async def get_child(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def list_pods(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]: ...

    async def list_resource_quotas(self, namespace: str) -> list[dict[str, Any]]: ...

    async def count_nodes(self, labels: dict[str, str]) -> int: ...

    async def list_nodes(self) -> list[dict[str, Any]]:
        """Every Node (the GPU preflight); raises :class:`NodesForbidden` when RBAC refuses."""
        ...

    async def list_daemonsets(
        self, namespace: str, labels: dict[str, str]
    ) -> list[dict[str, Any]]: ...

    async def delete_daemonset(self, namespace: str, name: str) -> None: ...

    async def apply(self, obj: dict[str, Any]) -> None: ...

    async def create_if_absent(self, obj: dict[str, Any]) -> bool:
        """Create ``obj``; an existing object of that name is left as it is. True if created."""
        ...

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None: ...

    async def scale(self, namespace: str, name: str, replicas: int) -> None: ...

    async def delete(self, ref: ChildRef) -> None: ...

    async def delete_job(self, namespace: str, name: str) -> None: ...

    async def post_event(
        self, job: dict[str, Any], *, type_: str, reason: str, message: str
    ) -> None: ...


class TemplateImmutable(Exception):
    """Applying a Job was refused because its pod template differs from the live Job's, which
    Kubernetes never changes (422 ``spec.template: ... field is immutable``): the operator now
    builds a running trainer attempt's pods differently (an upgrade, a changed default)."""


class NodesForbidden(Exception):
    """Listing Nodes was refused (403): the operator runs without ``list`` on nodes, as an
    install with hand-made namespaced RBAC may. The GPU preflight says so; nothing fails."""


def _count(verb: str, kind: str) -> None:
    metrics.API_REQUESTS.labels(verb=verb, kind=kind).inc()


class LightkubeAPI:
    """:class:`KubeAPI` over lightkube's async client (kubeconfig or in-cluster config)."""

    def __init__(self, client: AsyncClient | None = None) -> None:
        self.client = client or AsyncClient(field_manager=FIELD_MANAGER)

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        _count("get", job_api.KIND)
        try:
            obj = await self.client.get(AgentRLJobResource, name, namespace=namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise
        return dict(obj.to_dict())

    async def list_jobs(self, namespace: str | None) -> list[dict[str, Any]]:
        _count("list", job_api.KIND)
        ns = namespace if namespace is not None else "*"
        return [dict(o.to_dict()) async for o in self.client.list(AgentRLJobResource, namespace=ns)]

    async def get_child(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        _count("get", kind)
        try:
            obj = await self.client.get(_CHILD_KINDS[kind], name, namespace=namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise
        return dict(obj.to_dict())

    async def list_pods(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        _count("list", "Pod")
        return [
            dict(p.to_dict())
            async for p in self.client.list(Pod, namespace=namespace, labels=labels)
        ]

    async def list_resource_quotas(self, namespace: str) -> list[dict[str, Any]]:
        _count("list", "ResourceQuota")
        return [
            dict(q.to_dict()) async for q in self.client.list(ResourceQuota, namespace=namespace)
        ]

    async def count_nodes(self, labels: dict[str, str]) -> int:
        _count("list", "Node")
        return len([n async for n in self.client.list(Node, labels=labels or None)])

    async def list_nodes(self) -> list[dict[str, Any]]:
        _count("list", "Node")
        try:
            return [dict(n.to_dict()) async for n in self.client.list(Node)]
        except ApiError as exc:
            if exc.status.code == 403:
                raise NodesForbidden(exc.status.message or "forbidden") from exc
            raise

    async def list_daemonsets(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        _count("list", "DaemonSet")
        return [
            dict(d.to_dict())
            async for d in self.client.list(DaemonSet, namespace=namespace, labels=labels)
        ]

    async def delete_daemonset(self, namespace: str, name: str) -> None:
        _count("delete", "DaemonSet")
        try:
            await self.client.delete(
                DaemonSet, name, namespace=namespace, cascade=CascadeType.BACKGROUND
            )
        except ApiError as exc:
            if exc.status.code != 404:
                raise

    async def apply(self, obj: dict[str, Any]) -> None:
        _count("apply", obj["kind"])
        try:
            await self.client.apply(codecs.from_dict(obj), field_manager=FIELD_MANAGER, force=True)
        except ApiError as exc:
            message = exc.status.message or ""
            if (
                exc.status.code == 422
                and obj["kind"] == "Job"
                and "spec.template" in message
                and "field is immutable" in message
            ):
                raise TemplateImmutable(message) from exc
            raise

    async def create_if_absent(self, obj: dict[str, Any]) -> bool:
        _count("create", obj["kind"])
        try:
            await self.client.create(codecs.from_dict(obj), field_manager=FIELD_MANAGER)
        except ApiError as exc:
            if exc.status.code == 409:  # AlreadyExists: keep what is there
                return False
            raise
        return True

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        _count("patch", "AgentRLJob/status")
        await self.client.patch(
            AgentRLJobResource.Status,
            name,
            {"status": status},
            namespace=namespace,
            patch_type=PatchType.MERGE,
        )

    async def scale(self, namespace: str, name: str, replicas: int) -> None:
        """Write ``spec.sandbox.concurrency`` through the /scale subresource."""
        _count("patch", "AgentRLJob/scale")
        await self.client.patch(
            AgentRLJobResource.Scale,
            name,
            {"spec": {"replicas": replicas}},
            namespace=namespace,
            patch_type=PatchType.MERGE,
        )

    async def delete(self, ref: ChildRef) -> None:
        _count("delete", ref.kind)
        try:
            await self.client.delete(
                _CHILD_KINDS[ref.kind],
                ref.name,
                namespace=ref.namespace,
                cascade=CascadeType.BACKGROUND,
            )
        except ApiError as exc:
            if exc.status.code != 404:
                raise

    async def delete_job(self, namespace: str, name: str) -> None:
        _count("delete", job_api.KIND)
        try:
            await self.client.delete(
                AgentRLJobResource, name, namespace=namespace, cascade=CascadeType.BACKGROUND
            )
        except ApiError as exc:
            if exc.status.code != 404:
                raise

    async def post_event(
        self, job: dict[str, Any], *, type_: str, reason: str, message: str
    ) -> None:
        _count("create", "Event")
        meta = job["metadata"]
        now = datetime.now(UTC)
        event = Event(
            metadata=ObjectMeta(generateName=f"{meta['name']}.", namespace=meta["namespace"]),
            involvedObject=ObjectReference(
                apiVersion=job_api.API_VERSION,
                kind=job_api.KIND,
                name=meta["name"],
                namespace=meta["namespace"],
                uid=meta.get("uid"),
                resourceVersion=meta.get("resourceVersion"),
            ),
            type=type_,
            reason=reason,
            message=message[:1024],
            source=EventSource(component="agentrl-operator"),
            firstTimestamp=now,
            lastTimestamp=now,
            count=1,
            reportingComponent="agentrl-operator",
            reportingInstance="agentrl-operator",
        )
        try:
            await self.client.create(event, namespace=meta["namespace"])
        except ApiError as exc:  # an event is best effort: never fail a reconcile for it
            log.warning("could not post event %s on %s: %s", reason, meta["name"], exc)
