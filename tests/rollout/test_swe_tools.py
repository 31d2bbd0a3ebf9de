"""The SWE tool set (bash, str_replace_editor, submit) over real local sandboxes: real bash, a
real git repository, the diff submit captures applied to a fresh copy of the base commit."""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentrl.rollout.swe_tools import SWEToolRunner, tool_schemas, with_remaining_turns
from agentrl.rollout.tasks.model import NamedTestsVerification, Task
from agentrl.rollout.tasks.swebench import task_from_instance
from agentrl.sandbox.local import LocalProvider
from agentrl.sandbox.provider import SandboxRequest
from tests.rollout.swebench_rows import row

APP = "def f():\n    return 1\n\n\ndef g():\n    return 1\n"
GIT = "git -c user.name=a -c user.email=a@example.com commit -q --no-verify"
SETUP = f"git init -q -b main . && git add -A && {GIT} -m base"


def task(shell_setup: str | None = None) -> Task:
    return Task(
        id="t",
        source="toy",
        instruction="fix it",
        files={"app.py": APP, "pkg/sub/deep/x.py": "", "pkg/y.py": "", ".hidden/z": ""},
        shell_setup=shell_setup,
        verification=NamedTestsVerification(fail_to_pass=["t.py::t"]),
    )


@pytest.fixture
async def runner(tmp_path: Path) -> AsyncIterator[SWEToolRunner]:
    provider = LocalProvider(base_dir=str(tmp_path))
    the_task = task()
    async with await provider.create(SandboxRequest(episode_id="swe-tools")) as box:
        for path, text in the_task.files.items():
            await box.write_file(path, text)
        assert (await box.exec(SETUP, timeout=30)).ok
        yield SWEToolRunner(box, the_task, timeout_seconds=30, output_max_bytes=4096)


def edit(**args: object) -> dict[str, object]:
    return args


def test_the_schemas_are_openai_function_tools_for_the_three_tools() -> None:
    tools = tool_schemas()
    assert json.loads(json.dumps(tools)) == tools
    assert [t["type"] for t in tools] == ["function"] * 3
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    assert list(by_name) == ["bash", "str_replace_editor", "submit"]
    assert by_name["bash"]["required"] == ["command"]
    editor = by_name["str_replace_editor"]
    assert editor["required"] == ["command", "path"]
    assert editor["properties"]["command"]["enum"] == [
        "view",
        "create",
        "str_replace",
        "insert",
        "undo_edit",
    ]
    assert editor["properties"]["insert_line"]["type"] == "integer"
    assert editor["properties"]["view_range"] == {
        "type": "array",
        "items": {"type": "integer"},
        "description": editor["properties"]["view_range"]["description"],
    }
    assert by_name["submit"] == {"type": "object", "properties": {}, "required": []}


def test_the_turns_left_go_on_the_observations_last_line() -> None:
    assert with_remaining_turns("ok\n", 3) == "ok\n[3 turns left]"
    assert with_remaining_turns("ok", 1) == "ok\n[1 turn left]"


async def test_bash_runs_bash_not_sh(runner: SWEToolRunner) -> None:
    # [[ ]] and $BASH_VERSION exist in bash only (dash, Debian's /bin/sh, has neither)
    result = await runner.call("bash", {"command": '[[ -n "$BASH_VERSION" ]] && echo bash'})
    assert result.observation == "bash\n[exit code 0]"
    failed = await runner.call("bash", {"command": "ls no-such-file"})
    assert failed.observation.endswith("[exit code 2]")


async def test_bash_runs_the_tasks_shell_setup_first(tmp_path: Path) -> None:
    provider = LocalProvider(base_dir=str(tmp_path))
    the_task = task(shell_setup="export STAGE=activated\ncd pkg")
    async with await provider.create(SandboxRequest(episode_id="setup")) as box:
        tools = SWEToolRunner(box, the_task, timeout_seconds=30, output_max_bytes=4096)
        await box.write_file("pkg/y.py", "")
        result = await tools.call("bash", {"command": "echo $STAGE; ls"})
    assert result.observation == "activated\ny.py\n[exit code 0]"


def test_swebench_and_swesmith_tasks_activate_testbed_as_their_eval_scripts_do() -> None:
    record = row(
        "astropy__astropy-1",
        "astropy/astropy",
        fail_to_pass=["tests/test_m.py::test_new"],
        pass_to_pass=[],
        log_parser="parse_log_pytest",
        test_command="pytest -rA",
        test_file="tests/test_m.py",
    )
    setup = task_from_instance(record).shell_setup
    assert setup is not None
    script = str(record["eval_script"]).split("\n")
    lines = setup.split("\n")
    # the row's own eval script activates with the same two consecutive lines
    start = script.index(lines[0])
    assert (
        script[start : start + 2]
        == lines
        == [
            "source /opt/miniconda3/bin/activate",
            "conda activate testbed",
        ]
    )


