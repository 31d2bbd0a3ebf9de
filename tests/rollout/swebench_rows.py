"""SWE-bench 5.x dataset rows and evaluation logs for the tests, written the way the dataset and
the harness make them.

A row has the dataset's keys (FAIL_TO_PASS/PASS_TO_PASS as JSON strings, as the Hugging Face
exports store them) plus the 5.x columns ``image``, ``eval_script``, ``log_parser`` and
``eval_type``. Its ``eval_script`` has the structure SWE-bench's script generator gives every
Python instance: activate the conda environment, ``cd /testbed``, informational git commands,
reset the test files to the base commit, apply the test patch from a heredoc, run the test
command between the ``: '>>>>> Start Test Output'`` / ``End`` markers, reset the test files.

A log is what ``/bin/bash /eval.sh`` prints with stdout and stderr in one stream: ``set -x``
traces (``+ ...``) around the test runner's own output, and the exit-status lines the harness
adds to the script.
"""

from __future__ import annotations

import json
from typing import Any

HEREDOC = "EOF_114329324912"


def eval_script(
    *,
    base_commit: str,
    test_files: list[str],
    test_patch: str,
    test_command: str,
    conda: bool = True,
    repo_dir: str = "/testbed",
) -> str:
    """An eval script with the harness's structure (``conda=False`` drops the two activation
    lines, for a sandbox without conda)."""
    activate = ["source /opt/miniconda3/bin/activate", "conda activate testbed"] if conda else []
    reset = f"git checkout {base_commit} {' '.join(test_files)}"
    lines = [
        "#!/bin/bash",
        "set -uxo pipefail",
        *activate,
        f"cd {repo_dir}",
        f"git config --global --add safe.directory {repo_dir}",
        f"cd {repo_dir}",
        "git status",
        "git show",
        f"git -c core.fileMode=false diff {base_commit}",
        *activate,
        reset,
        f"git apply -v - <<'{HEREDOC}'\n{test_patch}\n{HEREDOC}",
        ": '>>>>> Start Test Output'",
        test_command,
        ": '>>>>> End Test Output'",
        reset,
    ]
    return "\n".join(lines) + "\n"


def row(
    instance_id: str,
    repo: str,
    *,
    fail_to_pass: list[str],
    pass_to_pass: list[str],
    log_parser: str,
    test_command: str,
    test_file: str,
    eval_type: str = "pass_and_fail",
    version: str = "1.0",
    image: bool = True,
) -> dict[str, Any]:
    """A 5.x row for ``repo`` whose test patch touches ``test_file``."""
    base = "4a1b2c3d4e5f60718293a4b5c6d7e8f901234567"
    test_patch = (
        f"diff --git a/{test_file} b/{test_file}\n"
        f"--- a/{test_file}\n+++ b/{test_file}\n"
        "@@ -1,2 +1,5 @@\n import pytest\n \n+\n+def test_new():\n+    assert True\n"
    )
    record: dict[str, Any] = {
        "repo": repo,
        "instance_id": instance_id,
        "base_commit": base,
        "patch": "diff --git a/src/m.py b/src/m.py\n--- a/src/m.py\n+++ b/src/m.py\n"
        "@@ -1 +1 @@\n-x = 1\n+x = 2\n",
        "test_patch": test_patch,
        "problem_statement": f"{repo}: something is wrong",
        "hints_text": "",
        "created_at": "2023-05-04T11:22:33Z",
        "version": version,
        "FAIL_TO_PASS": json.dumps(fail_to_pass),
        "PASS_TO_PASS": json.dumps(pass_to_pass),
        "environment_setup_commit": "b" * 40,
        "split": "test",
        "log_parser": log_parser,
        "eval_type": eval_type,
        "eval_script": eval_script(
            base_commit=base,
            test_files=[test_file],
            test_patch=test_patch,
            test_command=f"{test_command} {test_file}",
        ),
    }
    if image:
        record["image"] = (
            f"swebench/sweb.eval.x86_64.{instance_id.replace('__', '_1776_').lower()}:latest"
        )
    return record


def log(test_command: str, runner_output: str, *, exit_code: int) -> str:
    """What the eval script prints around one test run."""
    return (
        "+ source /opt/miniconda3/bin/activate\n"
        "++ _CONDA_ROOT=/opt/miniconda3\n"
        "++ . /opt/miniconda3/etc/profile.d/conda.sh\n"
        "+ conda activate testbed\n"
        "+ cd /testbed\n"
        "+ git config --global --add safe.directory /testbed\n"
        "+ git status\n"
        "On branch main\n"
        "Changes not staged for commit:\n"
        '  (use "git add <file>..." to update what will be committed)\n'
        "\tmodified:   src/m.py\n\n"
        "+ git checkout 4a1b2c3d4e5f60718293a4b5c6d7e8f901234567 tests/test_m.py\n"
        "Updated 1 path from 9f8e7d6\n"
        "+ git apply -v -\n"
        "Checking patch tests/test_m.py...\n"
        "Applied patch tests/test_m.py cleanly.\n"
        "+ : '>>>>> Start Test Output'\n"
        f"+ {test_command}\n"
        f"{runner_output}"
        f"+ SWEBENCH_TEST_EXIT_CODE={exit_code}\n"
        "+ : '>>>>> End Test Output'\n"
        f"+ echo '>>>>> Test Exit Code: {exit_code}'\n"
        f">>>>> Test Exit Code: {exit_code}\n"
        "+ git checkout 4a1b2c3d4e5f60718293a4b5c6d7e8f901234567 tests/test_m.py\n"
        "Updated 1 path from 9f8e7d6\n"
    )
