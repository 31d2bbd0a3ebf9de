"""The agent's tools and how they run in a sandbox.

Tools (``docs/design/toy-agent-contract.md``): ``run_tests`` (the task's visible tests),
``view PATH``, ``bash CMD``, ``apply EDIT_NAME`` (toy tasks' named candidate edits), ``edit``
(replace one exact occurrence of a text in a file; chat agents) and ``submit``. A command that
fails or times out is an observation for the agent; only a sandbox failure raises
(:class:`~agentrl.sandbox.errors.SandboxError`, an infra error).

Every observation is cut to ``rollout.toolOutputMaxBytes`` (head and tail kept) before the agent
sees it.

The native tool-call set (``bash``, ``str_replace_editor``, ``submit`` with the patch) is
:mod:`agentrl.rollout.swe_tools`, which extends :class:`ToolRunner`.

Callers: :mod:`agentrl.rollout.agent` (both scaffolds), :mod:`agentrl.rollout.swe_tools`.
"""

from __future__ import annotations

import shlex

from pydantic import BaseModel, Field

from agentrl.rollout import metrics
from agentrl.rollout.tasks.model import Task
from agentrl.sandbox.provider import ExecResult, Sandbox

TOOL_NAMES = ("run_tests", "view", "bash", "apply", "edit", "submit")


class ToolCall(BaseModel):
    """One tool call: its name and either a free-text argument or named arguments."""

    name: str
    argument: str = ""
    """The rest of the line for text actions (``view PATH``, ``bash CMD``, ``apply NAME``)."""
    arguments: dict[str, str] = Field(default_factory=dict)
    """Named arguments of chat tool calls (``edit``: path, old, new)."""


class ToolResult(BaseModel):
    """What a tool call produced."""

    observation: str
    submitted: bool = False
    seconds: float = 0.0
    patch: str | None = None
    """``submit`` of :class:`~agentrl.rollout.swe_tools.SWEToolRunner`: the agent's diff
    against the base commit (what grading applies in a fresh sandbox)."""


def parse_action(text: str) -> ToolCall | None:
    """The text action on the first non-empty line of a reply, or None if it names no tool."""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        name, _, rest = stripped.partition(" ")
        if name in TOOL_NAMES:
            return ToolCall(name=name, argument=rest.strip())
        return None
    return None


