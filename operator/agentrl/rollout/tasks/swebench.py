"""Read SWE-bench 5.x and SWE-smith instances (JSONL) into
:class:`~agentrl.rollout.tasks.model.Task`.

SWE-bench 5.x rows (:class:`SWEBenchInstance`) carry everything the harness needs to grade
them: the ``image`` the instance runs in (the repository at ``base_commit`` in a root-owned
``/testbed``, with a conda environment ``testbed``), the ``eval_script`` (activate the
environment, reset the test files, apply ``test_patch`` from a heredoc, run the tests between
the ``>>>>> Start/End Test Output`` markers, reset again), the ``log_parser`` that reads the
test output and the ``eval_type``. The task keeps them as they are, so the verifier runs the
harness's own evaluation (:class:`~agentrl.rollout.tasks.model.HarnessVerification`). A row
without ``image`` gets the harness's name for it (``swebench/sweb.eval.x86_64.<id>:latest``,
lower case, ``__`` spelled ``_1776_``); a log parser we do not implement is refused.

Rows without ``eval_script`` (SWE-Gym, exports from before 5.x) are what many users hold.
swebench 5.x no longer builds eval scripts (its ``make_test_spec`` takes the row's script; the
per-repository test commands of 4.x, ``MAP_REPO_VERSION_TO_SPECS``, are gone), so the loader
builds the script itself for the rows it can: a pytest suite (every FAIL_TO_PASS/PASS_TO_PASS id
is ``file.py::name``) with a ``base_commit`` and a ``test_patch``. The script has the harness's
structure (:func:`built_eval_script`) and is graded with ``parse_log_pytest``. Any other row
without a script (Django's or SymPy's own runners, a missing test patch) is refused naming the row
and what is missing.

SWE-smith rows (:class:`SWESmithInstance`, recognised by ``image_name``) name one image per
repository snapshot; their ``patch`` *creates* the bug. SWE-smith checks out the bug's branch
(fetched from GitHub: the bug commit, then a commit removing the F2P test files); sandboxes have
no network, so setup makes the same two commits in place (:func:`swesmith_setup`) and the
reference solution reverts the bug. The eval script is the one SWE-smith's harness writes for
its Python profile, after its own preparation: test files of FAIL_TO_PASS/PASS_TO_PASS as of the
bug commit, then the profile's test command (the environment activation is part of it) between
the markers; it is graded with SWE-smith's parser and rules.

Both kinds of task carry the images' ``testbed`` activation (:data:`TESTBED_ACTIVATE`) as
``shell_setup``: the agent's ``bash`` runs in the environment the tests run in.

``FAIL_TO_PASS``/``PASS_TO_PASS`` may be JSON lists or JSON-encoded strings of lists (the
Hugging Face exports do the latter).

Callers: :func:`agentrl.rollout.tasks.load_tasks` (``dataset.format: swebench`` or
``swesmith``) and :func:`agentrl.rollout.tasks.load_dataset`.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agentrl.rollout import grading, log_parsers
from agentrl.rollout.tasks.model import HarnessVerification, ReferenceSolution, Task

#: Where SWE-bench/SWE-smith images keep the repository.
TESTBED: Final = "/testbed"
#: Scratch files the verifier and setup write, relative to the repository: inside ``.git``, so
#: they are never part of the work tree (``git status``, ``git clean`` and the agent's diff do
#: not see them) and every provider can write them (the local one only writes inside its
#: directory).
SCRATCH_DIR: Final = ".git/agentrl"
#: Where setup writes the SWE-smith bug patch (removed once applied).
BUG_PATCH_PATH: Final = f"{SCRATCH_DIR}/bug.patch"
#: The harness's image name rule: ``swebench.image_builder.image_spec.ImageSpec.name``.
SWEBENCH_NAMESPACE: Final = "swebench"
#: Repositories the harness grades ``fail_only`` (their parsers only report failures).
FAIL_ONLY_REPOS: Final = frozenset(
    {
        "chartjs/Chart.js",
        "processing/p5.js",
        "markedjs/marked",
        "bpmn-io/bpmn-js",
        "openlayers/openlayers",
        "eslint/eslint",
    }
)
#: The harness's patch commands, tried in turn (``run_evaluation.GIT_APPLY_CMDS``).
HARNESS_APPLY_COMMANDS: Final = (
    "git apply --verbose",
    "git apply --verbose --3way",
    "git apply --verbose --reject",
    "patch --batch --forward --fuzz=5 -p1 -i",
)
#: Activation of the images' ``testbed`` conda environment, as the harness's eval scripts (and
#: SWE-smith's test command) do it; the agent's ``bash`` tool runs it before each command.
TESTBED_ACTIVATE: Final = ("source /opt/miniconda3/bin/activate", "conda activate testbed")
#: The test command of built eval scripts: pytest with a per-test summary line (``-rA``), no
#: tracebacks, no cache written into the tree.
PYTEST_COMMAND: Final = "pytest --no-header -rA --tb=no -p no:cacheprovider"
#: The log parser of built eval scripts.
PYTEST_LOG_PARSER: Final = "parse_log_pytest"
#: Delimiter of the heredoc carrying the test patch (the harness's).
HEREDOC: Final = "EOF_114329324912"
#: SWE-smith's Python profile test command (``swesmith.profiles.python.PythonProfile``).
SWESMITH_PYTHON_TEST_COMMAND: Final = (
    "source /opt/miniconda3/bin/activate; conda activate testbed; "
    "pytest --disable-warnings --color=no --tb=no --verbose"
)

_DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)


class DatasetError(ValueError):
    """A dataset line or directory cannot be read as a task; the message names where."""


def _id_list(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a JSON list of test ids: {exc}") from exc
    return [] if value is None else value


class _Instance(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)

    instance_id: str = Field(min_length=1)
    repo: str = Field(min_length=1)
    patch: str
    problem_statement: str = ""
    fail_to_pass: list[str] = Field(alias="FAIL_TO_PASS", min_length=1)
    pass_to_pass: list[str] = Field(default_factory=list, alias="PASS_TO_PASS")

    @field_validator("fail_to_pass", "pass_to_pass", mode="before")
    @classmethod
    def _json_list(cls, value: Any) -> Any:
        return _id_list(value)


class SWEBenchInstance(_Instance):
    """One SWE-bench 5.x dataset row (``swebench.types.SWEbenchInstance`` plus the columns
    ``make_test_spec`` reads)."""

    version: str = ""
    base_commit: str = ""
    test_patch: str = ""
    hints_text: str = ""
    created_at: str = ""
    environment_setup_commit: str = ""
    image: str | None = None
    """The evaluation image; unset: the harness's name for it (:func:`swebench_image`)."""
    eval_script: str | None = None
    """Unset (SWE-Gym, exports from before 5.x): built for pytest suites
    (:func:`built_eval_script`), else the row is refused."""
    log_parser: str | None = None
    """Unset: ``parse_log_pytest`` for a built script; a row with a script must name it."""
    eval_type: Literal["pass_and_fail", "fail_only"] | None = None
    """Unset: ``fail_only`` for the repositories the harness grades so, else pass_and_fail."""
    image_assets: dict[str, Any] | str | None = None
    """Binary files (multimodal baselines) the harness downloads into the tree before the
    tests; sandboxes have no network, so a row that needs any is refused."""

    @field_validator("version", mode="before")
    @classmethod
    def _version_text(cls, value: Any) -> Any:
        # JSON exports sometimes carry "3.0" as the number 3.0
        return str(value) if isinstance(value, int | float) else value

    @field_validator("image_assets")
    @classmethod
    def _no_assets(cls, value: Any) -> Any:
        assets = json.loads(value) if isinstance(value, str) and value.strip() else value
        if assets and any(assets.get(key) for key in ("test_patch", "patch")):
            raise ValueError(
                "names files the harness downloads before the tests (multimodal instances); "
                "sandboxes have no network: drop the instance"
            )
        return value

    @field_validator("log_parser")
    @classmethod
    def _known_parser(cls, value: str | None) -> str | None:
        if value is not None and value not in log_parsers.PARSERS:
            supported = ", ".join(sorted(p for p in log_parsers.PARSERS if p.startswith("parse")))
            raise ValueError(
                f"log_parser {value!r} is not supported (supported: {supported}); "
                "drop the instance or grade it with the swebench harness"
            )
        return value


