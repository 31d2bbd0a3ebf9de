"""The verifier reads test logs per test and reward files, and tells a crash from a failure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.rollout.sandbox_setup import prepare_sandbox
from agentrl.rollout.tasks.model import NamedTestsVerification
from agentrl.rollout.tasks.toy import generate_toy_tasks
from agentrl.rollout.verifier import (
    VerifierError,
    missing_runner,
    parse_django_log,
    parse_pytest_log,
    parse_reward,
    score_tests,
    verify,
)
from agentrl.sandbox.local import LocalProvider
from agentrl.sandbox.provider import ExecResult, SandboxRequest

TASKS = generate_toy_tasks(seed=0)

PYTEST_LOG = """\
============================= test session starts ==============================
collected 3 items

tests/test_a.py .F.                                                      [100%]
=========================== short test summary info ============================
PASSED tests/test_a.py::test_one
PASSED tests/test_a.py::test_three[x-1]
FAILED tests/test_a.py::test_two - AssertionError: expected 3, got 2
ERROR tests/test_b.py::test_setup - ImportError
"""

DJANGO_LOG = """\
test_add (arith.tests.AddTests) ... ok
test_sub (arith.tests.SubTests) ... FAIL
test_skip (arith.tests.SkipTests) ... skipped 'no db'
"""


def test_pytest_summary_lines_give_each_tests_status() -> None:
    assert parse_pytest_log(PYTEST_LOG) == {
        "tests/test_a.py::test_one": "PASSED",
        "tests/test_a.py::test_three[x-1]": "PASSED",
        "tests/test_a.py::test_two": "FAILED",
        "tests/test_b.py::test_setup": "ERROR",
    }


def test_django_verbose_lines_give_each_tests_status() -> None:
    assert parse_django_log(DJANGO_LOG) == {
        "test_add (arith.tests.AddTests)": "PASSED",
        "test_sub (arith.tests.SubTests)": "FAILED",
        "test_skip (arith.tests.SkipTests)": "SKIPPED",
    }


@pytest.mark.parametrize(
    ("f2p", "p2p", "reward", "failing"),
    [
        (["tests/test_a.py::test_one"], ["tests/test_a.py::test_three[x-1]"], 1.0, []),
        (["tests/test_a.py::test_two"], [], 0.0, ["tests/test_a.py::test_two"]),
        # A test the log never mentions did not pass.
        (["tests/test_a.py::test_one"], ["tests/test_c.py::gone"], 0.0, ["tests/test_c.py::gone"]),
    ],
)
def test_reward_is_one_only_when_every_required_test_passed(
    f2p: list[str], p2p: list[str], reward: float, failing: list[str]
) -> None:
    verification = NamedTestsVerification(fail_to_pass=f2p, pass_to_pass=p2p)
    assert score_tests(verification, parse_pytest_log(PYTEST_LOG)) == (reward, failing)


def test_reward_files_hold_a_number_or_a_reward_json() -> None:
    assert parse_reward("1\n", "/logs/verifier/reward.txt") == 1.0
    assert parse_reward('{"reward": 0.5, "x": 1}', "/logs/verifier/reward.json") == 0.5


@pytest.mark.parametrize(
    ("text", "path"),
    [("", "r.txt"), ("pass", "r.txt"), ("{", "r.json"), ('{"score": 1}', "r.json")],
)
def test_an_unreadable_reward_file_is_a_verifier_error(text: str, path: str) -> None:
    with pytest.raises(VerifierError):
        parse_reward(text, path)


@pytest.mark.slow
async def test_an_image_without_the_test_runner_is_an_infra_error_not_a_reward(
    tmp_path: Path,
) -> None:
    """What ``python:3.11-slim`` (the default ``spec.sandbox.image``) does with the toy tasks:
    its Python has no pytest. Here a real Python without pytest (a venv made without packages)
    runs the task's own test command in a real local sandbox; the verifier must raise, so the
    episode is an infra error and never a reward of 0."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    task = TASKS[0]
    command = task.verification.test_command.replace("python", str(bare / "bin" / "python"), 1)
    assert f" {bare}/bin/python -m pytest " in command
    verification = task.verification.model_copy(update={"test_command": command})
    provider = LocalProvider(base_dir=str(tmp_path / "sandboxes"))
    sandbox = await provider.create(SandboxRequest(episode_id="no-runner"))
    try:
        await prepare_sandbox(sandbox, task, timeout=60)
        with pytest.raises(VerifierError, match=r"No module named pytest.*spec\.sandbox\.image"):
            await verify(
                sandbox, task.model_copy(update={"verification": verification}), timeout=60
            )
        # the same sandbox with a Python that has pytest: a plain failing run, reward 0
        result = await verify(sandbox, task, timeout=60)
        assert result.reward == 0.0 and result.statuses
    finally:
        await sandbox.close()
        await provider.aclose()


def test_a_missing_command_is_told_from_failing_tests() -> None:
    # bash's own words for a command it cannot find, and pytest's for failing tests
    gone = ExecResult(exit_code=127, stderr="bash: line 1: pytest: command not found\n")
    assert missing_runner("pytest -rA", gone) == (
        "exit code 127: bash: line 1: pytest: command not found"
    )
    failed = ExecResult(exit_code=1, stdout=PYTEST_LOG)
    assert missing_runner("python -m pytest -rA", failed) is None
    collection = ExecResult(
        exit_code=2, stdout="ERROR collecting tests/test_a.py\nE   No module named 'numpy'\n"
    )
    assert missing_runner("python -m pytest -rA", collection) is None
