"""Text actions: the call syntax of a model without a tool-call template (the tiny policy).

One agent acts for every model (:class:`~agentrl.rollout.agent.TokenAgent`); what differs is
how a reply's calls are written. A model with a tool-calling chat template writes them in the
template's syntax and a :mod:`~agentrl.rollout.toolcalls` parser reads them. A model without
one (the tiny policy's word tokenizer, or a Hugging Face tokenizer given no
``spec.model.toolCallParser``) writes one action on the first non-empty line of its reply::

    run_tests | view PATH | bash CMD | apply EDIT_NAME | submit

and :func:`parse_text_action` reads that line into the same
:class:`~agentrl.rollout.toolcalls.ParsedReply` as a native call, naming the same tools of
:class:`~agentrl.rollout.swe_tools.SWEToolRunner`: ``view PATH`` is ``str_replace_editor``'s
``view``, ``bash CMD`` is ``bash``, ``apply NAME`` is ``apply_edit`` and ``run_tests`` the
task's visible tests (toy tasks). A line that names no action is the reply's error
(``unknown_tool``), counted like a malformed native call; an empty reply has no call.

The actions are listed to the model in its first user message (:func:`task_message`), with the
task's candidate edits, since a template without tools cannot show them.

Callers: the turn tokenizers (:mod:`agentrl.rollout.agent`, :mod:`agentrl.rollout.hf_tokenizer`).
"""

from __future__ import annotations

from typing import Final

from agentrl.rollout.swe_tools import APPLY_EDIT, BASH, EDITOR, RUN_TESTS, SUBMIT
from agentrl.rollout.tasks.model import Task
from agentrl.rollout.toolcalls import ParsedReply, ParsedToolCall, ParseFailure, ToolCallError

#: The actions, as the model is told them.
ACTIONS_LINE: Final = "run_tests | view PATH | bash CMD | apply EDIT_NAME | submit"
ACTION_WORDS: Final = ("run_tests", "view", "bash", "apply", "submit")


def actions_help(task: Task) -> str:
    """The action list a model acting in text actions is shown (the task's candidate edits
    included)."""
    lines = ["Reply with exactly one action on the first line:", ACTIONS_LINE]
    if task.candidate_edits:
        lines.append(f"candidate edits: {' '.join(e.name for e in task.candidate_edits)}")
    return "\n".join(lines)


def task_message(task: Task) -> str:
    """The first user message of an episode in text actions: the instruction and the actions."""
    return f"{task.instruction}\n\n{actions_help(task)}"


def _call(word: str, rest: str) -> ParsedToolCall:
    if word == "view":
        return ParsedToolCall(name=EDITOR, arguments={"command": "view", "path": rest})
    if word == "bash":
        return ParsedToolCall(name=BASH, arguments={"command": rest})
    if word == "apply":
        return ParsedToolCall(name=APPLY_EDIT, arguments={"name": rest})
    if word == "submit":
        return ParsedToolCall(name=SUBMIT)
    return ParsedToolCall(name=RUN_TESTS)


def parse_text_action(text: str) -> ParsedReply:
    """The action on the first non-empty line of ``text`` as a reply with one call; a line that
    names no action is the reply's ``unknown_tool`` error, an empty reply has no call."""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        word, _, rest = stripped.partition(" ")
        if word not in ACTION_WORDS:
            error = ToolCallError(
                reason=ParseFailure.UNKNOWN_TOOL,
                detail=f"{word[:40]!r} is not an action; reply with one of: {ACTIONS_LINE}",
            )
            return ParsedReply(text=text, content=text, error=error, text_action=True)
        return ParsedReply(
            text=text, content=text, calls=[_call(word, rest.strip())], text_action=True
        )
    return ParsedReply(text=text, content=text, text_action=True)
