"""The images as built (cpu flavour, by ``agentrl dev prepare``), run without a cluster.

Each test starts a buildah working container of the image its OCI archive was written from
(the stamp's image id) and runs commands in it with ``buildah run``: as the image's own user
unless a test says otherwise, with no network. What is expected comes from the Dockerfiles
(parsed), the project's metadata and the pods the operator renders, never from the images.
"""

from __future__ import annotations

import json
import re
import tarfile
import tomllib
from collections.abc import Iterator
from typing import IO

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from tests.images.dockerfiles import IMAGES, REPO, parse

from agentrl.devcluster import images as builder

pytestmark = pytest.mark.timeout(600)

AGENTRL_IMAGES = ["operator", "rocm-trainer", "sglang-engine"]
TORCH_IMAGES = ["rocm-trainer", "sglang-engine"]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _container(name: str) -> Iterator[builder.Container]:
    try:
        builder.stamp_of(name)
    except builder.ImageError as exc:
        pytest.fail(str(exc))
    with builder.container(name) as ctr:
        yield ctr


@pytest.fixture(scope="module")
def operator_ctr() -> Iterator[builder.Container]:
    yield from _container("operator")


@pytest.fixture(scope="module")
def trainer_ctr() -> Iterator[builder.Container]:
    yield from _container("rocm-trainer")


@pytest.fixture(scope="module")
def engine_ctr() -> Iterator[builder.Container]:
    yield from _container("sglang-engine")


@pytest.fixture(scope="module")
def sandbox_ctr() -> Iterator[builder.Container]:
    yield from _container("sandbox")


@pytest.fixture
def ctr(request: pytest.FixtureRequest) -> builder.Container:
    fixture = {
        "operator": "operator_ctr",
        "rocm-trainer": "trainer_ctr",
        "sglang-engine": "engine_ctr",
        "sandbox": "sandbox_ctr",
    }[request.param]
    value = request.getfixturevalue(fixture)
    assert isinstance(value, builder.Container)
    return value


def _ok(ctr: builder.Container, argv: list[str], **kwargs: str) -> str:
    proc = ctr.run(argv, **kwargs)
    assert proc.returncode == 0, f"{argv} in {ctr.image.ref}: {proc.returncode}\n{proc.stderr}"
    return proc.stdout


def _declared_user(name: str) -> str:
    return parse(IMAGES / name / "Dockerfile").last("USER") or ""


ALL = pytest.mark.parametrize("ctr", list(builder.IMAGES), indirect=True)
WITH_AGENTRL = pytest.mark.parametrize("ctr", AGENTRL_IMAGES, indirect=True)


@ALL
def test_the_archive_holds_the_image_that_is_run(ctr: builder.Container) -> None:
    stamp = builder.stamp_of(ctr.image.name)
    assert stamp["ref"] == ctr.image.ref
    assert ctr.image.archive.stat().st_size == stamp["archive_bytes"]
    # the archive's own config is the image that runs
    with tarfile.open(ctr.image.archive) as archive:
        index = json.load(_member(archive, "index.json"))
        (entry,) = index["manifests"]
        assert entry["annotations"]["org.opencontainers.image.ref.name"] == ctr.image.ref
        manifest = json.load(_member(archive, "blobs/sha256/" + entry["digest"].split(":")[1]))
    assert manifest["config"]["digest"] == f"sha256:{stamp['image_id']}"
    assert builder.in_storage(ctr.image)


def _member(archive: tarfile.TarFile, name: str) -> IO[bytes]:
    member = archive.extractfile(name)
    assert member is not None, name
    return member


@ALL
def test_the_config_has_the_dockerfiles_user_entrypoint_and_labels(
    ctr: builder.Container,
) -> None:
    parsed = parse(IMAGES / ctr.image.name / "Dockerfile")
    config = ctr.config()
    assert config.get("User") == _declared_user(ctr.image.name)
    if ctr.image.name in AGENTRL_IMAGES:
        assert config.get("Entrypoint") == parsed.entrypoint()
    else:
        assert not config.get("Entrypoint")
    labels = config.get("Labels")
    assert isinstance(labels, dict)
    assert labels["org.opencontainers.image.version"] == PROJECT["version"]
    for key in ("title", "description", "source", "licenses"):
        assert labels[f"org.opencontainers.image.{key}"], key
    assert labels[builder.KEY_LABEL] == builder.stamp_of(ctr.image.name)["key"]


