"""``agentrl tasks traces``: expert conversations to warm a model up on before RL (SFT).

A scripted solver works each bundled toy task the way the native tool-call agent would
(:mod:`agentrl.rollout.agent`): it writes every turn as text in the job's tool-call syntax
(:meth:`~agentrl.rollout.toolcalls.ToolCallParser.format_call`), the job's parser reads the
calls back from that text, the SWE tools run them in a real sandbox of the task
(:class:`~agentrl.rollout.swe_tools.SWEToolRunner`), and the results go into the conversation as
the rollout puts them there (the remaining turns on the observation when
``spec.rollout.showRemainingTurns``). The solver runs the failing tests, fixes the bug (the
task's reference edit) and runs the tests again before it submits. It fixes with the tool the
job's rollout offers: ``apply_edit`` with the reference edit's name, when the job offers it
(``edits``: the toy tasks' candidate edits, :func:`agentrl.rollout.tasks.offered_edits`), else
it views the function around the bug and replaces the buggy text with
``str_replace_editor``. A conversation is written only when the task's own verifier scores the
result 1 (reward in the sandbox the solver worked in, as toy episodes are graded).

Each line of the output is ``{"messages": [...], "tools": [...]}``: OpenAI chat messages
(assistant messages with ``tool_calls``, ``tool`` messages with the results) and the OpenAI tool
definitions of :func:`~agentrl.rollout.swe_tools.tool_schemas` — the format
``spec.trainer.warmStart.dataset`` reads. Only the training split is solved
(``spec.dataset.heldOutFraction``): a trace of a held-out task would leak its fix into the
pass@1 measured on it.

Callers: ``agentrl tasks traces``; the local run's warm-start set; tests.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from agentrl.rollout.agent import SYSTEM_PROMPT
from agentrl.rollout.caps import EpisodeCaps
from agentrl.rollout.sandbox_setup import prepare_sandbox
from agentrl.rollout.swe_tools import (
    APPLY_EDIT,
    BASH,
    EDITOR,
    SUBMIT,
    SWEToolRunner,
    tool_schemas,
    with_remaining_turns,
)
from agentrl.rollout.tasks.model import CandidateEdit, Task
from agentrl.rollout.toolcalls import ParsedToolCall, ToolCallParser
from agentrl.rollout.verifier import verify
from agentrl.sandbox.provider import SandboxProvider, SandboxRequest

#: Lines shown each side of the buggy line when the solver views the file.
VIEW_CONTEXT_LINES = 3


class TraceError(RuntimeError):
    """A task the scripted solver cannot turn into a resolved conversation."""


class ScriptedTurn(BaseModel):
    """One turn of the solver: a sentence, then one tool call."""

    thought: str
    call: ParsedToolCall


class Trace(BaseModel):
    """One expert conversation, as a warm-start line."""

    task_id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]

    def line(self) -> str:
        """The JSONL line (``messages`` and ``tools``; the task id stays out of the data)."""
        return json.dumps({"messages": self.messages, "tools": self.tools}, ensure_ascii=False)


def _fix(task: Task) -> CandidateEdit:
    name = task.reference.edit
    fix = next((e for e in task.candidate_edits if e.name == name), None)
    if fix is None:
        raise TraceError(f"{task.id}: no reference edit among its candidate edits")
    return fix


def toy_solution_turns(task: Task, *, apply_edit: bool = False) -> list[ScriptedTurn]:
    """The solver's turns for a toy task: test, fix, test, submit. ``apply_edit``: fix with
    that tool (the reference edit's name), else view the bug's surroundings and replace the
    buggy text with the editor."""
    if task.source != "toy" or task.visible_test_command is None:
        raise TraceError(f"{task.id}: the scripted solver knows toy tasks only")
    fix = _fix(task)
    if apply_edit:
        test = task.visible_test_command
        return [
            ScriptedTurn(
                thought="Let me run the tests to see what fails.",
                call=ParsedToolCall(name=BASH, arguments={"command": test}),
            ),
            ScriptedTurn(
                thought="The failure points to this kind of bug. I will apply its fix.",
                call=ParsedToolCall(name=APPLY_EDIT, arguments={"name": fix.name}),
            ),
            ScriptedTurn(
                thought="Let me run the tests again.",
                call=ParsedToolCall(name=BASH, arguments={"command": test}),
            ),
            ScriptedTurn(
                thought="The tests pass. I will submit.", call=ParsedToolCall(name=SUBMIT)
            ),
        ]
    lines = task.files[fix.path].split("\n")
    at = next((i for i, line in enumerate(lines) if fix.old.split("\n")[0] in line), None)
    if at is None:
        raise TraceError(f"{task.id}: the buggy text of {fix.path} is not in the file")
    first = max(1, at + 1 - VIEW_CONTEXT_LINES)
    last = min(len(lines), at + 1 + VIEW_CONTEXT_LINES)
    test = task.visible_test_command

    def call(name: str, **arguments: Any) -> ParsedToolCall:
        return ParsedToolCall(name=name, arguments=arguments)

    return [
        ScriptedTurn(
            thought="Let me run the tests to see what fails.", call=call(BASH, command=test)
        ),
        ScriptedTurn(
            thought=f"Let me look at the code around the failure in {fix.path}.",
            call=call(EDITOR, command="view", path=fix.path, view_range=[first, last]),
        ),
        ScriptedTurn(
            thought=f"Line {at + 1} is wrong. I will fix it.",
            call=call(
                EDITOR, command="str_replace", path=fix.path, old_str=fix.old, new_str=fix.new
            ),
        ),
        ScriptedTurn(thought="Let me run the tests again.", call=call(BASH, command=test)),
        ScriptedTurn(thought="The tests pass. I will submit.", call=call(SUBMIT)),
    ]


async def record_trace(
    task: Task,
    provider: SandboxProvider,
    parser: ToolCallParser,
    caps: EpisodeCaps,
    *,
    turns: Sequence[ScriptedTurn] | None = None,
    edits: Sequence[str] = (),
) -> Trace:
    """Work ``task`` with the scripted solver (or ``turns``) in a sandbox from ``provider``,
    offered the SWE tools (and ``apply_edit`` over ``edits``, which the solver then fixes
    with); :class:`TraceError` when a call does not read back, the turn cap is too small, or
    the result does not score 1."""
    script = list(turns) if turns is not None else toy_solution_turns(task, apply_edit=bool(edits))
    if len(script) > caps.max_turns:
        raise TraceError(
            f"{task.id}: the solver needs {len(script)} turns and spec.rollout.maxTurns is "
            f"{caps.max_turns}"
        )
    schemas = tool_schemas(edits)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task.instruction},
    ]
    request = SandboxRequest(
        episode_id=f"trace-{task.id}-{uuid.uuid4().hex[:8]}",
        image=task.image,
        template=task.template,
        workdir=task.workdir,
    )
    sandbox = await provider.create(request)
    async with sandbox:
        await prepare_sandbox(sandbox, task, timeout=caps.tool_timeout_seconds)
        tools = SWEToolRunner(
            sandbox,
            task,
            timeout_seconds=caps.tool_timeout_seconds,
            output_max_bytes=caps.tool_output_max_bytes,
        )
        submitted = False
        for index, turn in enumerate(script):
            text = f"{turn.thought}\n{parser.format_call(turn.call)}"
            reply = parser.parse(text, schemas)
            if reply.error is not None or [c.name for c in reply.calls] != [turn.call.name]:
                raise TraceError(f"{task.id}: turn {index + 1} does not read back: {reply.error}")
            messages.append(reply.assistant_message())
            result = await tools.call(reply.calls[0].name, reply.calls[0].arguments)
            if result.submitted:
                submitted = True
                break
            observation = result.observation
            if caps.show_remaining_turns:
                observation = with_remaining_turns(observation, caps.max_turns - index - 1)
            messages.append({"role": "tool", "content": observation})
        if not submitted:
            raise TraceError(f"{task.id}: the solver never submitted")
        graded = await verify(sandbox, task, timeout=caps.verifier_timeout_seconds)
    if graded.reward != 1.0:
        raise TraceError(
            f"{task.id}: the solved repository scores {graded.reward} (failing: {graded.failing})"
        )
    return Trace(task_id=task.id, messages=messages, tools=schemas)


class TraceReport(BaseModel):
    """What :func:`write_traces` wrote and what it could not."""

    written: int
    failed: dict[str, str]
    """Task id → why no conversation was written for it."""


async def write_traces(
    tasks: Sequence[Task],
    provider: SandboxProvider,
    parser: ToolCallParser,
    caps: EpisodeCaps,
    out: Path,
    *,
    concurrency: int = 4,
    edits: Sequence[str] = (),
) -> TraceReport:
    """Record a trace of every task, ``concurrency`` at once, and write them to ``out`` in task
    order (one JSON object per line). ``edits``: offer ``apply_edit`` over them (the job's
    :func:`agentrl.rollout.tasks.offered_edits`)."""
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(task: Task) -> Trace | str:
        async with gate:
            try:
                return await record_trace(task, provider, parser, caps, edits=edits)
            except TraceError as exc:
                return str(exc)

    results = await asyncio.gather(*(one(t) for t in tasks))
    traces = [r for r in results if isinstance(r, Trace)]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(t.line() + "\n" for t in traces), encoding="utf-8")
    failed = {t.id: r for t, r in zip(tasks, results, strict=True) if isinstance(r, str)}
    return TraceReport(written=len(traces), failed=failed)
