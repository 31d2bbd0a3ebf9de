"""``agentrl engine launch`` checks its flags with the installed SGLang's parser before exec:
run here in the pinned environment (agentrl from this checkout on ``PYTHONPATH``, SGLang
installed), as the engine image runs it, with ``--dry-run`` in place of the exec."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml
from tests.factories import make_job

from agentrl.devcluster import sglang_env

SOURCE_ROOT = Path(__file__).resolve().parents[2] / "operator"

_LAUNCH = "import sys; from agentrl.engine.cli import engine; engine(sys.argv[1:])"


def _launch(*args: str) -> subprocess.CompletedProcess[str]:
    assert sglang_env.VENV.is_done(), "the sglang environment is missing: run agentrl dev prepare"
    env = {**os.environ, "PYTHONPATH": str(SOURCE_ROOT)}
    return subprocess.run(
        [str(sglang_env.VENV.python), "-c", _LAUNCH, "launch", "--dry-run", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def _spec(tmp_path: Path, **inference: object) -> Path:
    job = make_job()
    for key, value in inference.items():
        job = job.with_spec(f"inference.{key}", value)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job.manifest()))
    return path


def test_flags_sglang_accepts_are_launched(tmp_path: Path) -> None:
    proc = _launch("--spec", str(_spec(tmp_path, extraArgs=["--enable-memory-saver"])))
    assert proc.returncode == 0, proc.stderr
    command = proc.stdout.splitlines()[-1]
    assert command.startswith("python3 -m sglang.launch_server --model-path /models/policy")
    assert "--cuda-graph-max-bs-decode 64" in command
    assert command.endswith("--enable-memory-saver")


def test_a_flag_sglang_refuses_stops_the_launch_naming_its_spec_field(tmp_path: Path) -> None:
    proc = _launch("--spec", str(_spec(tmp_path, extraArgs=["--page-size", "16", "--hip-turbo"])))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    message = proc.stderr
    assert "SGLang 0.5.15.post1 refuses the engine flags" in message
    assert "unrecognized arguments: --hip-turbo" in message
    assert "'--hip-turbo', from spec.inference.extraArgs[2]" in message
    assert "sglang.launch_server" not in proc.stdout  # nothing would have been exec'ed


def test_pod_arguments_sglang_refuses_are_named_by_position() -> None:
    """Arguments given to the launcher itself (the pod's args) that the release refuses: an
    ambiguous prefix (``--cuda-graph-max`` is three options in 0.5.15)."""
    proc = _launch("--spec", "/nonexistent/job.yaml", "--model-path", "/m", "--cuda-graph-max", "8")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "ambiguous option: --cuda-graph-max could match" in proc.stderr
    assert "'--cuda-graph-max', from the engine arguments[2]" in proc.stderr
