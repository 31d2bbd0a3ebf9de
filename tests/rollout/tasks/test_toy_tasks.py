"""The bundled toy dataset: enough tasks of several bug kinds, each a real bug caught by its
real tests, with six candidate edits (one per bug kind) of which exactly one fixes it."""

from __future__ import annotations

import collections
import sys
import types
from pathlib import Path

import pytest

from agentrl.rollout.tasks.model import NamedTestsVerification, Task
from agentrl.rollout.tasks.toy import apply_edit, generate_toy_tasks
from agentrl.rollout.tasks.toy_families import BUG_KINDS
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
def test_exactly_one_of_the_six_candidate_edits_fixes_the_bug(task: Task) -> None:
    verification = task.verification
    assert isinstance(verification, NamedTestsVerification)
    names = [e.name for e in task.candidate_edits]
    assert sorted(names) == sorted(BUG_KINDS)
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


def _failure_message(task: Task) -> str:
    """The AssertionError text of the task's failing test on the untouched repository."""
    [module_path] = [p for p in task.files if p.endswith(".py") and not p.startswith("tests/")]
    name = module_path[:-3]
    module = types.ModuleType(name)
    exec(compile(task.files[module_path], module_path, "exec"), module.__dict__)
    assert isinstance(task.verification, NamedTestsVerification)
    test_path, test_name = task.verification.fail_to_pass[0].split("::")
    sys.modules[name] = module
    try:
        tests: dict[str, object] = {}
        exec(compile(task.files[test_path], test_path, "exec"), tests)
        test = tests[test_name]
        assert callable(test)
        try:
            test()
        except AssertionError as exc:
            return str(exc)
    finally:
        del sys.modules[name]
    raise AssertionError(f"{task.id}: the failing test passed")


def test_the_failing_test_output_says_how_the_value_is_wrong_with_expected_and_actual() -> None:
    task = next(t for t in TASKS if t.id == "toy-stats-off_by_one")
    test_file = task.files["tests/test_stats.py"]
    assert (
        "check('window_sums([1, 2, 3, 4], 2)', stats.window_sums([1, 2, 3, 4], 2), [3, 5, 7])"
        in test_file
    )
    assert _failure_message(task) == (
        "window_sums([1, 2, 3, 4], 2) is one item too short: expected [3, 5, 7], got [3, 5]"
    )
    missing = next(t for t in TASKS if t.id == "toy-stats-missing_return")
    assert _failure_message(missing) == (
        "spread([3, 9, 4]) returned None instead of a value: expected 6, got None"
    )


@pytest.mark.parametrize(
    ("got", "expected", "words"),
    [
        (None, 3, "returned None instead of a value"),
        (None, [1], "returned None instead of a value"),
        (False, True, "returned the opposite truth value"),
        ([1], [1, 2], "is one item too short"),
        ("abcd", "abc", "is one item too long"),
        ((1, 2, 3), (1,), "has the wrong length"),
        ([2, 1], [1, 2], "has the right length but wrong items"),
        (5, 3, "is too large"),
        (2.5, 25.0, "is too small"),
        ({"a": 1}, {}, "is a different value"),
        ("3", 3, "is a different value"),
    ],
)
def test_the_check_helper_describes_the_difference_from_the_values(
    got: object, expected: object, words: str
) -> None:
    from agentrl.rollout.tasks.toy import CHECK_HELPER

    helper: dict[str, object] = {}
    exec(CHECK_HELPER, helper)
    check = helper["check"]
    assert callable(check)
    with pytest.raises(AssertionError) as raised:
        check("f(1)", got, expected)
    assert str(raised.value) == f"f(1) {words}: expected {expected!r}, got {got!r}"
    check("f(1)", expected, expected)  # equal values pass


def test_no_test_file_names_a_bug_kind() -> None:
    from agentrl.rollout.tasks.toy_families import BUG_KINDS

    for task in TASKS:
        for path, text in task.files.items():
            if path.startswith("tests/"):
                assert not [k for k in BUG_KINDS if k in text], (task.id, path)


def test_the_failing_tests_position_in_its_file_does_not_give_the_kind_away() -> None:
    """Families list their sites in one kind order; the tests of each module are shuffled, so
    the failing test's index (its line number, pytest's ``.F....``) differs across modules."""
    positions: dict[str, set[int]] = collections.defaultdict(set)
    for task in TASKS:
        assert isinstance(task.verification, NamedTestsVerification)
        test_path, failing = task.verification.fail_to_pass[0].split("::")
        order = [
            line.split("(")[0].removeprefix("def ")
            for line in task.files[test_path].splitlines()
            if line.startswith("def test_")
        ]
        positions[task.bug_kind or ""].add(order.index(failing))
    assert all(len(seen) >= 3 for seen in positions.values()), positions


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
