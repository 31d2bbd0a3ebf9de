"""The task type every dataset format is read into.

A :class:`Task` says what goes into a fresh sandbox (an image, or files for the toy set), what
the agent is asked (``instruction``), how the verifier scores the result (``verification``: named
tests that must pass, or a script that writes a reward file) and what the known-good solution is
(``reference``, used by ``agentrl tasks validate``).

Callers: the loaders beside this module produce tasks; :mod:`agentrl.rollout.episode`,
:mod:`agentrl.rollout.verifier` and :mod:`agentrl.rollout.validate` consume them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class CandidateEdit(BaseModel):
    """A named text replacement the toy agent can ``apply``: ``old`` becomes ``new`` in ``path``
    (exactly once)."""

    model_config = ConfigDict(frozen=True)

    name: str
    path: str
    old: str
    new: str


class NamedTestsVerification(BaseModel):
    """SWE-bench style: write the test files (or apply the test patch), run the named tests,
    reward 1 when every FAIL_TO_PASS and PASS_TO_PASS test passes, else 0."""

    kind: Literal["tests"] = "tests"
    fail_to_pass: list[str]
    """Test ids that fail before the fix and must pass after it."""
    pass_to_pass: list[str] = Field(default_factory=list)
    """Test ids that pass before and must still pass after."""
    test_files: dict[str, str] = Field(default_factory=dict)
    """Files (path relative to the workdir → content) written just before the tests run, so an
    agent cannot have weakened them."""
    test_patch: str | None = None
    """A unified diff applied with ``git apply`` just before the tests run (SWE-bench)."""
    test_command: str = "python -m pytest -rA -p no:cacheprovider"
    """Command the test ids are appended to; its output is parsed per test."""
    log_format: Literal["pytest", "django"] = "pytest"
    """How per-test results are read from the output."""


class HarnessVerification(BaseModel):
    """SWE-bench 5.x / SWE-smith: run the instance's own eval script in its image (as the
    harness does: root, in the repository, the script's own environment activation and test
    patch) and grade the log with the instance's log parser and the harness's rules; reward 1
    when the instance is resolved (every FAIL_TO_PASS and PASS_TO_PASS test succeeded)."""

    kind: Literal["harness"] = "harness"
    harness: Literal["swebench", "swesmith"] = "swebench"
    """Whose grading rules apply (:class:`agentrl.rollout.grading.Harness`)."""
    eval_script: str = Field(min_length=1)
    """The bash script the harness runs (``TestSpec.eval_script``: header, exit-status record)."""
    log_parser: str = Field(min_length=1)
    """Name of the log parser (:data:`agentrl.rollout.log_parsers.PARSERS`)."""
    eval_type: Literal["pass_and_fail", "fail_only"] = "pass_and_fail"
    """SWE-bench's ``eval_type``."""
    fail_to_pass: list[str] = Field(min_length=1)
    """Test ids that fail before the fix and must pass after it."""
    pass_to_pass: list[str] = Field(default_factory=list)
    """Test ids that pass before and must still pass after."""


class RewardFileVerification(BaseModel):
    """Harbor style: copy the task's test directory in, run its script, read the reward file."""

    kind: Literal["reward_file"] = "reward_file"
    files: dict[str, str]
    """Files (absolute path in the sandbox → content), e.g. ``/tests/test.sh``."""
    command: str = "bash /tests/test.sh"
    """Script that runs the tests and writes the reward."""
    reward_paths: list[str] = Field(
        default_factory=lambda: ["/logs/verifier/reward.txt", "/logs/verifier/reward.json"]
    )
    """Where the script writes its reward: a float in a ``.txt``, or ``{"reward": x}`` JSON."""
    timeout_seconds: float | None = None
    """The task's own verifier timeout (``task.toml``); capped by the spec's."""


Verification = Annotated[
    NamedTestsVerification | HarnessVerification | RewardFileVerification,
    Field(discriminator="kind"),
]


class ReferenceSolution(BaseModel):
    """The known-good solution, applied by ``agentrl tasks validate`` (exactly one is set)."""

    edit: str | None = None
    """Name of the candidate edit that fixes a toy task."""
    patch: str | None = None
    """Gold patch (unified diff) of a SWE-bench task, applied with ``git apply``."""
    patch_reverse: bool = False
    """Apply ``patch`` in reverse (SWE-smith: the instance's patch *creates* the bug)."""
    patch_commands: list[str] = Field(default_factory=lambda: ["git apply"])
    """Commands tried in turn to apply ``patch`` (the file name is appended; the tree is reset
    between tries), as the harness tries ``git apply``, ``--3way``, ``--reject``, ``patch``."""
    script: str | None = None
    """Harbor ``solution/solve.sh`` content, run with bash."""


class Task(BaseModel):
    """One task: what the sandbox starts from, what the agent is asked, how it is scored."""

    id: str = Field(min_length=1)
    source: Literal["toy", "swebench", "swesmith", "harbor"]
    instruction: str
    """The problem statement shown to the agent."""
    image: str | None = None
    """Container image the sandbox starts from (Kubernetes); ``None`` uses the spec's image."""
    template: str | None = None
    """E2B template; ``None`` uses ``spec.sandbox.e2b.template``."""
    workdir: str = "/workspace"
    """Repository directory inside the image (``/testbed`` for SWE-bench images)."""
    files: dict[str, str] = Field(default_factory=dict)
    """Files (relative to the workdir) written into the sandbox before the agent starts."""
    setup_commands: list[str] = Field(default_factory=list)
    """Commands run in the workdir before the agent starts (a failure is an infra error)."""
    shell_setup: str | None = None
    """Lines the agent's ``bash`` tool runs before each command, in the same shell (SWE-bench
    and SWE-smith images: activate the ``testbed`` conda environment, as their eval scripts
    do); ``None`` runs commands in the image's plain environment."""
    visible_test_command: str | None = None
    """What the ``run_tests`` tool runs; ``None`` means the task has no visible tests."""
    candidate_edits: list[CandidateEdit] = Field(default_factory=list)
    """Toy tasks: the edits the ``apply`` tool offers (exactly one fixes the bug)."""
    verification: Verification
    reference: ReferenceSolution = Field(default_factory=ReferenceSolution)
    bug_kind: str | None = None
    """Toy tasks: the kind of the planted bug (for statistics; never shown to the agent)."""
    timeout_seconds: float | None = None
    """The task's own agent timeout (Harbor ``[agent] timeout_sec``); capped by the spec's."""


class MissingTemplateError(ValueError):
    """Tasks name images that ``spec.sandbox.e2b.templates`` maps to no E2B template."""


def with_e2b_templates(tasks: list[Task], templates: Mapping[str, str]) -> list[Task]:
    """The tasks with the E2B template of their image (``spec.sandbox.e2b.templates``).

    E2B starts sandboxes from templates, not images: a task whose image has no template would
    run in the default template, without its repository or environment, and score 0 for no
    fault of the policy. Such tasks are refused, all named at once, before anything runs. Tasks
    without an image (toy tasks) and tasks that name their own template are kept as they are.
    """
    missing = [t for t in tasks if t.image and not t.template and t.image not in templates]
    if missing:
        shown = ", ".join(f"{t.id} ({t.image})" for t in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise MissingTemplateError(
            f"{len(missing)} tasks run in images with no E2B template: {shown}{more}; add each "
            "image to spec.sandbox.e2b.templates (image: template) or drop its tasks"
        )
    return [
        t.model_copy(update={"template": templates[t.image]})
        if t.image and not t.template
        else t
        for t in tasks
    ]
