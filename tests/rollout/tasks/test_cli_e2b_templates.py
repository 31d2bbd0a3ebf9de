"""With ``spec.sandbox.provider: e2b``, ``agentrl tasks validate`` and a run's task loading give
each task the template of its image (``spec.sandbox.e2b.templates``) and refuse a dataset
with a task whose image has none, naming the task, its image and the field, before any
sandbox is made."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from agentrl.api.job import AgentRLJobSpec
from agentrl.cli import main
from agentrl.rollout.tasks.model import MissingTemplateError, Task
from agentrl.trainer.assembly import TaskSplit
from tests.rollout.swebench_rows import row

IMAGE_A = "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"
IMAGE_B = "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"


def dataset(tmp_path: Path) -> Path:
    """Two SWE-bench rows, in the images IMAGE_A and IMAGE_B."""
    rows = [
        row(
            "astropy__astropy-12907",
            "astropy/astropy",
            fail_to_pass=["t.py::t"],
            pass_to_pass=[],
            log_parser="parse_log_pytest",
            test_command="pytest -rA",
            test_file="t.py",
        ),
        row(
            "django__django-11099",
            "django/django",
            fail_to_pass=["t"],
            pass_to_pass=[],
            log_parser="parse_log_django",
            test_command="./tests/runtests.py",
            test_file="tests/x/tests.py",
        ),
    ]
    path = tmp_path / "swe.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def sandbox(templates: dict[str, str]) -> dict[str, Any]:
    return {
        "provider": "e2b",
        "e2b": {"apiKeySecretRef": {"name": "e2b"}, "template": "base", "templates": templates},
    }


def manifest(tmp_path: Path, templates: dict[str, str]) -> Path:
    path = tmp_path / "job.yaml"
    doc = {
        "apiVersion": "agentrl.dev/v1alpha1",
        "kind": "AgentRLJob",
        "metadata": {"name": "swe-e2b"},
        "spec": {
            "model": {"source": {"path": "tiny"}},
            "dataset": {"format": "swebench", "path": str(tmp_path / "swe.jsonl")},
            "sandbox": sandbox(templates),
        },
    }
    path.write_text(yaml.safe_dump(doc))
    return path


class _Sandboxes:
    async def aclose(self) -> None:
        return None


@pytest.fixture
def validated(monkeypatch: pytest.MonkeyPatch) -> list[Task]:
    """The tasks ``validate`` hands to the validation (which, and the provider, are stubbed:
    E2B needs its API)."""
    seen: list[Task] = []

    async def validate_dataset(_sandboxes: object, items: list[Task], **_: object) -> list:  # type: ignore[type-arg]
        seen.extend(items)
        return []

    monkeypatch.setattr("agentrl.rollout.validate.validate_dataset", validate_dataset)
    monkeypatch.setattr("agentrl.sandbox.open_provider", lambda *a, **k: _Sandboxes())
    return seen


def test_validate_on_e2b_refuses_a_task_whose_image_has_no_template(
    tmp_path: Path, validated: list[Task]
) -> None:
    path = dataset(tmp_path)
    job = manifest(tmp_path, {IMAGE_A: "astropy-12907"})
    result = CliRunner().invoke(
        main, ["tasks", "validate", str(path), "--provider", "e2b", "--manifest", str(job)]
    )
    assert result.exit_code == 1
    message = " ".join(result.output.split())
    assert f"django__django-11099 ({IMAGE_B})" in message
    assert "spec.sandbox.e2b.templates" in message
    assert "astropy__astropy-12907" not in message
    assert validated == []  # refused before any sandbox


def test_validate_on_e2b_runs_each_task_in_its_images_template(
    tmp_path: Path, validated: list[Task]
) -> None:
    path = dataset(tmp_path)
    job = manifest(tmp_path, {IMAGE_A: "astropy-12907", IMAGE_B: "django-11099"})
    result = CliRunner().invoke(
        main, ["tasks", "validate", str(path), "--provider", "e2b", "--manifest", str(job)]
    )
    assert result.exit_code == 0, result.output
    assert [(t.id, t.template) for t in validated] == [
        ("astropy__astropy-12907", "astropy-12907"),
        ("django__django-11099", "django-11099"),
    ]


def run_spec(tmp_path: Path, provider: dict[str, Any]) -> AgentRLJobSpec:
    return AgentRLJobSpec.model_validate(
        {
            "model": {"source": {"path": "tiny"}},
            "dataset": {"format": "swebench", "path": str(dataset(tmp_path))},
            "sandbox": provider,
            "trainer": {"backend": "torch", "gpusPerNode": 0},
        }
    )


def test_a_run_on_e2b_loads_each_task_with_its_images_template(tmp_path: Path) -> None:
    spec = run_spec(tmp_path, sandbox({IMAGE_A: "astropy-12907", IMAGE_B: "django-11099"}))
    templates = {t.id: t.template for t in TaskSplit.of(spec).all}
    assert templates == {
        "astropy__astropy-12907": "astropy-12907",
        "django__django-11099": "django-11099",
    }


def test_a_run_on_e2b_is_refused_when_a_tasks_image_has_no_template(tmp_path: Path) -> None:
    spec = run_spec(tmp_path, sandbox({IMAGE_B: "django-11099"}))
    with pytest.raises(MissingTemplateError, match=r"astropy__astropy-12907 \(swebench/"):
        TaskSplit.of(spec)


def test_a_run_elsewhere_keeps_the_tasks_as_they_are(tmp_path: Path) -> None:
    spec = run_spec(tmp_path, {"provider": "kubernetes"})
    assert {t.template for t in TaskSplit.of(spec).all} == {None}
