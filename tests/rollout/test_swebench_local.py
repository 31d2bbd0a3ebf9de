"""A SWE-bench-shaped instance verified and validated end to end in local sandboxes.

The instance is synthetic but has the shape of a dataset row (``swebench_rows.row`` keys) and
of its image: a git repository at ``base_commit`` whose test fails until the gold patch fixes
the code, and an eval script with the harness's structure (informational git commands, test
files reset to ``base_commit``, the test patch applied from a heredoc, ``pytest -rA`` between
the markers, the reset again, the exit-status record). What differs from a real instance, and
only that: the image is replaced by files and a setup that commits them (with fixed dates, so
``base_commit`` is known in advance); the script has no conda activation (no conda here) and
``cd``\\ s to ``$HOME`` (the local provider's directory, which is the repository) instead of
``/testbed``. The verifier runs the script and grades it through the same code as on a cluster;
the harness's own ``get_eval_report`` grades the same log for comparison.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
from swebench.harness.grading import get_eval_report
from swebench.harness.utils import make_test_spec

from agentrl.rollout.episode import infra_reason
from agentrl.rollout.sandbox_setup import SetupError, prepare_sandbox
from agentrl.rollout.swe_tools import SWEToolRunner
from agentrl.rollout.tasks.model import HarnessVerification, Task
from agentrl.rollout.tasks.swebench import (
    SWEBenchInstance,
    built_eval_script,
    task_from_instance,
    touched_files,
)
from agentrl.rollout.validate import validate_task
from agentrl.rollout.verifier import (
    EVAL_LOG_PATH,
    GradeStatus,
    VerifierError,
    grade_patch,
    verify,
)
from agentrl.sandbox.errors import SandboxCreateError
from agentrl.sandbox.local import LocalProvider
from agentrl.sandbox.provider import SandboxRequest
from tests.rollout.swebench_rows import eval_script

CALC = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"
TESTS = "from calc import add, sub\n\n\ndef test_sub():\n    assert sub(3, 1) == 2\n"
TEST_PATCH = """\
diff --git a/tests/test_calc.py b/tests/test_calc.py
--- a/tests/test_calc.py
+++ b/tests/test_calc.py
@@ -3,3 +3,7 @@ from calc import add, sub

 def test_sub():
     assert sub(3, 1) == 2
+
+
+def test_add():
+    assert add(2, 2) == 4
"""
GOLD_PATCH = """\
diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1,5 +1,5 @@
 def add(a, b):
-    return a - b
+    return a + b


 def sub(a, b):
"""
FILES = {"calc.py": CALC, "tests/test_calc.py": TESTS, "tests/conftest.py": ""}
#: Commits the files with fixed names and dates: the same base commit in every sandbox.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "a",
    "GIT_AUTHOR_EMAIL": "a@example.com",
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z",
    "GIT_COMMITTER_NAME": "a",
    "GIT_COMMITTER_EMAIL": "a@example.com",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z",
}
COMMIT = " ".join(f"{k}={v}" for k, v in GIT_ENV.items()) + (" git commit -q -m base")
SETUP = ["git init -q -b main . && git add -A && " + COMMIT]
TEST_COMMAND = "python -m pytest -rA -p no:cacheprovider tests/test_calc.py"


def base_commit(tmp_path: Path) -> str:
    """The commit the setup makes, made once here."""
    repo = tmp_path / "base"
    for rel, content in FILES.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(content)
    env = {**os.environ, **GIT_ENV}
    subprocess.run(["git", "init", "-q", "-b", "main", "."], cwd=repo, check=True)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-q", "-m", "base"], cwd=repo, check=True, env=env)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True)
    return head.stdout.decode().strip()


def instance(base: str, *, script: str | None = None) -> dict[str, object]:
    return {
        "repo": "example/calc",
        "instance_id": "example__calc-1",
        "base_commit": base,
        "patch": GOLD_PATCH,
        "test_patch": TEST_PATCH,
        "problem_statement": "add() subtracts",
        "hints_text": "",
        "created_at": "2024-01-01T00:00:00Z",
        "version": "0.1",
        "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_add"]),
        "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_sub"]),
        "environment_setup_commit": base,
        "image": "swebench/sweb.eval.x86_64.example_1776_calc-1:latest",
        "log_parser": "parse_log_pytest",
        "eval_type": "pass_and_fail",
        "eval_script": script
        or eval_script(
            base_commit=base,
            test_files=["tests/test_calc.py"],
            test_patch=TEST_PATCH,
            test_command=TEST_COMMAND,
            conda=False,
            repo_dir='"$HOME"',
        ),
    }


def as_local_task(record: dict[str, object]) -> Task:
    """The instance's task, with the image replaced by files and a committing setup."""
    task = task_from_instance(record)
    return task.model_copy(update={"files": FILES, "setup_commands": SETUP})


