"""``agentrl engine serve-tiny`` fault injection, as the watchdog and the trainer see it: a real
process (the engine faults), and the tiny engine in-process behind the trainer's own weight sync
(the weight route failing). The job passes the flags in ``spec.inference.extraArgs``."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import yaml
from aiohttp.test_utils import TestServer

from agentrl.api.engine import TINY_EXTRA_FLAGS
from agentrl.api.validation import load_job
from agentrl.engine_client.client import EngineClient, EngineUnavailable, SamplingParams
from agentrl.local.engines import free_port
from agentrl.reconcile import engine as engine_pods
from agentrl.reconcile.context import BuildContext
from agentrl.tiny import policy as tiny
from agentrl.tiny.server import FaultPlan, TinyEngine, build_app, serve_tiny
from agentrl.tiny.tokenizer import get_tokenizer
from agentrl.trainer.weight_sync import DiskWeightSync, PushRetry

LINE = "HIP error: an illegal memory access was encountered"
EXAMPLE = Path(__file__).parents[2] / "examples" / "quickstart-cluster.yaml"


def _spawn(tmp_path: Path, *fault: str) -> tuple[subprocess.Popen[bytes], str, Path]:
    port = free_port()
    log = tmp_path / "engine.log"
    weights = tiny.save_policy(tiny.new_policy(0, dim=8), tmp_path / "weights")
    proc = subprocess.Popen(
        [sys.executable, "-c", "from agentrl.tiny.server import serve_tiny; serve_tiny()",
         "--model-path", str(weights), "--port", str(port), "--log-file", str(log), *fault],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    return proc, f"http://127.0.0.1:{port}", log


def _start(tmp_path: Path, mode: str, after: int) -> tuple[subprocess.Popen[bytes], str, Path]:
    return _spawn(
        tmp_path, "--fault-mode", mode, "--fault-after-requests", str(after), "--fault-line", LINE
    )


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
            # SIGTERM still stops it, the stuck request ended (a pod's engine must stop within
            # its grace period, not be killed at its end)
            proc.terminate()
            assert await asyncio.to_thread(proc.wait, 20) == 0
            assert (await asyncio.gather(stuck, return_exceptions=True))[0] is not None
    finally:
        _stop(proc)


# ---- the weight route fails: --fault-weight-updates-after ------------------------------------


@pytest.mark.slow
async def test_weight_updates_answer_503_after_n_while_generation_goes_on(tmp_path: Path) -> None:
    proc, url, _ = _spawn(tmp_path, "--fault-weight-updates-after", "1")
    v1 = tiny.save_policy(tiny.new_policy(1, dim=8), tmp_path / "v1")
    v2 = tiny.save_policy(tiny.new_policy(2, dim=8), tmp_path / "v2")
    try:
        async with EngineClient(url, max_connections=4, timeout_seconds=10) as client:
            await client.wait_healthy(deadline_seconds=90)
            taken = await client.update_weights_from_disk(str(v1), weight_version="1")
            assert taken.success
            with pytest.raises(EngineUnavailable) as refused:
                await client.update_weights_from_disk(str(v2), weight_version="2")
            assert refused.value.status == 503
            assert "/update_weights_from_disk is failing" in str(refused.value)
            # the server lives on, serving the last weights it took
            assert (await client.get_model_info()).weight_version == "1"
            await _one_request(client)
            assert await client.health(timeout=2.0) is True
            assert proc.poll() is None
    finally:
        _stop(proc)


@pytest.fixture
async def failing_after_one() -> AsyncIterator[tuple[TinyEngine, EngineClient]]:
    """The tiny engine in-process, its weight route failing after one update taken."""
    plan = FaultPlan(line=None, after_requests=None, mode=None, weight_updates_after=1)
    engine = TinyEngine(tiny.new_policy(0, dim=8), model_path="mem", fault=plan)
    server = TestServer(build_app(engine), host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    client = EngineClient(url, max_connections=4, timeout_seconds=10)
    try:
        yield engine, client
    finally:
        await client.close()
        await server.close()


async def test_the_trainers_pushes_to_a_broken_weight_route_fail_and_count_in_a_row(
    failing_after_one: tuple[TinyEngine, EngineClient], tmp_path: Path
) -> None:
    """What the trainer's disk weight sync reports against it: the first push taken, then one
    failure per push (each after its tries), counted in a row, with the engine's words."""
    engine, client = failing_after_one
    policy = tiny.new_policy(3, dim=8)
    sync = DiskWeightSync(
        [client],
        export=lambda path: tiny.save_policy(policy, path),
        weights_dir=tmp_path / "weights",
        retry=PushRetry(attempts=2, backoff_seconds=0.0),
    )
    first = await sync.push(1)
    assert first.failed == [] and first.failures == []
    counts = []
    for version in (2, 3, 4):
        report = await sync.push(version)
        assert report.failed == [client.base_url]
        [failure] = report.failures
        counts.append(failure.failures)
        assert failure.engine == client.base_url
        assert "HTTP 503" in failure.error
        assert "/update_weights_from_disk is failing" in failure.error
    assert counts == [1, 2, 3]
    assert engine.weight_version == "1" and engine.weight_updates == 1
    # generation was paused and continued around each try: it goes on
    assert not engine.paused
    out = await client.generate(
        get_tokenizer().apply_chat_template([{"role": "user", "content": "hi"}]),
        SamplingParams(max_new_tokens=2),
    )
    assert out.meta_info.weight_version == "1"


async def test_the_distributed_weight_routes_fail_too(
    failing_after_one: tuple[TinyEngine, EngineClient],
) -> None:
    engine, client = failing_after_one
    engine.weight_update_taken()  # as if one update was taken
    async with aiohttp.ClientSession() as session:
        for route in ("/init_weights_update_group", "/update_weights_from_distributed"):
            async with session.post(client.base_url + route, json={}) as response:
                assert response.status == 503, route
                assert f"{route} is failing" in await response.text()


def test_a_job_passes_the_fault_flags_to_serve_tiny_in_extra_args() -> None:
    """``spec.inference.extraArgs`` of a ``server: tiny`` job reach the engine container's
    command line, which serve-tiny's own parser reads; and every flag the API lets through is
    one serve-tiny has."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["inference"]["extraArgs"] = [
        "--fault-weight-updates-after=2",
        f"--fault-line={LINE}",
    ]
    job = load_job(yaml.safe_dump(doc))
    sts = engine_pods.statefulset(job, BuildContext.for_job(job), replicas=1)
    container = sts["spec"]["template"]["spec"]["containers"][0]
    params = serve_tiny.make_context("serve-tiny", list(container["args"])).params
    assert params["fault_weight_updates_after"] == 2
    assert params["fault_line"] == LINE
    options = {opt for param in serve_tiny.params for opt in param.opts}
    assert set(TINY_EXTRA_FLAGS) <= options
