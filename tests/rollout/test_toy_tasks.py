"""The bundled toy dataset: enough tasks of several bug kinds, each a real bug caught by its
real tests, with 4–6 candidate edits of which exactly one fixes it."""

from __future__ import annotations

import collections
import sys
import types
from pathlib import Path

import pytest

from agentrl.rollout.tasks.model import NamedTestsVerification, Task
from agentrl.rollout.tasks.toy import apply_edit, generate_toy_tasks
from agentrl.rollout.validate import validate_dataset
from agentrl.sandbox.local import LocalProvider

TASKS = generate_toy_tasks()


def run_tests_in_process(task: Task, files: dict[str, str]) -> dict[str, bool]:
    """Run the task's generated test functions against ``files``: {test id: passed}."""
    [module_path] = [p for p in files if p.endswith(".py") and not p.startswith("tests/")]
    name = module_path[:-3]
    module = types.ModuleType(name)
    exec(compile(files[module_path], module_path, "exec"), module.__dict__)
    test_path = next(p for p in files if p.startswith("tests/"))
    sys.modules[name] = module
    try:
        tests: dict[str, object] = {}
        exec(compile(files[test_path], test_path, "exec"), tests)
    finally:
        del sys.modules[name]
    results = {}
    for key, fn in tests.items():
        if key.startswith("test_") and callable(fn):
            try:
                fn()
                results[f"{test_path}::{key}"] = True
            except Exception:
                results[f"{test_path}::{key}"] = False
    return results


def test_there_are_at_least_fifty_tasks_over_six_bug_kinds() -> None:
    kinds = collections.Counter(t.bug_kind for t in TASKS)
    assert len(TASKS) >= 50
    assert len(kinds) >= 6
    assert len({t.id for t in TASKS}) == len(TASKS)


@pytest.mark.parametrize("task", TASKS, ids=[t.id for t in TASKS])
def test_exactly_one_of_four_to_six_candidate_edits_fixes_the_bug(task: Task) -> None:
    verification = task.verification
    assert isinstance(verification, NamedTestsVerification)
    names = [e.name for e in task.candidate_edits]
    assert 4 <= len(names) <= 6
    assert len(set(names)) == len(names)
    required = [*verification.fail_to_pass, *verification.pass_to_pass]

    untouched = run_tests_in_process(task, task.files)
    assert [untouched[t] for t in verification.fail_to_pass] == [False]
    assert all(untouched[t] for t in verification.pass_to_pass)
    fixing = []
    for edit in task.candidate_edits:
        results = run_tests_in_process(task, apply_edit(task.files, edit))
        if all(results[t] for t in required):
            fixing.append(edit.name)
    assert fixing == [task.reference.edit]


def test_the_failing_test_output_shows_expected_and_actual_values() -> None:
    task = next(t for t in TASKS if t.id == "toy-stats-off_by_one")
    test_file = task.files["tests/test_stats.py"]
    assert "'window_sums([1, 2, 3, 4], 2): expected [3, 5, 7], got ' + repr(got)" in test_file


def test_generation_is_deterministic_for_a_seed() -> None:
    again = generate_toy_tasks()
    assert [t.model_dump() for t in again] == [t.model_dump() for t in TASKS]
    other = generate_toy_tasks(seed=1)
    assert [t.candidate_edits for t in other] != [t.candidate_edits for t in TASKS]


@pytest.mark.slow
async def test_validation_in_local_sandboxes_scores_reference_one_and_untouched_zero(
    tmp_path: Path,
) -> None:
    picked = [TASKS[0], TASKS[13]]
    reports = await validate_dataset(
        LocalProvider(base_dir=str(tmp_path)), picked, concurrency=2, timeout=120
    )
    summary = {(r.task_id, c.variant): (c.reward, c.problem) for r in reports for c in r.checks}
    assert summary == {
        (picked[0].id, "untouched"): (0.0, None),
        (picked[0].id, "reference"): (1.0, None),
        (picked[1].id, "untouched"): (0.0, None),
        (picked[1].id, "reference"): (1.0, None),
    }


@pytest.mark.slow
async def test_validation_reports_a_task_whose_reference_does_not_fix_it(tmp_path: Path) -> None:
    task = TASKS[0]
    decoy = next(e.name for e in task.candidate_edits if e.name != task.reference.edit)
    broken = task.model_copy(
        update={"reference": task.reference.model_copy(update={"edit": decoy})}
    )
    [report] = await validate_dataset(
        LocalProvider(base_dir=str(tmp_path)), [broken], concurrency=1, timeout=120
    )
    assert not report.ok
    [problem] = [c for c in report.checks if c.problem is not None]
    assert problem.variant == "reference"
    assert problem.problem is not None
    assert problem.problem.startswith("scored 0, expected 1; failing: tests/test_stats.py::")
