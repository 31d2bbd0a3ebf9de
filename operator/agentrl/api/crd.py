"""Generate the AgentRLJob CustomResourceDefinition from the models.

The CRD in ``crds/`` is never edited by hand: ``agentrl crds --write crds/`` regenerates it and
a test fails when the checked-in file drifts from the models. The generator turns pydantic's
JSON Schema into a structural OpenAPI v3 schema the API server accepts:

- ``$ref``\\ s are inlined; titles and examples dropped; descriptions kept (from attribute
  docstrings, so ``kubectl explain`` shows the same words as ``docs/manifest.md``);
- optional fields (``X | None``) become plain ``X`` (absent means unset);
- a nested object whose whole value has a default gets that whole default (the fully
  defaulted object), so an omitted object is defaulted and its CEL rules still evaluate;
- JSON Schema 2020 ``exclusiveMinimum: n`` becomes OpenAPI 3.0 ``minimum: n,
  exclusiveMinimum: true``;
- each model's :class:`~agentrl.api.rules.Rule`\\ s become ``x-kubernetes-validations``.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from agentrl.api import job as job_mod
from agentrl.api.base import ManifestModel
from agentrl.api.status import AgentRLJobStatus

_DROP = {"title", "examples", "propertyNames"}  # propertyNames: not structural


def _model_classes(root: type[BaseModel]) -> dict[str, type[ManifestModel]]:
    """Every ManifestModel reachable from ``root``, by class name (pydantic's $defs keys)."""
    found: dict[str, type[ManifestModel]] = {}
    stack: list[type[BaseModel]] = [root]
    while stack:
        cls = stack.pop()
        if cls.__name__ in found or not issubclass(cls, ManifestModel):
            continue
        found[cls.__name__] = cls
        for field in cls.model_fields.values():
            stack.extend(_models_in(field.annotation))
    return found


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in getattr(annotation, "__args__", ()) or ():
        out.extend(_models_in(arg))
    return out


class _Converter:
    def __init__(self, defs: dict[str, Any], classes: dict[str, type[ManifestModel]]) -> None:
        self.defs = defs
        self.classes = classes

    def convert(self, node: dict[str, Any]) -> dict[str, Any]:
        if "$ref" in node:
            name = node["$ref"].split("/")[-1]
            merged = {**self.defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
            out = self.convert(merged)
            cls = self.classes.get(name)
            if cls is not None:
                _collection_defaults(cls, out)
                if cls.cel_rules:
                    out["x-kubernetes-validations"] = [r.to_crd() for r in cls.cel_rules]
            return out
        if "anyOf" in node:
            options = [o for o in node["anyOf"] if o.get("type") != "null"]
            rest = {k: v for k, v in node.items() if k != "anyOf"}
            if len(options) == 1:
                if rest.get("default", 0) is None:
                    rest.pop("default")
                return self.convert({**options[0], **rest})
            raise ValueError(f"unions are not structural: {node}")
        out = {}
        for key, value in node.items():
            self._convert_key(key, value, out)
        if "enum" in out and "type" not in out:
            out["type"] = "string"
        return out

    def _convert_key(self, key: str, value: Any, out: dict[str, Any]) -> None:
        """One keyword of a JSON Schema node, in its OpenAPI 3.0 structural spelling."""
        if key in _DROP:
            return
        if key == "description":
            out["description"] = clean_description(value)
        elif key == "properties":
            out["properties"] = {k: self.convert(v) for k, v in value.items()}
        elif key == "items":
            out["items"] = self.convert(value)
        elif key == "additionalProperties":
            # `false` (extra="forbid") is expressed by the structural schema itself
            if isinstance(value, dict):
                out["additionalProperties"] = self.convert(value)
        elif key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        else:
            out[key] = value


def _collection_defaults(cls: type[ManifestModel], schema: dict[str, Any]) -> None:
    """Empty list/map defaults (pydantic's default_factory) as schema defaults, so an object
    the API server returns equals the one the models produce."""
    props = schema.get("properties", {})
    for name, field in cls.model_fields.items():
        alias = field.alias or name
        if field.default_factory is None or alias not in props:
            continue
        value = field.default_factory()  # type: ignore[call-arg]
        if isinstance(value, list | dict) and not value:
            props[alias]["default"] = value
        elif isinstance(value, BaseModel):
            # the whole defaulted object: the API server checks CEL rules against a default
            # as written, before defaulting inside it
            props[alias]["default"] = value.model_dump(
                mode="json", by_alias=True, exclude_none=True
            )


def clean_description(text: str) -> str:
    """Docstring text as one paragraph with Markdown-style backticks."""
    return " ".join(text.replace("``", "`").split())


def _schema_of(model: type[ManifestModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation", ref_template="#/$defs/{model}")
    defs = raw.pop("$defs", {})
    conv = _Converter(defs, _model_classes(model))
    out = conv.convert(raw)
    _collection_defaults(model, out)
    if model.cel_rules:
        out["x-kubernetes-validations"] = [r.to_crd() for r in model.cel_rules]
    return out


PRINTER_COLUMNS: list[dict[str, Any]] = [
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
    },
    {"name": "Reason", "type": "string", "jsonPath": ".status.readyReason"},
    {
        "name": "Degraded",
        "type": "string",
        "jsonPath": ".status.degradedReason",
        "description": "The Degraded condition's reason while it is True",
    },
    {"name": "Step", "type": "integer", "jsonPath": ".status.trainer.step"},
    {"name": "Reward", "type": "number", "jsonPath": ".status.rollout.meanReward"},
    {
        "name": "Sandboxes",
        "type": "integer",
        "jsonPath": ".status.sandbox.concurrency",
        "description": "Sandbox concurrency in effect",
    },
    {
        "name": "Engines",
        "type": "integer",
        "jsonPath": ".status.engines.ready",
        "description": "Engines ready",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {
        "name": "Desired",
        "type": "integer",
        "jsonPath": ".spec.sandbox.concurrency",
        "priority": 1,
        "description": "spec.sandbox.concurrency",
    },
    {
        "name": "Limited-By",
        "type": "string",
        "jsonPath": ".status.sandbox.limitedBy",
        "priority": 1,
    },
    {"name": "Stage", "type": "string", "jsonPath": ".status.trainer.stage", "priority": 1},
    {"name": "Pass@1", "type": "number", "jsonPath": ".status.rollout.passAt1", "priority": 1},
    {
        "name": "Traj/h",
        "type": "number",
        "jsonPath": ".status.rollout.trajectoriesPerHour",
        "priority": 1,
    },
    {
        "name": "Infra-Err",
        "type": "number",
        "jsonPath": ".status.rollout.infraErrorRate",
        "priority": 1,
    },
    {
        "name": "Weights",
        "type": "integer",
        "jsonPath": ".status.engines.weightVersion",
        "priority": 1,
    },
]


def openapi_schema() -> dict[str, Any]:
    """The structural schema of the whole AgentRLJob object."""
    return {
        "type": "object",
        "description": clean_description(job_mod.AgentRLJob.__doc__ or ""),
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {
                "type": "object",
                "properties": {
                    "name": {
                        "type": "string",
                        "pattern": r"^[a-z]([-a-z0-9]*[a-z0-9])?$",
                    }
                },
            },
            "spec": _schema_of(job_mod.AgentRLJobSpec),
            "status": _schema_of(AgentRLJobStatus),
        },
        "x-kubernetes-validations": [r.to_crd() for r in job_mod.AgentRLJob.cel_rules],
    }


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition object: plain data, no object shared between two places
    (a model used twice, such as an enum, would otherwise be written as a YAML anchor and
    alias, which the checked-in CRD must not carry)."""
    body: dict[str, Any] = json.loads(json.dumps(_crd()))
    return body


def _crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{job_mod.PLURAL}.{job_mod.GROUP}",
            "labels": {"app.kubernetes.io/name": "agentrl", "app.kubernetes.io/part-of": "agentrl"},
        },
        "spec": {
            "group": job_mod.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": job_mod.KIND,
                "listKind": f"{job_mod.KIND}List",
                "plural": job_mod.PLURAL,
                "singular": job_mod.SINGULAR,
                "shortNames": list(job_mod.SHORT_NAMES),
                "categories": list(job_mod.CATEGORIES),
            },
            "versions": [
                {
                    "name": job_mod.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.sandbox.concurrency",
                            "statusReplicasPath": ".status.sandbox.concurrency",
                            "labelSelectorPath": ".status.sandbox.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


def crd_yaml() -> str:
    """The CRD as YAML, exactly as checked in under ``crds/``."""
    import yaml

    header = (
        "# GENERATED by `agentrl crds --write crds/` from operator/agentrl/api/.\n"
        "# Do not edit: change the models and regenerate (CI fails on drift).\n"
    )
    return header + yaml.safe_dump(crd(), sort_keys=False, width=100, allow_unicode=True)


CRD_FILENAME = f"{job_mod.GROUP}_{job_mod.PLURAL}.yaml"
