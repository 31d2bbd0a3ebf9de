"""Test doubles for rollout tests: a scripted engine, a toy task and a sandbox handler that
answers its test command the way pytest would."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from agentrl.engine_client.client import (
    EngineUnavailable,
    FinishReason,
    GenerateResponse,
    MetaInfo,
    SamplingParams,
)
from agentrl.rollout.tasks.model import CandidateEdit, NamedTestsVerification, Task
from agentrl.sandbox.fake import FakeSandbox
from agentrl.sandbox.provider import ExecResult
from agentrl.tiny.tokenizer import get_tokenizer

LOGPROB = -0.25
TEST_ID = "tests/test_app.py::test_value"


class ScriptedEngine:
    """Replies with the next text of ``script`` (the last one repeats); records every call.

    The reply's ids are ``encode(text)`` plus ``end_id``, cut at ``max_new_tokens`` — by default
    the tiny policy's word tokenizer and ``<eos>``; pass a model's own to script it."""

    def __init__(
        self,
        script: Sequence[str] | Callable[[list[int]], str],
        *,
        base_url: str = "http://engine-0",
        latency: float = 0.0,
        gate: asyncio.Event | None = None,
        fail_calls: int = 0,
        encode: Callable[[str], list[int]] | None = None,
        end_id: int | None = None,
    ) -> None:
        self.script = script
        self.encode = encode or get_tokenizer().encode
        self.end_id = get_tokenizer().eos_id if end_id is None else end_id
        self.base_url = base_url
        self.latency = latency
        self.gate = gate
        self.fail_calls = fail_calls
        self.inputs: list[list[int]] = []
        self.sampling: list[SamplingParams] = []
        self.healthy = True

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: SamplingParams,
        *,
        rid: str | None = None,
        timeout: float | None = None,
    ) -> GenerateResponse:
        if self.fail_calls > 0:
            self.fail_calls -= 1
            raise EngineUnavailable("connection refused", url=self.base_url)
        self.inputs.append(list(input_ids))
        self.sampling.append(sampling_params)
        if self.gate is not None:
            await self.gate.wait()
        if self.latency:
            await asyncio.sleep(self.latency)
        if callable(self.script):
            text = self.script(list(input_ids))
        else:
            text = self.script[min(len(self.inputs) - 1, len(self.script) - 1)]
        ids = [*self.encode(text), self.end_id][: sampling_params.max_new_tokens]
        finish = "stop" if len(ids) < sampling_params.max_new_tokens else "length"
        return GenerateResponse(
            text=text,
            output_ids=ids,
            meta_info=MetaInfo(
                finish_reason=FinishReason(type=finish),  # type: ignore[arg-type]
                output_token_logprobs=[(LOGPROB, i, None) for i in ids],
                weight_version="7",
            ),
        )

    async def health(self, *, timeout: float = 10.0) -> bool:
        return self.healthy


def toy_task(task_id: str = "app") -> Task:
    """A one-file task: ``fix`` turns BUG into OK (the test passes), ``decoy`` does not."""
    return Task(
        id=task_id,
        source="toy",
        instruction="Make test_value pass.",
        files={"app.py": "VALUE = 'BUG'\nOTHER = 1\n"},
        visible_test_command="pytest -rA",
        candidate_edits=[
            CandidateEdit(name="fix", path="app.py", old="'BUG'", new="'OK'"),
            CandidateEdit(name="decoy", path="app.py", old="OTHER = 1", new="OTHER = 2"),
        ],
        verification=NamedTestsVerification(fail_to_pass=[TEST_ID], test_command="pytest -rA"),
    )


def pytest_handler(sandbox: FakeSandbox, command: str) -> ExecResult:
    """``pytest`` passes when app.py holds 'OK'; other commands echo."""
    if command.startswith("pytest"):
        source = sandbox.files.get(f"{sandbox.workdir}/app.py", b"").decode()
        verdict = "PASSED" if "'OK'" in source else "FAILED"
        return ExecResult(
            exit_code=0 if verdict == "PASSED" else 1, stdout=f"{verdict} {TEST_ID}\n"
        )
    return ExecResult(exit_code=0, stdout=f"ran: {command}\n")
