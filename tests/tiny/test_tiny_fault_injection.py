"""``agentrl engine serve-tiny`` fault injection, as the watchdog sees it: a real process."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.engine_client.client import EngineClient, SamplingParams
from agentrl.local.engines import free_port
from agentrl.tiny import policy as tiny
from agentrl.tiny.tokenizer import get_tokenizer

LINE = "HIP error: an illegal memory access was encountered"


def _start(tmp_path: Path, mode: str, after: int) -> tuple[subprocess.Popen[bytes], str, Path]:
    port = free_port()
    log = tmp_path / "engine.log"
    weights = tiny.save_policy(tiny.new_policy(0, dim=8), tmp_path / "weights")
    proc = subprocess.Popen(
        [sys.executable, "-c", "from agentrl.tiny.server import serve_tiny; serve_tiny()",
         "--model-path", str(weights), "--port", str(port), "--log-file", str(log),
         "--fault-mode", mode,
         "--fault-after-requests", str(after), "--fault-line", LINE],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    return proc, f"http://127.0.0.1:{port}", log


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()


async def _one_request(client: EngineClient) -> None:
    prompt = get_tokenizer().apply_chat_template([{"role": "user", "content": "hi"}])
    await client.generate(prompt, SamplingParams(max_new_tokens=2))


@pytest.mark.slow
async def test_crash_mode_prints_the_line_and_exits_non_zero_after_n_requests(
    tmp_path: Path,
) -> None:
    proc, url, log = _start(tmp_path, "crash", 1)
    try:
        async with EngineClient(url, max_connections=2, timeout_seconds=10) as client:
            await client.wait_healthy(deadline_seconds=90)
            await _one_request(client)  # the first request is answered
            code = await asyncio.to_thread(proc.wait, 20)
        assert code != 0
        assert LINE + "\n" in log.read_text()
        assert proc.stderr is not None and LINE in proc.stderr.read().decode()
    finally:
        _stop(proc)


@pytest.mark.slow
async def test_hang_mode_stops_answering_http(tmp_path: Path) -> None:
    proc, url, log = _start(tmp_path, "hang", 1)
    try:
        async with EngineClient(url, max_connections=4, timeout_seconds=10) as client:
            await client.wait_healthy(deadline_seconds=90)
            await _one_request(client)
            await asyncio.sleep(0.3)
            assert await client.health(timeout=1.0) is False
            assert proc.poll() is None  # alive, just not answering
        assert LINE in log.read_text()
    finally:
        _stop(proc)


@pytest.mark.slow
async def test_stall_mode_reports_running_requests_but_generates_nothing(tmp_path: Path) -> None:
    proc, url, _ = _start(tmp_path, "stall", 1)
    try:
        async with EngineClient(url, max_connections=4, timeout_seconds=10) as client:
            await client.wait_healthy(deadline_seconds=90)
            await _one_request(client)
            await asyncio.sleep(0.3)
            stuck = asyncio.ensure_future(_one_request(client))
            await asyncio.sleep(0.5)
            before = await client.metrics()
            time.sleep(0.5)
            after = await client.metrics()
            assert await client.health(timeout=2.0) is True  # the HTTP server is alive
            assert await client.health_generate(timeout=1.0) is False  # generation is not
            assert before.num_running_reqs == 1.0
            assert after.generation_tokens_total == before.generation_tokens_total
            stuck.cancel()
            await asyncio.gather(stuck, return_exceptions=True)
    finally:
        _stop(proc)
