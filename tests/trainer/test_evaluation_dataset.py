"""``spec.trainer.evaluation.dataset``: pass@1 measured on a task set of its own (the report
trained on SWE-smith and measured on SWE-bench Verified). The run's held-out tasks are exactly
that file's, the training tasks exactly ``spec.dataset``'s, and a task in both refuses the run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrl.api.validation import load_job
from agentrl.rollout.tasks import DatasetError
from agentrl.trainer.assembly import TaskSplit
from tests.api.cases import BASE, merge
from tests.rollout.swebench_rows import row


def _write(path: Path, ids: list[str]) -> Path:
    rows = [
        row(
            i,
            "acme/widgets",
            fail_to_pass=["tests/test_w.py::test_new"],
            pass_to_pass=["tests/test_w.py::test_old"],
            log_parser="parse_log_pytest",
            test_command="pytest -rA",
            test_file="tests/test_w.py",
        )
        for i in ids
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _job(train: Path, evaluation: Path, **evaluation_fields: Any) -> Any:
    doc = merge(
        BASE,
        {
            "spec": {
                "dataset": {"format": "swebench", "path": str(train), "heldOutFraction": 0.0},
                "sandbox": {"provider": "kubernetes"},
                "trainer": {
                    "evaluation": {
                        "tasks": 3,
                        "dataset": {"format": "swebench", "path": str(evaluation)},
                        **evaluation_fields,
                    }
                },
            }
        },
    )
    return load_job(yaml.safe_dump(doc))


def test_the_held_out_tasks_are_the_evaluation_files_and_training_keeps_every_task(
    tmp_path: Path,
) -> None:
    train_ids = [f"acme__widgets-{n}" for n in range(1, 9)]
    eval_ids = [f"acme__widgets-{n}" for n in range(101, 106)]
    job = _job(
        _write(tmp_path / "train.jsonl", train_ids), _write(tmp_path / "eval.jsonl", eval_ids)
    )
    split = TaskSplit.of(job.spec)
    assert sorted(t.id for t in split.train) == sorted(train_ids)
    assert sorted(t.id for t in split.held_out) == sorted(eval_ids)


def test_max_tasks_cuts_the_evaluation_set(tmp_path: Path) -> None:
    eval_ids = [f"acme__widgets-{n}" for n in range(101, 111)]
    job = _job(
        _write(tmp_path / "train.jsonl", ["acme__widgets-1", "acme__widgets-2"]),
        _write(tmp_path / "eval.jsonl", eval_ids),
    )
    job.spec.trainer.evaluation.dataset.max_tasks = 4
    held_out = TaskSplit.of(job.spec).held_out
    assert len(held_out) == 4 and {t.id for t in held_out} <= set(eval_ids)


def test_a_task_in_both_files_refuses_the_run_naming_it(tmp_path: Path) -> None:
    job = _job(
        _write(tmp_path / "train.jsonl", ["acme__widgets-1", "acme__widgets-2"]),
        _write(tmp_path / "eval.jsonl", ["acme__widgets-2", "acme__widgets-3"]),
    )
    with pytest.raises(
        DatasetError, match=r"shares 1 task\(s\) with spec.dataset: acme__widgets-2;"
    ):
        TaskSplit.of(job.spec)
