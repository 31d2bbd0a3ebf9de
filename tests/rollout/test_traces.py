"""Expert traces for the warm-start stage: the scripted solver writes its calls in the job's
tool-call syntax, the real parser reads them back, the SWE tools run them in a local sandbox of
the task, and only a conversation whose result the task's verifier scores 1 is kept.

Expected values come from elsewhere: written calls by hand, the fixed module from the toy
family's correct source, the remaining-turn notes counted by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.rollout.caps import EpisodeCaps
from agentrl.rollout.swe_tools import tool_schemas
from agentrl.rollout.tasks.toy import generate_toy_tasks
from agentrl.rollout.tasks.toy_families import FAMILIES
from agentrl.rollout.tasks.traces import (
    ScriptedTurn,
    TraceError,
    record_trace,
    toy_solution_turns,
    write_traces,
)
from agentrl.rollout.toolcalls import ParsedToolCall, get_parser
from agentrl.sandbox.local import LocalProvider

CAPS = EpisodeCaps(max_turns=12, tool_timeout_seconds=60, verifier_timeout_seconds=60)


def test_a_call_written_in_each_syntax_is_exactly_what_that_syntax_looks_like() -> None:
    call = ParsedToolCall(
        name="str_replace_editor",
        arguments={"command": "view", "path": "a.py", "view_range": [3, 9]},
    )
    assert get_parser("qwen25").format_call(call) == (
        "<tool_call>\n"
        '{"name": "str_replace_editor", "arguments": {"command": "view", "path": "a.py", '
        '"view_range": [3, 9]}}\n'
        "</tool_call>"
    )
    assert get_parser("qwen3_coder").format_call(call) == (
        "<tool_call>\n<function=str_replace_editor>\n"
        "<parameter=command>\nview\n</parameter>\n"
        "<parameter=path>\na.py\n</parameter>\n"
        "<parameter=view_range>\n[3, 9]\n</parameter>\n"
        "</function>\n</tool_call>"
    )


@pytest.mark.parametrize("parser", ["qwen25", "hermes", "qwen3_coder"])
def test_each_parser_reads_back_the_calls_it_writes(parser: str) -> None:
    calls = [
        ParsedToolCall(name="bash", arguments={"command": "cat <<'EOF' > x.py\nprint(1)\nEOF"}),
        ParsedToolCall(
            name="str_replace_editor",
            arguments={"command": "insert", "path": "x.py", "insert_line": 2, "new_str": "a\nb"},
        ),
        ParsedToolCall(name="submit", arguments={}),
    ]
    p = get_parser(parser)
    for call in calls:
        reply = p.parse(f"Next.\n{p.format_call(call)}", tool_schemas())
        assert reply.error is None
        assert reply.content == "Next."
        assert reply.calls == [call]


def _task(task_id: str):  # type: ignore[no-untyped-def]
    return next(t for t in generate_toy_tasks(0) if t.id == task_id)


async def test_a_trace_is_the_conversation_of_a_resolved_episode(tmp_path: Path) -> None:
    task = _task("toy-stats-off_by_one")
    trace = await record_trace(
        task, LocalProvider(base_dir=str(tmp_path)), get_parser("qwen25"), CAPS
    )
    roles = [m["role"] for m in trace.messages]
    # system, user, then five turns: four observed, the last one submits
    assert roles == ["system", "user"] + ["assistant", "tool"] * 4 + ["assistant"]
    assert trace.tools == tool_schemas()
    assert trace.messages[1]["content"] == task.instruction
    calls = [m["tool_calls"][0]["function"] for m in trace.messages if m["role"] == "assistant"]
    assert [c["name"] for c in calls] == [
        "bash",
        "str_replace_editor",
        "str_replace_editor",
        "bash",
        "submit",
    ]
    # the replacement turns the buggy module into the family's correct one
    edit = calls[2]["arguments"]
    assert edit["command"] == "str_replace"
    buggy = task.files["stats.py"]
    assert buggy.count(edit["old_str"]) == 1
    correct = next(f for f in FAMILIES if f.module == "stats").source
    assert buggy.replace(edit["old_str"], edit["new_str"]) == correct
    # the observations are the tools' real output, with the turns left (12 - 1, 12 - 2, ...)
    observations = [m["content"] for m in trace.messages if m["role"] == "tool"]
    assert "1 failed" in observations[0] and "test_window_sums" in observations[0]
    assert "6 passed" in observations[3]
    assert [o.rsplit("\n", 1)[-1] for o in observations] == [
        "[11 turns left]",
        "[10 turns left]",
        "[9 turns left]",
        "[8 turns left]",
    ]
    line = json.loads(trace.line())
    assert set(line) == {"messages", "tools"}


async def test_offered_apply_edit_the_solver_fixes_with_the_reference_edits_name(
    tmp_path: Path,
) -> None:
    from agentrl.api.model import DatasetSpec
    from agentrl.rollout.tasks import offered_edits

    edits = offered_edits(DatasetSpec(format="toy"))
    # the six kinds of bug the toy families plant, each a candidate edit of every toy task
    assert sorted(edits) == sorted(
        [
            "off_by_one",
            "swap_comparison",
            "wrong_operator",
            "negate_condition",
            "wrong_constant",
            "missing_return",
        ]
    )
    task = _task("toy-stats-off_by_one")
    assert sorted(e.name for e in task.candidate_edits) == sorted(edits)
    trace = await record_trace(
        task, LocalProvider(base_dir=str(tmp_path)), get_parser("qwen25"), CAPS, edits=edits
    )
    assert trace.tools == tool_schemas(edits)
    assert [t["function"]["name"] for t in trace.tools][-1] == "apply_edit"
    calls = [m["tool_calls"][0]["function"] for m in trace.messages if m["role"] == "assistant"]
    assert [c["name"] for c in calls] == ["bash", "apply_edit", "bash", "submit"]
    assert calls[1]["arguments"] == {"name": "off_by_one"}
    observations = [m["content"] for m in trace.messages if m["role"] == "tool"]
    assert observations[1].startswith("applied off_by_one to stats.py")
    assert "6 passed" in observations[2]


async def test_a_script_that_does_not_fix_the_bug_gives_no_trace(tmp_path: Path) -> None:
    task = _task("toy-stats-off_by_one")
    decoy = next(e for e in task.candidate_edits if e.name != task.reference.edit)
    turns = [
        ScriptedTurn(
            thought="Maybe this.",
            call=ParsedToolCall(
                name="str_replace_editor",
                arguments={
                    "command": "str_replace",
                    "path": decoy.path,
                    "old_str": decoy.old,
                    "new_str": decoy.new,
                },
            ),
        ),
        ScriptedTurn(thought="Done.", call=ParsedToolCall(name="submit", arguments={})),
    ]
    with pytest.raises(TraceError, match="scores 0"):
        await record_trace(
            task, LocalProvider(base_dir=str(tmp_path)), get_parser("qwen25"), CAPS, turns=turns
        )


async def test_a_turn_cap_below_the_solvers_turns_is_refused_naming_the_field(
    tmp_path: Path,
) -> None:
    task = _task("toy-stats-off_by_one")
    assert len(toy_solution_turns(task)) == 5
    with pytest.raises(TraceError, match=r"spec.rollout.maxTurns is 4"):
        await record_trace(
            task,
            LocalProvider(base_dir=str(tmp_path)),
            get_parser("qwen25"),
            EpisodeCaps(max_turns=4),
        )


async def test_every_toy_task_of_a_family_gets_a_trace_in_the_xml_syntax_too(
    tmp_path: Path,
) -> None:
    tasks = [t for t in generate_toy_tasks(0) if t.id.startswith("toy-stats-")]
    out = tmp_path / "traces.jsonl"
    report = await write_traces(
        tasks, LocalProvider(base_dir=str(tmp_path)), get_parser("qwen3_coder"), CAPS, out
    )
    assert report.failed == {}
    assert report.written == len(tasks) == 6
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [line["messages"][1]["content"] for line in lines] == [t.instruction for t in tasks]


def _manifest(tmp_path: Path, **model: object) -> Path:
    import yaml

    doc = {
        "apiVersion": "agentrl.dev/v1alpha1",
        "kind": "AgentRLJob",
        "metadata": {"name": "traces"},
        "spec": {
            "model": {"source": {"path": str(tmp_path / "model")}, **model},
            "dataset": {"format": "toy", "heldOutFraction": 0.5, "maxTasks": 6, "seed": 3},
            "inference": {"server": "tiny", "gpusPerEngine": 0},
            "rollout": {"maxTurns": 12},
            "sandbox": {"provider": "local"},
            "trainer": {"backend": "torch", "gpusPerNode": 0},
        },
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_agentrl_tasks_traces_solves_the_training_split_only(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from agentrl.api.model import DatasetSpec
    from agentrl.cli import main
    from agentrl.rollout.tasks import load_tasks, split_held_out

    out = tmp_path / "traces.jsonl"
    manifest = _manifest(tmp_path, toolCallParser="qwen3_coder")
    result = CliRunner().invoke(main, ["tasks", "traces", str(manifest), "--out", str(out)])
    assert result.exit_code == 0, result.output
    dataset = DatasetSpec(format="toy", heldOutFraction=0.5, maxTasks=6, seed=3)
    train, held = split_held_out(load_tasks(dataset), 0.5, 3)
    assert (len(train), len(held)) == (3, 3)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(x["messages"][1]["content"] for x in lines) == sorted(
        t.instruction for t in train
    )
    assert "<function=" not in out.read_text()  # calls are structured; the template writes them
    assert "wrote 3 conversations" in result.output
    # the toy tasks' rollout offers apply_edit: the solver fixes with it by default
    names = [c["function"]["name"] for m in lines[0]["messages"] for c in m.get("tool_calls", [])]
    assert names == ["bash", "apply_edit", "bash", "submit"]

    editor = tmp_path / "editor.jsonl"
    result = CliRunner().invoke(
        main, ["tasks", "traces", str(manifest), "--out", str(editor), "--solver", "editor"]
    )
    assert result.exit_code == 0, result.output
    first = json.loads(editor.read_text().splitlines()[0])
    assert [t["function"]["name"] for t in first["tools"]] == [
        "bash",
        "str_replace_editor",
        "submit",
    ]


def test_agentrl_tasks_traces_needs_the_jobs_tool_call_parser(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from agentrl.cli import main

    out = tmp_path / "traces.jsonl"
    result = CliRunner().invoke(
        main, ["tasks", "traces", str(_manifest(tmp_path)), "--out", str(out)]
    )
    assert result.exit_code == 2
    assert "spec.model.toolCallParser is not set" in result.output
