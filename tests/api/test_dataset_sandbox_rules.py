"""SWE-bench and SWE-smith instances run in their own images, which local sandboxes cannot
start: that combination is refused at apply time, naming spec.sandbox.provider, both by
``agentrl validate`` and by the real API server (the CRD's CEL rule)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from agentrl.api import validation
from agentrl.devcluster.testing import Kubectl
from tests.api.cases import BASE, merge

E2B = {"provider": "e2b", "e2b": {"apiKeySecretRef": {"name": "e2b"}}}


def _manifest(format_: str, sandbox: dict[str, Any]) -> dict[str, Any]:
    dataset: dict[str, Any] = {"format": format_}
    if format_ != "toy":
        dataset["path"] = "/data/tasks.jsonl"
    patch: dict[str, Any] = {"dataset": dataset, "sandbox": sandbox}
    if sandbox.get("provider") == "local":
        patch["trainer"] = {"backend": "torch", "gpusPerNode": 1}
    return merge(BASE, {"spec": patch})


def _message(format_: str) -> str:
    return (
        f"dataset.format {format_} runs every instance in its own image (the repository in "
        "/testbed, its conda environment) and sandbox.provider local runs no images: use "
        "provider kubernetes (or e2b with templates built from the images)"
    )


REFUSED = [
    ("swebench", {"provider": "local"}),
    ("swesmith", {"provider": "local"}),
]
ACCEPTED = [
    ("swebench", {"provider": "kubernetes"}),
    ("swesmith", {"provider": "kubernetes"}),
    ("swebench", E2B),
    ("toy", {"provider": "local"}),
    ("harbor", {"provider": "local"}),
]


@pytest.mark.parametrize(("format_", "sandbox"), REFUSED)
def test_swe_datasets_on_local_sandboxes_are_refused(format_: str, sandbox: dict[str, Any]) -> None:
    _, errors = validation.validate_text(yaml.safe_dump(_manifest(format_, sandbox)))
    assert [(e.path, e.message) for e in errors] == [("spec.sandbox.provider", _message(format_))]


@pytest.mark.parametrize(("format_", "sandbox"), ACCEPTED)
def test_the_other_combinations_are_accepted(format_: str, sandbox: dict[str, Any]) -> None:
    _, errors = validation.validate_text(yaml.safe_dump(_manifest(format_, sandbox)))
    assert errors == []


@pytest.mark.apiserver
@pytest.mark.usefixtures("crd_installed")
@pytest.mark.parametrize(("format_", "sandbox"), REFUSED + ACCEPTED)
def test_the_api_server_applies_the_same_rule(
    kubectl: Kubectl, format_: str, sandbox: dict[str, Any]
) -> None:
    proc = kubectl.run(
        "create",
        "--dry-run=server",
        "-f",
        "-",
        stdin=yaml.safe_dump(_manifest(format_, sandbox)),
        check=False,
    )
    if (format_, sandbox) in REFUSED:
        assert proc.returncode != 0
        assert "spec.sandbox.provider" in proc.stderr
        assert _message(format_) in " ".join(proc.stderr.split()), proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
