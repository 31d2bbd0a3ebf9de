"""Which token an argparse refusal names (``agentrl.engine.sglang_check``), with the messages a
real ``argparse`` parser gives; and the launcher's message naming the flag's spec field.

SGLang's own parser is exercised in ``tests/contracts/test_sglang_launch_check.py``; here a
small standard-library parser with the same kinds of options produces the messages."""

from __future__ import annotations

import argparse

import pytest

from agentrl.api import engine_flags, wire
from agentrl.engine import launch, sglang_check


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _Refused(message)


def _message(args: list[str]) -> str:
    parser = _Parser(add_help=False)
    parser.add_argument("--model-path")
    parser.add_argument("--tp-size", "--tensor-parallel-size", type=int)
    parser.add_argument("--tool-call-parser", choices=["qwen25", "qwen3_coder"])
    parser.add_argument("--cuda-graph-max-bs-decode", type=int)
    parser.add_argument("--cuda-graph-max-bs-prefill", type=int)
    with pytest.raises(_Refused) as info:
        parser.parse_args(args)
    return str(info.value)


@pytest.mark.parametrize(
    ("args", "index"),
    [
        (["--model-path", "/m", "--hip-turbo"], 2),
        (["--model-path", "/m", "--tool-call-parser", "qwen9"], 2),
        (["--model-path", "/m", "--tool-call-parser=qwen9"], 2),
        (["--model-path", "/m", "--tensor-parallel-size", "two"], 2),
        (["--model-path", "/m", "--cuda-graph-max-bs", "8"], 2),
    ],
)
def test_the_refused_token_is_found(args: list[str], index: int) -> None:
    message = _message(args)
    assert sglang_check._offending_index(message, args) == index, message


def test_the_launchers_message_names_the_flag_and_its_field(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args = ["--model-path", "/m", "--page-size", "16", "--hip-turbo"]
    sources = ["spec.model.source", "spec.model.source"] + [
        f"spec.inference.extraArgs[{i}]" for i in range(3)
    ]
    rejection = sglang_check.Rejection("unrecognized arguments: --hip-turbo", index=4)
    monkeypatch.setattr(sglang_check, "check_args", lambda _: rejection)
    monkeypatch.setattr(launch, "_installed_sglang_version", lambda: "0.5.23")
    with pytest.raises(engine_flags.EngineFlagError) as info:
        launch.check_with_sglang(args, sources)
    message = str(info.value)
    assert message.startswith("SGLang 0.5.23 (agentrl's flags are checked against SGLang 0.5.15")
    assert "'--hip-turbo', from spec.inference.extraArgs[2]," in message


def test_a_refused_value_names_the_flag_it_belongs_to(monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["--model-path", "/m", "--tool-call-parser", "qwen9"]
    sources = ["spec.model.source"] * 2 + ["spec.model.toolCallParser"] * 2
    rejection = sglang_check.Rejection("invalid choice: 'qwen9'", index=3)
    monkeypatch.setattr(sglang_check, "check_args", lambda _: rejection)
    monkeypatch.setattr(launch, "_installed_sglang_version", lambda: wire.SGLANG_VERSION)
    with pytest.raises(
        engine_flags.EngineFlagError,
        match=r"'--tool-call-parser', from spec\.model\.toolCallParser",
    ):
        launch.check_with_sglang(args, sources)