async def run_verifier(provider: LocalProvider, task: Task, edit: str | None = None) -> tuple:
    async with await provider.create(SandboxRequest(episode_id="e1", workdir=task.workdir)) as box:
        for path, content in task.files.items():
            await box.write_file(path, content)
        for command in task.setup_commands:
            assert (await box.exec(command, timeout=60)).ok
        if edit is not None:
            assert (await box.exec(edit, timeout=60)).ok
        result = await verify(box, task, timeout=120)
        log = (await box.read_file(EVAL_LOG_PATH)).decode()
    return result, log


def harness_resolved(record: dict[str, object], log: str, tmp_path: Path) -> bool:
    spec = make_test_spec(record)
    path = tmp_path / "test_output.txt"
    path.write_text(log)
    pred = {"instance_id": spec.instance_id, "model_patch": "x", "model_name_or_path": "m"}
    return bool(get_eval_report(spec, pred, str(path), True)[spec.instance_id]["resolved"])


@pytest.mark.asyncio
async def test_the_untouched_repository_is_not_resolved_as_the_harness_says(
    tmp_path: Path,
) -> None:
    record = instance(base_commit(tmp_path))
    provider = LocalProvider(base_dir=str(tmp_path / "boxes"))
    result, log = await run_verifier(provider, as_local_task(record))
    assert (result.reward, result.resolution) == (0.0, "RESOLVED_NO")
    assert result.statuses == {
        "tests/test_calc.py::test_sub": "PASSED",
        "tests/test_calc.py::test_add": "FAILED",
    }
    assert result.failing == ["tests/test_calc.py::test_add"]
    assert "+ : '>>>>> Start Test Output'" in log and ">>>>> Test Exit Code: 1" in log
    assert harness_resolved(record, log, tmp_path) is False


@pytest.mark.asyncio
async def test_the_gold_fix_is_resolved_as_the_harness_says(tmp_path: Path) -> None:
    record = instance(base_commit(tmp_path))
    provider = LocalProvider(base_dir=str(tmp_path / "boxes"))
    fix = "sed -i '2s/a - b/a + b/' calc.py"
    result, log = await run_verifier(provider, as_local_task(record), edit=fix)
    assert (result.reward, result.resolution) == (1.0, "RESOLVED_FULL")
    assert ">>>>> Test Exit Code: 0" in log
    assert harness_resolved(record, log, tmp_path) is True


@pytest.mark.asyncio
async def test_tests_an_agent_weakened_are_reset_before_they_run(tmp_path: Path) -> None:
    record = instance(base_commit(tmp_path))
    provider = LocalProvider(base_dir=str(tmp_path / "boxes"))
    cheat = (
        "printf 'def test_sub():\\n    pass\\n\\n\\ndef test_add():\\n    pass\\n' "
        "> tests/test_calc.py"
    )
    result, log = await run_verifier(provider, as_local_task(record), edit=cheat)
    assert result.reward == 0.0
    assert result.statuses["tests/test_calc.py::test_add"] == "FAILED"
    assert harness_resolved(record, log, tmp_path) is False


@pytest.mark.asyncio
async def test_an_environment_fault_in_the_log_is_an_infra_error(tmp_path: Path) -> None:
    script = "#!/bin/bash\nset -uxo pipefail\necho 'fatal: Could not resolve host: github.com'\n"
    record = instance(base_commit(tmp_path), script=script)
    provider = LocalProvider(base_dir=str(tmp_path / "boxes"))
    with pytest.raises(VerifierError, match=r"environment fault \(network_unreachable\)"):
        await run_verifier(provider, as_local_task(record))


@pytest.mark.asyncio
async def test_validation_scores_the_untouched_repository_0_and_the_gold_patch_1(
    tmp_path: Path,
) -> None:
    record = instance(base_commit(tmp_path))
    provider = LocalProvider(base_dir=str(tmp_path / "boxes"))
    report = await validate_task(provider, as_local_task(record), timeout=120)
    assert [(c.variant, c.reward, c.problem) for c in report.checks] == [
        ("untouched", 0.0, None),
        ("reference", 1.0, None),
    ]
    assert report.ok