def truncate_output(text: str, max_bytes: int) -> str:
    """``text`` cut to ``max_bytes`` UTF-8 bytes, keeping its head and tail (the end of a test
    run is where the summary is)."""
    data = text.encode()
    if len(data) <= max_bytes:
        return text
    metrics.TOOL_OUTPUT_CUTS.inc()
    marker = f"\n[... {len(data) - max_bytes} bytes truncated ...]\n".encode()
    keep = max(0, max_bytes - len(marker))
    head = data[: keep // 2]
    tail = data[len(data) - (keep - keep // 2) :] if keep - keep // 2 else b""
    return (head + marker + tail).decode(errors="ignore")


def format_exec(result: ExecResult, timeout: float) -> str:
    """A command's output as the agent sees it."""
    text = result.output.rstrip("\n")
    if result.timed_out:
        return f"{text}\n[command timed out after {timeout:g}s and was killed]".lstrip("\n")
    return f"{text}\n[exit code {result.exit_code}]".lstrip("\n")


async def replace_once(sandbox: Sandbox, path: str, old: str, new: str) -> str | None:
    """Replace the single occurrence of ``old`` in ``path``; the reason when it cannot."""
    try:
        text = (await sandbox.read_file(path)).decode(errors="replace")
    except FileNotFoundError:
        return f"no such file: {path}"
    found = text.count(old) if old else 0
    if found != 1:
        return f"expected exactly one occurrence of the old text in {path}, found {found}"
    await sandbox.write_file(path, text.replace(old, new))
    return None


class ToolRunner:
    """Runs tool calls for one episode in its sandbox."""

    def __init__(
        self, sandbox: Sandbox, task: Task, *, timeout_seconds: float, output_max_bytes: int
    ) -> None:
        self.sandbox = sandbox
        self.task = task
        self.timeout_seconds = timeout_seconds
        self.output_max_bytes = output_max_bytes

    def describe(self) -> str:
        """The tool list shown to a text agent."""
        lines = [
            "Reply with exactly one action on the first line:",
            "run_tests | view PATH | bash CMD | apply EDIT_NAME | submit",
        ]
        if self.task.candidate_edits:
            names = " ".join(e.name for e in self.task.candidate_edits)
            lines.append(f"candidate edits: {names}")
        return "\n".join(lines)

    async def run(self, call: ToolCall | None) -> ToolResult:
        if call is None:
            return ToolResult(observation=f"unknown action.\n{self.describe()}")
        handler = {
            "run_tests": self._run_tests,
            "view": self._view,
            "bash": self._bash,
            "apply": self._apply,
            "edit": self._edit,
            "submit": self._submit,
        }[call.name]
        result = await handler(call)
        return result.model_copy(
            update={"observation": truncate_output(result.observation, self.output_max_bytes)}
        )

    async def _exec(self, command: str) -> ToolResult:
        result = await self.sandbox.exec(command, timeout=self.timeout_seconds)
        return ToolResult(
            observation=format_exec(result, self.timeout_seconds),
            seconds=result.duration_seconds,
        )

    async def _run_tests(self, call: ToolCall) -> ToolResult:
        if not self.task.visible_test_command:
            return ToolResult(observation="this task has no visible tests; use bash to run some")
        return await self._exec(self.task.visible_test_command)

    async def _view(self, call: ToolCall) -> ToolResult:
        path = call.argument or call.arguments.get("path", "")
        if not path:
            return ToolResult(observation="usage: view PATH")
        try:
            data = await self.sandbox.read_file(path)
        except FileNotFoundError:
            return ToolResult(observation=f"no such file: {path}")
        return ToolResult(observation=data.decode(errors="replace"))

    async def _bash(self, call: ToolCall) -> ToolResult:
        command = call.argument or call.arguments.get("command", "")
        if not command:
            return ToolResult(observation="usage: bash CMD")
        return await self._exec(command)

    async def _apply(self, call: ToolCall) -> ToolResult:
        name = call.argument or call.arguments.get("name", "")
        edits = {e.name: e for e in self.task.candidate_edits}
        if name not in edits:
            known = " ".join(edits) or "(none)"
            return ToolResult(observation=f"unknown edit {name!r}; candidate edits: {known}")
        edit = edits[name]
        # Candidate edits are alternatives, each written against the task's original files:
        # applying one first undoes whichever was applied before, so trying another candidate
        # after a failing test run is one action, not a revert plus an apply.
        for path in sorted({e.path for e in self.task.candidate_edits}):
            original = self.task.files.get(path)
            if original is not None:
                await self.sandbox.write_file(path, original)
        problem = await replace_once(self.sandbox, edit.path, edit.old, edit.new)
        if problem is not None:
            return ToolResult(observation=f"edit {name} does not apply: {problem}")
        return ToolResult(observation=f"applied {name} to {edit.path}")

    async def _edit(self, call: ToolCall) -> ToolResult:
        args = call.arguments
        path, old, new = args.get("path", ""), args.get("old", ""), args.get("new", "")
        if not path or not old:
            return ToolResult(observation="usage: edit(path, old, new) with a non-empty old text")
        problem = await replace_once(self.sandbox, path, old, new)
        if problem is not None:
            return ToolResult(observation=f"edit not applied: {problem}")
        return ToolResult(observation=f"edited {shlex.quote(path)}")

    async def _submit(self, call: ToolCall) -> ToolResult:
        return ToolResult(observation="submitted", submitted=True)
