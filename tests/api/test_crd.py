"""The checked-in CRD is exactly what the models generate, and carries what kubectl scale, an
HPA and the printer columns need."""

from __future__ import annotations

from pathlib import Path

import yaml

from agentrl.api import crd


def _walk(schema: dict, path: str = ""):  # type: ignore[no-untyped-def]
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if "items" in schema:
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}{{}}")


def test_checked_in_crd_matches_the_models() -> None:
    checked_in = Path("crds") / crd.CRD_FILENAME
    assert checked_in.read_text() == crd.crd_yaml(), (
        "crds/ drifted from the models: run `agentrl crds --write crds/`"
    )


def test_crd_names_and_scale_subresource() -> None:
    obj = yaml.safe_load(crd.crd_yaml())
    names = obj["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"], names["categories"]) == (
        "AgentRLJob",
        "agentrljobs",
        ["arj"],
        ["agentrl"],
    )
    version = obj["spec"]["versions"][0]
    assert version["name"] == "v1alpha1"
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.sandbox.concurrency",
        "statusReplicasPath": ".status.sandbox.concurrency",
        "labelSelectorPath": ".status.sandbox.selector",
    }
    status_schema = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    # HPA reads the selector as a string
    assert status_schema["properties"]["sandbox"]["properties"]["selector"]["type"] == "string"


def test_printer_columns_a_user_wants_at_a_glance() -> None:
    obj = yaml.safe_load(crd.crd_yaml())
    columns = obj["spec"]["versions"][0]["additionalPrinterColumns"]
    default = [c["name"] for c in columns if not c.get("priority")]
    assert default == [
        "Ready",
        "Reason",
        "Degraded",
        "Step",
        "Reward",
        "Sandboxes",
        "Engines",
        "Age",
    ]


def test_schema_is_structural_every_node_has_a_type_and_no_refs() -> None:
    schema = crd.openapi_schema()
    for path, node in _walk(schema):
        assert "$ref" not in node and "anyOf" not in node, path
        assert "type" in node, f"{path} has no type"


def test_every_string_is_bounded_so_cel_cost_stays_within_budget() -> None:
    spec = crd.openapi_schema()["properties"]["spec"]
    unbounded = [
        p
        for p, n in _walk(spec)
        if n.get("type") == "string"
        and "maxLength" not in n
        and "enum" not in n
        and "pattern" not in n
    ]
    assert unbounded == []


def test_defaults_reach_into_omitted_objects() -> None:
    spec = crd.openapi_schema()["properties"]["spec"]["properties"]
    # an omitted spec.rollout still gets groupSize 8: rollout defaults to its defaulted object
    assert spec["rollout"]["default"]["groupSize"] == 8
    assert spec["rollout"]["properties"]["groupSize"]["default"] == 8
    assert spec["sandbox"]["properties"]["concurrency"]["default"] == 16


def test_cross_field_rules_are_cel_with_message_expressions() -> None:
    spec = crd.openapi_schema()["properties"]["spec"]
    rules = spec["x-kubernetes-validations"]
    assert any("trajectoriesPerStep % self.rollout.groupSize" in r["rule"] for r in rules)
    assert all("messageExpression" in r for r in rules)
    transition = [r for r in rules if "oldSelf" in r["rule"]]
    assert {r["fieldPath"] for r in transition} == {".model", ".trainer"}


def test_the_manifest_reference_in_docs_matches_the_models() -> None:
    from agentrl.api import reference

    assert Path("docs/manifest.md").read_text() == reference.manifest_reference(), (
        "docs/manifest.md drifted from the models: run `agentrl docs --write docs/manifest.md`"
    )