class SWESmithInstance(_Instance):
    """One SWE-smith dataset row: ``instance_id`` ``owner__repo.<commit8>.<bug id>``, ``repo``
    ``swesmith/owner__repo.<commit8>``, ``image_name`` of the snapshot, ``patch`` planting the
    bug."""

    image_name: str = Field(min_length=1)
    base_commit: str = ""


def swebench_image(instance_id: str, namespace: str = SWEBENCH_NAMESPACE) -> str:
    """The SWE-bench evaluation image of an instance (the harness's naming rule)."""
    return f"{namespace}/sweb.eval.x86_64.{instance_id}:latest".replace("__", "_1776_").lower()


def touched_files(diff: str) -> list[str]:
    """Paths a unified diff changes (the ``b/`` side), in order, without duplicates."""
    seen: dict[str, None] = {}
    for match in _DIFF_FILE.finditer(diff):
        seen.setdefault(match.group(2), None)
    return list(seen)


def _test_files(tests: list[str]) -> list[str]:
    """The files of pytest ids (``path::name``), sorted, once each (SWE-smith's rule)."""
    return sorted({test.split("::", 1)[0] for test in tests})


#: The ref setup leaves on the bug commit (the state SWE-smith's eval checks out, ``HEAD~1``
#: of the bug branch, with the F2P test files present); a ref, so commits the agent makes do
#: not move it.
BUG_REF: Final = "refs/agentrl/bug"


