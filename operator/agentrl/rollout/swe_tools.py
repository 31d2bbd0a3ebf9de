"""The tools SWE agents know, as OpenAI function tools: ``bash``, ``str_replace_editor`` and
``submit`` (the set SWE-agent and the public trajectory datasets use), and ``apply_edit`` for a
dataset whose tasks name candidate edits (the bundled toy tasks: the text actions' ``apply
NAME`` as a native tool, its ``name`` an enum of the edits).

``bash`` runs one command with ``/bin/bash`` (not ``/bin/sh``) in a fresh shell in the
repository, after the task's ``shell_setup`` lines (SWE-bench/SWE-smith images: activate the
``testbed`` conda environment as their eval scripts do), killed after the per-command timeout;
its output is cut head and tail around a marker. ``str_replace_editor`` views files
(``cat -n`` numbering, an optional ``[start, end]`` line range) and directories (two levels,
hidden entries left out), creates files (never over an existing one), replaces a text that
occurs exactly once (no match and several matches are told apart, the latter with the lines
they start on), inserts after a line, and undoes the last edit of a file. ``submit`` ends the
episode with the patch: everything the agent changed against the commit the repository was at
before its first tool call (``git add -A`` then ``git diff --cached BASE``, so new files are
in; binary files are left out, a text diff cannot carry them).

Every argument arrives as the model wrote it (JSON from a native tool call, strings from an
XML-style parser); numbers in strings are accepted. A wrong call is an observation for the
agent, never an exception; only a sandbox failure raises
(:class:`~agentrl.sandbox.errors.SandboxError`, an infra error).

:func:`tool_schemas` is the ``tools=`` list for a chat template or ``/v1/chat/completions``;
:meth:`SWEToolRunner.call` runs one named call; :func:`with_remaining_turns` appends the turns
left to an observation.

Callers: the native tool-call agent scaffold (:mod:`agentrl.rollout.agent`) and tests.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Any, Final

from agentrl.rollout.tasks.model import Task
from agentrl.rollout.tools import ToolResult, format_exec, replace_once, truncate_output
from agentrl.sandbox.provider import Sandbox, resolve_path

BASH: Final = "bash"
EDITOR: Final = "str_replace_editor"
SUBMIT: Final = "submit"
SWE_TOOL_NAMES: Final = (BASH, EDITOR, SUBMIT)
#: The toy tasks' named candidate edits as a native tool (the text actions' ``apply NAME``):
#: offered only to a job whose tasks have them (:func:`tool_schemas` ``edits``).
APPLY_EDIT: Final = "apply_edit"
#: The toy tasks' visible tests as a tool (the text actions' ``run_tests``): run only for a
#: task that has a visible test command, and never offered as a native tool.
RUN_TESTS: Final = "run_tests"
EDITOR_COMMANDS: Final = ("view", "create", "str_replace", "insert", "undo_edit")
#: Lines of context shown around an edit.
SNIPPET_LINES: Final = 4

_STRING = {"type": "string"}


def _function(
    name: str, description: str, properties: dict[str, Any], required: list[str]
) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def tool_schemas(edits: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The OpenAI function tools (``tools=``) of :class:`SWEToolRunner`, in a fixed order; with
    ``edits`` (the names of a dataset's candidate edits, :func:`agentrl.rollout.tasks.
    offered_edits`) also ``apply_edit``, whose ``name`` is one of them."""
    return [*_swe_tools(), *([_apply_edit(edits)] if edits else [])]


def _apply_edit(edits: Sequence[str]) -> dict[str, Any]:
    return _function(
        APPLY_EDIT,
        "Apply one of the task's named candidate edits to the repository. Each names a kind "
        "of fix at the bug's location; applying one first undoes the one applied before, so "
        "another can be tried after a failing test run.",
        {
            "name": {
                **_STRING,
                "enum": list(edits),
                "description": "The candidate edit to apply.",
            }
        },
        ["name"],
    )


