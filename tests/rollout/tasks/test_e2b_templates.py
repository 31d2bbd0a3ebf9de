"""With E2B, each task image runs in the template ``spec.sandbox.e2b.templates`` maps it to; a
task whose image has none is refused before anything runs."""

from __future__ import annotations

import pytest

from agentrl.api.sandbox import E2BSpec
from agentrl.rollout.tasks.model import (
    MissingTemplateError,
    NamedTestsVerification,
    Task,
    with_e2b_templates,
)

IMAGE_A = "swebench/sweb.eval.x86_64.astropy_1776_astropy-1:latest"
IMAGE_B = "swebench/sweb.eval.x86_64.django_1776_django-2:latest"


def task(task_id: str, image: str | None, template: str | None = None) -> Task:
    return Task(
        id=task_id,
        source="swebench",
        instruction="",
        image=image,
        template=template,
        verification=NamedTestsVerification(fail_to_pass=["t.py::t"]),
    )


def test_the_manifest_maps_images_to_templates() -> None:
    spec = E2BSpec.model_validate(
        {"apiKeySecretRef": {"name": "e2b"}, "templates": {IMAGE_A: "astropy-1"}}
    )
    assert spec.templates == {IMAGE_A: "astropy-1"}
    assert E2BSpec.model_validate({"apiKeySecretRef": {"name": "e2b"}}).templates == {}


def test_each_task_gets_its_images_template() -> None:
    tasks = [task("a", IMAGE_A), task("toy", None), task("own", IMAGE_B, "mine")]
    mapped = with_e2b_templates(tasks, {IMAGE_A: "astropy-1"})
    assert [(t.id, t.template) for t in mapped] == [
        ("a", "astropy-1"),
        ("toy", None),
        ("own", "mine"),
    ]


def test_tasks_whose_image_has_no_template_are_refused_naming_them() -> None:
    tasks = [task("a", IMAGE_A), task("b", IMAGE_B), task("c", IMAGE_B)]
    with pytest.raises(MissingTemplateError) as caught:
        with_e2b_templates(tasks, {IMAGE_A: "astropy-1"})
    assert str(caught.value) == (
        f"2 tasks run in images with no E2B template: b ({IMAGE_B}), c ({IMAGE_B}); add each "
        "image to spec.sandbox.e2b.templates (image: template) or drop its tasks"
    )
