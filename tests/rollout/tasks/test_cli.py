"""``agentrl tasks generate`` and ``agentrl tasks validate``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentrl.cli import main
from agentrl.rollout.tasks import load_dataset


def test_generate_writes_every_toy_task_as_jsonl_that_loads_back(tmp_path: Path) -> None:
    out = tmp_path / "toy.jsonl"
    result = CliRunner().invoke(
        main, ["tasks", "generate", "--out", str(out), "--repos", str(tmp_path / "repos")]
    )
    assert result.exit_code == 0, result.output
    lines = out.read_text().splitlines()
    assert len(lines) == 54
    assert json.loads(lines[0])["id"] == "toy-stats-off_by_one"
    assert [t.id for t in load_dataset(out)][:2] == [
        "toy-stats-off_by_one",
        "toy-stats-swap_comparison",
    ]
    assert (tmp_path / "repos" / "toy-stats-off_by_one" / "tests" / "test_stats.py").is_file()


@pytest.mark.slow
def test_validate_exits_zero_for_valid_tasks_and_one_with_the_reason_otherwise(
    tmp_path: Path,
) -> None:
    good = tmp_path / "good.jsonl"
    CliRunner().invoke(main, ["tasks", "generate", "--out", str(good)])
    first = good.read_text().splitlines()[0]
    good.write_text(first + "\n")
    result = CliRunner().invoke(main, ["tasks", "validate", str(good)])
    assert result.exit_code == 0, result.output
    assert "1/1 tasks valid" in result.output

    record = json.loads(first)
    record["reference"]["edit"] = "no_such_edit"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(record) + "\n")
    result = CliRunner().invoke(main, ["tasks", "validate", str(bad)])
    assert result.exit_code == 1
    assert (
        "FAIL toy-stats-off_by_one [reference]: reference edit 'no_such_edit' is not among "
        "the candidate edits"
    ) in result.output


def test_validate_refuses_swe_instances_on_local_sandboxes(tmp_path: Path) -> None:
    from tests.rollout.swebench_rows import row

    record = row(
        "django__django-11099",
        "django/django",
        fail_to_pass=["t"],
        pass_to_pass=[],
        log_parser="parse_log_django",
        test_command="./tests/runtests.py",
        test_file="tests/x/tests.py",
    )
    path = tmp_path / "swe.jsonl"
    path.write_text(json.dumps(record) + "\n")
    result = CliRunner().invoke(main, ["tasks", "validate", str(path)])
    assert result.exit_code == 2
    assert (
        "holds SWE-bench/SWE-smith instances (django__django-11099, ...), which run in their "
        "own images: local sandboxes have none; use --provider kubernetes --manifest job.yaml"
    ) in " ".join(result.output.split())
