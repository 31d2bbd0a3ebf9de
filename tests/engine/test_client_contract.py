"""EngineClient: pool sizing from the spec, metrics parsing, and error classes by what the
caller does next."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from agentrl.api import AgentRLJobSpec
from agentrl.engine.client import (
    CONTROL_CONNECTIONS,
    EngineClient,
    EngineRequestError,
    EngineTimeout,
    EngineUnavailable,
    SamplingParams,
    connection_pool_size,
    parse_metrics,
)
from agentrl.local.engines import free_port


def _spec(concurrency: int, running: int) -> AgentRLJobSpec:
    return AgentRLJobSpec.model_validate(
        {
            "model": {"source": {"path": "tiny"}},
            "sandbox": {"concurrency": concurrency},
            "inference": {"maxRunningRequests": running},
        }
    )


@pytest.mark.parametrize(
    ("concurrency", "running", "expected"),
    [
        (16, 64, 16 + 4),  # every episode may call at once: 16 slots + 4 control
        (384, 64, 128 + 4),  # beyond running + one queue's worth, requests wait in our pool
    ],
)
def test_pool_size_follows_the_spec(concurrency: int, running: int, expected: int) -> None:
    assert CONTROL_CONNECTIONS == 4
    assert connection_pool_size(_spec(concurrency, running)) == expected


async def test_the_http_pool_has_exactly_the_given_size() -> None:
    client = EngineClient("http://127.0.0.1:1", max_connections=37)
    session = client._ensure_session()
    assert session.connector is not None and session.connector.limit == 37
    assert session.connector.limit_per_host == 37
    await client.close()


def test_sglang_metrics_text_is_parsed_and_summed_over_labels() -> None:
    text = (
        "# HELP sglang:num_running_reqs r\n# TYPE sglang:num_running_reqs gauge\n"
        'sglang:num_running_reqs{model_name="a"} 3.0\n'
        'sglang:num_running_reqs{model_name="b"} 2.0\n'
        "# HELP sglang:generation_tokens_total g\n# TYPE sglang:generation_tokens_total counter\n"
        'sglang:generation_tokens_total{model_name="a"} 120.0\n'
    )
    m = parse_metrics(text)
    assert (m.num_running_reqs, m.generation_tokens_total, m.token_usage) == (5.0, 120.0, None)


@pytest.fixture
async def scripted() -> AsyncIterator[str]:
    async def fail(_: web.Request) -> web.Response:
        return web.Response(status=503, text="overloaded")

    async def bad(_: web.Request) -> web.Response:
        return web.Response(status=400, text="bad input")

    async def slow(_: web.Request) -> web.Response:
        import asyncio

        await asyncio.sleep(5)
        return web.json_response({})

    app = web.Application()
    app.add_routes(
        [web.post("/generate", fail), web.get("/get_model_info", bad), web.get("/metrics", slow)]
    )
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield str(server.make_url("")).rstrip("/")
    await server.close()


async def test_a_5xx_is_an_unavailable_engine_and_a_4xx_a_request_error(scripted: str) -> None:
    async with EngineClient(scripted, max_connections=2) as client:
        with pytest.raises(EngineUnavailable) as info:
            await client.generate([1], SamplingParams())
        assert info.value.status == 503
        with pytest.raises(EngineRequestError):
            await client.get_model_info()
        with pytest.raises(EngineTimeout):
            await client.metrics(timeout=0.2)


async def test_a_refused_connection_is_an_unavailable_engine() -> None:
    async with EngineClient(f"http://127.0.0.1:{free_port()}", max_connections=1) as client:
        with pytest.raises(EngineUnavailable):
            await client.generate([1], SamplingParams())
        assert await client.health() is False
