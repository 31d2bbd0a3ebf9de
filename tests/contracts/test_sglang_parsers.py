"""The parser names the API accepts (``agentrl/api/sglang_parsers.json``) are exactly those
the pinned SGLang's argument parser accepts; a bump that changes them fails here with the
difference (regenerate with ``python -m agentrl.devcluster.sglang_env parsers --write``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from tests.factories import make_job

from agentrl.api import AgentRLJob, sglang_parsers


def _choices(sglang: dict[str, Any], flag: str) -> list[str]:
    return next(o["choices"] for o in sglang["options"] if flag in o["strings"])


def test_the_committed_lists_are_the_pinned_releases(sglang: dict[str, Any]) -> None:
    assert sglang["version"] == sglang_parsers.SGLANG_RELEASE
    assert list(sglang_parsers.REASONING_PARSERS) == [*sglang["reasoning_parsers"], "auto"]
    assert list(sglang_parsers.TOOL_CALL_PARSERS) == [*sglang["tool_call_parsers"], "auto"]
    # and the argument parser's choices are those names (plus auto)
    assert sorted(_choices(sglang, "--reasoning-parser")) == sorted(
        sglang_parsers.REASONING_PARSERS
    )
    assert sorted(_choices(sglang, "--tool-call-parser")) == sorted(
        sglang_parsers.TOOL_CALL_PARSERS
    )


@pytest.mark.parametrize(
    ("field", "value"), [("toolCallParser", "qwen9"), ("reasoningParser", "qwen2.5")]
)
def test_an_unknown_parser_name_is_refused_naming_the_field(field: str, value: str) -> None:
    with pytest.raises(ValidationError) as info:
        make_job().with_spec(f"model.{field}", value).obj()
    (error,) = info.value.errors()
    assert error["loc"] == ("spec", "model", field)
    assert "qwen3" in error["msg"]  # the accepted names are listed


def test_agentrl_validate_refuses_it_naming_the_field(tmp_path: Path) -> None:
    manifest = make_job().with_spec("model.toolCallParser", "qwen9").manifest()
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    proc = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0
    assert "toolCallParser" in proc.stdout + proc.stderr


def test_every_listed_name_is_accepted() -> None:
    for name in sglang_parsers.TOOL_CALL_PARSERS:
        job = make_job().with_spec("model.toolCallParser", name).obj()
        assert job.spec.model.tool_call_parser == name
    for name in sglang_parsers.REASONING_PARSERS:
        assert (
            AgentRLJob.model_validate(
                make_job().with_spec("model.reasoningParser", name).manifest()
            ).spec.model.reasoning_parser
            == name
        )


def test_the_crd_lists_the_same_names() -> None:
    crd = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "crds" / "agentrl.dev_agentrljobs.yaml").read_text()
    )
    model = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]["model"]["properties"]
    assert model["toolCallParser"]["enum"] == list(sglang_parsers.TOOL_CALL_PARSERS)
    assert model["reasoningParser"]["enum"] == list(sglang_parsers.REASONING_PARSERS)
