"""An in-memory stand-in for :class:`agentrl.controller.kube.KubeAPI`, recording every call.

It tests the reconciler's orchestration (order of writes, minimal writes, events after the
status) without a cluster; what the API server itself does is tested in e2e/ against the real
one.
"""

from __future__ import annotations

import copy
from typing import Any

from agentrl.reconcile.children import ChildRef


class FakeKube:
    def __init__(self, job: dict[str, Any]) -> None:
        self.job: dict[str, Any] | None = copy.deepcopy(job)
        self.calls: list[tuple[str, str]] = []
        self.fail_status_patch = False
        self.children: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: list[tuple[str, str]] = []

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("get", "AgentRLJob"))
        return copy.deepcopy(self.job)

    async def list_jobs(self, namespace: str | None) -> list[dict[str, Any]]:
        return [copy.deepcopy(self.job)] if self.job else []

    async def get_child(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("get", kind))
        return None

    async def list_pods(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        self.calls.append(("list", "Pod"))
        return []

    async def list_resource_quotas(self, namespace: str) -> list[dict[str, Any]]:
        self.calls.append(("list", "ResourceQuota"))
        return []

    async def count_nodes(self, labels: dict[str, str]) -> int:
        return 0

    async def list_nodes(self) -> list[dict[str, Any]]:
        self.calls.append(("list", "Node"))
        return []

    async def list_daemonsets(
        self, namespace: str, labels: dict[str, str]
    ) -> list[dict[str, Any]]:
        return []

    async def delete_daemonset(self, namespace: str, name: str) -> None:
        self.calls.append(("delete", "DaemonSet"))

    async def apply(self, obj: dict[str, Any]) -> None:
        self.calls.append(("apply", obj["kind"]))
        self.children[(obj["kind"], obj["metadata"]["name"])] = obj

    async def create_if_absent(self, obj: dict[str, Any]) -> bool:
        self.calls.append(("create", obj["kind"]))
        ident = (obj["kind"], obj["metadata"]["name"])
        if ident in self.children:
            return False
        self.children[ident] = obj
        return True

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.calls.append(("patch", "status"))
        if self.fail_status_patch:
            raise RuntimeError("status write refused")
        assert self.job is not None
        merged = {k: v for k, v in status.items() if v is not None}
        self.job["status"] = merged

    async def scale(self, namespace: str, name: str, replicas: int) -> None:
        self.calls.append(("patch", "scale"))

    async def delete(self, ref: ChildRef) -> None:
        self.calls.append(("delete", ref.kind))

    async def delete_job(self, namespace: str, name: str) -> None:
        self.calls.append(("delete", "AgentRLJob"))
        self.job = None

    async def post_event(
        self, job: dict[str, Any], *, type_: str, reason: str, message: str
    ) -> None:
        self.calls.append(("create", "Event"))
        self.events.append((type_, reason))

    def writes(self) -> list[tuple[str, str]]:
        return [c for c in self.calls if c[0] not in ("get", "list")]
