"""The verifier: after submit (or a cap), run the task's tests and turn them into a reward.

``tests`` tasks (toy): the test files are written again (or the test patch applied to
pristine test files), the test command runs, its log is parsed per test, and the reward is 1 when
every FAIL_TO_PASS and PASS_TO_PASS test passed, else 0 (a test missing from the log failed).
``harness`` tasks (SWE-bench 5.x, SWE-smith): the instance's eval script runs the way the harness
runs it (``/bin/bash`` on the script, as the sandbox's user — root in those images — from the
repository, stdout and stderr in one stream written to a file, so no capture limit cuts the log);
the script activates its environment, resets the test files and applies the test patch itself.
The log is graded by :mod:`agentrl.rollout.grading` exactly as the harness grades it; the
reward is 1 when the instance is resolved. A log the harness could not grade is reward 0, unless
it shows one of the harness's environment faults (out of memory, no network...): then it is an
infra error.
``reward_file`` tasks (Harbor): the test directory is copied in, ``test.sh`` runs, and the reward
is read from the file it wrote.

Failing tests, broken code, and tests that hang past the verifier timeout are the policy's doing:
reward 0. The verifier *crashing* (the test patch does not apply to pristine files, the sandbox
image lacks the test runner, the reward file is missing or unreadable, the sandbox fails)
raises :class:`VerifierError` or a :class:`~agentrl.sandbox.errors.SandboxError`: an infra
error, never a reward.

Grading a submitted patch (:func:`grade_patch`) is what the SWE-bench harness does with a
prediction: the patch goes into a *fresh* sandbox of the task (a second lease from the provider,
prepared as an episode's is), never the agent's, through the harness's patch commands in turn
(``git apply --verbose``, ``--3way``, ``--reject``, then ``patch --batch --forward --fuzz=5``,
the tree reset between tries, a final ``git apply --check --reverse`` accepting a patch that is in
although each command complained); then the task's verification runs there as above. Each
outcome has its :class:`GradeStatus`: a patch that does not apply and an empty patch are the
policy's doing (reward 0, ``patch_failed`` / ``empty_patch``); a grading sandbox that cannot be
created or prepared is an infra error (the exception propagates).

Callers: :mod:`agentrl.rollout.episode` and :mod:`agentrl.rollout.validate`.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import time
from enum import StrEnum

from pydantic import BaseModel, Field

from agentrl.rollout import grading, metrics
from agentrl.rollout.sandbox_setup import prepare_sandbox
from agentrl.rollout.tasks.model import (
    HarnessVerification,
    NamedTestsVerification,
    RewardFileVerification,
    Task,
)
from agentrl.rollout.tasks.swebench import HARNESS_APPLY_COMMANDS, SCRATCH_DIR, touched_files
from agentrl.sandbox.errors import SandboxCreateError
from agentrl.sandbox.provider import ExecResult, Sandbox, SandboxProvider, SandboxRequest

#: Where the test patch is written before ``git apply`` (outside the repository).
TEST_PATCH_PATH = "/tmp/agentrl_test.patch"
#: Where a harness task's eval script and its log go (relative to the repository, in ``.git``).
EVAL_SCRIPT_PATH = f"{SCRATCH_DIR}/eval.sh"
EVAL_LOG_PATH = f"{SCRATCH_DIR}/test_output.txt"
#: Where a submitted patch is written in the grading sandbox (inside ``.git``: off the tree).
MODEL_PATCH_PATH = f"{SCRATCH_DIR}/model.patch"
#: What the harness runs between two patch commands (a failed ``--reject`` leaves debris).
RESET_TREE = "git checkout -- . ; git clean -fd"

_PYTEST_LINE = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(\S.*?)(?:\s+-\s+.*)?$")
_DJANGO_LINE = re.compile(r"^(\S+ \([^)]+\)) \.\.\. (ok|FAIL|ERROR|skipped.*|expected failure)$")


class VerifierError(Exception):
    """The verifier could not produce a reward: an infra error."""


class GradeStatus(StrEnum):
    """How grading a submitted patch ended (:func:`grade_patch`)."""

    RESOLVED = "resolved"
    """The patch applied and the task's tests passed: reward 1 (harness tasks: resolved)."""
    UNRESOLVED = "unresolved"
    """The patch applied and the tests did not all pass (or ran past the timeout): reward 0."""
    PATCH_FAILED = "patch_failed"
    """No patch command applied the patch to a fresh copy of the task: reward 0."""
    EMPTY_PATCH = "empty_patch"
    """The agent changed nothing: reward 0, no sandbox leased."""


