"""The default image references (``spec.inference.image``, ``spec.trainer.image``, the chart's
``jobDefaults`` and operator image) are exactly what ``make images-rocm`` (images/Makefile)
tags when ``REGISTRY`` is left at its default, so the one build command of docs/images.md
produces the images a job names by default."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

from agentrl.api.engine import InferenceSpec
from agentrl.api.trainer import TrainerSpec

ROOT = Path(__file__).resolve().parents[2]


def _makefile() -> tuple[str, dict[str, str]]:
    """images/Makefile's default REGISTRY and, per target, the image name it tags."""
    text = (ROOT / "images" / "Makefile").read_text()
    (registry,) = re.findall(r"^REGISTRY\s*\?=\s*(\S+)\s*$", text, flags=re.M)
    targets: dict[str, str] = {}
    for target, body in re.findall(r"^(\w+):[^\n]*\n((?:\t[^\n]*\n)+)", text, flags=re.M):
        names = re.findall(r"-t \$\(REGISTRY\)/([\w-]+):\$\(TAG\)", body)
        if names:
            targets[target] = names[0]
    return registry, targets


def test_the_defaults_are_the_names_make_images_rocm_builds() -> None:
    registry, targets = _makefile()
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    engine = f"{registry}/{targets['engine']}:{version}"
    trainer = f"{registry}/{targets['trainer']}:{version}"
    assert InferenceSpec.model_fields["image"].default == engine
    assert TrainerSpec.model_fields["image"].default == trainer
    values = yaml.safe_load((ROOT / "charts" / "agentrl" / "values.yaml").read_text())
    assert values["jobDefaults"]["engineImage"] == engine
    assert values["jobDefaults"]["trainerImage"] == trainer
    assert values["operator"]["image"]["repository"] == f"{registry}/{targets['operator']}"
    chart = yaml.safe_load((ROOT / "charts" / "agentrl" / "Chart.yaml").read_text())
    assert chart["appVersion"] == version  # the operator's tag defaults to it


def test_docs_give_the_build_command_and_where_to_point_jobs() -> None:
    text = (ROOT / "docs" / "images.md").read_text()
    assert "make images-rocm REGISTRY=" in text
    for setting in ("jobDefaults.engineImage", "jobDefaults.trainerImage",
                    "operator.image.repository"):
        assert setting in text
