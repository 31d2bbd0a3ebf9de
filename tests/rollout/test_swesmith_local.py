"""A SWE-smith-shaped instance run end to end in local sandboxes: setup makes the bug branch in
place (bug commit, F2P test files removed), the agent sees a clean tree without the tests that
would point at the bug, and the eval script brings them back and grades the run with
SWE-smith's parser and rules; ``agentrl tasks validate``'s path (untouched 0, reverted bug 1)
goes through the same code.

Differences from a real instance, and only these: the image (a clean snapshot of the repository)
is replaced by files and a committing setup; the eval script ``cd``\\ s to ``$HOME`` (the local
sandbox directory) instead of ``/testbed`` and runs pytest without the conda activation (no
conda here).
"""

from __future__ import annotations

import json
from pathlib import Path

from agentrl.rollout.sandbox_setup import prepare_sandbox
from agentrl.rollout.swe_tools import SWEToolRunner
from agentrl.rollout.tasks.model import HarnessVerification, Task
from agentrl.rollout.tasks.swebench import (
    SWESMITH_PYTHON_TEST_COMMAND,
    TESTBED,
    task_from_instance,
    touched_files,
)
from agentrl.rollout.validate import validate_task
from agentrl.rollout.verifier import GradeStatus, grade_patch, verify
from agentrl.sandbox.local import LocalProvider
from agentrl.sandbox.provider import SandboxRequest
from tests.rollout.test_swebench_local import GIT_ENV

SOURCE = "def clamp(x, low, high):\n    return max(low, min(x, high))\n"
F2P_TESTS = (
    "from shapes import clamp\n\n\n"
    "def test_clamp_high():\n    assert clamp(9, 0, 5) == 5\n\n\n"
    "def test_clamp_low():\n    assert clamp(-1, 0, 5) == 0\n"
)
P2P_TESTS = "from shapes import clamp\n\n\ndef test_inside():\n    assert clamp(3, 0, 5) == 3\n"
#: Plants the bug: min and max swapped.
BUG = """\
diff --git a/shapes.py b/shapes.py
--- a/shapes.py
+++ b/shapes.py
@@ -1,2 +1,2 @@
 def clamp(x, low, high):
-    return max(low, min(x, high))
+    return min(low, max(x, high))
"""
FILES = {"shapes.py": SOURCE, "tests/test_clamp.py": F2P_TESTS, "tests/test_inside.py": P2P_TESTS}
COMMIT = " ".join(f"{k}={v}" for k, v in GIT_ENV.items()) + " git commit -q -m snapshot"
SNAPSHOT = f"git init -q -b main . && git add -A && {COMMIT}"
LOCAL_TEST_COMMAND = "python -m pytest --disable-warnings --color=no --tb=no --verbose"


def local_task() -> Task:
    record = {
        "instance_id": "example__shapes.1a2b3c4d.func_pm_swap__x1",
        "repo": "swesmith/example__shapes.1a2b3c4d",
        "image_name": "swebench/swesmith.x86_64.example_1776_shapes.1a2b3c4d",
        "patch": BUG,
        "problem_statement": "clamp() returns the wrong bound",
        "FAIL_TO_PASS": json.dumps(
            ["tests/test_clamp.py::test_clamp_high", "tests/test_clamp.py::test_clamp_low"]
        ),
        "PASS_TO_PASS": json.dumps(["tests/test_inside.py::test_inside"]),
    }
    task = task_from_instance(record)
    verification = task.verification
    assert isinstance(verification, HarnessVerification)
    script = verification.eval_script.replace(f"cd {TESTBED}", 'cd "$HOME"').replace(
        SWESMITH_PYTHON_TEST_COMMAND, LOCAL_TEST_COMMAND
    )
    return task.model_copy(
        update={
            "files": {**FILES, **task.files},
            "setup_commands": [SNAPSHOT, *task.setup_commands],
            "verification": verification.model_copy(update={"eval_script": script}),
        }
    )


async def test_the_agent_sees_a_clean_tree_without_the_f2p_tests_and_grading_restores_them(
    tmp_path: Path,
) -> None:
    task = local_task()
    provider = LocalProvider(base_dir=str(tmp_path))
    async with await provider.create(SandboxRequest(episode_id="s1", workdir=task.workdir)) as box:
        for path, content in task.files.items():
            await box.write_file(path, content)
        for command in task.setup_commands:
            result = await box.exec(command, timeout=60)
            assert result.ok, result.output
        # clean, no F2P test file, and the bug patch file gone
        assert (await box.exec("git status --porcelain", timeout=30)).stdout == ""
        assert (await box.exec("ls tests", timeout=30)).stdout.split() == ["test_inside.py"]
        assert (await box.exec("ls -A .git/agentrl", timeout=30)).stdout == ""
        assert "min(low, max(x, high))" in (await box.read_file("shapes.py")).decode()
        # the agent fixes the bug and (to no avail) rewrites the P2P test
        fix = "sed -i 's/min(low, max(x, high))/max(low, min(x, high))/' shapes.py"
        assert (await box.exec(fix, timeout=30)).ok
        await box.write_file("tests/test_inside.py", "def test_inside():\n    assert False\n")
        result = await verify(box, task, timeout=120)
    assert result.statuses == {
        "tests/test_clamp.py::test_clamp_high": "PASSED",
        "tests/test_clamp.py::test_clamp_low": "PASSED",
        "tests/test_inside.py::test_inside": "PASSED",
    }
    assert (result.reward, result.resolution) == (1.0, "RESOLVED_FULL")


async def test_validation_scores_the_bug_0_and_its_revert_1(tmp_path: Path) -> None:
    provider = LocalProvider(base_dir=str(tmp_path))
    report = await validate_task(provider, local_task(), timeout=120)
    assert [(c.variant, c.reward, c.problem) for c in report.checks] == [
        ("untouched", 0.0, None),
        ("reference", 1.0, None),
    ]


async def test_the_agents_submitted_patch_is_graded_in_a_fresh_bug_branch(tmp_path: Path) -> None:
    """The agent fixes the bug with the editor and commits it; submit's patch is taken against
    the bug branch as the agent found it, and grading makes the branch again in a fresh sandbox,
    applies the patch there and runs the eval script."""
    task = local_task().model_copy(update={"shell_setup": None})  # no conda here
    provider = LocalProvider(base_dir=str(tmp_path))
    async with await provider.create(SandboxRequest(episode_id="s2", workdir=task.workdir)) as box:
        await prepare_sandbox(box, task, timeout=60)
        tools = SWEToolRunner(box, task, timeout_seconds=60, output_max_bytes=10_000)
        edit = {
            "command": "str_replace",
            "path": "shapes.py",
            "old_str": "min(low, max(x, high))",
            "new_str": "max(low, min(x, high))",
        }
        assert "has been edited" in (await tools.call("str_replace_editor", edit)).observation
        commit = f"git add -A && {COMMIT.replace('snapshot', 'fix')}"
        assert (await tools.call("bash", {"command": commit})).observation == "[exit code 0]"
        submitted = await tools.call("submit", {})
    patch = submitted.patch or ""
    assert touched_files(patch) == ["shapes.py"]
    result = await grade_patch(provider, task, patch, timeout=120, episode_id="s2")
    assert (result.grade_status, result.reward, result.resolution) == (
        GradeStatus.RESOLVED,
        1.0,
        "RESOLVED_FULL",
    )