@pytest.mark.asyncio
async def test_validation_reports_a_gold_patch_that_does_not_fix_the_tests(
    tmp_path: Path,
) -> None:
    record = instance(base_commit(tmp_path))
    wrong = GOLD_PATCH.replace("+    return a + b", "+    return a + b + 1")
    record["patch"] = wrong
    provider = LocalProvider(base_dir=str(tmp_path / "boxes"))
    report = await validate_task(provider, as_local_task(record), timeout=120)
    reference = report.checks[1]
    assert reference.reward == 0.0
    assert reference.problem == ("scored 0, expected 1; failing: tests/test_calc.py::test_add")


# ---------------------------------------------------------------------------------------------
# Grading a submitted patch in a fresh sandbox


class CountingProvider:
    """A local provider that records the sandboxes it leases (and can refuse to lease)."""

    name = "local"

    def __init__(self, inner: LocalProvider, *, fail_from: int | None = None) -> None:
        self.inner = inner
        self.requests: list[SandboxRequest] = []
        self.fail_from = fail_from

    async def create(self, request: SandboxRequest):  # type: ignore[no-untyped-def]
        self.requests.append(request)
        if self.fail_from is not None and len(self.requests) > self.fail_from:
            raise SandboxCreateError("no capacity", provider="local")
        return await self.inner.create(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def agent_patch(provider: LocalProvider, task: Task, *calls: tuple[str, dict]) -> str:
    """The patch the agent's tools capture on submit after ``calls``, in the agent's sandbox."""
    request = SandboxRequest(episode_id="agent", workdir=task.workdir)
    async with await provider.create(request) as box:
        await prepare_sandbox(box, task, timeout=60)
        tools = SWEToolRunner(box, task, timeout_seconds=60, output_max_bytes=10_000)
        for name, args in calls:
            await tools.call(name, args)
        submitted = await tools.call("submit", {})
    assert submitted.submitted and submitted.patch is not None
    return submitted.patch


FIX = (
    "str_replace_editor",
    {
        "command": "str_replace",
        "path": "calc.py",
        "old_str": "    return a - b\n\n\n",
        "new_str": "    return a + b\n\n\n",
    },
)


@pytest.mark.asyncio
async def test_the_agents_patch_is_resolved_in_a_fresh_sandbox(tmp_path: Path) -> None:
    task = as_local_task(instance(base_commit(tmp_path)))
    local = LocalProvider(base_dir=str(tmp_path / "boxes"))
    patch = await agent_patch(local, task, FIX)
    assert touched_files(patch) == ["calc.py"]
    provider = CountingProvider(local)
    result = await grade_patch(provider, task, patch, timeout=120, episode_id="e1")
    assert (result.grade_status, result.reward, result.resolution) == (
        GradeStatus.RESOLVED,
        1.0,
        "RESOLVED_FULL",
    )
    # one lease, its own: the agent's sandbox is not the one graded
    assert [r.episode_id for r in provider.requests] == ["e1-grade"]


@pytest.mark.asyncio
async def test_a_patch_that_edits_the_tests_instead_of_the_code_is_not_resolved(
    tmp_path: Path,
) -> None:
    task = as_local_task(instance(base_commit(tmp_path)))
    local = LocalProvider(base_dir=str(tmp_path / "boxes"))
    weakened = "def test_sub():\n    pass\n\n\ndef test_add():\n    pass\n"
    cheat = (
        "bash",
        {"command": f"printf '%s' {shlex.quote(weakened)} > tests/test_calc.py"},
    )
    patch = await agent_patch(local, task, cheat)
    assert touched_files(patch) == ["tests/test_calc.py"]
    result = await grade_patch(local, task, patch, timeout=120, episode_id="e1")
    assert (result.grade_status, result.reward) == (GradeStatus.UNRESOLVED, 0.0)
    # the eval script put the test file back and applied the test patch: test_add ran, failed
    assert result.statuses["tests/test_calc.py::test_add"] == "FAILED"


@pytest.mark.asyncio
async def test_a_patch_that_does_not_apply_is_reward_0_not_an_infra_error(
    tmp_path: Path,
) -> None:
    task = as_local_task(instance(base_commit(tmp_path)))
    local = LocalProvider(base_dir=str(tmp_path / "boxes"))
    # written against a file the base commit does not have: no command (not even patch's
    # fuzz) can apply it
    stale = GOLD_PATCH.replace("calc.py", "calculator.py")
    result = await grade_patch(local, task, stale, timeout=120, episode_id="e1")
    assert (result.grade_status, result.reward) == (GradeStatus.PATCH_FAILED, 0.0)
    assert "patch" in result.output_tail


@pytest.mark.asyncio
async def test_an_empty_patch_is_reward_0_without_a_sandbox(tmp_path: Path) -> None:
    task = as_local_task(instance(base_commit(tmp_path)))
    provider = CountingProvider(LocalProvider(base_dir=str(tmp_path / "boxes")))
    result = await grade_patch(provider, task, "\n", timeout=120, episode_id="e1")
    assert (result.grade_status, result.reward, provider.requests) == (
        GradeStatus.EMPTY_PATCH,
        0.0,
        [],
    )


@pytest.mark.asyncio
async def test_a_grading_sandbox_that_fails_to_start_is_an_infra_error(tmp_path: Path) -> None:
    task = as_local_task(instance(base_commit(tmp_path)))
    provider = CountingProvider(LocalProvider(base_dir=str(tmp_path / "boxes")), fail_from=0)
    with pytest.raises(SandboxCreateError) as caught:
        await grade_patch(provider, task, GOLD_PATCH, timeout=120, episode_id="e1")
    assert infra_reason(caught.value) == "sandbox_create"


@pytest.mark.asyncio
async def test_a_grading_sandbox_whose_setup_fails_is_an_infra_error(tmp_path: Path) -> None:
    task = as_local_task(instance(base_commit(tmp_path)))
    broken = task.model_copy(update={"setup_commands": ["exit 3"]})
    local = LocalProvider(base_dir=str(tmp_path / "boxes"))
    with pytest.raises(SetupError) as caught:
        await grade_patch(local, broken, GOLD_PATCH, timeout=120, episode_id="e1")
    assert infra_reason(caught.value) == "setup"


# ---------------------------------------------------------------------------------------------
# A row without an eval script (SWE-Gym, exports from before 5.x)

#: A conftest at the root puts the repository on pytest's path (as installing the package in
#: the image's environment does).
PLAIN_FILES = {**FILES, "conftest.py": ""}


def plain_row(base: str) -> dict[str, object]:
    """The instance as SWE-Gym or a pre-5.x export holds it: no image, eval_script,
    log_parser or eval_type."""
    record = instance(base)
    for key in ("image", "eval_script", "log_parser", "eval_type"):
        del record[key]
    return record


def base_commit_of(tmp_path: Path, files: dict[str, str]) -> str:
    repo = tmp_path / "plain-base"
    for rel, content in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(content)
    env = {**os.environ, **GIT_ENV}
    subprocess.run(["git", "init", "-q", "-b", "main", "."], cwd=repo, check=True)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-q", "-m", "base"], cwd=repo, check=True, env=env)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True)
    return head.stdout.decode().strip()


@pytest.mark.asyncio
async def test_a_row_without_an_eval_script_is_graded_as_the_harness_grades_its_built_script(
    tmp_path: Path,
) -> None:
    record = plain_row(base_commit_of(tmp_path, PLAIN_FILES))
    task = task_from_instance(record).model_copy(
        update={"files": PLAIN_FILES, "setup_commands": SETUP}
    )
    verification = task.verification
    assert isinstance(verification, HarnessVerification)
    assert verification.log_parser == "parse_log_pytest"
    # what swebench's make_test_spec makes of the row with the built script is what runs
    built = {
        **record,
        "image": task.image,
        "eval_script": built_eval_script(SWEBenchInstance.model_validate(record)),
        "log_parser": "parse_log_pytest",
        "eval_type": "pass_and_fail",
    }
    spec = make_test_spec(built)
    assert verification.eval_script == (
        "\n".join(["#!/bin/bash", "set -uxo pipefail", *spec.eval_script_list]) + "\n"
    )
    provider = LocalProvider(base_dir=str(tmp_path / "boxes"))
    untouched, log = await run_verifier(provider, task)
    assert (untouched.reward, untouched.resolution) == (0.0, "RESOLVED_NO")
    assert harness_resolved(built, log, tmp_path) is False
    fixed, log = await run_verifier(provider, task, edit="sed -i '2s/a - b/a + b/' calc.py")
    assert (fixed.reward, fixed.resolution) == (1.0, "RESOLVED_FULL")
    assert harness_resolved(built, log, tmp_path) is True