def _quoted(paths: list[str]) -> str:
    return " ".join(shlex.quote(p) for p in paths)


def swesmith_eval_script(instance: SWESmithInstance) -> str:
    """The eval script SWE-smith's harness runs for a Python-profile instance, after the steps
    it takes just before: the test files of F2P/P2P as of the bug commit (the F2P files the
    agent never saw come back, its edits to the others are undone)."""
    files = _test_files([*instance.fail_to_pass, *instance.pass_to_pass])
    lines = [*grading.SCRIPT_HEADER, f"cd {TESTBED}"]
    if files:
        lines.append(f"git checkout {BUG_REF} -- {_quoted(files)}")
    lines += [
        f": '{grading.START_TEST_OUTPUT}'",
        SWESMITH_PYTHON_TEST_COMMAND,
        f": '{grading.END_TEST_OUTPUT}'",
    ]
    return "\n".join(lines) + "\n"


def _is_pytest_id(test: str) -> bool:
    path, sep, name = test.partition("::")
    return bool(sep and name) and path.endswith(".py") and " " not in path


def unbuildable(instance: SWEBenchInstance) -> list[str]:
    """Why no eval script can be built for a row without one (empty: it can)."""
    reasons = []
    if not instance.base_commit:
        reasons.append("base_commit is empty")
    if not touched_files(instance.test_patch):
        reasons.append("test_patch changes no file")
    other = next(
        (t for t in [*instance.fail_to_pass, *instance.pass_to_pass] if not _is_pytest_id(t)),
        None,
    )
    if other is not None:
        reasons.append(
            f"its tests are not pytest ids (e.g. {other!r}): eval scripts are built for pytest "
            "suites only (swebench 5.x has no per-repository test commands to build others)"
        )
    if instance.log_parser not in (None, PYTEST_LOG_PARSER):
        reasons.append(f"log_parser {instance.log_parser!r} is not {PYTEST_LOG_PARSER!r}")
    return reasons


def built_eval_script(instance: SWEBenchInstance) -> str:
    """The eval script of a pytest row that carries none, with the structure of the harness's
    scripts: activate ``testbed`` and ``cd`` to the repository, informational git commands, the
    test patch's files reset to ``base_commit``, the test patch applied from a heredoc, pytest
    on the files of the FAIL_TO_PASS/PASS_TO_PASS ids between the markers, the reset again
    (``HEAD``-independent, so the agent's commits change nothing)."""
    reasons = unbuildable(instance)
    if reasons:
        raise ValueError("; ".join(reasons))
    base = instance.base_commit
    reset = f"git checkout {base} {_quoted(touched_files(instance.test_patch))}"
    tests = _test_files([*instance.fail_to_pass, *instance.pass_to_pass])
    lines = [
        *grading.SCRIPT_HEADER,
        *TESTBED_ACTIVATE,
        f"cd {TESTBED}",
        f"git config --global --add safe.directory {TESTBED}",
        f"cd {TESTBED}",
        "git status",
        "git show",
        f"git -c core.fileMode=false diff {base}",
        *TESTBED_ACTIVATE,
        reset,
        f"git apply -v - <<'{HEREDOC}'\n{instance.test_patch}\n{HEREDOC}",
        f": '{grading.START_TEST_OUTPUT}'",
        f"{PYTEST_COMMAND} {_quoted(tests)}",
        f": '{grading.END_TEST_OUTPUT}'",
        reset,
    ]
    return "\n".join(lines) + "\n"


