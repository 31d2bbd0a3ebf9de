"""``agentrl render``: the stream the operator applies, and clear errors."""

from __future__ import annotations

from pathlib import Path

import yaml
from click.testing import CliRunner

from agentrl.cli import main
from agentrl.reconcile.children import desired_children
from agentrl.reconcile.context import BuildContext
from tests.factories import make_job


def _write(tmp_path: Path, manifest: dict) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def test_render_prints_the_children_as_a_yaml_stream(tmp_path):
    path = _write(tmp_path, make_job("swe", "rl").with_engines(2).manifest())
    result = CliRunner().invoke(main, ["render", str(path)])
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(result.output))
    assert [d["kind"] for d in docs][:2] == ["ConfigMap", "PersistentVolumeClaim"]
    assert len(docs) == 18
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    assert sts["spec"]["replicas"] == 2
    assert sts["metadata"]["namespace"] == "rl"


def test_render_is_exactly_what_the_operator_builds(tmp_path):
    factory = make_job("swe", "rl").with_engines(3)
    path = _write(tmp_path, factory.manifest())
    result = CliRunner().invoke(main, ["render", str(path), "--uid", "u-1"])
    job = factory.obj()
    expected = desired_children(job, BuildContext.for_job(job, uid="u-1"))
    assert list(yaml.safe_load_all(result.output)) == expected


def test_render_is_deterministic(tmp_path):
    path = _write(tmp_path, make_job("swe").manifest())
    runs = {CliRunner().invoke(main, ["render", str(path)]).output for _ in range(2)}
    assert len(runs) == 1


def test_render_uses_the_namespace_option_when_the_manifest_has_none(tmp_path):
    path = _write(tmp_path, make_job("swe", None).manifest())
    output = CliRunner().invoke(main, ["render", str(path), "-n", "lab"]).output
    assert {d["metadata"]["namespace"] for d in yaml.safe_load_all(output)} == {"lab"}


def test_an_invalid_manifest_exits_1_naming_the_field(tmp_path):
    path = _write(tmp_path, make_job("swe").with_spec("rollout.groupSize", 1).manifest())
    result = CliRunner().invoke(main, ["render", str(path)])
    assert result.exit_code == 1
    assert "spec.rollout.groupSize" in result.output
    assert str(path) in result.output


def test_refused_engine_flags_exit_1_naming_the_field(tmp_path):
    manifest = make_job("swe").with_spec("inference.extraArgs", ["--context-length=9"]).manifest()
    result = CliRunner().invoke(main, ["render", str(_write(tmp_path, manifest))])
    assert result.exit_code == 1
    assert "spec.inference.contextLength" in result.output


def test_a_missing_file_is_reported(tmp_path):
    result = CliRunner().invoke(main, ["render", str(tmp_path / "nope.yaml")])
    assert result.exit_code != 0
    assert "nope.yaml" in result.output
