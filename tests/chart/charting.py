"""Helpers of the chart tests: run the real ``helm`` on ``charts/agentrl`` and read what it
renders, and the operator's permissions written out by hand (what the tests expect the chart's
RBAC to grant, and a sample of what it must not).

Used by every module in ``tests/chart/``.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agentrl.devcluster.testing import Kubectl, wait_for

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "agentrl"
CRD_NAME = "agentrljobs.agentrl.dev"
#: The Kubernetes release the local control plane runs. helm, built as its release build is,
#: assumes its own client-go's Kubernetes minor for offline rendering (v1.34 for helm 3.19), so
#: `helm template` and `helm lint` run here with no --kube-version, as a user runs them.
KUBE_VERSION = "1.34.4"


class HelmError(RuntimeError):
    """helm exited non-zero; ``stderr`` holds its message."""

    def __init__(self, args: list[str], stderr: str) -> None:
        super().__init__(f"helm {' '.join(args)} failed: {stderr.strip()}")
        self.stderr = stderr


@dataclass
class Helm:
    """The real helm binary, optionally aimed at a cluster through ``env``."""

    binary: Path
    env: dict[str, str] = field(default_factory=dict)

    def run(self, *args: str, check: bool = True,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(self.binary), *args], capture_output=True, text=True,
                              timeout=timeout, check=False, env=self.env or None)
        if check and proc.returncode != 0:
            raise HelmError(list(args), proc.stderr)
        return proc

    def template(self, values: dict[str, Any] | None = None, *, chart: Path = CHART,
                 release: str = "rel", namespace: str = "agentrl-system") -> list[dict[str, Any]]:
        """Every object ``helm template`` renders with these values (empty documents dropped)."""
        proc = subprocess.run(
            [str(self.binary), "template", release, str(chart), "--namespace", namespace,
             "--values", "-"],
            input=json.dumps(values or {}), capture_output=True, text=True, timeout=60,
            check=False, env=self.env or None)
        if proc.returncode != 0:
            raise HelmError(["template", release, str(chart)], proc.stderr)
        return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def adopt_crd(admin: Kubectl, release: str, namespace: str) -> None:
    """Let ``release`` take over a CRD applied outside Helm (Helm refuses to overwrite an
    object without its ownership labels): the documented migration step."""
    if admin.run("get", "crd", CRD_NAME, check=False).returncode != 0:
        return
    admin.run("label", "crd", CRD_NAME, "app.kubernetes.io/managed-by=Helm", "--overwrite")
    admin.run("annotate", "crd", CRD_NAME, f"meta.helm.sh/release-name={release}",
              f"meta.helm.sh/release-namespace={namespace}", "--overwrite")


def apply_crds(admin: Kubectl, root: Path = REPO) -> None:
    """The CRD of the tree at ``root`` (``crds/``), applied server-side taking over its fields
    (as the chart installs it), and waited for until Established."""
    for path in sorted((root / "crds").glob("*.yaml")):
        admin.run("apply", "--server-side", "--force-conflicts", "-f", str(path))
    # `kubectl wait` fails at once instead of waiting while a just-created CRD's
    # status.conditions is still null (".status.conditions accessor error: <nil>"): try again
    wait_for(
        lambda: (
            admin.run(
                "wait",
                "--for=condition=Established",
                "--timeout=20s",
                f"crd/{CRD_NAME}",
                check=False,
                timeout=30,
            ).returncode
            == 0
        ),
        timeout=60,
        interval=0.5,
        what="the AgentRLJob CRD to be Established",
    )


def unique_release(prefix: str = "arl") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    """The one rendered object of ``kind`` (and ``name``); fails when there is not exactly one."""
    hits = [d for d in docs if d["kind"] == kind
            and (name is None or d["metadata"]["name"] == name)]
    assert len(hits) == 1, f"expected one {kind} {name or ''}, found {len(hits)}"
    return hits[0]


def kinds(docs: list[dict[str, Any]]) -> list[str]:
    return sorted(d["kind"] for d in docs)


def expand(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """RBAC rules as (apiGroup, resource, verb) triples (rules with resourceNames excluded)."""
    out = set()
    for rule in rules:
        assert "resourceNames" not in rule, rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    out.add((group, resource, verb))
    return out


def triples(group: str, resources: list[str], verbs: list[str]) -> set[tuple[str, str, str]]:
    return {(group, r, v) for r in resources for v in verbs}


CRUD = ["get", "list", "watch", "create", "update", "patch", "delete"]

#: What the operator does in the namespaces of its jobs, written out from what it calls (the
#: controller's reconcile plan in operator/agentrl/reconcile/plan.py) and what the Roles it
#: creates grant (operator/agentrl/reconcile/rbac.py): RBAC escalation prevention refuses to
#: create a Role granting more than its creator holds.
NAMESPACED_NEEDS: set[tuple[str, str, str]] = (
    # the jobs: watch, patch (kopf annotations), delete after ttlSecondsAfterFinished
    triples("agentrl.dev", ["agentrljobs"], ["get", "list", "watch", "patch", "update", "delete"])
    | triples("agentrl.dev", ["agentrljobs/status", "agentrljobs/scale"],
              ["get", "patch", "update"])
    # blockOwnerDeletion on every child's ownerReference
    | triples("agentrl.dev", ["agentrljobs/finalizers"], ["update"])
    | triples("", ["configmaps", "services", "serviceaccounts", "persistentvolumeclaims"], CRUD)
    | triples("apps", ["statefulsets", "deployments", "daemonsets"], CRUD)
    | triples("batch", ["jobs"], CRUD)
    | triples("policy", ["poddisruptionbudgets"], CRUD)
    | triples("networking.k8s.io", ["networkpolicies"], CRUD)
    | triples("rbac.authorization.k8s.io", ["roles", "rolebindings"], CRUD)
    | triples("", ["pods"], ["get", "list", "watch", "create", "patch", "delete"])
    | triples("", ["pods/exec"], ["create", "get"])
    | triples("", ["pods/log"], ["get"])
    | triples("", ["events"], ["create", "patch"])
    | triples("", ["resourcequotas"], ["get", "list", "watch"])
    # the job's Ray token Secret, created once; Secrets are never read
    | triples("", ["secrets"], ["create"])
)

#: Cluster-scoped reads in every mode: kopf's CRD scanning, and the Node lists that size the
#: pre-pull DaemonSets and feed the GPU preflight (operator/agentrl/controller/kube.py
#: ``count_nodes``, ``list_nodes``).
CLUSTER_NEEDS: set[tuple[str, str, str]] = (
    triples("apiextensions.k8s.io", ["customresourcedefinitions"], ["get", "list", "watch"])
    | triples("", ["nodes"], ["list"])
)

#: ... and in namespaced mode only: namespace discovery (kopf never lists namespaces when it
#: serves the whole cluster).
NAMESPACE_DISCOVERY: set[tuple[str, str, str]] = triples(
    "", ["namespaces"], ["get", "list", "watch"])

#: A sample of what the operator must never be able to do, as (apiGroup, resource, verb).
MUST_NOT: set[tuple[str, str, str]] = {
    ("", "secrets", "get"),
    ("", "secrets", "list"),
    ("agentrl.dev", "agentrljobs", "create"),
    ("", "pods", "update"),
    ("", "namespaces", "create"),
    ("", "namespaces", "delete"),
    ("", "nodes", "get"),
    ("", "nodes", "patch"),
    ("rbac.authorization.k8s.io", "clusterroles", "create"),
    ("rbac.authorization.k8s.io", "clusterrolebindings", "create"),
    ("rbac.authorization.k8s.io", "roles", "bind"),
    ("rbac.authorization.k8s.io", "roles", "escalate"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "create"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "delete"),
    ("", "serviceaccounts/token", "create"),
    ("", "serviceaccounts", "impersonate"),
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "create"),
    ("kopf.dev", "clusterkopfpeerings", "patch"),
    ("", "namespaces", "list"),
}