def task_from_swebench(instance: SWEBenchInstance) -> Task:
    """A SWE-bench 5.x instance as a task graded by its own eval script (built for a pytest
    row without one; other rows without one raise :class:`ValueError` naming why)."""
    eval_script = instance.eval_script or built_eval_script(instance)
    eval_type = instance.eval_type or (
        "fail_only" if instance.repo in FAIL_ONLY_REPOS else "pass_and_fail"
    )
    return Task(
        id=instance.instance_id,
        source="swebench",
        instruction=instance.problem_statement,
        image=instance.image or swebench_image(instance.instance_id),
        workdir=TESTBED,
        shell_setup="\n".join(TESTBED_ACTIVATE),
        verification=HarnessVerification(
            harness="swebench",
            eval_script=grading.harness_eval_script(eval_script),
            log_parser=instance.log_parser or PYTEST_LOG_PARSER,
            eval_type=eval_type,
            fail_to_pass=instance.fail_to_pass,
            pass_to_pass=instance.pass_to_pass,
        ),
        reference=ReferenceSolution(
            patch=instance.patch, patch_commands=list(HARNESS_APPLY_COMMANDS)
        ),
    )


_GIT_COMMIT = "git -c user.name=agentrl -c user.email=agentrl@localhost commit -q --no-verify"


def swesmith_setup(instance: SWESmithInstance) -> str:
    """SWE-smith's bug branch, made in place: the bug committed (and marked with
    :data:`BUG_REF`), then the F2P test files removed in a second commit, so the agent works in
    a clean tree without the tests that would point at the bug, as on the branch."""
    f2p_files = _test_files(instance.fail_to_pass)
    return " && ".join(
        [
            f"git apply {BUG_PATCH_PATH}",
            f"rm -f {BUG_PATCH_PATH}",
            "git add -A",
            f"{_GIT_COMMIT} -m 'SWE-smith bug'",
            f"git update-ref {BUG_REF} HEAD",
            f"git rm -q --ignore-unmatch -- {_quoted(f2p_files)}",
            f"{_GIT_COMMIT} --allow-empty -m 'Remove F2P tests'",
        ]
    )


def task_from_swesmith(instance: SWESmithInstance) -> Task:
    """A SWE-smith instance as a task: its bug branch made at setup."""
    return Task(
        id=instance.instance_id,
        source="swesmith",
        instruction=instance.problem_statement,
        image=instance.image_name,
        workdir=TESTBED,
        shell_setup="\n".join(TESTBED_ACTIVATE),
        files={BUG_PATCH_PATH: instance.patch},
        setup_commands=[swesmith_setup(instance)],
        verification=HarnessVerification(
            harness="swesmith",
            eval_script=swesmith_eval_script(instance),
            log_parser=log_parsers.SWESMITH_PYTHON,
            fail_to_pass=instance.fail_to_pass,
            pass_to_pass=instance.pass_to_pass,
        ),
        reference=ReferenceSolution(patch=instance.patch, patch_reverse=True),
    )


def _problems(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        field = ".".join(str(p) for p in error["loc"]) or "row"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "missing" and field in ("eval_script", "log_parser"):
            message = (
                "missing; SWE-bench 5.x rows carry image, eval_script, log_parser and "
                "eval_type (re-export the dataset with swebench>=5)"
            )
        elif error["type"] == "too_short" and field == "FAIL_TO_PASS":
            message = "is empty"
        parts.append(f"{field} {message}")
    return "; ".join(parts)


def task_from_instance(record: dict[str, Any], where: str = "instance") -> Task:
    """One SWE-bench or SWE-smith row (SWE-smith when it names ``image_name``) as a task."""
    smith = "image_name" in record
    model: type[_Instance] = SWESmithInstance if smith else SWEBenchInstance
    try:
        instance = model.model_validate(record)
    except ValidationError as exc:
        ident = record.get("instance_id")
        label = f"{where} ({ident})" if ident else where
        kind = "SWE-smith" if smith else "SWE-bench"
        raise DatasetError(f"{label}: not a {kind} instance: {_problems(exc)}") from exc
    if isinstance(instance, SWESmithInstance):
        return task_from_swesmith(instance)
    assert isinstance(instance, SWEBenchInstance)
    ident = record.get("instance_id")
    label = f"{where} ({ident})" if ident else where
    fix = (
        "SWE-bench 5.x rows carry image, eval_script, log_parser and eval_type (re-export the "
        "dataset with swebench>=5)"
    )
    if instance.eval_script is None and (reasons := unbuildable(instance)):
        raise DatasetError(
            f"{label}: not a SWE-bench instance: eval_script missing; {fix}, and none can be "
            f"built for this row: {'; '.join(reasons)}"
        )
    if instance.eval_script is not None and instance.log_parser is None:
        raise DatasetError(f"{label}: not a SWE-bench instance: log_parser missing; {fix}")
    return task_from_swebench(instance)


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