class VerifierResult(BaseModel):
    """A reward and the evidence for it."""

    reward: float
    statuses: dict[str, str] = Field(default_factory=dict)
    """Per-test status parsed from the log (``tests`` tasks)."""
    failing: list[str] = Field(default_factory=list)
    """FAIL_TO_PASS/PASS_TO_PASS tests that did not pass."""
    timed_out: bool = False
    output_tail: str = ""
    seconds: float = 0.0
    resolution: str | None = None
    """Harness tasks: ``RESOLVED_FULL``, ``RESOLVED_PARTIAL`` or ``RESOLVED_NO`` (``None``
    when the log could not be graded)."""
    grade_status: GradeStatus | None = None
    """Set by :func:`grade_patch` (``None`` when the tests ran in the agent's sandbox)."""


def parse_pytest_log(log: str) -> dict[str, str]:
    """Per-test status from ``pytest -rA`` output: ``{"tests/t.py::test_x": "PASSED", ...}``."""
    statuses: dict[str, str] = {}
    for line in log.splitlines():
        match = _PYTEST_LINE.match(line.strip())
        if match:
            statuses[match.group(2)] = match.group(1)
    return statuses


def parse_django_log(log: str) -> dict[str, str]:
    """Per-test status from Django's runner at ``--verbosity 2`` (``PASSED``/``FAILED``/...)."""
    names = {"ok": "PASSED", "FAIL": "FAILED", "ERROR": "ERROR", "expected failure": "XFAIL"}
    statuses: dict[str, str] = {}
    for line in log.splitlines():
        match = _DJANGO_LINE.match(line.strip())
        if match:
            word = match.group(2)
            statuses[match.group(1)] = "SKIPPED" if word.startswith("skipped") else names[word]
    return statuses


def missing_runner(command: str, result: ExecResult) -> str | None:
    """Why the test command never ran a test because the sandbox image lacks its runner (the
    shell found no such command, or Python no such ``-m`` module), or None. That is the image's
    fault, not the policy's: an infra error, never a reward of 0."""
    if result.exit_code in (126, 127) and re.search(
        r"not found|not executable|Permission denied", result.output
    ):
        return f"exit code {result.exit_code}: {result.output.strip()[-200:]}"
    module = re.search(r"(?:^|\s)-m\s+([\w.]+)", command)
    if module and re.search(rf"No module named '?{re.escape(module.group(1))}'?", result.output):
        return f"No module named {module.group(1)}"
    return None


def score_tests(
    verification: NamedTestsVerification, statuses: dict[str, str]
) -> tuple[float, list[str]]:
    """Reward 1.0 when every required test passed, with the list of those that did not."""
    required = [*verification.fail_to_pass, *verification.pass_to_pass]
    failing = [t for t in required if statuses.get(t) not in ("PASSED", "XFAIL")]
    return (0.0 if failing else 1.0), failing


def parse_reward(text: str, path: str) -> float:
    """A reward file's value: a float (``reward.txt``) or ``{"reward": x}`` JSON."""
    stripped = text.strip()
    if not stripped:
        raise VerifierError(f"reward file {path} is empty")
    if path.endswith(".json"):
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise VerifierError(f"reward file {path} is not JSON: {exc}") from exc
        value = data.get("reward") if isinstance(data, dict) else data
        if not isinstance(value, int | float):
            raise VerifierError(f"reward file {path} has no numeric 'reward'")
        return float(value)
    try:
        return float(stripped)
    except ValueError as exc:
        raise VerifierError(f"reward file {path} is not a number: {stripped[:80]!r}") from exc