async def test_a_command_past_its_timeout_is_killed_and_said_so(tmp_path: Path) -> None:
    provider = LocalProvider(base_dir=str(tmp_path))
    async with await provider.create(SandboxRequest(episode_id="slow")) as box:
        tools = SWEToolRunner(box, task(), timeout_seconds=0.5, output_max_bytes=4096)
        result = await tools.call("bash", {"command": "echo started; sleep 30"})
    assert result.observation.endswith("[command timed out after 0.5s and was killed]")


async def test_long_output_keeps_head_and_tail(runner: SWEToolRunner) -> None:
    result = await runner.call(
        "bash", {"command": "echo HEAD; head -c 20000 /dev/zero | tr '\\0' x; echo; echo TAIL"}
    )
    assert len(result.observation.encode()) <= 4096
    assert result.observation.startswith("HEAD\n")
    assert result.observation.endswith("TAIL\n[exit code 0]")
    assert "bytes truncated ..." in result.observation


async def test_view_numbers_lines_like_cat_n_and_takes_a_range(runner: SWEToolRunner) -> None:
    expected = subprocess.run(
        ["cat", "-n"], input=APP, capture_output=True, text=True, check=True
    ).stdout.rstrip("\n")
    whole = await runner.call("str_replace_editor", edit(command="view", path="app.py"))
    assert whole.observation.split("\n", 1)[1] == expected
    part = await runner.call(
        "str_replace_editor", edit(command="view", path="app.py", view_range=[2, 4])
    )
    assert part.observation.split("\n", 1)[1] == "\n".join(expected.split("\n")[1:4])
    to_end = await runner.call(
        "str_replace_editor", edit(command="view", path="app.py", view_range="[5, -1]")
    )
    assert to_end.observation.split("\n", 1)[1] == "\n".join(expected.split("\n")[4:])
    bad = await runner.call(
        "str_replace_editor", edit(command="view", path="app.py", view_range=[9, 12])
    )
    assert bad.observation == "view_range start 9 is outside the file's lines 1-6."


async def test_view_of_a_directory_lists_two_levels_without_hidden_entries(
    runner: SWEToolRunner,
) -> None:
    result = await runner.call("str_replace_editor", edit(command="view", path="pkg"))
    root = runner.sandbox.workdir
    assert result.observation.split("\n")[1:] == [
        f"{root}/pkg",
        f"{root}/pkg/sub",
        f"{root}/pkg/sub/deep",
        f"{root}/pkg/y.py",
    ]
    top = await runner.call("str_replace_editor", edit(command="view", path="."))
    assert ".hidden" not in top.observation and ".git" not in top.observation
    missing = await runner.call("str_replace_editor", edit(command="view", path="nope.py"))
    assert missing.observation == f"The path {root}/nope.py does not exist."


async def test_str_replace_needs_exactly_one_match(runner: SWEToolRunner) -> None:
    none = await runner.call(
        "str_replace_editor", edit(command="str_replace", path="app.py", old_str="return 2")
    )
    root = runner.sandbox.workdir
    assert none.observation == (
        f"No replacement was made: old_str does not occur verbatim in {root}/app.py."
    )
    several = await runner.call(
        "str_replace_editor",
        edit(command="str_replace", path="app.py", old_str="return 1", new_str="return 2"),
    )
    assert several.observation.startswith(
        f"No replacement was made: old_str occurs 2 times in {root}/app.py, at lines [2, 6]."
    )
    assert (await runner.sandbox.read_file("app.py")).decode() == APP
    once = await runner.call(
        "str_replace_editor",
        edit(
            command="str_replace",
            path="app.py",
            old_str="def g():\n    return 1",
            new_str="def g():\n    return 2",
        ),
    )
    fixed = APP.replace("def g():\n    return 1", "def g():\n    return 2")
    assert (await runner.sandbox.read_file("app.py")).decode() == fixed
    # the snippet: the edited lines with up to 4 lines of context, numbered
    assert once.observation.split("\n")[1:-1] == [
        "     1\tdef f():",
        "     2\t    return 1",
        "     3\t",
        "     4\t",
        "     5\tdef g():",
        "     6\t    return 2",
    ]
    undone = await runner.call("str_replace_editor", edit(command="undo_edit", path="app.py"))
    assert undone.observation.startswith(f"Undid the last edit of {root}/app.py.")
    assert (await runner.sandbox.read_file("app.py")).decode() == APP
    again = await runner.call("str_replace_editor", edit(command="undo_edit", path="app.py"))
    assert again.observation == f"No edit of {root}/app.py to undo."


async def test_insert_goes_after_the_line_and_undo_reverts_only_the_last_edit(
    runner: SWEToolRunner,
) -> None:
    await runner.call(
        "str_replace_editor", edit(command="insert", path="app.py", insert_line=0, new_str="# a")
    )
    await runner.call(
        "str_replace_editor",
        edit(command="insert", path="app.py", insert_line="7", new_str="# b\n# c"),
    )
    assert (await runner.sandbox.read_file("app.py")).decode() == f"# a\n{APP}# b\n# c\n"
    await runner.call("str_replace_editor", edit(command="undo_edit", path="app.py"))
    assert (await runner.sandbox.read_file("app.py")).decode() == f"# a\n{APP}"
    outside = await runner.call(
        "str_replace_editor", edit(command="insert", path="app.py", insert_line=99, new_str="x")
    )
    assert outside.observation == "insert_line 99 is outside the file's lines 0-7."


