"""The premise of the SWE sandbox profile, checked on this machine's kernel: a root process
with every capability dropped and no privilege escalation (the pod's ``runAsUser: 0``,
``capabilities: {drop: [ALL]}``, ``allowPrivilegeEscalation: false``, here ``setpriv
--bounding-set=-all --inh-caps=-all --no-new-privs``) can do everything a SWE-bench eval script
and an agent do in a root-owned ``/testbed`` (edit the code, reset and patch the tests, run
them), while the toy profile's uid 1000 cannot even edit the code there."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.rollout import grading
from agentrl.rollout.tasks.swebench import task_from_instance
from tests.rollout.swebench_rows import eval_script
from tests.rollout.test_swebench_local import FILES, GIT_ENV, TEST_COMMAND, TEST_PATCH, instance

NO_CAPS = ["--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]


def _as(uid: int, command: str, cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *NO_CAPS]
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "PYTHONDONTWRITEBYTECODE": "1",
        "LANG": "C.UTF-8",
    }
    return subprocess.run(
        [*argv, "bash", "-c", command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def testbed() -> Iterator[tuple[Path, str, Path]]:
    """A root-owned repository (0755 directories, 0644 files) at its base commit, in a
    directory every user may enter (pytest's tmp_path is 0700 for its owner)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.fail("this test needs root and setpriv (util-linux), as the dev machine has")
    tmp_path = Path(tempfile.mkdtemp(prefix="agentrl-testbed-"))
    tmp_path.chmod(0o755)
    try:
        yield _make_testbed(tmp_path)
    finally:
        shutil.rmtree(tmp_path)


def _make_testbed(tmp_path: Path) -> tuple[Path, str, Path]:
    repo = tmp_path / "testbed"
    for rel, content in FILES.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(content)
    env = {**os.environ, **GIT_ENV}
    for args in (["init", "-q", "-b", "main", "."], ["add", "-A"], ["commit", "-q", "-m", "b"]):
        subprocess.run(["git", *args], cwd=repo, check=True, env=env)
    base = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True, text=True
    ).stdout.strip()
    home = tmp_path / "home"
    home.mkdir(mode=0o777)
    home.chmod(0o777)  # any user's git config and caches
    return repo, base, home


def test_root_without_capabilities_runs_the_eval_script_in_a_root_owned_testbed(
    testbed: tuple[Path, str, Path],
) -> None:
    repo, base, home = testbed
    caps = _as(0, "grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status", repo, home)
    assert caps.stdout.split() == ["CapEff:", "0" * 16, "CapBnd:", "0" * 16, "NoNewPrivs:", "1"]

    # the agent's fix, then the harness's script (reset, test patch, pytest) as that user
    fix = _as(0, "sed -i '2s/a - b/a + b/' calc.py", repo, home)
    assert fix.returncode == 0, fix.stderr
    script = eval_script(
        base_commit=base,
        test_files=["tests/test_calc.py"],
        test_patch=TEST_PATCH,
        test_command=TEST_COMMAND,
        conda=False,
        repo_dir=str(repo),
    )
    task = task_from_instance(instance(base, script=script))
    (home / "eval.sh").write_text(task.verification.eval_script)  # type: ignore[union-attr]
    run = _as(0, f"bash {home / 'eval.sh'} 2>&1", repo, home)
    verdict = grading.grade(
        run.stdout,
        harness=grading.Harness.SWEBENCH,
        log_parser="parse_log_pytest",
        eval_type=grading.EvalType.PASS_AND_FAIL,
        fail_to_pass=["tests/test_calc.py::test_add"],
        pass_to_pass=["tests/test_calc.py::test_sub"],
    )
    assert "Applied patch tests/test_calc.py cleanly." in run.stdout
    assert verdict.statuses == {
        "tests/test_calc.py::test_sub": "PASSED",
        "tests/test_calc.py::test_add": "PASSED",
    }
    assert verdict.resolved


def test_the_toy_profiles_uid_cannot_edit_a_root_owned_testbed(
    testbed: tuple[Path, str, Path],
) -> None:
    repo, _, home = testbed
    assert _as(1000, "cat calc.py", repo, home).returncode == 0  # it can read, not write
    fix = _as(1000, "sed -i '2s/a - b/a + b/' calc.py", repo, home)
    assert fix.returncode != 0
    assert "Permission denied" in fix.stderr
    assert "return a - b" in (repo / "calc.py").read_text().splitlines()[1]