async def _verify_tests(
    sandbox: Sandbox, verification: NamedTestsVerification, timeout: float
) -> VerifierResult:
    for path, content in verification.test_files.items():
        await sandbox.write_file(path, content)
    if verification.test_patch:
        files = touched_files(verification.test_patch)
        await sandbox.write_file(TEST_PATCH_PATH, verification.test_patch)
        # Put the test files back to the base commit first, so an agent's edits to them
        # neither block the patch nor survive it (the SWE-bench harness does the same).
        quoted = " ".join(shlex.quote(f) for f in files)
        prepared = await sandbox.exec(
            f"git checkout -q HEAD -- {quoted} 2>/dev/null; git apply {TEST_PATCH_PATH}",
            timeout=timeout,
        )
        if prepared.exit_code != 0:
            raise VerifierError(f"test patch does not apply: {prepared.output[-500:]}")
    result = await sandbox.exec(verification.test_command, timeout=timeout)
    parser = parse_django_log if verification.log_format == "django" else parse_pytest_log
    statuses = parser(result.output)
    missing = None if statuses else missing_runner(verification.test_command, result)
    if missing is not None:
        raise VerifierError(
            f"the sandbox image cannot run the tests ({missing}; command "
            f"{verification.test_command!r}): set spec.sandbox.image (or the task's image) to "
            "one that has the test runner, e.g. images/sandbox for the toy tasks"
        )
    reward, failing = score_tests(verification, statuses)
    return VerifierResult(
        reward=reward,
        statuses=statuses,
        failing=failing,
        timed_out=result.timed_out,
        output_tail=result.output[-2000:],
    )


async def _verify_harness(
    sandbox: Sandbox, verification: HarnessVerification, timeout: float
) -> VerifierResult:
    await sandbox.write_file(EVAL_SCRIPT_PATH, verification.eval_script)
    run = await sandbox.exec(
        f"/bin/bash {EVAL_SCRIPT_PATH} > {EVAL_LOG_PATH} 2>&1", timeout=timeout
    )
    try:
        log = (await sandbox.read_file(EVAL_LOG_PATH)).decode(errors="replace")
    except FileNotFoundError as exc:
        raise VerifierError(
            f"the eval script left no log (exit code {run.exit_code}): {run.output[-300:]}"
        ) from exc
    if run.timed_out:
        return VerifierResult(reward=0.0, timed_out=True, output_tail=log[-2000:])
    verdict = grading.grade(
        log,
        harness=grading.Harness(verification.harness),
        log_parser=verification.log_parser,
        eval_type=grading.EvalType(verification.eval_type),
        fail_to_pass=verification.fail_to_pass,
        pass_to_pass=verification.pass_to_pass,
    )
    if not verdict.found:
        if verdict.infra is not None and verdict.infra[1] == grading.TIER_ENVIRONMENT:
            raise VerifierError(
                f"the evaluation hit an environment fault ({verdict.infra[0]}): {log[-300:]}"
            )
        return VerifierResult(
            reward=0.0,
            failing=[*verification.fail_to_pass, *verification.pass_to_pass],
            output_tail=log[-2000:],
        )
    assert verdict.report is not None
    report = verdict.report
    failing = [*report.fail_to_pass.failure, *report.pass_to_pass.failure]
    return VerifierResult(
        reward=1.0 if verdict.resolved else 0.0,
        statuses=verdict.statuses,
        failing=failing,
        output_tail=log[-2000:],
        resolution=verdict.resolution.value,
    )