@ALL
def test_processes_run_as_the_declared_uid(ctr: builder.Container) -> None:
    uid, _, gid = _declared_user(ctr.image.name).partition(":")
    assert _ok(ctr, ["id", "-u"]).strip() == uid
    assert _ok(ctr, ["id", "-g"]).strip() == (gid or uid)
    if ctr.image.name == "operator":
        assert uid == "65532"


@ALL
def test_python3_is_the_recorded_version_and_satisfies_requires_python(
    ctr: builder.Container,
) -> None:
    out = _ok(ctr, ["python3", "--version"])
    match = re.fullmatch(r"Python (3\.\d+)\.(\d+)\s*", out)
    assert match, out
    assert match.group(1) == ctr.image.cpu.python
    assert Version(f"{match.group(1)}.{match.group(2)}") in SpecifierSet(PROJECT["requires-python"])


@WITH_AGENTRL
def test_agentrl_imports_and_its_cli_answers_as_the_images_user(ctr: builder.Container) -> None:
    version = _ok(ctr, ["python3", "-c", "import agentrl; print(agentrl.__version__)"])
    assert version.strip() == PROJECT["version"]
    assert "Usage: agentrl" in _ok(ctr, ["agentrl", "--help"])


@WITH_AGENTRL
def test_every_requirement_of_agentrl_is_installed(ctr: builder.Container) -> None:
    # agentrl itself goes in with --no-deps after its dependency layer: pip's own check says
    # whether that layer left anything of its metadata's requirements out
    out = _ok(ctr, ["python3", "-m", "pip", "check"])
    assert "No broken requirements found." in out


@WITH_AGENTRL
def test_the_entrypoint_command_exists_in_the_image(ctr: builder.Container) -> None:
    entrypoint = parse(IMAGES / ctr.image.name / "Dockerfile").entrypoint()
    out = _ok(ctr, [*entrypoint, "--help"])
    assert f"Usage: agentrl {' '.join(entrypoint[1:])}" in out


def test_the_operator_image_is_not_root_and_holds_no_torch(operator_ctr: builder.Container) -> None:
    # no write access to its own install as uid 65532
    proc = operator_ctr.run(["sh", "-c", "touch /opt/venv/x"])
    assert proc.returncode != 0
    proc = operator_ctr.run(["python3", "-c", "import torch"])
    assert proc.returncode != 0 and "No module named 'torch'" in proc.stderr


@pytest.mark.parametrize("ctr", TORCH_IMAGES, indirect=True)
def test_the_torch_images_import_the_shared_torch(ctr: builder.Container) -> None:
    out = _ok(ctr, ["python3", "-c", "import torch; print(torch.__version__, torch.__file__)"])
    version, path = out.split()
    assert Version(version).base_version == builder.TORCH_VERSION
    assert path.startswith("/opt/venv/")  # the torch-cpu layer's, not one agentrl pulled in


def test_the_trainer_image_has_its_extras(trainer_ctr: builder.Container) -> None:
    script = (
        "import megatron.core, ray, transformers, safetensors, numpy; "
        "print(ray.__version__, megatron.core.__version__)"
    )
    out = _ok(trainer_ctr, ["python3", "-c", script])
    assert len(out.split()) == 2


def test_the_engine_image_loads_the_tiny_weights_the_trainer_pushes(
    engine_ctr: builder.Container,
) -> None:
    # what /update_weights_from_disk of `agentrl engine serve-tiny` does with a pushed
    # directory (it answered 500 on the real node: no safetensors in the engine image)
    script = (
        "from agentrl.tiny import policy as tiny; "
        "d = tiny.save_policy(tiny.new_policy(0), '/tmp/pushed'); "
        "print(type(tiny.load_policy(d)).__name__)"
    )
    assert _ok(engine_ctr, ["python3", "-c", script]).strip() == "TinyPolicy"


