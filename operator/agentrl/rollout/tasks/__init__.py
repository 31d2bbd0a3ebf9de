"""Tasks: the bundled toy dataset, SWE-bench/SWE-smith JSONL and Harbor directories, all read
into one :class:`Task` type.

Callers: the rollout scheduler's task source (``agentrl run``), ``agentrl tasks`` and tests.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from agentrl.api.model import DatasetFormat, DatasetSpec
from agentrl.rollout.tasks.harbor import load_harbor_directory
from agentrl.rollout.tasks.model import (
    CandidateEdit,
    HarnessVerification,
    NamedTestsVerification,
    ReferenceSolution,
    RewardFileVerification,
    Task,
)
from agentrl.rollout.tasks.swebench import DatasetError, load_swebench_jsonl
from agentrl.rollout.tasks.toy import generate_toy_tasks

__all__ = [
    "CandidateEdit",
    "DatasetError",
    "HarnessVerification",
    "NamedTestsVerification",
    "ReferenceSolution",
    "RewardFileVerification",
    "Task",
    "checked_evaluation_set",
    "generate_toy_tasks",
    "load_dataset",
    "load_tasks",
    "offered_edits",
    "split_held_out",
    "task_images",
]


def offered_edits(dataset: DatasetSpec) -> tuple[str, ...]:
    """The candidate edits a native tool-call agent may ``apply_edit`` on ``dataset``'s tasks
    (:func:`agentrl.rollout.swe_tools.tool_schemas`): the bundled toy tasks' (``format: toy``),
    none for every other format (their agents edit with ``str_replace_editor``)."""
    from agentrl.rollout.tasks.toy_families import BUG_KINDS

    return tuple(BUG_KINDS) if dataset.format == DatasetFormat.TOY else ()


def _load_task_jsonl(path: Path) -> list[Task]:
    """Our own task JSONL (what ``agentrl tasks generate`` writes)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [Task.model_validate(json.loads(line)) for line in lines if line.strip()]


def load_dataset(path: str | Path) -> list[Task]:
    """Tasks from a path, format guessed from its shape: a directory is Harbor; a JSONL file
    whose first line has ``instance_id`` is SWE-bench/SWE-smith, else our own task JSONL."""
    target = Path(path)
    if target.is_dir():
        return load_harbor_directory(target)
    first = next((ln for ln in target.read_text(encoding="utf-8").splitlines() if ln.strip()), "")
    if not first:
        raise DatasetError(f"{target}: empty")
    if "instance_id" in json.loads(first):
        return load_swebench_jsonl(target)
    return _load_task_jsonl(target)


def _check_rows_match_format(tasks: list[Task], format_: DatasetFormat, path: str) -> None:
    """``swesmith`` promises SWE-smith rows (``image_name``); ``swebench`` reads both kinds (the
    kind of each row decides its grading, and both run as the same sandbox profile)."""
    if format_ != DatasetFormat.SWESMITH:
        return
    other = next((t for t in tasks if t.source != "swesmith"), None)
    if other is not None:
        raise DatasetError(
            f"spec.dataset.format is swesmith but {path} holds SWE-bench rows ({other.id}: no "
            "image_name); set spec.dataset.format to swebench"
        )


def load_tasks(dataset: DatasetSpec) -> list[Task]:
    """The tasks ``spec.dataset`` names, shuffled with ``dataset.seed`` and cut to
    ``dataset.maxTasks``."""
    if dataset.format == DatasetFormat.TOY:
        tasks = (
            generate_toy_tasks(dataset.seed) if dataset.path is None else load_dataset(dataset.path)
        )
    elif dataset.path is None:  # the API's CEL rule forbids this; keep the message anyway
        raise DatasetError(f"dataset.path is required for format {dataset.format.value}")
    elif dataset.format in (DatasetFormat.SWEBENCH, DatasetFormat.SWESMITH):
        tasks = load_swebench_jsonl(dataset.path)
        _check_rows_match_format(tasks, dataset.format, dataset.path)
    else:
        tasks = load_harbor_directory(dataset.path)
    random.Random(dataset.seed).shuffle(tasks)
    if dataset.max_tasks is not None:
        tasks = tasks[: dataset.max_tasks]
    return tasks


def task_images(tasks: list[Task]) -> list[str]:
    """The images the tasks run in, each once, in task order (what pre-pull needs)."""
    return list(dict.fromkeys(task.image for task in tasks if task.image))


def split_held_out(tasks: list[Task], fraction: float, seed: int) -> tuple[list[Task], list[Task]]:
    """(train, held_out): ``round(len × fraction)`` tasks held out, chosen by ``seed`` and
    independent of the list's order."""
    ordered = sorted(tasks, key=lambda t: t.id)
    random.Random(seed).shuffle(ordered)
    count = round(len(ordered) * fraction)
    held = {t.id for t in ordered[:count]}
    return [t for t in tasks if t.id not in held], [t for t in tasks if t.id in held]


def checked_evaluation_set(train: list[Task], evaluation: list[Task]) -> list[Task]:
    """``evaluation`` (``spec.trainer.evaluation.dataset``'s tasks) when none of them is also a
    training task; else :class:`DatasetError` naming the shared ids: a task evaluated on must
    never be trained on, or pass@1 measures memory."""
    trained = {t.id for t in train}
    shared = [t.id for t in evaluation if t.id in trained]
    if shared:
        shown = ", ".join(shared[:5]) + (f" and {len(shared) - 5} more" if len(shared) > 5 else "")
        raise DatasetError(
            f"trainer.evaluation.dataset shares {len(shared)} task(s) with spec.dataset: {shown}; "
            "a task evaluated on must not be trained on: remove them from one of the two files"
        )
    if not evaluation:
        raise DatasetError("trainer.evaluation.dataset has no task")
    return evaluation