def _swe_tools() -> list[dict[str, Any]]:
    return [
        _function(
            BASH,
            "Run a bash command in the repository and see its output and exit code. Each call "
            "is a fresh shell in the repository directory (cd and variables do not carry over); "
            "a command that runs past the time limit is killed. Long output is cut in the "
            "middle. No interactive commands.",
            {"command": {**_STRING, "description": "The bash command to run."}},
            ["command"],
        ),
        _function(
            EDITOR,
            "View, create and edit files.\n"
            "* view: a file with line numbers (cat -n), or a directory's files two levels "
            "deep (hidden ones left out)\n"
            "* create: a new file with file_text (an existing file is never overwritten)\n"
            "* str_replace: replace old_str, which must occur exactly once in the file "
            "(whitespace included), with new_str\n"
            "* insert: insert new_str after line insert_line (0: at the top)\n"
            "* undo_edit: revert the last edit of the file",
            {
                "command": {
                    **_STRING,
                    "enum": list(EDITOR_COMMANDS),
                    "description": "The command to run.",
                },
                "path": {**_STRING, "description": "Path of the file or directory."},
                "file_text": {**_STRING, "description": "create: the content of the file."},
                "old_str": {**_STRING, "description": "str_replace: the exact text to replace."},
                "new_str": {
                    **_STRING,
                    "description": "str_replace: the replacement (empty deletes old_str); "
                    "insert: the text to insert.",
                },
                "insert_line": {
                    "type": "integer",
                    "description": "insert: the line new_str goes after (0: before line 1).",
                },
                "view_range": {
                    "type": "array",
                    "items": {"type": "integer"},
                    "description": "view: [start, end] lines of a file, 1-based and inclusive; "
                    "end -1 reads to the end.",
                },
            },
            ["command", "path"],
        ),
        _function(
            SUBMIT,
            "Submit your changes to the repository as the solution and end the task. Call it "
            "once the issue is fixed.",
            {},
            [],
        ),
    ]


def with_remaining_turns(observation: str, turns_left: int) -> str:
    """``observation`` with the turns the agent has left on a last line: ``[N turns left]``
    (``[1 turn left]``)."""
    unit = "turn" if turns_left == 1 else "turns"
    return f"{observation.rstrip(chr(10))}\n[{turns_left} {unit} left]"


def numbered(lines: list[str], first: int) -> str:
    """Lines as ``cat -n`` prints them, the first numbered ``first``."""
    return "\n".join(f"{number:6}\t{line}" for number, line in enumerate(lines, start=first))


def _lines(text: str) -> list[str]:
    body = text[:-1] if text.endswith("\n") else text
    return body.split("\n") if body else []


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        return None


def _view_range(value: Any) -> list[int] | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    if not isinstance(value, list) or len(value) != 2:
        return None
    ints = [_as_int(v) for v in value]
    return None if None in ints else [int(v) for v in ints if v is not None]


