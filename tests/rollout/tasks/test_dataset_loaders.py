"""SWE-bench 5.x / SWE-smith JSONL and Harbor directories read into tasks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.api.model import DatasetFormat, DatasetSpec
from agentrl.rollout.tasks import (
    DatasetError,
    load_dataset,
    load_tasks,
    split_held_out,
    task_images,
)
from agentrl.rollout.tasks.model import HarnessVerification, RewardFileVerification
from agentrl.rollout.tasks.swebench import task_from_instance
from tests.rollout.swebench_rows import row


def write_jsonl(path: Path, records: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def smith_row(**changes: object) -> dict[str, object]:
    """A SWE-smith row (the keys of the published SWE-smith dataset)."""
    record: dict[str, object] = {
        "instance_id": "pandas-dev__pandas.95280573.func_pm_op_swap__abc",
        "repo": "swesmith/pandas-dev__pandas.95280573",
        "image_name": "swebench/swesmith.x86_64.pandas-dev_1776_pandas.95280573",
        "patch": "diff --git a/pandas/core/ops.py b/pandas/core/ops.py\n",
        "problem_statement": "Subtraction is reversed",
        "FAIL_TO_PASS": json.dumps(
            ["pandas/tests/test_ops.py::test_sub", "pandas/tests/test_ops.py::test_rsub"]
        ),
        "PASS_TO_PASS": json.dumps(["pandas/tests/frame/test_api.py::test_len"]),
        "created_at": "2025-03-10T12:00:00",
    }
    record.update(changes)
    return record


def test_a_swebench_row_keeps_its_image_eval_script_parser_and_eval_type(
    tmp_path: Path,
) -> None:
    record = row(
        "astropy__astropy-12907",
        "astropy/astropy",
        fail_to_pass=["tests/test_m.py::test_new"],
        pass_to_pass=["tests/test_m.py::test_old"],
        log_parser="parse_log_astropy",
        test_command="pytest -rA -vv -o console_output_style=classic --tb=no",
        test_file="tests/test_m.py",
    )
    [task] = load_dataset(write_jsonl(tmp_path / "d.jsonl", [record]))
    assert (task.id, task.source) == ("astropy__astropy-12907", "swebench")
    assert task.image == "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"
    assert task.workdir == "/testbed"
    assert task.instruction == "astropy/astropy: something is wrong"
    assert task.files == {} and task.setup_commands == []
    verification = task.verification
    assert isinstance(verification, HarnessVerification)
    assert verification.harness == "swebench"
    assert verification.log_parser == "parse_log_astropy"
    assert verification.eval_type == "pass_and_fail"
    # the JSON strings of the export, decoded
    assert verification.fail_to_pass == ["tests/test_m.py::test_new"]
    assert verification.pass_to_pass == ["tests/test_m.py::test_old"]
    # the row's own script: its conda activation, test patch heredoc and test command
    script = verification.eval_script
    assert "source /opt/miniconda3/bin/activate\nconda activate testbed\ncd /testbed\n" in script
    assert "git apply -v - <<'EOF_114329324912'\ndiff --git a/tests/test_m.py" in script
    assert "\npytest -rA -vv -o console_output_style=classic --tb=no tests/test_m.py\n" in script
    assert task.reference.patch == record["patch"]
    assert task.reference.patch_commands == [
        "git apply --verbose",
        "git apply --verbose --3way",
        "git apply --verbose --reject",
        "patch --batch --forward --fuzz=5 -p1 -i",
    ]


def test_a_row_of_a_fail_only_repository_without_eval_type_is_graded_fail_only() -> None:
    record = row(
        "eslint__eslint-1",
        "eslint/eslint",
        fail_to_pass=["a"],
        pass_to_pass=[],
        log_parser="parse_log_pytest",
        test_command="pytest -rA",
        test_file="tests/test_m.py",
    )
    del record["eval_type"]
    verification = task_from_instance(record).verification
    assert isinstance(verification, HarnessVerification)
    assert verification.eval_type == "fail_only"


def test_a_row_from_before_5x_is_refused_with_the_fix(tmp_path: Path) -> None:
    old = {
        "instance_id": "django__django-1",
        "repo": "django/django",
        "patch": "p",
        "test_patch": "diff --git a/tests/queries/test_q.py b/tests/queries/test_q.py\n",
        "FAIL_TO_PASS": ["test_x (queries.test_q.QTests)"],
    }
    path = write_jsonl(tmp_path / "d.jsonl", [old])
    with pytest.raises(DatasetError) as caught:
        load_dataset(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:1 (django__django-1): not a SWE-bench instance: ")
    assert "eval_script missing; SWE-bench 5.x rows carry image, eval_script" in message
    assert "re-export the dataset with swebench>=5" in message
    # and why none can be built for it
    assert message.endswith(
        "none can be built for this row: base_commit is empty; its tests are not pytest ids "
        "(e.g. 'test_x (queries.test_q.QTests)'): eval scripts are built for pytest suites only "
        "(swebench 5.x has no per-repository test commands to build others)"
    )


def plain(record: dict[str, object]) -> dict[str, object]:
    """A row as SWE-Gym and pre-5.x exports hold it: no image, eval_script, log_parser,
    eval_type."""
    return {
        k: v
        for k, v in record.items()
        if k not in ("image", "eval_script", "log_parser", "eval_type")
    }


def test_a_pytest_row_without_an_eval_script_gets_the_harness_shaped_one() -> None:
    record = row(
        "pydantic__pydantic-5021",
        "pydantic/pydantic",
        fail_to_pass=["tests/test_m.py::test_new"],
        pass_to_pass=["tests/test_m.py::test_old"],
        log_parser="parse_log_pytest",
        test_command="pytest --no-header -rA --tb=no -p no:cacheprovider",
        test_file="tests/test_m.py",
        image=False,
    )
    task = task_from_instance(plain(record))
    verification = task.verification
    assert isinstance(verification, HarnessVerification)
    assert (verification.log_parser, verification.eval_type) == (
        "parse_log_pytest",
        "pass_and_fail",
    )
    assert task.image == "swebench/sweb.eval.x86_64.pydantic_1776_pydantic-5021:latest"
    # the harness's script for the row (the fixture's rendering of it), plus the exit status
    # record the harness adds
    expected = str(record["eval_script"]).replace(
        ": '>>>>> End Test Output'",
        "SWEBENCH_TEST_EXIT_CODE=$?\n: '>>>>> End Test Output'\n"
        'echo ">>>>> Test Exit Code: $SWEBENCH_TEST_EXIT_CODE"',
    )
    assert verification.eval_script == expected
    assert task.shell_setup == "source /opt/miniconda3/bin/activate\nconda activate testbed"


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"test_patch": ""}, "test_patch changes no file"),
        ({"log_parser": "parse_log_django"}, "log_parser 'parse_log_django' is not "),
        (
            {"FAIL_TO_PASS": json.dumps(["test_new (m.tests.T)"])},
            "its tests are not pytest ids (e.g. 'test_new (m.tests.T)')",
        ),
    ],
)
def test_a_row_without_an_eval_script_that_none_can_be_built_for_is_refused_naming_it(
    changes: dict[str, object], reason: str
) -> None:
    record = plain(
        row(
            "org__lib-7",
            "org/lib",
            fail_to_pass=["tests/test_m.py::test_new"],
            pass_to_pass=[],
            log_parser="parse_log_pytest",
            test_command="pytest",
            test_file="tests/test_m.py",
        )
    )
    with pytest.raises(DatasetError) as caught:
        task_from_instance({**record, **changes}, "d.jsonl:3")
    message = str(caught.value)
    assert message.startswith("d.jsonl:3 (org__lib-7): not a SWE-bench instance: eval_script")
    assert reason in message


def test_a_row_with_an_eval_script_but_no_log_parser_is_refused() -> None:
    record = row(
        "org__lib-7",
        "org/lib",
        fail_to_pass=["tests/test_m.py::test_new"],
        pass_to_pass=[],
        log_parser="parse_log_pytest",
        test_command="pytest",
        test_file="tests/test_m.py",
    )
    del record["log_parser"]
    with pytest.raises(DatasetError, match=r"^instance \(org__lib-7\): .*log_parser missing"):
        task_from_instance(record)


def test_a_log_parser_we_do_not_implement_is_refused_naming_it() -> None:
    record = row(
        "chartjs__Chart.js-1",
        "chartjs/Chart.js",
        fail_to_pass=["a"],
        pass_to_pass=[],
        log_parser="parse_log_chart_js",
        test_command="npx karma",
        test_file="test/x.js",
    )
    with pytest.raises(DatasetError, match=r"log_parser 'parse_log_chart_js' is not supported"):
        task_from_instance(record)


def test_a_multimodal_row_whose_tests_need_downloaded_assets_is_refused() -> None:
    record = row(
        "matplotlib__matplotlib-1",
        "matplotlib/matplotlib",
        fail_to_pass=["a"],
        pass_to_pass=[],
        log_parser="parse_log_matplotlib",
        test_command="pytest -rA",
        test_file="lib/t.py",
    )
    assets = {"test_patch": [{"path": "baseline/x.png", "url": "https://example.com/x.png"}]}
    with pytest.raises(DatasetError, match=r"image_assets names files the harness downloads"):
        task_from_instance({**record, "image_assets": json.dumps(assets)})
    # an empty asset list (most rows) is fine
    assert task_from_instance({**record, "image_assets": "{}"}).id == "matplotlib__matplotlib-1"


def test_a_swesmith_row_plants_and_commits_its_bug_and_reverts_it_as_reference(
    tmp_path: Path,
) -> None:
    [task] = load_dataset(write_jsonl(tmp_path / "d.jsonl", [smith_row()]))
    assert task.source == "swesmith"
    assert task.image == "swebench/swesmith.x86_64.pandas-dev_1776_pandas.95280573"
    assert task.workdir == "/testbed"
    assert task.files == {".git/agentrl/bug.patch": smith_row()["patch"]}
    commit = "git -c user.name=agentrl -c user.email=agentrl@localhost commit -q --no-verify"
    assert task.setup_commands == [
        "git apply .git/agentrl/bug.patch && rm -f .git/agentrl/bug.patch && git add -A && "
        f"{commit} -m 'SWE-smith bug' && git update-ref refs/agentrl/bug HEAD && "
        "git rm -q --ignore-unmatch -- pandas/tests/test_ops.py && "
        f"{commit} --allow-empty -m 'Remove F2P tests'"
    ]
    assert (task.reference.patch, task.reference.patch_reverse) == (smith_row()["patch"], True)
    verification = task.verification
    assert isinstance(verification, HarnessVerification)
    assert (verification.harness, verification.log_parser) == ("swesmith", "swesmith_python")
    # SWE-smith's eval.sh for the Python profile, after its restore of the F2P/P2P test files
    assert verification.eval_script == (
        "#!/bin/bash\n"
        "set -uxo pipefail\n"
        "cd /testbed\n"
        "git checkout refs/agentrl/bug -- pandas/tests/frame/test_api.py pandas/tests/test_ops.py\n"
        ": '>>>>> Start Test Output'\n"
        "source /opt/miniconda3/bin/activate; conda activate testbed; "
        "pytest --disable-warnings --color=no --tb=no --verbose\n"
        ": '>>>>> End Test Output'\n"
    )


def test_a_swesmith_row_without_fail_to_pass_is_refused_naming_the_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [smith_row(FAIL_TO_PASS="[]")])
    with pytest.raises(
        DatasetError,
        match=r"d\.jsonl:1 \(pandas-dev__pandas\.95280573\.func_pm_op_swap__abc\): "
        r"not a SWE-smith instance: FAIL_TO_PASS is empty",
    ):
        load_dataset(path)


def test_format_swesmith_promises_swesmith_rows_and_swebench_reads_both(tmp_path: Path) -> None:
    smith = write_jsonl(tmp_path / "smith.jsonl", [smith_row()])
    assert [t.source for t in load_tasks(DatasetSpec(format="swesmith", path=str(smith)))] == [
        "swesmith"
    ]
    assert [t.source for t in load_tasks(DatasetSpec(format="swebench", path=str(smith)))] == [
        "swesmith"
    ]
    swe = row(
        "django__django-11099",
        "django/django",
        fail_to_pass=["t"],
        pass_to_pass=[],
        log_parser="parse_log_django",
        test_command="./tests/runtests.py",
        test_file="tests/x/tests.py",
    )
    mixed = write_jsonl(tmp_path / "mixed.jsonl", [smith_row(), swe])
    with pytest.raises(
        DatasetError,
        match=r"spec.dataset.format is swesmith but .*mixed.jsonl holds SWE-bench rows "
        r"\(django__django-11099: no image_name\); set spec.dataset.format to swebench",
    ):
        load_tasks(DatasetSpec(format="swesmith", path=str(mixed)))


def test_the_images_of_a_dataset_are_listed_once_each_in_order(tmp_path: Path) -> None:
    other = smith_row(instance_id="pandas-dev__pandas.95280573.func_pm_x__def")
    swe = row(
        "django__django-11099",
        "django/django",
        fail_to_pass=["t"],
        pass_to_pass=[],
        log_parser="parse_log_django",
        test_command="./tests/runtests.py",
        test_file="tests/x/tests.py",
    )
    tasks = load_dataset(write_jsonl(tmp_path / "d.jsonl", [smith_row(), swe, other]))
    assert task_images(tasks) == [
        "swebench/swesmith.x86_64.pandas-dev_1776_pandas.95280573",
        "swebench/sweb.eval.x86_64.django_1776_django-11099:latest",
    ]


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
