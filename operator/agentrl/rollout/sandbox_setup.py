"""Putting a task into a freshly leased sandbox: its files, then its setup commands.

One function for every sandbox a task is laid into — the agent's
(:mod:`agentrl.rollout.episode`), the clean grading sandbox
(:func:`agentrl.rollout.verifier.grade_patch`) and the dataset check
(:mod:`agentrl.rollout.validate`) — so they cannot drift apart.
"""

from __future__ import annotations

from agentrl.rollout.tasks.model import Task
from agentrl.sandbox.provider import Sandbox


class SetupError(Exception):
    """The task's files or setup commands could not be put in place: an infra error."""


async def prepare_sandbox(sandbox: Sandbox, task: Task, *, timeout: float) -> None:
    """Write the task's files and run its setup commands (a failing one raises SetupError)."""
    for path, content in task.files.items():
        await sandbox.write_file(path, content)
    for command in task.setup_commands:
        result = await sandbox.exec(command, timeout=timeout)
        if not result.ok:
            raise SetupError(f"setup command {command!r} failed: {result.output[-300:]}")