class SWEToolRunner:
    """Runs the tool calls of one episode in its sandbox: ``bash``, ``str_replace_editor`` and
    ``submit``, and for toy tasks ``apply_edit`` (tasks with candidate edits) and
    ``run_tests`` (tasks with a visible test command).

    The commit the diff of ``submit`` is taken against is read before the first call runs."""

    def __init__(
        self, sandbox: Sandbox, task: Task, *, timeout_seconds: float, output_max_bytes: int
    ) -> None:
        self.sandbox = sandbox
        self.task = task
        self.timeout_seconds = timeout_seconds
        self.output_max_bytes = output_max_bytes
        self.base_commit: str | None = None
        """The repository's ``HEAD`` before the agent's first call (None: not a repository)."""
        self._base_read = False
        self._history: dict[str, list[str | None]] = {}
        """Per file, its contents before each edit (None: it did not exist)."""
        self.patch: str | None = None
        """The diff ``submit`` captured (None until then)."""

    def tool_names(self) -> list[str]:
        """The tools this task's calls may name."""
        return [
            *SWE_TOOL_NAMES,
            *([APPLY_EDIT] if self.task.candidate_edits else []),
            *([RUN_TESTS] if self.task.visible_test_command else []),
        ]

    async def call(self, name: str, arguments: Mapping[str, Any] | None = None) -> ToolResult:
        """Run the tool ``name`` with the model's ``arguments`` (its JSON object)."""
        args = dict(arguments or {})
        await self.read_base()
        if name == BASH:
            result = await self._run_bash(args)
        elif name == EDITOR:
            result = await self._run_editor(args)
        elif name == SUBMIT:
            patch = await self.capture_patch()
            return ToolResult(observation="submitted", submitted=True, patch=patch)
        elif name == APPLY_EDIT and self.task.candidate_edits:
            result = await self._apply(str(args.get("name", "")))
        elif name == RUN_TESTS and self.task.visible_test_command:
            result = await self._exec(self.task.visible_test_command)
        else:
            known = ", ".join(self.tool_names())
            result = ToolResult(observation=f"unknown tool {name!r}; the tools are: {known}")
        return result.model_copy(
            update={"observation": truncate_output(result.observation, self.output_max_bytes)}
        )

    async def _exec(self, command: str) -> ToolResult:
        result = await self.sandbox.exec(command, timeout=self.timeout_seconds)
        return ToolResult(
            observation=format_exec(result, self.timeout_seconds),
            seconds=result.duration_seconds,
        )

    async def _apply(self, name: str) -> ToolResult:
        edits = {e.name: e for e in self.task.candidate_edits}
        if name not in edits:
            known = " ".join(edits) or "(none)"
            return ToolResult(observation=f"unknown edit {name!r}; candidate edits: {known}")
        edit = edits[name]
        # Candidate edits are alternatives, each written against the task's original files:
        # applying one first undoes whichever was applied before, so trying another candidate
        # after a failing test run is one call, not a revert plus an apply.
        for path in sorted({e.path for e in self.task.candidate_edits}):
            original = self.task.files.get(path)
            if original is not None:
                await self.sandbox.write_file(path, original)
        problem = await replace_once(self.sandbox, edit.path, edit.old, edit.new)
        if problem is not None:
            return ToolResult(observation=f"edit {name} does not apply: {problem}")
        return ToolResult(observation=f"applied {name} to {edit.path}")

    async def _git(self, command: str) -> tuple[bool, str]:
        result = await self.sandbox.exec(command, timeout=self.timeout_seconds)
        return result.ok, result.stdout

    async def read_base(self) -> None:
        """Pin :attr:`base_commit` to the repository's ``HEAD`` now, once (the first tool call
        does it; an episode does it before the agent starts, so a text-action agent that
        commits its changes still has them in the patch)."""
        if self._base_read:
            return
        self._base_read = True
        ok, out = await self._git("git rev-parse --verify -q HEAD")
        self.base_commit = out.strip() if ok and out.strip() else None

    async def capture_patch(self) -> str:
        """The agent's changes as a patch against :attr:`base_commit` (new files included,
        binary files left out); empty when nothing changed or the sandbox is no repository.
        Stages every change in the agent's sandbox (``git add -A``)."""
        await self.read_base()
        if self.base_commit is None:
            self.patch = ""
            return self.patch
        base = shlex.quote(self.base_commit)
        ok, numstat = await self._git(
            f"git add -A >/dev/null 2>&1; git diff --cached --no-renames --numstat {base}"
        )
        # numstat marks binary files with "-<TAB>-<TAB>path"
        binary = [
            line.split("\t", 2)[2] for line in numstat.splitlines() if line.startswith("-\t-\t")
        ]
        excluded = " ".join(shlex.quote(f":(exclude,literal){path}") for path in binary)
        ok, diff = await self._git(
            f"git diff --cached --no-renames --no-color {base} -- . {excluded}".rstrip()
        )
        self.patch = diff if ok else ""
        return self.patch

    async def _run_bash(self, args: dict[str, Any]) -> ToolResult:
        command = str(args.get("command") or "")
        if not command.strip():
            return ToolResult(observation="bash: give the command to run in `command`")
        script = f"{self.task.shell_setup}\n{command}" if self.task.shell_setup else command
        result = await self.sandbox.exec(
            f"/bin/bash -c {shlex.quote(script)}", timeout=self.timeout_seconds
        )
        return ToolResult(
            observation=format_exec(result, self.timeout_seconds),
            seconds=result.duration_seconds,
        )

    async def _kind(self, path: str) -> str:
        quoted = shlex.quote(path)
        result = await self.sandbox.exec(
            f"if [ -d {quoted} ]; then echo dir; elif [ -e {quoted} ]; then echo file; "
            "else echo missing; fi",
            timeout=self.timeout_seconds,
        )
        return result.stdout.strip()

    async def _run_editor(self, args: dict[str, Any]) -> ToolResult:
        command = str(args.get("command") or "")
        path = str(args.get("path") or "")
        if command not in EDITOR_COMMANDS:
            allowed = ", ".join(EDITOR_COMMANDS)
            return ToolResult(
                observation=f"{EDITOR}: unknown command {command!r}; the commands are: {allowed}"
            )
        if not path:
            return ToolResult(observation=f"{EDITOR} {command}: give the file's `path`")
        full = resolve_path(self.sandbox.workdir, path)
        handler = {
            "view": self._view_path,
            "create": self._create,
            "str_replace": self._str_replace,
            "insert": self._insert,
            "undo_edit": self._undo,
        }[command]
        return ToolResult(observation=await handler(full, args))

    async def _read(self, path: str) -> str:
        return (await self.sandbox.read_file(path)).decode(errors="replace")

    async def _write(self, path: str, text: str, before: str | None) -> None:
        await self.sandbox.write_file(path, text)
        self._history.setdefault(path, []).append(before)

    async def _view_path(self, path: str, args: dict[str, Any]) -> str:
        kind = await self._kind(path)
        if kind == "missing":
            return f"The path {path} does not exist."
        if kind == "dir":
            if args.get("view_range") not in (None, "", []):
                return "view_range applies to files, not directories."
            listing = await self.sandbox.exec(
                f"find {shlex.quote(path)} -maxdepth 2 -not -path '*/.*' | sort",
                timeout=self.timeout_seconds,
            )
            return (
                f"Files and directories up to 2 levels deep in {path}, hidden ones left "
                f"out:\n{listing.stdout.rstrip()}"
            )
        lines = _lines(await self._read(path))
        raw_range = args.get("view_range")
        if raw_range in (None, "", []):
            return f"Here is {path} with line numbers (cat -n):\n{numbered(lines, 1)}"
        view = _view_range(raw_range)
        if view is None:
            return "view_range must be two integers: [start, end]"
        start, end = view
        if not 1 <= start <= max(1, len(lines)):
            return f"view_range start {start} is outside the file's lines 1-{len(lines)}."
        if end == -1:
            end = len(lines)
        if end < start:
            return f"view_range end {end} is before its start {start}."
        end = min(end, len(lines))
        shown = numbered(lines[start - 1 : end], start)
        return f"Here are lines {start}-{end} of {path} (cat -n):\n{shown}"

    async def _create(self, path: str, args: dict[str, Any]) -> str:
        text = args.get("file_text")
        if text is None:
            return f"{EDITOR} create: give the content in `file_text`"
        if await self._kind(path) != "missing":
            return f"{path} already exists; create never overwrites a file (use str_replace)."
        await self._write(path, str(text), None)
        return f"File created at {path}."

    def _snippet(self, path: str, lines: list[str], first: int, last: int) -> str:
        start = max(1, first - SNIPPET_LINES)
        end = min(len(lines), last + SNIPPET_LINES)
        return (
            f"The file {path} has been edited. Lines {start}-{end} now read (cat -n):\n"
            f"{numbered(lines[start - 1 : end], start)}\n"
            "Check that the edit is what you meant; edit again if not."
        )

    async def _str_replace(self, path: str, args: dict[str, Any]) -> str:
        old = args.get("old_str")
        new = str(args.get("new_str") or "")
        if not old:
            return f"{EDITOR} str_replace: give the text to replace in `old_str`"
        old = str(old)
        if await self._kind(path) != "file":
            return f"The path {path} is not a file."
        text = await self._read(path)
        starts = []
        index = text.find(old)
        while index != -1:
            starts.append(index)
            index = text.find(old, index + len(old))
        if not starts:
            return f"No replacement was made: old_str does not occur verbatim in {path}."
        if len(starts) > 1:
            numbers = [text.count("\n", 0, s) + 1 for s in starts]
            return (
                f"No replacement was made: old_str occurs {len(starts)} times in {path}, "
                f"at lines {numbers}. Include more of the surrounding lines so it occurs once."
            )
        updated = text.replace(old, new, 1)
        await self._write(path, updated, text)
        first = text.count("\n", 0, starts[0]) + 1
        return self._snippet(path, _lines(updated), first, first + new.count("\n"))

    async def _insert(self, path: str, args: dict[str, Any]) -> str:
        line = _as_int(args.get("insert_line"))
        new = args.get("new_str")
        if line is None or new is None:
            return f"{EDITOR} insert: give `insert_line` (an integer) and `new_str`"
        if await self._kind(path) != "file":
            return f"The path {path} is not a file."
        text = await self._read(path)
        lines = _lines(text)
        if not 0 <= line <= len(lines):
            return f"insert_line {line} is outside the file's lines 0-{len(lines)}."
        inserted = _lines(str(new)) or [""]
        updated_lines = [*lines[:line], *inserted, *lines[line:]]
        trailing = "\n" if text.endswith("\n") or not text else ""
        await self._write(path, "\n".join(updated_lines) + trailing, text)
        return self._snippet(path, updated_lines, line + 1, line + len(inserted))

    async def _undo(self, path: str, args: dict[str, Any]) -> str:
        history = self._history.get(path)
        if not history:
            return f"No edit of {path} to undo."
        before = history.pop()
        if before is None:
            await self.sandbox.exec(f"rm -f {shlex.quote(path)}", timeout=self.timeout_seconds)
            return f"Undid the creation of {path}: it is removed."
        await self.sandbox.write_file(path, before)
        return f"Undid the last edit of {path}.\n{numbered(_lines(before), 1)}"
