"""SWE-bench/SWE-smith JSONL and Harbor directories read into tasks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.api.model import DatasetFormat, DatasetSpec
from agentrl.rollout.tasks import DatasetError, load_dataset, load_tasks, split_held_out
from agentrl.rollout.tasks.model import NamedTestsVerification, RewardFileVerification
from agentrl.rollout.tasks.swebench import BUG_PATCH_PATH

TEST_PATCH = """\
diff --git a/tests/test_core.py b/tests/test_core.py
--- a/tests/test_core.py
+++ b/tests/test_core.py
@@ -1 +1,2 @@
 x
+y
diff --git a/tests/test_io.py b/tests/test_io.py
"""


def write_jsonl(path: Path, records: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_swebench_instance_becomes_a_tests_task_on_its_image(tmp_path: Path) -> None:
    record = {
        "instance_id": "astropy__astropy-12907",
        "repo": "astropy/astropy",
        "base_commit": "abc",
        "patch": "diff --git a/x b/x\n",
        "test_patch": TEST_PATCH,
        "problem_statement": "Fix it.",
        # The Hugging Face export stores the lists as JSON strings.
        "FAIL_TO_PASS": json.dumps(["tests/test_core.py::test_new"]),
        "PASS_TO_PASS": json.dumps(["tests/test_io.py::test_old"]),
    }
    [task] = load_dataset(write_jsonl(tmp_path / "d.jsonl", [record]))
    assert task.id == "astropy__astropy-12907"
    assert task.image == "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"
    assert task.workdir == "/testbed"
    assert task.instruction == "Fix it."
    verification = task.verification
    assert isinstance(verification, NamedTestsVerification)
    assert verification.fail_to_pass == ["tests/test_core.py::test_new"]
    assert verification.pass_to_pass == ["tests/test_io.py::test_old"]
    assert verification.test_command == (
        "python -m pytest -rA -p no:cacheprovider tests/test_core.py tests/test_io.py"
    )
    assert task.reference.patch == "diff --git a/x b/x\n"
    assert task.reference.patch_reverse is False


def test_django_instances_use_djangos_runner_with_module_labels(tmp_path: Path) -> None:
    record = {
        "instance_id": "django__django-1",
        "repo": "django/django",
        "patch": "p",
        "test_patch": "diff --git a/tests/queries/test_q.py b/tests/queries/test_q.py\n",
        "FAIL_TO_PASS": ["test_x (queries.test_q.QTests)"],
    }
    [task] = load_dataset(write_jsonl(tmp_path / "d.jsonl", [record]))
    assert isinstance(task.verification, NamedTestsVerification)
    assert task.verification.log_format == "django"
    assert task.verification.test_command.endswith("--parallel 1 queries.test_q")


def test_a_swesmith_instance_plants_its_bug_at_setup_and_reverts_it_as_reference(
    tmp_path: Path,
) -> None:
    record = {
        "instance_id": "pandas-dev__pandas.95280573.func_pm_op_swap__abc",
        "repo": "swesmith/pandas-dev__pandas.95280573",
        "image_name": "jyangballin/swesmith.x86_64.pandas-dev_1776_pandas.95280573",
        "patch": "BUG PATCH",
        "FAIL_TO_PASS": ["t::a"],
        "PASS_TO_PASS": [],
    }
    [task] = load_dataset(write_jsonl(tmp_path / "d.jsonl", [record]))
    assert task.image == "jyangballin/swesmith.x86_64.pandas-dev_1776_pandas.95280573"
    assert task.files == {BUG_PATCH_PATH: "BUG PATCH"}
    assert task.setup_commands == [f"git apply {BUG_PATCH_PATH}"]
    assert (task.reference.patch, task.reference.patch_reverse) == ("BUG PATCH", True)


def test_an_instance_without_fail_to_pass_is_refused_naming_the_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"instance_id": "a", "repo": "r", "patch": "p"}])
    with pytest.raises(DatasetError, match=r"d\.jsonl:1 \(a\): FAIL_TO_PASS is empty"):
        load_dataset(path)


def test_a_harbor_directory_becomes_a_reward_file_task(tmp_path: Path) -> None:
    task_dir = tmp_path / "tasks" / "fix-csv"
    (task_dir / "tests").mkdir(parents=True)
    (task_dir / "solution").mkdir()
    (task_dir / "instruction.md").write_text("Fix the CSV parser.")
    (task_dir / "task.toml").write_text(
        "[agent]\ntimeout_sec = 900\n[verifier]\ntimeout_sec = 120\n"
        '[environment]\ndocker_image = "ghcr.io/x/csv:1"\n'
    )
    (task_dir / "tests" / "test.sh").write_text("pytest && echo 1 > /logs/verifier/reward.txt\n")
    (task_dir / "tests" / "test_csv.py").write_text("def test(): pass\n")
    (task_dir / "solution" / "solve.sh").write_text("sed -i s/a/b/ csv.py\n")
    [task] = load_dataset(tmp_path / "tasks")
    assert (task.id, task.instruction, task.image) == (
        "fix-csv",
        "Fix the CSV parser.",
        "ghcr.io/x/csv:1",
    )
    assert task.timeout_seconds == 900
    verification = task.verification
    assert isinstance(verification, RewardFileVerification)
    assert sorted(verification.files) == ["/tests/test.sh", "/tests/test_csv.py"]
    assert verification.timeout_seconds == 120
    assert task.reference.script == "sed -i s/a/b/ csv.py\n"


def test_the_toy_dataset_is_shuffled_by_seed_and_cut_to_max_tasks() -> None:
    spec = DatasetSpec(format=DatasetFormat.TOY, seed=3, max_tasks=10)
    first, again = load_tasks(spec), load_tasks(spec)
    assert [t.id for t in first] == [t.id for t in again]
    assert len(first) == 10
    other = load_tasks(DatasetSpec(format=DatasetFormat.TOY, seed=4, max_tasks=10))
    assert [t.id for t in other] != [t.id for t in first]


def test_the_held_out_split_takes_the_fraction_and_does_not_depend_on_order() -> None:
    tasks = load_tasks(DatasetSpec(format=DatasetFormat.TOY))
    train, held = split_held_out(tasks, 0.2, seed=1)
    # 54 tasks × 0.2 = 10.8 → 11 held out.
    assert (len(train), len(held)) == (43, 11)
    _, held_reversed = split_held_out(list(reversed(tasks)), 0.2, seed=1)
    assert {t.id for t in held_reversed} == {t.id for t in held}
