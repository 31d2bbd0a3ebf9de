"""ServiceAccounts, Roles and RoleBindings of a job's workloads, each granting exactly what
that workload calls, in the job's namespace only.

* ``NAME-rollout``: the kubernetes sandbox provider (in the rollout workers) creates, watches
  and deletes sandbox pods, execs into them and reads their logs.
* ``NAME-trainer``: the driver annotates its own pod with its progress, posts Events and, when
  pre-pull is on, writes the dataset's task images into the ``NAME-task-images`` ConfigMap.
* ``NAME-engine``: the watchdog sidecar annotates its own pod (only the engine pods, by name),
  posts Events on the job and reads the job (for its uid).

Called by ``rollout`` and ``engine``.
"""

from __future__ import annotations

from typing import Any

from agentrl.api import GROUP, PLURAL, AgentRLJob
from agentrl.reconcile import names
from agentrl.reconcile.constants import Component
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.meta import object_meta


def _rule(
    resources: list[str],
    verbs: list[str],
    *,
    group: str = "",
    resource_names: list[str] | None = None,
) -> dict[str, Any]:
    rule: dict[str, Any] = {"apiGroups": [group], "resources": resources, "verbs": verbs}
    if resource_names:
        rule["resourceNames"] = resource_names
    return rule


def sandbox_provider_rules() -> list[dict[str, Any]]:
    """What the kubernetes sandbox provider needs: sandbox pods, exec and logs. Nothing else
    (exec is a ``create`` on ``pods/exec`` over WebSocket; some clients open it with ``get``)."""
    return [
        _rule(["pods"], ["create", "get", "list", "watch", "delete"]),
        _rule(["pods/exec"], ["create", "get"]),
        _rule(["pods/log"], ["get"]),
    ]


def watchdog_rules(job: AgentRLJob) -> list[dict[str, Any]]:
    """The watchdog's rules: its own pod (every engine pod, by name), Events, the job."""
    name = job.metadata.name
    pods = [names.engine_pod(name, i) for i in range(job.spec.inference.engines)]
    return [
        _rule(["pods"], ["get", "patch"], resource_names=pods),
        _rule(["events"], ["create"]),
        _rule([PLURAL], ["get"], group=GROUP, resource_names=[name]),
    ]


def trainer_rules(job: AgentRLJob, *, task_images: bool) -> list[dict[str, Any]]:
    """The trainer driver's rules: it writes its progress annotation on its own pod (whose name
    the Job generates, so the rule cannot name it) and posts Events; with ``task_images``
    (pre-pull on) it also writes the dataset's images into ``NAME-task-images``, that
    ConfigMap only."""
    rules = [
        _rule(["pods"], ["get", "patch"]),
        _rule(["events"], ["create"]),
    ]
    if task_images:
        rules.append(
            _rule(
                ["configmaps"],
                ["get", "patch"],
                resource_names=[names.task_images(job.metadata.name)],
            )
        )
    return rules


def service_account(
    job: AgentRLJob, ctx: BuildContext, *, name: str, component: Component
) -> dict[str, Any]:
    """A ServiceAccount owned by the job."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": object_meta(job, ctx, name=name, component=component),
    }


def role(
    job: AgentRLJob,
    ctx: BuildContext,
    *,
    name: str,
    component: Component,
    rules: list[dict[str, Any]],
) -> dict[str, Any]:
    """A namespaced Role owned by the job."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": object_meta(job, ctx, name=name, component=component),
        "rules": rules,
    }


def role_binding(
    job: AgentRLJob, ctx: BuildContext, *, name: str, component: Component
) -> dict[str, Any]:
    """Binds the Role ``name`` to the ServiceAccount ``name``."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": object_meta(job, ctx, name=name, component=component),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ctx.namespace}],
    }


def rbac_objects(
    job: AgentRLJob,
    ctx: BuildContext,
    *,
    name: str,
    component: Component,
    rules: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding, all named ``name``."""
    return [
        service_account(job, ctx, name=name, component=component),
        role(job, ctx, name=name, component=component, rules=rules),
        role_binding(job, ctx, name=name, component=component),
    ]
