"""What every tool shares: its result, how a command's output is shown, the output cut, and
an exact-once text replacement.

The tools themselves (``bash``, ``str_replace_editor``, ``submit``, and the toy tasks'
``apply_edit`` and ``run_tests``) are :class:`~agentrl.rollout.swe_tools.SWEToolRunner`. A
command that fails or times out is an observation for the agent; only a sandbox failure raises
(:class:`~agentrl.sandbox.errors.SandboxError`, an infra error). Every observation is cut to
``rollout.toolOutputMaxBytes`` (head and tail kept) before the agent sees it.

Callers: :mod:`agentrl.rollout.swe_tools`, :mod:`agentrl.rollout.validate`.
"""

from __future__ import annotations

from pydantic import BaseModel

from agentrl.rollout import metrics
from agentrl.sandbox.provider import ExecResult, Sandbox


class ToolResult(BaseModel):
    """What a tool call produced."""

    observation: str
    submitted: bool = False
    seconds: float = 0.0
    patch: str | None = None
    """``submit`` of :class:`~agentrl.rollout.swe_tools.SWEToolRunner`: the agent's diff
    against the base commit (what grading applies in a fresh sandbox)."""


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
