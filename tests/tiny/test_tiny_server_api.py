"""The tiny engine behind SGLang's API, driven through the runtime's own EngineClient.

The request and response shapes asserted here are SGLang's documented ones
(``docs/design/toy-agent-contract.md``), so the client that passes them is the one used against
real SGLang.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import torch
from aiohttp.test_utils import TestServer

from agentrl.engine_client.client import (
    EngineClient,
    EngineRequestError,
    SamplingParams,
)
from agentrl.tiny import policy as tiny
from agentrl.tiny.server import TinyEngine, build_app
from agentrl.tiny.tokenizer import get_tokenizer


@pytest.fixture
async def served() -> AsyncIterator[tuple[TinyEngine, EngineClient, str]]:
    engine = TinyEngine(
        tiny.new_policy(0, dim=16), model_path="mem", context_length=64, max_running_requests=2
    )
    server = TestServer(build_app(engine), host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    client = EngineClient(url, max_connections=8, timeout_seconds=10)
    try:
        yield engine, client, url
    finally:
        await client.close()
        await server.close()


def _prompt() -> list[int]:
    return get_tokenizer().apply_chat_template([{"role": "user", "content": "fix the bug"}])


async def test_generate_returns_ids_text_and_one_logprob_per_token(served) -> None:  # type: ignore[no-untyped-def]
    _, _client, url = served
    body = {
        "input_ids": _prompt(),
        "sampling_params": {"max_new_tokens": 3, "temperature": 1.0},
        "return_logprob": True,
    }
    async with aiohttp.ClientSession() as s, s.post(url + "/generate", json=body) as r:
        raw = await r.json()
    assert set(raw) >= {"text", "output_ids", "meta_info"}
    meta = raw["meta_info"]
    assert set(meta) >= {
        "id",
        "finish_reason",
        "prompt_tokens",
        "completion_tokens",
        "output_token_logprobs",
        "weight_version",
    }
    assert meta["prompt_tokens"] == len(_prompt())
    assert len(meta["output_token_logprobs"]) == meta["completion_tokens"] == len(raw["output_ids"])
    assert [e[1] for e in meta["output_token_logprobs"]] == raw["output_ids"]
    assert meta["finish_reason"]["type"] in ("stop", "length")


async def test_engine_logprobs_equal_the_trainers_recomputation(served) -> None:  # type: ignore[no-untyped-def]
    engine, client, _ = served
    prompt = _prompt()
    out = await client.generate(prompt, SamplingParams(max_new_tokens=4, temperature=0.7))
    ids = prompt + out.output_ids
    with torch.no_grad():
        trainer = tiny.sequence_logprobs(
            engine.model, ids, [(len(prompt), len(ids))], temperature=0.7
        )
    assert trainer.tolist() == pytest.approx(out.logprobs, abs=1e-5)


async def test_a_length_cap_ends_generation_with_finish_reason_length(served) -> None:  # type: ignore[no-untyped-def]
    engine, client, _ = served
    # An output layer that always prefers one non-eos word: the cap is what stops it.
    with torch.no_grad():
        engine.model.output.bias.fill_(-50.0)
        engine.model.output.bias[get_tokenizer().token_id("view")] = 50.0
    out = await client.generate(_prompt(), SamplingParams(max_new_tokens=2, temperature=1.0))
    assert out.finish_type == "length" and len(out.output_ids) == 2


async def test_a_prompt_longer_than_the_context_is_refused_as_a_request_error(served) -> None:  # type: ignore[no-untyped-def]
    _, client, _ = served
    with pytest.raises(EngineRequestError) as info:
        await client.generate([1] * 64, SamplingParams(max_new_tokens=1))
    assert info.value.status == 400


async def test_weights_from_disk_change_the_served_version_and_outputs(
    served, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    _engine, client, _ = served
    assert (await client.get_model_info()).weight_version == "0"
    new = tiny.new_policy(0, dim=16)
    with torch.no_grad():
        new.output.bias.fill_(-50.0)
        new.output.bias[get_tokenizer().eos_id] = 50.0
    tiny.save_policy(new, tmp_path / "v7")
    await client.pause_generation(mode="in_place")
    result = await client.update_weights_from_disk(str(tmp_path / "v7"), weight_version="7")
    await client.flush_cache()
    await client.continue_generation()
    assert result.success
    info = await client.get_model_info()
    assert (info.weight_version, info.model_path, info.tokenizer_path) == (
        "7",
        str(tmp_path / "v7"),
        "agentrl:tiny",
    )
    out = await client.generate(_prompt(), SamplingParams(max_new_tokens=3))
    assert out.output_ids == [get_tokenizer().eos_id]
    assert out.meta_info.weight_version == "7"


async def test_a_failed_weight_load_keeps_the_old_weights(served, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, client, _ = served
    with pytest.raises(EngineRequestError):
        await client.update_weights_from_disk(str(tmp_path / "missing"), weight_version="9")
    assert (await client.get_model_info()).weight_version == "0"


async def test_paused_generation_holds_requests_until_continued(served) -> None:  # type: ignore[no-untyped-def]
    _engine, client, _ = served
    await client.pause_generation(mode="in_place")
    pending = asyncio.ensure_future(client.generate(_prompt(), SamplingParams(max_new_tokens=2)))
    await asyncio.sleep(0.2)
    assert not pending.done()
    metrics = await client.metrics()
    assert metrics.num_queue_reqs == 1.0
    await client.continue_generation()
    out = await asyncio.wait_for(pending, 5)
    assert out.output_ids


async def test_metrics_use_sglang_names_and_count_generated_tokens(served) -> None:  # type: ignore[no-untyped-def]
    _, client, _ = served
    out = await client.generate(_prompt(), SamplingParams(max_new_tokens=3))
    m = await client.metrics()
    assert m.generation_tokens_total == len(out.output_ids)
    assert m.prompt_tokens_total == len(_prompt())
    assert m.num_running_reqs == 0.0
    assert m.max_total_num_tokens == 64 * 2  # context length × max running requests
    assert await client.health() and await client.health_generate()


async def test_a_scheduler_that_fails_answers_every_request_and_health_with_the_error(
    served,  # type: ignore[no-untyped-def]
) -> None:
    """The model's forward raising inside the scheduler: the requests it holds answer 500 with
    the error instead of hanging, and /health answers 503 from then on (the watchdog's cue)."""
    engine, _, url = served

    def broken(batch):  # type: ignore[no-untyped-def]
        raise RuntimeError("forward refused: out of memory")

    engine.served.next_logits = broken  # type: ignore[method-assign]
    body = {"input_ids": _prompt(), "sampling_params": {"max_new_tokens": 4}}
    async with aiohttp.ClientSession() as session:
        held = [session.post(f"{url}/generate", json=body) for _ in range(3)]  # 2 run, 1 queued
        answers = await asyncio.wait_for(asyncio.gather(*held), timeout=10)
        for answer in answers:
            assert answer.status == 500
            assert await answer.text() == (
                "the engine's scheduler failed: RuntimeError: forward refused: out of memory"
            )
        async with session.get(f"{url}/health") as health:
            assert health.status == 503
            assert "forward refused: out of memory" in await health.text()
        async with session.post(f"{url}/generate", json=body) as later:
            assert later.status == 503
    assert engine.queue == [] and engine.running == []
