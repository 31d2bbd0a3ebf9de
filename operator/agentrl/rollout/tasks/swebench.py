"""Read SWE-bench and SWE-smith instances (JSONL) into :class:`~agentrl.rollout.tasks.model.Task`.

SWE-bench: the image holds the repository at ``base_commit`` in ``/testbed``; the gold ``patch``
fixes it; ``test_patch`` adds the tests; FAIL_TO_PASS/PASS_TO_PASS name them. The image is
``swebench/sweb.eval.x86_64.<instance id with "__" spelled "_1776_">:latest`` unless the line
names ``image_name``.

SWE-smith: ``image_name`` is one image per repository snapshot and ``patch`` *creates* the bug,
so the loader applies it at setup and the reference solution reverts it.

Both: ``FAIL_TO_PASS``/``PASS_TO_PASS`` may be JSON lists or JSON-encoded strings of lists (the
Hugging Face exports do the latter). Test commands follow the SWE-bench harness for pytest
repositories (``pytest -rA`` on the files the test patch touches) and Django's runner; other
runners are reported by ``agentrl tasks validate`` rather than guessed.

Callers: :func:`agentrl.rollout.tasks.load_tasks` (``dataset.format: swebench``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from agentrl.rollout.tasks.model import NamedTestsVerification, ReferenceSolution, Task

#: Where SWE-bench/SWE-smith images keep the repository.
TESTBED = "/testbed"
#: Where setup writes the SWE-smith bug patch (outside the repository, so git status stays clean).
BUG_PATCH_PATH = "/tmp/agentrl_bug.patch"

_DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
_DJANGO_TEST_COMMAND = "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1"


class DatasetError(ValueError):
    """A dataset line or directory cannot be read as a task; the message names where."""


def _id_list(value: Any, field: str, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{where}: {field} is not a JSON list: {exc}") from exc
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise DatasetError(f"{where}: {field} must be a list of test ids")
    return value


def swebench_image(instance_id: str) -> str:
    """The SWE-bench evaluation image of an instance (the harness's naming rule)."""
    return f"swebench/sweb.eval.x86_64.{instance_id.replace('__', '_1776_').lower()}:latest"


def touched_files(diff: str) -> list[str]:
    """Paths a unified diff changes (the ``b/`` side), in order, without duplicates."""
    seen: dict[str, None] = {}
    for match in _DIFF_FILE.finditer(diff):
        seen.setdefault(match.group(2), None)
    return list(seen)


def _django_targets(files: list[str]) -> list[str]:
    # Django's runner takes dotted module labels relative to tests/.
    labels = []
    for path in files:
        if path.startswith("tests/") and path.endswith(".py"):
            labels.append(path[len("tests/") : -len(".py")].replace("/", "."))
    return labels


def task_from_instance(record: dict[str, Any], where: str = "instance") -> Task:
    """One SWE-bench or SWE-smith instance as a task."""
    try:
        instance_id = str(record["instance_id"])
        repo = str(record["repo"])
        patch = str(record["patch"])
    except KeyError as exc:
        raise DatasetError(f"{where}: missing field {exc.args[0]!r}") from exc
    fail_to_pass = _id_list(record.get("FAIL_TO_PASS"), "FAIL_TO_PASS", where)
    if not fail_to_pass:
        raise DatasetError(f"{where} ({instance_id}): FAIL_TO_PASS is empty")
    pass_to_pass = _id_list(record.get("PASS_TO_PASS"), "PASS_TO_PASS", where)
    test_patch = record.get("test_patch") or None
    is_smith = repo.startswith("swesmith/") or (
        "image_name" in record and "swesmith" in str(record.get("image_name", ""))
    )
    image = str(record.get("image_name") or "") or swebench_image(instance_id)

    django = repo == "django/django"
    test_files = touched_files(test_patch) if test_patch else []
    if django:
        command = f"{_DJANGO_TEST_COMMAND} {' '.join(_django_targets(test_files))}".strip()
    else:
        targets = " ".join(test_files)
        command = f"python -m pytest -rA -p no:cacheprovider {targets}".strip()

    setup: list[str] = []
    reference = ReferenceSolution(patch=patch)
    if is_smith:
        # The instance patch plants the bug in a clean snapshot: apply it at setup, and the
        # known-good solution is to take it out again.
        setup = [f"git apply {BUG_PATCH_PATH}"]
        reference = ReferenceSolution(patch=patch, patch_reverse=True)
    return Task(
        id=instance_id,
        source="swebench",
        instruction=str(record.get("problem_statement") or ""),
        image=image,
        workdir=TESTBED,
        files={BUG_PATCH_PATH: patch} if is_smith else {},
        setup_commands=setup,
        visible_test_command=None,
        verification=NamedTestsVerification(
            fail_to_pass=fail_to_pass,
            pass_to_pass=pass_to_pass,
            test_patch=test_patch,
            test_command=command,
            log_format="django" if django else "pytest",
        ),
        reference=reference,
    )


def load_swebench_jsonl(path: str | Path) -> list[Task]:
    """Every instance of a SWE-bench/SWE-smith JSONL file (blank lines skipped)."""
    tasks: list[Task] = []
    with Path(path).open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{where}: not JSON: {exc}") from exc
            if not isinstance(record, dict):
                raise DatasetError(f"{where}: expected a JSON object")
            tasks.append(task_from_instance(record, where))
    return tasks
