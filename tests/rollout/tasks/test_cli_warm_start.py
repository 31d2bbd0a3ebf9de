"""``agentrl tasks validate`` on a warm-start file: each refused line as FILE:LINE: reason, a
summary, exit 1 when a line is refused; the file and the model from ``--warm-start``/``--model``
or from a manifest's ``spec.trainer.warmStart`` and ``spec.model``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from agentrl.cli import main
from agentrl.rollout.conversations import read_warm_start
from agentrl.rollout.hf_model_files import write_tokenizer_files
from agentrl.rollout.hf_tokenizer import load_hf_turn_tokenizer
from agentrl.rollout.swe_tools import tool_schemas
from tests.api.cases import BASE, merge

USER = {"role": "user", "content": "Fix the bug."}
SUBMIT = {
    "role": "assistant",
    "content": "Done.",
    "tool_calls": [{"type": "function", "function": {"name": "submit", "arguments": {}}}],
}
GOOD = json.dumps({"messages": [USER, SUBMIT]})
UNKNOWN_TOOL = json.dumps(
    {
        "messages": [
            USER,
            {"role": "assistant", "tool_calls": [{"function": {"name": "rm_rf", "arguments": {}}}]},
        ]
    }
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer_files(tmp_path_factory.mktemp("model"))


def validate(*args: str) -> Any:
    return CliRunner().invoke(main, ["tasks", "validate", *args])


def test_each_bad_line_is_printed_as_file_line_reason_and_the_exit_is_1(
    tmp_path: Path, model_dir: Path
) -> None:
    path = tmp_path / "warm.jsonl"
    path.write_text("\n".join([GOOD, "{oops", UNKNOWN_TOOL]) + "\n")
    result = validate(
        "--warm-start", str(path), "--model", str(model_dir), "--tool-call-parser", "qwen25"
    )
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert any(line.startswith(f"{path}:2: not JSON: ") for line in lines), lines
    assert (
        f"{path}:3: calls tool 'rm_rf', which the job does not offer (its tools: bash, "
        "str_replace_editor, submit)"
    ) in lines
    assert f"warm start {path}: 1/3 conversations valid" in result.output


def test_a_good_file_passes_with_its_token_counts(tmp_path: Path, model_dir: Path) -> None:
    path = tmp_path / "warm.jsonl"
    path.write_text(GOOD + "\n" + GOOD + "\n")
    result = validate(
        "--warm-start", str(path), "--model", str(model_dir), "--tool-call-parser", "qwen25"
    )
    assert result.exit_code == 0, result.output
    turns = load_hf_turn_tokenizer(str(model_dir), tools=tool_schemas(), tool_call_parser="qwen25")
    report = read_warm_start(path, turns, tokens_per_batch=32768)
    assert (
        f"warm start {path}: 2/2 conversations valid, {report.tokens} tokens, "
        f"{report.trained_tokens} of them assistant tokens (trained on)"
    ) in result.output


def test_without_a_parser_the_job_offers_no_tools(tmp_path: Path, model_dir: Path) -> None:
    path = tmp_path / "warm.jsonl"
    path.write_text(GOOD + "\n")
    result = validate("--warm-start", str(path), "--model", str(model_dir))
    assert result.exit_code == 1
    assert "the job offers no tools" in result.output


def manifest(tmp_path: Path, model_dir: Path, dataset: str, **warm_start: Any) -> Path:
    doc = merge(
        BASE,
        {
            "spec": {
                "model": {
                    "source": {"path": str(model_dir)},
                    "toolCallParser": "qwen3_coder",
                    "chatTemplate": {"bundled": "qwen3-coder"},
                },
                "trainer": {"warmStart": {"dataset": dataset, **warm_start}},
            }
        },
    )
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_manifest_names_the_file_the_model_and_the_budget(
    tmp_path: Path, model_dir: Path
) -> None:
    path = tmp_path / "warm.jsonl"
    path.write_text(GOOD + "\n")
    job = manifest(tmp_path, model_dir, str(path))
    result = validate("--manifest", str(job))
    assert result.exit_code == 0, result.output
    assert f"warm start {path}: 1/1 conversations valid" in result.output

    small = manifest(tmp_path, model_dir, str(path), tokensPerBatch=512)
    result = validate("--manifest", str(small))
    assert result.exit_code == 1
    assert f"{path}:1: " in result.output
    assert "more than spec.trainer.warmStart.tokensPerBatch (512)" in result.output


def test_a_warm_start_file_that_is_not_here_is_a_usage_error_naming_the_way_out(
    tmp_path: Path, model_dir: Path
) -> None:
    job = manifest(tmp_path, model_dir, "/nowhere/warm.jsonl")
    result = validate("--manifest", str(job))
    assert result.exit_code == 2
    assert "/nowhere/warm.jsonl is not on this machine" in result.output
    assert "--warm-start" in result.output


def test_nothing_to_check_is_a_usage_error(tmp_path: Path) -> None:
    result = validate()
    assert result.exit_code == 2
    assert "give DATASET, or a warm-start file to check" in result.output
    path = tmp_path / "warm.jsonl"
    path.write_text(GOOD + "\n")
    result = validate("--warm-start", str(path))
    assert result.exit_code == 2
    assert "--warm-start needs the model: --model DIR" in result.output
