"""Ask the real API server what a ServiceAccount may do: many questions in one round trip with
SubjectAccessReviews (the API behind ``kubectl auth can-i``), single ones with the real
``kubectl auth can-i --as``. Used by the chart tests on the cluster."""

from __future__ import annotations

import json
from typing import Any

from agentrl.devcluster.testing import Kubectl


def service_account_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def review(admin: Kubectl, user: str, triples: set[tuple[str, str, str]],
           namespace: str | None) -> dict[str, list[str]]:
    """The API server's answers for ``user`` on each (group, resource, verb) triple, as
    {"allowed": [...], "denied": [...]} of "verb resource.group" strings. ``namespace`` None
    asks cluster-wide."""
    ordered = sorted(triples)
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{user.split(':')[2]}",
              "system:authenticated"]
    items = []
    for group, resource, verb in ordered:
        name, _, sub = resource.partition("/")
        attributes = {"group": group, "resource": name, "verb": verb}
        if sub:
            attributes["subresource"] = sub
        if namespace:
            attributes["namespace"] = namespace
        items.append({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": groups, "resourceAttributes": attributes},
        })
    out = admin.run("create", "-o", "json", "-f", "-", stdin=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": items})).stdout
    results = _json_stream(out)
    assert len(results) == len(ordered)
    answers: dict[str, list[str]] = {"allowed": [], "denied": []}
    for (group, resource, verb), result in zip(ordered, results, strict=True):
        key = "allowed" if result["status"].get("allowed") else "denied"
        answers[key].append(f"{verb} {resource}.{group}")
    return answers


def _json_stream(text: str) -> list[Any]:
    """kubectl prints one JSON document per created object, back to back."""
    decoder = json.JSONDecoder()
    docs, pos = [], 0
    while pos < len(text.rstrip()):
        while text[pos].isspace():
            pos += 1
        doc, pos = decoder.raw_decode(text, pos)
        docs.append(doc)
    return docs


def can_i(admin: Kubectl, user: str, verb: str, resource: str,
          namespace: str | None = None) -> bool:
    """``kubectl auth can-i VERB RESOURCE [--subresource SUB] --as USER`` (exit 0 yes, 1 no).
    ``resource`` may be "pods/exec" (kubectl itself would read "/exec" as an object name)."""
    name, _, sub = resource.partition("/")
    args = ["auth", "can-i", verb, name, "--as", user]
    args += ["--subresource", sub] if sub else []
    args += ["--namespace", namespace] if namespace else ["--all-namespaces"]
    proc = admin.run(*args, check=False)
    answer = proc.stdout.strip()
    assert answer in ("yes", "no"), proc.stderr
    return answer == "yes"