async def _verify_reward_file(
    sandbox: Sandbox, verification: RewardFileVerification, timeout: float
) -> VerifierResult:
    for path, content in verification.files.items():
        await sandbox.write_file(path, content)
    limit = min(timeout, verification.timeout_seconds or timeout)
    result = await sandbox.exec(verification.command, timeout=limit)
    if result.timed_out:
        return VerifierResult(reward=0.0, timed_out=True, output_tail=result.output[-2000:])
    for path in verification.reward_paths:
        try:
            text = (await sandbox.read_file(path)).decode(errors="replace")
        except FileNotFoundError:
            continue
        return VerifierResult(reward=parse_reward(text, path), output_tail=result.output[-2000:])
    raise VerifierError(
        f"the test script wrote no reward file ({', '.join(verification.reward_paths)}); "
        f"exit code {result.exit_code}: {result.output[-300:]}"
    )


async def verify(sandbox: Sandbox, task: Task, *, timeout: float) -> VerifierResult:
    """Run the task's tests in ``sandbox`` and score them."""
    start = time.monotonic()
    verification = task.verification
    if isinstance(verification, NamedTestsVerification):
        result = await _verify_tests(sandbox, verification, timeout)
    elif isinstance(verification, HarnessVerification):
        result = await _verify_harness(sandbox, verification, timeout)
    else:
        result = await _verify_reward_file(sandbox, verification, timeout)
    seconds = time.monotonic() - start
    metrics.VERIFIER_SECONDS.observe(seconds)
    return result.model_copy(update={"seconds": seconds})


async def apply_patch(sandbox: Sandbox, patch: str, *, timeout: float) -> str | None:
    """Apply ``patch`` in ``sandbox``'s repository as the harness applies a prediction; the
    last command's output when none applied it, else None."""
    await sandbox.write_file(MODEL_PATCH_PATH, patch)
    output = ""
    for attempt, command in enumerate(HARNESS_APPLY_COMMANDS):
        if attempt:
            await sandbox.exec(RESET_TREE, timeout=timeout)
        result = await sandbox.exec(f"{command} {MODEL_PATCH_PATH}", timeout=timeout)
        if result.ok:
            return None
        output = result.output
    check = await sandbox.exec(f"git apply --check --reverse {MODEL_PATCH_PATH}", timeout=timeout)
    return None if check.ok else output or "the patch applies with no command"


async def grade_patch(
    provider: SandboxProvider,
    task: Task,
    patch: str,
    *,
    timeout: float,
    episode_id: str,
    startup_timeout: float | None = None,
) -> VerifierResult:
    """Grade a submitted ``patch`` in a fresh sandbox of ``task``: apply it there, then run the
    task's verification (:func:`verify`). ``timeout`` bounds each command (the patch commands,
    the setup, the tests); ``startup_timeout`` the sandbox's creation. A sandbox that cannot be
    created (:class:`~agentrl.sandbox.errors.SandboxCreateError`) or prepared
    (:class:`~agentrl.rollout.sandbox_setup.SetupError`) raises: an infra error."""
    start = time.monotonic()
    if not patch.strip():
        return VerifierResult(reward=0.0, grade_status=GradeStatus.EMPTY_PATCH)
    request = SandboxRequest(
        episode_id=f"{episode_id}-grade",
        image=task.image,
        template=task.template,
        workdir=task.workdir,
    )
    try:
        async with asyncio.timeout(startup_timeout):
            sandbox = await provider.create(request)
    except TimeoutError as exc:
        raise SandboxCreateError(
            f"grading sandbox not ready within {startup_timeout:g}s", provider=provider.name
        ) from exc
    async with sandbox:
        await prepare_sandbox(sandbox, task, timeout=timeout)
        problem = await apply_patch(sandbox, patch, timeout=timeout)
        if problem is not None:
            metrics.VERIFIER_SECONDS.observe(time.monotonic() - start)
            return VerifierResult(
                reward=0.0,
                grade_status=GradeStatus.PATCH_FAILED,
                output_tail=problem[-2000:],
                seconds=time.monotonic() - start,
            )
        result = await verify(sandbox, task, timeout=timeout)
    status = GradeStatus.RESOLVED if result.reward == 1.0 else GradeStatus.UNRESOLVED
    return result.model_copy(
        update={"grade_status": status, "seconds": time.monotonic() - start}
    )
