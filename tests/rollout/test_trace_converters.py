"""Public SWE trajectory sets converted into warm-start lines: each source's rows, shaped as the
real datasets are, become conversations on the job's tools (expected messages written out by
hand), the rows that cannot be converted faithfully are skipped with their number and reason,
and the converted file reads back through the warm-start reader with the job's template and
parser without an error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agentrl.api.model import ModelSpec
from agentrl.rollout.agent import SYSTEM_PROMPT
from agentrl.rollout.conversations import job_turn_tokenizer, read_conversations
from agentrl.rollout.swe_tools import tool_schemas
from agentrl.rollout.tasks.cli import tasks
from agentrl.rollout.trace_converters import (
    ConvertOptions,
    TraceConversionError,
    convert,
    convert_openhands,
    convert_swe_agent_text,
    convert_xml_text,
)


def null_fields(message: dict[str, Any]) -> dict[str, Any]:
    """A message as the parquet column stores it: every field present, null where unused."""
    return {"content": None, "tool_calls": None, "name": None, "tool_call_id": None, **message}


def oh_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    # OpenHands/OpenAI write arguments as a JSON string
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


# nebius/SWE-rebench-openhands-trajectories, as its dataset card lays a row out
# (https://huggingface.co/datasets/nebius/SWE-rebench-openhands-trajectories: columns
# trajectory_id, instance_id, repo, trajectory, tools, model_patch, exit_status, resolved (int),
# gen_tests_correct, pred_passes_gen_tests; messages with role, content, tool_calls, name,
# tool_call_id; OpenHands v0.54 tools execute_bash, str_replace_editor, think, finish).
REBENCH_ROW: dict[str, Any] = {
    "trajectory_id": "chatcmpl-0001",
    "instance_id": "owner__repo-12",
    "repo": "owner/repo",
    "trajectory": [
        null_fields({"role": "system", "content": "You are OpenHands agent, ..."}),
        null_fields(
            {
                "role": "user",
                "content": "<uploaded_files>/workspace/repo</uploaded_files>\nFix add().",
            }
        ),
        null_fields(
            {
                "role": "assistant",
                "content": "Let me look at the code.",
                "tool_calls": [
                    oh_call(
                        "call_1",
                        "str_replace_editor",
                        {
                            "command": "view",
                            "path": "/workspace/repo/calc.py",
                            "view_range": [1, 3],
                            "security_risk": "LOW",
                        },
                    )
                ],
            }
        ),
        null_fields(
            {
                "role": "tool",
                "content": "     1\tdef add(a, b):\n     2\t    return a - b\n",
                "name": "str_replace_editor",
                "tool_call_id": "call_1",
            }
        ),
        null_fields(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [oh_call("call_2", "think", {"thought": "add subtracts."})],
            }
        ),
        null_fields(
            {
                "role": "tool",
                "content": "Your thought has been logged.",
                "name": "think",
                "tool_call_id": "call_2",
            }
        ),
        null_fields(
            {
                "role": "assistant",
                "content": "I will fix it.",
                "tool_calls": [
                    oh_call(
                        "call_3",
                        "str_replace_editor",
                        {
                            "command": "str_replace",
                            "path": "/workspace/repo/calc.py",
                            "old_str": "return a - b",
                            "new_str": "return a + b",
                        },
                    )
                ],
            }
        ),
        null_fields(
            {
                "role": "tool",
                "content": "The file /workspace/repo/calc.py has been edited.",
                "name": "str_replace_editor",
                "tool_call_id": "call_3",
            }
        ),
        null_fields(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    oh_call(
                        "call_4",
                        "execute_bash",
                        {
                            "command": "cd /workspace/repo && python -m pytest -q",
                            "is_input": "false",
                            "timeout": 120,
                        },
                    )
                ],
            }
        ),
        null_fields(
            {
                "role": "tool",
                "content": "1 passed",
                "name": "execute_bash",
                "tool_call_id": "call_4",
            }
        ),
        null_fields(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [oh_call("call_5", "finish", {"message": "Fixed add()."})],
            }
        ),
        null_fields({"role": "tool", "content": "", "name": "finish", "tool_call_id": "call_5"}),
    ],
    "tools": [{"type": "function", "function": {"name": "execute_bash", "description": "..."}}],
    "model_patch": "diff --git a/calc.py b/calc.py\n",
    "exit_status": "submit",
    "resolved": 1,
    "gen_tests_correct": None,
    "pred_passes_gen_tests": None,
}

REBENCH_EXPECTED: list[dict[str, Any]] = [
    {"role": "system", "content": SYSTEM_PROMPT},
    {"role": "user", "content": "<uploaded_files>/workspace/repo</uploaded_files>\nFix add()."},
    {
        "role": "assistant",
        "content": "Let me look at the code.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {
                    "name": "str_replace_editor",
                    "arguments": {
                        "command": "view",
                        "path": "/workspace/repo/calc.py",
                        "view_range": [1, 3],
                    },
                },
            }
        ],
    },
    {
        "role": "tool",
        "content": "     1\tdef add(a, b):\n     2\t    return a - b\n",
        "tool_call_id": "call_1",
    },
    # the think call is text of the next turn; its logged result is gone
    {
        "role": "assistant",
        "content": "add subtracts.\n\nI will fix it.",
        "tool_calls": [
            {
                "id": "call_3",
                "type": "function",
                "function": {
                    "name": "str_replace_editor",
                    "arguments": {
                        "command": "str_replace",
                        "path": "/workspace/repo/calc.py",
                        "old_str": "return a - b",
                        "new_str": "return a + b",
                    },
                },
            }
        ],
    },
    {
        "role": "tool",
        "content": "The file /workspace/repo/calc.py has been edited.",
        "tool_call_id": "call_3",
    },
    {
        "role": "assistant",
        "tool_calls": [
            {
                "id": "call_4",
                "type": "function",
                "function": {
                    "name": "bash",
                    "arguments": {"command": "cd /workspace/repo && python -m pytest -q"},
                },
            }
        ],
    },
    {"role": "tool", "content": "1 passed", "tool_call_id": "call_4"},
    {
        "role": "assistant",
        "content": "Fixed add().",
        "tool_calls": [
            {"id": "call_5", "type": "function", "function": {"name": "submit", "arguments": {}}}
        ],
    },
]


def dumped(line: str) -> list[dict[str, Any]]:
    raw = json.loads(line)
    assert raw["tools"] == tool_schemas()
    return raw["messages"]


def test_openhands_rebench_row_maps_onto_the_job_tools() -> None:
    (converted,) = convert("openhands", [json.dumps(REBENCH_ROW)]).conversations
    assert dumped(converted.jsonl()) == REBENCH_EXPECTED
    assert converted.conversation.called_tools() == [
        "str_replace_editor",
        "str_replace_editor",
        "bash",
        "submit",
    ]


def test_openhands_keeps_the_source_system_prompt_when_asked() -> None:
    options = ConvertOptions(keep_system_prompt=True)
    conversation = convert_openhands(REBENCH_ROW, options)
    assert conversation.messages[0].content == "You are OpenHands agent, ..."  # type: ignore[union-attr]


# SWE-Gym/OpenHands-Sampled-Trajectories (split train.raw): instance_id, resolved (bool),
# messages (chat messages with tool_calls and tool results), run_id, git_patch, ...; layout as
# the dataset's readers use it (e.g. github inspect_degradation's OpenHands loader:
# row["messages"], row["resolved"], row["run_id"]).
def swe_gym_row(*, resolved: bool, tool: str = "execute_bash") -> dict[str, Any]:
    return {
        "instance_id": "getmoto__moto-5000",
        "run_id": "gpt-4o-2024-08-06_maxiter_30_N_v2.1-no-hint-train-t04-run_1",
        "resolved": resolved,
        "git_patch": "diff --git ...",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant ..."},
            {"role": "user", "content": [{"type": "text", "text": "Fix the bug."}]},
            {
                "role": "assistant",
                "content": "Run the tests.",
                "tool_calls": [oh_call("toolu_01", tool, {"command": "pytest -q"})],
            },
            {
                "role": "tool",
                "content": [{"type": "text", "text": "1 failed"}],
                "tool_call_id": "toolu_01",
                "name": tool,
            },
            {
                "role": "assistant",
                "content": "Done.",
                "tool_calls": [oh_call("toolu_02", "finish", {})],
            },
        ],
    }


def test_openhands_skips_unresolved_rows_and_tools_without_counterpart() -> None:
    lines = [
        json.dumps(swe_gym_row(resolved=True)),
        json.dumps(swe_gym_row(resolved=False)),
        "",
        json.dumps(swe_gym_row(resolved=True, tool="browser")),
        "{not json",
    ]
    report = convert("openhands", lines)
    assert [c.line for c in report.conversations] == [1]
    assert report.unresolved == 1
    assert [(s.line, s.reason) for s in report.skipped] == [
        (
            4,
            "calls tool 'browser', which has no counterpart among the job's tools "
            "(bash, str_replace_editor, submit)",
        ),
        (
            5,
            "not JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        ),
    ]
    assert dumped(report.conversations[0].jsonl()) == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "Fix the bug."},
        {
            "role": "assistant",
            "content": "Run the tests.",
            "tool_calls": [
                {
                    "id": "toolu_01",
                    "type": "function",
                    "function": {"name": "bash", "arguments": {"command": "pytest -q"}},
                }
            ],
        },
        {"role": "tool", "content": "1 failed", "tool_call_id": "toolu_01"},
        {
            "role": "assistant",
            "content": "Done.",
            "tool_calls": [
                {
                    "id": "toolu_02",
                    "type": "function",
                    "function": {"name": "submit", "arguments": {}},
                }
            ],
        },
    ]
    kept = convert("openhands", lines[:2], ConvertOptions(include_unresolved=True))
    assert [c.line for c in kept.conversations] == [1, 2]


@pytest.mark.parametrize(
    ("call", "reason"),
    [
        (
            ("execute_bash", {"command": "cd /workspace/repo"}),
            "the bash call 'cd /workspace/repo' only changes shell state, which does not carry "
            "over to the next call in the job (each bash call is a fresh shell)",
        ),
        (
            ("execute_bash", {"command": "C-c", "is_input": "true"}),
            "execute_bash with is_input (keys sent to a running process) has no counterpart",
        ),
        (
            ("str_replace_editor", {"command": "view", "path": "/a", "impl_source": "oh_aci"}),
            "str_replace_editor argument(s) impl_source have no counterpart in the job's editor "
            "(its arguments: command, file_text, insert_line, new_str, old_str, path, "
            "view_range)",
        ),
    ],
)
def test_openhands_refuses_calls_it_cannot_map(
    call: tuple[str, dict[str, Any]], reason: str
) -> None:
    row = swe_gym_row(resolved=True)
    row["messages"][2]["tool_calls"] = [oh_call("toolu_01", *call)]
    with pytest.raises(TraceConversionError) as caught:
        convert_openhands(row)
    assert str(caught.value) == reason


def test_a_trajectory_that_never_submits_is_refused() -> None:
    row = swe_gym_row(resolved=True)
    row["messages"] = row["messages"][:4]
    with pytest.raises(TraceConversionError, match="never calls submit"):
        convert_openhands(row)


# SWE-bench/SWE-smith-trajectories, xml split: messages (a JSON string), instance_id, resolved,
# model, traj_id, patch; the assistant text as swesmith's transform_traj_xml writes it
# (github SWE-bench/SWE-smith swesmith/train/traj_mgr/utils.py: thought, a blank line, then
# "<function=NAME>" and one "<parameter=K>V</parameter>" a line, old_str/new_str/file_text with a
# newline each side, other values as Python str(); tool results as user messages).
SWE_SMITH_MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a helpful assistant that can interact with a computer."},
    {"role": "user", "content": "<uploaded_files>\n/testbed\n</uploaded_files>\nFix add()."},
    {
        "role": "assistant",
        "content": "Let me view the file.\n\n<function=str_replace_editor>\n"
        "<parameter=command>view</parameter>\n<parameter=path>/testbed/calc.py</parameter>\n"
        "<parameter=view_range>[1, 2]</parameter>\n</function>",
    },
    {"role": "user", "content": "OBSERVATION:\n     1\tdef add(a, b):\n     2\t    return a - b"},
    {
        "role": "assistant",
        "content": "Fix the operator.\n\n<function=str_replace_editor>\n"
        "<parameter=command>str_replace</parameter>\n<parameter=path>/testbed/calc.py</parameter>\n"
        "<parameter=old_str>\n    return a - b\n</parameter>\n"
        "<parameter=new_str>\n    return a + b\n</parameter>\n</function>",
    },
    {"role": "user", "content": "OBSERVATION:\nThe file /testbed/calc.py has been edited."},
    {
        "role": "assistant",
        "content": "Run the tests.\n\n<function=bash>\n"
        "<parameter=command>cd /testbed && python -m pytest -q</parameter>\n</function>",
    },
    {"role": "user", "content": "OBSERVATION:\n1 passed"},
    {
        "role": "assistant",
        "content": "Since we have successfully fixed the issue and verified it works, let's "
        "submit the changes:\n\n<function=submit>\n</function>",
    },
]


def swe_smith_row(*, resolved: bool) -> dict[str, Any]:
    return {
        "messages": json.dumps(SWE_SMITH_MESSAGES),
        "instance_id": "owner__repo.abc123.func_pm_op_swap__x1",
        "resolved": resolved,
        "model": "claude-3-7-sonnet-20250219",
        "traj_id": "owner__repo.abc123.func_pm_op_swap__x1.abcd",
        "patch": "diff --git a/calc.py b/calc.py\n",
    }


def fn(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def test_swe_smith_xml_blocks_become_calls_and_results_tool_messages() -> None:
    report = convert(
        "swe-smith",
        [json.dumps(swe_smith_row(resolved=True)), json.dumps(swe_smith_row(resolved=False))],
    )
    assert report.unresolved == 1
    (converted,) = report.conversations
    assert dumped(converted.jsonl()) == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "<uploaded_files>\n/testbed\n</uploaded_files>\nFix add()."},
        {
            "role": "assistant",
            "content": "Let me view the file.",
            "tool_calls": [
                fn("str_replace_editor", command="view", path="/testbed/calc.py", view_range=[1, 2])
            ],
        },
        {
            "role": "tool",
            "content": "OBSERVATION:\n     1\tdef add(a, b):\n     2\t    return a - b",
        },
        {
            "role": "assistant",
            "content": "Fix the operator.",
            "tool_calls": [
                fn(
                    "str_replace_editor",
                    command="str_replace",
                    path="/testbed/calc.py",
                    old_str="    return a - b",
                    new_str="    return a + b",
                )
            ],
        },
        {"role": "tool", "content": "OBSERVATION:\nThe file /testbed/calc.py has been edited."},
        {
            "role": "assistant",
            "content": "Run the tests.",
            "tool_calls": [fn("bash", command="cd /testbed && python -m pytest -q")],
        },
        {"role": "tool", "content": "OBSERVATION:\n1 passed"},
        {
            "role": "assistant",
            "content": "Since we have successfully fixed the issue and verified it works, let's "
            "submit the changes:",
            "tool_calls": [fn("submit")],
        },
    ]


# R2E-Gym/R2EGym-SFT-Trajectories: a messages column of {role, content}, calls as the same
# <function=...> text with R2E-Gym's tools (execute_bash {cmd}, file_editor, search, finish
# {command: submit, result}); results as user messages; no resolved column (every row is a
# successful trajectory). Layout as R2E-Gym's own agent parses and prompts it (github
# R2E-Gym/R2E-Gym, src/r2egym/agenthub/agent/agent.py parse_tool_call).
def r2e_row(tool: str = "execute_bash", parameter: str = "cmd") -> dict[str, Any]:
    return {
        "messages": [
            {"role": "system", "content": "You are a programming agent ..."},
            {"role": "user", "content": "<github_issue>\nadd() subtracts\n</github_issue>"},
            {
                "role": "assistant",
                "content": "Reproduce first.\n<function="
                + tool
                + ">\n  <parameter="
                + parameter
                + ">python reproduce.py</parameter>\n</function>",
            },
            {"role": "user", "content": "Exit code: 0\nExecution output of [execute_bash]:\n-1"},
            {
                "role": "assistant",
                "content": "<function=file_editor>\n  <parameter=command>view</parameter>\n"
                "  <parameter=path>/testbed/calc.py</parameter>\n"
                "  <parameter=concise>True</parameter>\n</function>",
            },
            {"role": "user", "content": "Here's the result of running `cat -n` ..."},
            {
                "role": "assistant",
                "content": "Done.\n<function=finish>\n  <parameter=command>submit</parameter>\n"
                "  <parameter=result>add() adds now.</parameter>\n</function>",
            },
        ]
    }


def test_r2e_gym_text_blocks_map_onto_the_job_tools() -> None:
    conversation = convert_xml_text(r2e_row())
    assert dumped(json.dumps(conversation.model_dump(mode="json", exclude_none=True)))[2:] == [
        {
            "role": "assistant",
            "content": "Reproduce first.",
            "tool_calls": [fn("bash", command="python reproduce.py")],
        },
        {"role": "tool", "content": "Exit code: 0\nExecution output of [execute_bash]:\n-1"},
        {
            "role": "assistant",
            "tool_calls": [fn("str_replace_editor", command="view", path="/testbed/calc.py")],
        },
        {"role": "tool", "content": "Here's the result of running `cat -n` ..."},
        {
            "role": "assistant",
            "content": "Done.\n\nadd() adds now.",
            "tool_calls": [fn("submit")],
        },
    ]
    with pytest.raises(TraceConversionError, match="calls tool 'search'"):
        convert_xml_text(r2e_row(tool="search", parameter="search_term"))


# nebius/SWE-agent-trajectories: instance_id, model_name, target (bool), trajectory: a list of
# {cutoff_date, mask, role (system, user, ai), system_prompt, text}, exit_status,
# generated_patch, eval_logs (dataset card's dataset_info,
# https://huggingface.co/datasets/nebius/SWE-agent-trajectories); the ai text a DISCUSSION then
# the command in a fenced block, as SWE-agent's thought-action format writes it.
def text_step(role: str, text: str) -> dict[str, Any]:
    return {
        "cutoff_date": None,
        "mask": role != "ai",
        "role": role,
        "system_prompt": None,
        "text": text,
    }


def swe_agent_row(action: str, *, target: bool = True) -> dict[str, Any]:
    return {
        "instance_id": "owner__repo-7",
        "model_name": "swe-agent-llama-70b",
        "target": target,
        "trajectory": [
            text_step("system", "SETTING: You are an autonomous programmer ..."),
            text_step(
                "user", "We're currently solving the following issue ...\n(Open file: n/a)\nbash-$"
            ),
            text_step("ai", "DISCUSSION\nLet me run the tests.\n\n```\npytest -q\n```\n"),
            text_step("user", "1 failed\n(Open file: n/a)\n(Current directory: /repo)\nbash-$"),
            text_step("ai", f"DISCUSSION\nFix it.\n\n```\n{action}\n```\n"),
            text_step("user", "(Open file: n/a)\n(Current directory: /repo)\nbash-$"),
            text_step("ai", "DISCUSSION\nThe tests pass now.\n\n```\nsubmit\n```\n"),
        ],
        "exit_status": "submitted",
        "generated_patch": "diff --git ...",
        "eval_logs": "",
    }


def test_swe_agent_text_converts_shell_actions_and_refuses_interface_commands() -> None:
    rows = [
        swe_agent_row("sed -i 's/a - b/a + b/' calc.py"),
        swe_agent_row("edit 2:2\n    return a + b\nend_of_edit"),
        swe_agent_row("sed -i 's/a - b/a + b/' calc.py", target=False),
    ]
    report = convert("swe-agent-text", [json.dumps(rows)])  # a JSON array file
    assert report.unresolved == 1
    assert [(s.line, s.reason) for s in report.skipped] == [
        (
            2,
            "uses SWE-agent's 'edit' command, which acts on its open-file window and has no "
            "faithful counterpart among the job's tools (bash, str_replace_editor, submit)",
        )
    ]
    (converted,) = report.conversations
    assert converted.line == 1
    assert dumped(converted.jsonl()) == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {
            "role": "user",
            "content": "We're currently solving the following issue ...\n(Open file: n/a)\nbash-$",
        },
        {
            "role": "assistant",
            "content": "DISCUSSION\nLet me run the tests.",
            "tool_calls": [fn("bash", command="pytest -q")],
        },
        {
            "role": "tool",
            "content": "1 failed\n(Open file: n/a)\n(Current directory: /repo)\nbash-$",
        },
        {
            "role": "assistant",
            "content": "DISCUSSION\nFix it.",
            "tool_calls": [fn("bash", command="sed -i 's/a - b/a + b/' calc.py")],
        },
        {"role": "tool", "content": "(Open file: n/a)\n(Current directory: /repo)\nbash-$"},
        {
            "role": "assistant",
            "content": "DISCUSSION\nThe tests pass now.",
            "tool_calls": [fn("submit")],
        },
    ]
    # the trajectory may also come as a JSON string
    row = swe_agent_row("ls")
    row["trajectory"] = json.dumps(row["trajectory"])
    assert convert_swe_agent_text(row).called_tools() == ["bash", "bash", "submit"]


def test_converted_lines_read_back_with_the_job_template_and_parser(tmp_path: Path) -> None:
    from agentrl.trainer.hf_model import create_model

    model_dir = create_model(tmp_path / "model", seed=0)
    turns = job_turn_tokenizer(
        ModelSpec.model_validate({"source": {"path": str(model_dir)}, "toolCallParser": "qwen25"})
    )
    lines = [
        *(c.jsonl() for c in convert("openhands", [json.dumps(REBENCH_ROW)]).conversations),
        *(
            c.jsonl()
            for c in convert("swe-smith", [json.dumps(swe_smith_row(resolved=True))]).conversations
        ),
        *(c.jsonl() for c in convert("swe-smith", [json.dumps(r2e_row())]).conversations),
        *(
            c.jsonl()
            for c in convert("swe-agent-text", [json.dumps(swe_agent_row("ls"))]).conversations
        ),
    ]
    assert len(lines) == 4
    report = read_conversations(lines, turns, tokens_per_batch=100_000)
    assert report.errors == []
    assert [c.line for c in report.conversations] == [1, 2, 3, 4]
    assert all(c.trained_tokens > 0 for c in report.conversations)


def test_cli_writes_the_conversations_and_reports_skipped_rows(tmp_path: Path) -> None:
    source = tmp_path / "swe_gym.jsonl"
    source.write_text(
        json.dumps(swe_gym_row(resolved=True))
        + "\n"
        + json.dumps(swe_gym_row(resolved=True, tool="browser"))
        + "\n"
        + json.dumps(swe_gym_row(resolved=False))
        + "\n",
        encoding="utf-8",
    )
    out = tmp_path / "out" / "warm.jsonl"
    result = CliRunner().invoke(
        tasks, ["convert-traces", "--from", "openhands", str(source), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert f"{source}:2: calls tool 'browser'" in result.stderr
    assert (
        f"wrote 1/3 rows of {source} to {out}: 1 skipped (above), 1 unresolved left out "
        "(--include-unresolved keeps them)" in result.stderr
    )
    (line,) = out.read_text(encoding="utf-8").splitlines()
    assert [m["role"] for m in json.loads(line)["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    # nothing converted: exit 1
    result = CliRunner().invoke(
        tasks, ["convert-traces", "--from", "swe-smith", str(source), "--out", str(out)]
    )
    assert result.exit_code == 1
    assert "wrote 0/3 rows" in result.stderr
