"""One SGLang release everywhere: the engine image's base, the constant our flag schema and
client are checked against, and the package in the contract environment."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from agentrl.api import wire
from agentrl.devcluster import sglang_env

DOCKERFILE = Path(__file__).resolve().parents[2] / "images" / "sglang-engine" / "Dockerfile"


def test_the_engine_image_is_based_on_the_pinned_release() -> None:
    base = re.search(r"^ARG SGLANG_BASE=(\S+)$", DOCKERFILE.read_text(), re.MULTILINE)
    assert base is not None, f"{DOCKERFILE} has no ARG SGLANG_BASE=..."
    tag = re.fullmatch(r"lmsysorg/sglang:v(?P<version>[^-]+)-rocm\S+", base.group(1))
    assert tag is not None, base.group(1)
    assert tag.group("version") == wire.SGLANG_VERSION == "0.5.15.post1"


def test_the_contract_environment_holds_that_release(sglang: dict[str, Any]) -> None:
    assert sglang["version"] == wire.SGLANG_VERSION
    assert sglang_env.VENV.name == f"sglang-{wire.SGLANG_VERSION}"
    assert f"sglang=={wire.SGLANG_VERSION}" in sglang_env.VENV.no_deps


def test_agentrl_dev_prepare_makes_the_environment() -> None:
    from agentrl.devcluster import prepare

    (step,) = [s for s in prepare.steps() if s.name == "sglang"]
    assert step.is_done()  # the stamp of this very environment is written
    assert wire.SGLANG_VERSION in step.describe
