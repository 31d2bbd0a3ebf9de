"""``agentrl tasks validate``: every task's reference solution must score 1 and the untouched
repository 0, each in a fresh sandbox.

For toy tasks the check goes further: every decoy candidate edit must score 0 too ("exactly one
candidate fixes it"), when ``check_candidates`` is set.

SWE-bench and SWE-smith tasks take the same path as an episode's verifier: the instance's eval
script, its log parser and the harness's grading (:mod:`agentrl.rollout.verifier`). The gold
patch goes in as the harness applies a prediction: each of its patch commands in turn
(``git apply --verbose``, ``--3way``, ``--reject``, then ``patch --fuzz=5``), the tree reset
between tries, and a final ``git apply --check --reverse`` accepting a patch that is in although
every command complained. SWE-smith's reference reverts the bug patch.

Callers: :mod:`agentrl.rollout.tasks.cli` and tests.
"""

from __future__ import annotations

import asyncio
import uuid

from pydantic import BaseModel, Field

from agentrl.rollout.episode import infra_reason
from agentrl.rollout.sandbox_setup import prepare_sandbox
from agentrl.rollout.tasks.model import Task
from agentrl.rollout.tasks.swebench import SCRATCH_DIR
from agentrl.rollout.tools import replace_once
from agentrl.rollout.verifier import verify
from agentrl.sandbox.provider import Sandbox, SandboxProvider, SandboxRequest

#: Inside the repository's ``.git``: outside the work tree, writable under every provider.
GOLD_PATCH_PATH = f"{SCRATCH_DIR}/gold.patch"
#: What the harness runs between two patch commands (a failed ``--reject`` leaves debris).
RESET_TREE = "git checkout -- . ; git clean -fd"
SOLVE_SCRIPT_PATH = "/tmp/agentrl_solve.sh"


class Check(BaseModel):
    """One run of a task in a sandbox and what it should have scored."""

    variant: str
    """``untouched``, ``reference`` or ``candidate:NAME``."""
    expected: float
    reward: float | None = None
    problem: str | None = None
    """Why it did not score as expected (or could not be scored)."""


class TaskReport(BaseModel):
    task_id: str
    checks: list[Check] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.problem is None for c in self.checks)


async def _apply_reference(sandbox: Sandbox, task: Task, timeout: float) -> str | None:
    ref = task.reference
    if ref.edit is not None:
        edit = next((e for e in task.candidate_edits if e.name == ref.edit), None)
        if edit is None:
            return f"reference edit {ref.edit!r} is not among the candidate edits"
        return await replace_once(sandbox, edit.path, edit.old, edit.new)
    if ref.patch is not None:
        return await _apply_patch(
            sandbox, ref.patch, ref.patch_commands, ref.patch_reverse, timeout
        )
    if ref.script is not None:
        await sandbox.write_file(SOLVE_SCRIPT_PATH, ref.script)
        result = await sandbox.exec(f"bash {SOLVE_SCRIPT_PATH}", timeout=timeout)
        return None if result.ok else f"solve.sh failed: {result.output[-300:]}"
    return "the task has no reference solution"


async def _apply_patch(
    sandbox: Sandbox, patch: str, commands: list[str], reverse: bool, timeout: float
) -> str | None:
    await sandbox.write_file(GOLD_PATCH_PATH, patch)
    if reverse:
        result = await sandbox.exec(f"git apply -R {GOLD_PATCH_PATH}", timeout=timeout)
        return None if result.ok else f"the bug patch does not revert: {result.output[-300:]}"
    output = ""
    for attempt, command in enumerate(commands):
        if attempt:
            await sandbox.exec(RESET_TREE, timeout=timeout)
        result = await sandbox.exec(f"{command} {GOLD_PATCH_PATH}", timeout=timeout)
        if result.ok:
            return None
        output = result.output
    if len(commands) > 1:
        check = await sandbox.exec(
            f"git apply --check --reverse {GOLD_PATCH_PATH}", timeout=timeout
        )
        if check.ok:
            return None
    return f"gold patch does not apply: {output[-300:]}"


async def _run_variant(
    provider: SandboxProvider,
    task: Task,
    variant: str,
    expected: float,
    *,
    timeout: float,
) -> Check:
    request = SandboxRequest(
        episode_id=f"validate-{uuid.uuid4().hex[:10]}",
        image=task.image,
        template=task.template,
        workdir=task.workdir,
    )
    check = Check(variant=variant, expected=expected)
    try:
        async with await provider.create(request) as sandbox:
            await prepare_sandbox(sandbox, task, timeout=timeout)
            problem: str | None = None
            if variant == "reference":
                problem = await _apply_reference(sandbox, task, timeout)
            elif variant.startswith("candidate:"):
                name = variant.split(":", 1)[1]
                edit = next(e for e in task.candidate_edits if e.name == name)
                problem = await replace_once(sandbox, edit.path, edit.old, edit.new)
                if problem is not None:
                    problem = f"candidate edit does not apply: {problem}"
            if problem is not None:
                check.problem = problem
                return check
            result = await verify(sandbox, task, timeout=timeout)
    except Exception as exc:
        check.problem = f"infra error ({infra_reason(exc)}): {type(exc).__name__}: {exc}"
        return check
    check.reward = result.reward
    if result.reward != expected:
        evidence = ", ".join(result.failing[:5]) or result.output_tail[-300:]
        if expected == 1.0:
            check.problem = f"scored {result.reward:g}, expected 1; failing: {evidence}"
        else:
            check.problem = f"scored {result.reward:g}, expected 0: the tests already pass"
    return check


async def validate_task(
    provider: SandboxProvider,
    task: Task,
    *,
    timeout: float = 600.0,
    check_candidates: bool = False,
) -> TaskReport:
    """Run the task untouched, with its reference solution, and optionally with each decoy."""
    variants: list[tuple[str, float]] = [("untouched", 0.0), ("reference", 1.0)]
    if check_candidates:
        variants += [
            (f"candidate:{e.name}", 0.0)
            for e in task.candidate_edits
            if e.name != task.reference.edit
        ]
    checks = await asyncio.gather(
        *(_run_variant(provider, task, v, exp, timeout=timeout) for v, exp in variants)
    )
    return TaskReport(task_id=task.id, checks=list(checks))


async def validate_dataset(
    provider: SandboxProvider,
    tasks: list[Task],
    *,
    concurrency: int,
    timeout: float = 600.0,
    check_candidates: bool = False,
) -> list[TaskReport]:
    """Validate every task, ``concurrency`` tasks at a time; reports in task order."""
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(task: Task) -> TaskReport:
        async with gate:
            return await validate_task(
                provider,
                task,
                timeout=timeout,
                check_candidates=check_candidates,
            )

    return list(await asyncio.gather(*(one(t) for t in tasks)))
