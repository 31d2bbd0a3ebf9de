"""The operator's RBAC as rendered: exactly the permissions written out in
``charting.NAMESPACED_NEEDS`` / ``CLUSTER_NEEDS`` (no more, no less), cluster-wide by default,
per namespace in namespaced mode, and a superset of every Role the operator creates for a job
(RBAC escalation prevention refuses a Role granting what its creator lacks). Offline."""

from __future__ import annotations

from typing import Any

import yaml

from tests.chart.charting import (
    CLUSTER_NEEDS,
    NAMESPACE_DISCOVERY,
    NAMESPACED_NEEDS,
    REPO,
    Helm,
    expand,
    find,
)
from tests.factories import from_manifest


def test_cluster_wide_mode_grants_exactly_what_the_operator_uses(helm: Helm) -> None:
    docs = helm.template(release="rel", namespace="ops")
    role = find(docs, "ClusterRole", "rel-agentrl")
    assert expand(role["rules"]) == NAMESPACED_NEEDS | CLUSTER_NEEDS
    binding = find(docs, "ClusterRoleBinding", "rel-agentrl")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                  "kind": "ClusterRole", "name": "rel-agentrl"}
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "rel-agentrl", "namespace": "ops"},
    ]
    assert not [d for d in docs if d["kind"] in ("Role", "RoleBinding")]


def test_namespaced_mode_grants_job_permissions_only_in_the_watched_namespaces(
    helm: Helm,
) -> None:
    docs = helm.template({"watchNamespaces": ["team-a", "team-b"]}, release="rel",
                         namespace="ops")
    roles = {d["metadata"]["namespace"]: d for d in docs if d["kind"] == "Role"}
    assert set(roles) == {"team-a", "team-b"}
    for namespace, role in roles.items():
        assert expand(role["rules"]) == NAMESPACED_NEEDS, namespace
        binding = find([d for d in docs if d["metadata"].get("namespace") == namespace],
                       "RoleBinding")
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "rel-agentrl", "namespace": "ops"},
        ]
    # cluster-wide, only the reads kopf needs for discovery
    (cluster_role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    assert cluster_role["metadata"]["name"] == "rel-agentrl-discovery"
    assert expand(cluster_role["rules"]) == CLUSTER_NEEDS | NAMESPACE_DISCOVERY


def test_rbac_create_false_renders_no_rbac_objects(helm: Helm) -> None:
    docs = helm.template({"rbac": {"create": False}})
    assert not [d for d in docs if d["kind"] in
                ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")]


#: The shipped MI355X report job, in namespace team-a.
MI355X = from_manifest(
    yaml.safe_load((REPO / "examples" / "mi355x-report.yaml").read_text())
).with_metadata("namespace", "team-a")


def _grants(held: set[tuple[str, str, str]], rule: dict[str, Any]) -> list[str]:
    """The (group, resource, verb) of ``rule`` that ``held`` lacks."""
    missing = []
    for group in rule["apiGroups"]:
        for resource in rule["resources"]:
            for verb in rule["verbs"]:
                if (group, resource, verb) not in held:
                    missing.append(f"{verb} {resource}.{group}")
    return missing


def test_operator_holds_every_rule_of_the_roles_it_creates_for_a_job(helm: Helm) -> None:
    from agentrl.reconcile import rbac

    docs = helm.template()
    held = expand(find(docs, "ClusterRole")["rules"])
    child_rules = [
        *rbac.sandbox_provider_rules(),
        *rbac.watchdog_rules(MI355X.obj()),
        *rbac.trainer_rules(MI355X.obj(), task_images=True),
    ]
    assert child_rules, "the reconcile layer builds Roles for rollout workers and watchdogs"
    for rule in child_rules:
        assert _grants(held, rule) == [], rule
