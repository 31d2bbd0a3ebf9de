"""EngineClient: pool sizing from the spec, metrics parsing, and error classes by what the
caller does next."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import REGISTRY

from agentrl.api import AgentRLJobSpec
from agentrl.engine_client.client import (
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


async def test_the_http_pool_never_opens_more_than_its_size_and_exports_it() -> None:
    release = asyncio.Event()

    async def hold(_: bytes) -> bytes:
        await release.wait()
        return _answer(200, b'{"model_path": "m"}')

    async with RawServer(hold) as server:
        async with EngineClient(server.url, max_connections=3) as client:
            calls = [asyncio.create_task(client.get_model_info()) for _ in range(10)]
            await _until(lambda: server.open == 3)
            await asyncio.sleep(0.1)  # give a fourth connection every chance to appear
            assert server.open == 3
            release.set()
            infos = await asyncio.gather(*calls)
        assert [i.model_path for i in infos] == ["m"] * 10
        assert server.peak_open == 3
        assert server.connections == 3  # the 7 waiting calls reused them
    assert REGISTRY.get_sample_value("agentrl_engine_client_pool_size", {"engine": server.url}) == 3


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
        [web.post("/generate", fail), web.get("/model_info", bad), web.get("/metrics", slow)]
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


# ---------------------------------------------------------------------------------------------
# The keep-alive transport against a server written with asyncio streams (not the client's own
# parser): framing, connection reuse, stale connections, timeouts.


def _answer(status: int, body: bytes, *extra: str) -> bytes:
    head = [f"HTTP/1.1 {status} X", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class RawServer:
    """Answers each request with ``script(request bytes)``; ``None`` closes the connection
    without answering. Counts connections."""

    def __init__(self, script: Callable[[bytes], Awaitable[bytes | None]]) -> None:
        self.script = script
        self.requests: list[bytes] = []
        self.connections = self.open = self.peak_open = 0
        self.url = ""
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        self.peak_open = max(self.peak_open, self.open)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                answer = await self.script(request)
                if answer is None:
                    return
                writer.write(answer)
                await writer.drain()
        finally:
            self.open -= 1
            writer.close()


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


GENERATED = {
    "text": "bash ls",
    "output_ids": [5, 6],
    "meta_info": {
        "id": "r1",
        "finish_reason": {"type": "stop"},
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "output_token_logprobs": [[-0.5, 5, None], [-0.25, 6, None]],
        "weight_version": 7,
    },
}


async def test_generate_sends_sglangs_request_and_reads_its_answer() -> None:
    async def answer(_: bytes) -> bytes:
        return _answer(200, json.dumps(GENERATED).encode())

    async with (
        RawServer(answer) as server,
        EngineClient(server.url, max_connections=2, api_key="k") as c,
    ):
        response = await c.generate(
            [1, 2, 3], SamplingParams(max_new_tokens=4, temperature=0.5), rid="e1"
        )
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /generate HTTP/1.1"
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    assert headers["authorization"] == "Bearer k"
    assert headers["content-type"] == "application/json"
    assert int(headers["content-length"]) == len(body)
    assert json.loads(body) == {
        "input_ids": [1, 2, 3],
        "sampling_params": {"max_new_tokens": 4, "temperature": 0.5, "top_p": 1.0},
        "return_logprob": True,
        "rid": "e1",
    }
    assert response.output_ids == [5, 6]
    assert response.logprobs == [-0.5, -0.25]
    assert response.finish_type == "stop"
    assert response.meta_info.weight_version == "7"


async def test_a_batch_answer_yields_its_first_response() -> None:
    async def answer(_: bytes) -> bytes:
        return _answer(200, json.dumps([GENERATED, {**GENERATED, "text": "other"}]).encode())

    async with RawServer(answer) as server, EngineClient(server.url, max_connections=1) as c:
        assert (await c.generate([1], SamplingParams())).text == "bash ls"


async def test_sequential_calls_share_one_keep_alive_connection() -> None:
    async def answer(_: bytes) -> bytes:
        return _answer(200, b"")

    async with RawServer(answer) as server, EngineClient(server.url, max_connections=4) as c:
        for _ in range(20):
            assert await c.health() is True
    assert (server.connections, len(server.requests)) == (1, 20)


async def test_a_chunked_answer_is_joined_and_its_connection_reused() -> None:
    body = json.dumps({"model_path": "chunked/model", "weight_version": "3"}).encode()
    parts = [body[:5], body[5:17], body[17:]]
    chunked = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in parts)

    async def answer(_: bytes) -> bytes:
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        return head + chunked + b"0\r\nX-Trailer: t\r\n\r\n"

    async with RawServer(answer) as server, EngineClient(server.url, max_connections=1) as c:
        for _ in range(2):
            info = await c.get_model_info()
            assert (info.model_path, info.weight_version) == ("chunked/model", "3")
    assert server.connections == 1


async def test_an_answer_framed_by_the_end_of_the_connection_is_read_whole() -> None:
    class EofServer(RawServer):
        async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.0 200 OK\r\n\r\n# metrics\nsglang:num_running_reqs 4\n")
            await writer.drain()
            writer.close()

    async with EofServer(_no_script) as server, EngineClient(server.url, max_connections=1) as c:
        assert (await c.metrics()).num_running_reqs == 4.0
        assert (await c.metrics()).num_running_reqs == 4.0
    assert server.connections == 2


async def _no_script(_: bytes) -> bytes | None:
    return None


async def test_connection_close_is_honoured() -> None:
    async def answer(_: bytes) -> bytes:
        return _answer(200, b"", "Connection: close")

    async with RawServer(answer) as server, EngineClient(server.url, max_connections=1) as c:
        assert await c.health() is True
        assert await c.health() is True
    assert server.connections == 2


async def test_a_reused_connection_closed_unanswered_is_retried_once_on_a_new_one() -> None:
    seen: list[int] = []

    async def answer(_: bytes) -> bytes | None:
        seen.append(len(seen))
        # The second request arrives on the kept connection and is dropped unanswered, the
        # way a server that timed the idle connection out drops it.
        return None if len(seen) == 2 else _answer(200, b'{"model_path": "m"}')

    async with RawServer(answer) as server, EngineClient(server.url, max_connections=1) as c:
        await c.get_model_info()
        assert (await c.get_model_info()).model_path == "m"
    assert (len(server.requests), server.connections) == (3, 2)


async def test_a_fresh_connection_closed_unanswered_is_an_unavailable_engine() -> None:
    async with RawServer(_no_script) as server, EngineClient(server.url, max_connections=1) as c:
        with pytest.raises(EngineUnavailable):
            await c.generate([1], SamplingParams())
    assert len(server.requests) == 1  # not retried: nothing says the server did not act on it


async def test_a_timed_out_request_closes_its_connection() -> None:
    closed = asyncio.Event()

    class SilentServer(RawServer):
        async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            await reader.read()  # never answer; returns at the client's end of the connection
            closed.set()
            writer.close()

    async with SilentServer(_no_script) as server:
        async with EngineClient(server.url, max_connections=2) as client:
            with pytest.raises(EngineTimeout):
                await client.generate([1], SamplingParams(), timeout=0.2)
            await asyncio.wait_for(closed.wait(), 5)
        gauge = REGISTRY.get_sample_value(
            "agentrl_engine_client_connections", {"engine": server.url}
        )
        assert gauge == 0


async def test_an_answer_that_is_not_http_is_an_unavailable_engine() -> None:
    async def garbage(_: bytes) -> bytes:
        return b"SSH-2.0-OpenSSH_9.6\r\n\r\n"

    async with RawServer(garbage) as server, EngineClient(server.url, max_connections=1) as c:
        with pytest.raises(EngineUnavailable):
            await c.get_model_info()
        assert await c.health() is False


async def test_an_engine_named_by_host_name_is_reached() -> None:
    async def answer(_: bytes) -> bytes:
        return _answer(200, b"")

    async with RawServer(answer) as server:
        port = server.url.rsplit(":", 1)[1]
        # localhost may resolve to ::1 first; the server listens on 127.0.0.1 only.
        async with EngineClient(f"http://localhost:{port}", max_connections=1) as client:
            assert await client.health() is True
    assert server.connections == 1
