"""A model on a PVC: ``spec.model.source.path`` is a path inside the volume (docs/manifest.md),
which pods mount at /models. The shipped examples resolve to the directory they mean in the
engine's ``--model-path``, the trainer's model directory and the pods' mounts, and ``agentrl
validate`` refuses a path that repeats the mount point (it would resolve to /models/models/X)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from agentrl.api.cli import validate
from agentrl.api.engine_flags import launch_args
from agentrl.api.validation import load_job
from agentrl.api.wire import model_path
from agentrl.reconcile.cli import render_objects
from tests.api.cases import BASE

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

#: Example → the directory its pods must read and the claim mounted there, written out by hand.
ON_A_PVC = {
    "mi355x-report.yaml": ("/models/Qwen3-30B-A3B-Instruct-2507", "models"),
    "e2b.yaml": ("/models/Qwen3-30B-A3B-Instruct-2507", "models"),
    "small-cluster.yaml": ("/models/Qwen3-8B", "models"),
    "quickstart-cluster-hf.yaml": ("/models/qwen3-mini", "qwen3-mini-model"),
}


def test_every_example_on_a_pvc_is_listed_here() -> None:
    on_pvc = {
        p.name for p in EXAMPLES.glob("*.yaml")
        if load_job(p.read_text()).spec.model.source.pvc is not None
    }
    assert on_pvc == set(ON_A_PVC)


@pytest.mark.parametrize(("name", "want", "claim"), [(k, *v) for k, v in sorted(ON_A_PVC.items())])
def test_the_example_resolves_to_the_directory_it_means(name: str, want: str, claim: str) -> None:
    text = (EXAMPLES / name).read_text()
    job = load_job(text)
    args = launch_args(job)
    assert args[args.index("--model-path") + 1] == want  # the engine's SGLang flag
    assert model_path(job) == want  # what the trainer builds its model from
    objects = render_objects(text, source=name)
    for kind, suffix in (("StatefulSet", "-engine"), ("Job", "-trainer"),
                         ("Deployment", "-rollout")):  # the workers read the tokenizer there
        (obj,) = [o for o in objects if o["kind"] == kind
                  and o["metadata"]["name"] == job.metadata.name + suffix]
        pod = obj["spec"]["template"]["spec"]
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"]
                  for v in pod["volumes"] if "persistentVolumeClaim" in v}
        mounts = {m["mountPath"]: m["name"] for c in pod["containers"]
                  for m in c.get("volumeMounts", [])}
        assert claims[mounts["/models"]] == claim, (kind, claims, mounts)


def _with_source(source: dict[str, str]) -> str:
    doc = yaml.safe_load(yaml.safe_dump(BASE))
    doc["spec"]["model"]["source"] = source
    return yaml.safe_dump(doc)


@pytest.mark.parametrize("path", ["/models/Qwen3-8B", "/models"])
def test_validate_refuses_a_path_that_repeats_the_mount_point(tmp_path: Path, path: str) -> None:
    manifest = tmp_path / "job.yaml"
    manifest.write_text(_with_source({"path": path, "pvc": "models"}))
    result = CliRunner().invoke(validate, [str(manifest)])
    assert result.exit_code == 1
    assert f"{manifest}: spec.model.source.path: " in result.output
    assert f"resolves to /models{path}" in result.output
    assert "without the leading /models" in result.output


@pytest.mark.parametrize(
    "source",
    [
        {"path": "Qwen3-8B", "pvc": "models"},
        {"path": "models/Qwen3-8B", "pvc": "models"},  # a models/ directory inside the volume
        {"path": "/models/Qwen3-8B"},  # no PVC: a directory of the image or node
        {"path": "/modelsets/Qwen3-8B", "pvc": "models"},
    ],
)
def test_validate_accepts_a_path_inside_the_volume_or_without_a_pvc(
    tmp_path: Path, source: dict[str, str]
) -> None:
    manifest = tmp_path / "job.yaml"
    manifest.write_text(_with_source(source))
    result = CliRunner().invoke(validate, [str(manifest)])
    assert result.exit_code == 0, result.output

