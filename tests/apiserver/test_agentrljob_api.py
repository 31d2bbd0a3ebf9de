"""The AgentRLJob API as the real kube-apiserver serves it: examples are accepted and read back
as the models produce them, the invalid corpus is refused naming the field, immutable fields
stay immutable, and /scale drives spec.sandbox.concurrency within the rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from tests.api.cases import BASE, INVALID, Case, merge

from agentrl.api import AgentRLJob
from agentrl.devcluster.testing import Kubectl

pytestmark = [pytest.mark.apiserver, pytest.mark.usefixtures("crd_installed")]

EXAMPLES = sorted(Path("examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_is_accepted_and_reads_back_as_the_models_produce(
    kubectl: Kubectl, path: Path
) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        out = json.loads(
            kubectl.run(
                "create", "--dry-run=server", "-o", "json", "-f", "-", stdin=yaml.safe_dump(doc)
            ).stdout
        )
        # the server applied the schema defaults; the models apply the same defaults
        expected = AgentRLJob.model_validate(doc).to_manifest()["spec"]
        assert out["spec"] == expected


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c.name)
def test_the_api_server_rejects_each_invalid_manifest_naming_its_field(
    kubectl: Kubectl, case: Case
) -> None:
    proc = kubectl.run(
        "create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(case.manifest()), check=False
    )
    assert proc.returncode != 0, f"{case.name}: the API server accepted it"
    assert case.field in proc.stderr, proc.stderr


def test_a_rejected_manifest_leaves_nothing_behind(kubectl: Kubectl) -> None:
    kubectl.run("create", "-f", "-", stdin=yaml.safe_dump(INVALID[0].manifest()), check=False)
    assert kubectl.json("get", "agentrljobs")["items"] == []


def _create(kubectl: Kubectl, patch: dict | None = None) -> None:  # type: ignore[type-arg]
    kubectl.run("create", "-f", "-", stdin=yaml.safe_dump(merge(BASE, patch or {})))


def test_model_and_trainer_topology_are_immutable(kubectl: Kubectl) -> None:
    _create(kubectl)
    proc = kubectl.run(
        "patch",
        "arj",
        "corpus",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"model": {"source": {"path": "/models/other"}}}}),
        check=False,
    )
    assert proc.returncode != 0 and "spec.model" in proc.stderr
    assert "immutable" in proc.stderr
    proc = kubectl.run(
        "patch",
        "arj",
        "corpus",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"trainer": {"nodes": 2}}}),
        check=False,
    )
    assert proc.returncode != 0 and "spec.trainer" in proc.stderr
    # a scale field still changes in place
    kubectl.run(
        "patch",
        "arj",
        "corpus",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"rollout": {"maxTurns": 30}}}),
    )
    assert kubectl.json("get", "arj", "corpus")["spec"]["rollout"]["maxTurns"] == 30


def test_kubectl_scale_sets_sandbox_concurrency(kubectl: Kubectl) -> None:
    _create(kubectl)
    kubectl.run("scale", "arj/corpus", "--replicas=384")
    assert kubectl.json("get", "arj", "corpus")["spec"]["sandbox"]["concurrency"] == 384
    scale = json.loads(
        kubectl.run(
            "get",
            "--raw",
            f"/apis/agentrl.dev/v1alpha1/namespaces/{kubectl.namespace}/agentrljobs/corpus/scale",
        ).stdout
    )
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 384


def test_kubectl_scale_is_bounded_by_the_autoscale_rule(kubectl: Kubectl) -> None:
    _create(kubectl, {"spec": {"sandbox": {"autoscale": {"enabled": True, "min": 16, "max": 64}}}})
    proc = kubectl.run("scale", "arj/corpus", "--replicas=500", check=False)
    assert proc.returncode != 0
    assert "spec.sandbox.concurrency" in proc.stderr
    assert kubectl.json("get", "arj", "corpus")["spec"]["sandbox"]["concurrency"] == 32


def test_short_name_and_category_resolve(kubectl: Kubectl) -> None:
    _create(kubectl)
    names = kubectl.run("get", "agentrl", "-o", "name").stdout.split()
    assert names == ["agentrljob.agentrl.dev/corpus"]
