"""``agentrl engine launch``: the exec, the tee to the log volume, the environment, and the
refusal of graph-disabling flags — run for real, with a stand-in ``python3`` on PATH."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentrl.api.engine_flags import launch_args
from tests.factories import make_job

#: The job the engine tests launch: Qwen3-30B-A3B served as "policy", inference defaults.
QWEN = make_job("swe").with_served_model("/models/qwen3-30b-a3b", "policy").with_inference()

#: Stands in for `python3 -m sglang.launch_server`: reports what it was started with (argv,
#: whether it leads its process group, two env values), prints a fault line, exits 3.
FAKE_PYTHON = """#!{python}
import json, os, sys
print(json.dumps({{"argv": sys.argv[1:], "pgid_is_pid": os.getpgid(0) == os.getpid(),
                  "aiter": os.environ.get("SGLANG_USE_AITER"),
                  "scratch": os.environ.get("HSA_NO_SCRATCH_RECLAIM")}}), flush=True)
print("Fatal Python error: Aborted", file=sys.stderr, flush=True)
sys.exit(3)
"""


@pytest.fixture
def fake_python(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "python3"
    script.write_text(FAKE_PYTHON.format(python=sys.executable))
    script.chmod(0o755)
    return bin_dir


def run_launch(tmp_path: Path, bin_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    agentrl = shutil.which("agentrl")
    assert agentrl
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("SGLANG_USE_AITER", None)
    return subprocess.run(
        [agentrl, "engine", "launch", "--log-file", str(tmp_path / "log" / "engine.log"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def write_spec(tmp_path: Path, **inference: object) -> Path:
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(QWEN.copy().with_inference(**inference).obj().to_manifest()))
    return spec


def test_launch_execs_the_engine_with_the_spec_flags_and_tees_its_log(
    tmp_path: Path, fake_python: Path
) -> None:
    spec = write_spec(tmp_path)
    result = run_launch(tmp_path, fake_python, "--spec", str(spec))
    # exec: the engine's own exit status is the container's.
    assert result.returncode == 3, result.stderr
    report = json.loads(result.stdout.splitlines()[1])  # line 0 is the launcher's banner
    assert report["argv"] == ["-m", "sglang.launch_server", *launch_args(QWEN.obj())]
    assert report["pgid_is_pid"] is True  # the watchdog stops this process group
    assert report["aiter"] == "1"
    assert report["scratch"] == "1"
    log = (tmp_path / "log" / "engine.log").read_text()
    assert "agentrl engine launch: exec python3 -m sglang.launch_server" in log
    assert "Fatal Python error: Aborted" in log  # stderr reaches the shared log too
    assert '"pgid_is_pid": true' in log


def test_launch_runs_the_arguments_the_operator_rendered(tmp_path: Path, fake_python: Path) -> None:
    rendered = ["--model-path", "/m", "--port", "1", "--log-file", "x"]
    result = run_launch(tmp_path, fake_python, "--spec", str(tmp_path / "absent.yaml"), *rendered)
    assert result.returncode == 3, result.stderr
    report = json.loads(result.stdout.splitlines()[1])
    # Everything from the first SGLang flag on is SGLang's, even names the launcher also has.
    assert report["argv"] == ["-m", "sglang.launch_server", *rendered]


def test_launch_refuses_a_spec_whose_extra_args_disable_graphs(
    tmp_path: Path, fake_python: Path
) -> None:
    manifest = QWEN.obj().to_manifest()
    manifest["spec"]["inference"]["extraArgs"] = ["--disable-cuda-graph"]  # type: ignore[index]
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(manifest))
    result = run_launch(tmp_path, fake_python, "--spec", str(spec))
    assert result.returncode == 2
    assert "spec.inference.extraArgs[0]" in result.stderr
    assert not (tmp_path / "log" / "engine.log").exists()  # nothing was started


def test_launch_refuses_graph_disabling_arguments_even_from_the_pod(
    tmp_path: Path, fake_python: Path
) -> None:
    result = run_launch(
        tmp_path, fake_python, "--spec", "/nonexistent", "--model-path", "/m",
        "--disable-cuda-graph",
    )  # fmt: skip
    assert result.returncode == 2
    assert "the engine arguments[2]" in result.stderr


def test_dry_run_prints_the_environment_and_the_command(tmp_path: Path, fake_python: Path) -> None:
    spec = write_spec(tmp_path, contextLength=4096)
    result = run_launch(tmp_path, fake_python, "--spec", str(spec), "--dry-run")
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert "SGLANG_USE_AITER=1" in lines
    assert lines[-1].startswith("python3 -m sglang.launch_server --model-path ")
    assert "--context-length 4096" in lines[-1]