def test_the_torch_layer_is_shared_by_the_trainer_and_the_engine(
    trainer_ctr: builder.Container, engine_ctr: builder.Container
) -> None:
    torch_info = builder.inspect(builder.TORCH_IMAGE)
    assert torch_info is not None, "the torch-cpu base is missing: run 'agentrl dev prepare'"
    torch_layers = _diff_ids(torch_info)
    for name in TORCH_IMAGES:
        info = builder.inspect(builder.IMAGES[name].ref)
        assert info is not None
        assert _diff_ids(info)[: len(torch_layers)] == torch_layers


def _diff_ids(info: dict[str, object]) -> list[str]:
    oci = info["OCIv1"]
    assert isinstance(oci, dict)
    return list(oci["rootfs"]["diff_ids"])


# --- the sandbox image runs a toy task's tests, as a sandbox pod would ----------------------


def _exec(ctr: builder.Container, argv: list[str]) -> tuple[str, int]:
    """One command as the kubernetes provider sends it: its argv through exec, as the pod's
    uid (the pod's runAsUser), no network."""
    from agentrl.reconcile.sandbox import SANDBOX_UID

    proc = ctr.run(argv, user=f"{SANDBOX_UID}:{SANDBOX_UID}")
    return proc.stdout + proc.stderr, proc.returncode


def test_the_sandbox_image_runs_a_toy_tasks_tests(sandbox_ctr: builder.Container) -> None:
    from agentrl.rollout.tasks.toy import apply_edit, generate_toy_tasks
    from agentrl.rollout.verifier import parse_pytest_log
    from agentrl.sandbox import kube_exec

    task = generate_toy_tasks(seed=0)[0]
    verification = task.verification
    files = {**task.files, **verification.test_files}

    def run_tests(tree: dict[str, str]) -> dict[str, str]:
        _exec(sandbox_ctr, ["/bin/sh", "-c", f"rm -rf {task.workdir}/* {task.workdir}/.[!.]*"])
        for path, content in tree.items():
            for argv in kube_exec.write_commands(f"{task.workdir}/{path}", content.encode()):
                out, code = _exec(sandbox_ctr, argv)
                assert code == 0, out
        argv = kube_exec.timed_command(verification.test_command, 120, task.workdir)
        out, _ = _exec(sandbox_ctr, argv)
        return parse_pytest_log(out)

    buggy = run_tests(files)
    # the planted bug fails its test; the others pass
    assert {t: buggy.get(t) for t in verification.fail_to_pass} == dict.fromkeys(
        verification.fail_to_pass, "FAILED"
    )
    assert {t: buggy.get(t) for t in verification.pass_to_pass} == dict.fromkeys(
        verification.pass_to_pass, "PASSED"
    )
    # the reference fix makes every named test pass
    fix = next(e for e in task.candidate_edits if e.name == task.reference.edit)
    fixed = run_tests(apply_edit(files, fix))
    named = [*verification.fail_to_pass, *verification.pass_to_pass]
    assert {t: fixed.get(t) for t in named} == dict.fromkeys(named, "PASSED")


def test_the_sandbox_image_has_what_the_providers_commands_use(
    sandbox_ctr: builder.Container,
) -> None:
    for tool in ("sh", "timeout", "base64", "mkdir", "cat", "sleep", "python"):
        out, code = _exec(sandbox_ctr, ["/bin/sh", "-c", f"command -v {tool}"])
        assert code == 0, f"{tool} missing: {out}"
    out, code = _exec(sandbox_ctr, ["python", "-m", "pytest", "--version"])
    assert code == 0 and "pytest" in out, out
    # uid 1000 may write its workdir (also when no emptyDir is mounted over it)
    out, code = _exec(sandbox_ctr, ["/bin/sh", "-c", "touch /workspace/x && rm /workspace/x"])
    assert code == 0, out
    # and the image holds none of our code
    out, code = _exec(sandbox_ctr, ["python", "-c", "import agentrl"])
    assert code != 0 and "No module named 'agentrl'" in out