async def test_create_refuses_an_existing_file_and_undo_removes_a_created_one(
    runner: SWEToolRunner,
) -> None:
    root = runner.sandbox.workdir
    refused = await runner.call(
        "str_replace_editor", edit(command="create", path="app.py", file_text="x")
    )
    assert refused.observation.startswith(f"{root}/app.py already exists;")
    assert (await runner.sandbox.read_file("app.py")).decode() == APP
    made = await runner.call(
        "str_replace_editor", edit(command="create", path="new/mod.py", file_text="X = 1\n")
    )
    assert made.observation == f"File created at {root}/new/mod.py."
    assert (await runner.sandbox.read_file("new/mod.py")).decode() == "X = 1\n"
    await runner.call("str_replace_editor", edit(command="undo_edit", path="new/mod.py"))
    with pytest.raises(FileNotFoundError):
        await runner.sandbox.read_file("new/mod.py")


async def test_wrong_calls_are_observations(runner: SWEToolRunner) -> None:
    unknown = await runner.call("python", {"code": "1"})
    assert unknown.observation == (
        "unknown tool 'python'; the tools are: bash, str_replace_editor, submit"
    )
    bad = await runner.call("str_replace_editor", {"command": "delete", "path": "app.py"})
    assert bad.observation.startswith("str_replace_editor: unknown command 'delete'")
    assert not unknown.submitted and not bad.submitted


async def test_submit_captures_the_diff_against_the_start_with_new_files_not_binaries(
    runner: SWEToolRunner, tmp_path: Path
) -> None:
    await runner.call(
        "str_replace_editor",
        edit(
            command="str_replace",
            path="app.py",
            old_str="    return 1\n\n",
            new_str="    return 2\n\n",
        ),
    )
    await runner.call(
        "str_replace_editor", edit(command="create", path="new.py", file_text="N = 1\n")
    )
    # a binary file, and a commit: neither moves what the patch is taken against
    await runner.call("bash", {"command": "printf 'a\\0b' > blob.bin"})
    await runner.call("bash", {"command": f"git add -A && {GIT} -m mine"})
    result = await runner.call("submit", {})
    assert result.submitted and result.observation == "submitted"
    patch = result.patch or ""
    assert "diff --git a/app.py b/app.py" in patch and "diff --git a/new.py b/new.py" in patch
    assert "blob.bin" not in patch
    # the patch applies to a fresh copy of the base commit and gives the agent's text files
    fresh = tmp_path / "fresh"
    subprocess.run(["git", "init", "-q", str(fresh)], check=True)
    (fresh / "app.py").write_text(APP)
    (fresh / "p.diff").write_text(patch)
    subprocess.run(["git", "apply", "p.diff"], cwd=fresh, check=True)
    assert (fresh / "app.py").read_text() == APP.replace("return 1\n\n", "return 2\n\n", 1)
    assert (fresh / "new.py").read_text() == "N = 1\n"


async def test_submit_without_changes_gives_an_empty_patch(runner: SWEToolRunner) -> None:
    result = await runner.call("submit", {})
    assert (result.submitted, result.patch) == (True, "")


async def test_apply_edit_applies_a_toy_tasks_named_edit_and_only_where_offered(
    tmp_path: Path,
) -> None:
    from agentrl.rollout.tasks import generate_toy_tasks

    task = next(t for t in generate_toy_tasks(0) if t.id == "toy-stats-off_by_one")
    schema = tool_schemas([e.name for e in task.candidate_edits])[-1]["function"]
    assert schema["name"] == "apply_edit"
    assert schema["parameters"]["properties"]["name"]["enum"] == [
        e.name for e in task.candidate_edits
    ]
    provider = LocalProvider(base_dir=str(tmp_path))
    sandbox = await provider.create(SandboxRequest(episode_id="edits", image="local"))
    async with sandbox:
        for path, text in task.files.items():
            await sandbox.write_file(path, text)
        runner = SWEToolRunner(sandbox, task, timeout_seconds=30, output_max_bytes=4096)
        fix = next(e for e in task.candidate_edits if e.name == "off_by_one")
        applied = await runner.call("apply_edit", {"name": "off_by_one"})
        assert applied.observation == "applied off_by_one to stats.py"
        want = task.files["stats.py"].replace(fix.old, fix.new, 1)
        assert (await sandbox.read_file("stats.py")).decode() == want
        unknown = await runner.call("apply_edit", {"name": "rewrite_everything"})
        assert unknown.observation.startswith("unknown edit 'rewrite_everything'")

        # a task without candidate edits (SWE-bench) has no such tool
        plain = SWEToolRunner(
            sandbox,
            task.model_copy(update={"candidate_edits": []}),
            timeout_seconds=30,
            output_max_bytes=4096,
        )
        refused = await plain.call("apply_edit", {"name": "off_by_one"})
        assert refused.observation == (
            "unknown tool 'apply_edit'; the tools are: bash, str_replace_editor, submit, run_tests"
        )
