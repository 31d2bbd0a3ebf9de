"""A weight push while requests are held (generation paused in place) works as SGLang 0.5.15
behaves, not only on an idle engine.

SGLang's facts, read from the pinned release: ``/update_weights_from_disk`` and
``/update_weights_from_distributed`` flush the cache after loading unless the body says
``flush_cache: false`` (the structs' default is ``True``); the scheduler asserts that this flush
worked; and ``Scheduler.flush_cache`` flushes only a fully idle scheduler (``is_fully_idle``),
so ``/flush_cache`` answers 400 while requests are queued or running — paused in place ones
too. The tiny engine behaves the same (its flush is refused and an update's default flush
fails while requests are held), so the trainer's weight sync is run against it here with a
request held.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from agentrl.engine_client.client import EngineClient, SamplingParams
from agentrl.tiny import policy as tiny
from agentrl.tiny.server import TinyEngine, build_app
from agentrl.trainer.weight_sync import DiskWeightSync, DistributedWeightSync


def test_sglang_flushes_after_an_update_by_default_and_only_when_idle(
    sglang: dict[str, Any],
) -> None:
    facts = sglang["flush_after_update"]
    assert facts["defaults"] == {
        "UpdateWeightFromDiskReqInput": True,
        "UpdateWeightsFromDistributedReqInput": True,
    }
    assert facts["asserted"] == ["flush_cache_success"]
    assert facts["flush_only_when_idle"] is True


async def _held_request(engine: TinyEngine, client: EngineClient) -> asyncio.Task[Any]:
    """A generation held by an in-place pause (queued while paused, as SGLang holds it)."""
    await client.pause_generation(mode="in_place")
    task = asyncio.create_task(client.generate([1, 2], SamplingParams(max_new_tokens=3)))
    for _ in range(100):
        if not engine.idle:
            return task
        await asyncio.sleep(0.01)
    raise AssertionError("the request never reached the engine")


async def test_a_disk_push_with_a_held_request_updates_and_resumes(tmp_path: Path) -> None:
    engine = TinyEngine(tiny.new_policy(0, dim=16), model_path="start", context_length=64)
    server = TestServer(build_app(engine), host="127.0.0.1")
    await server.start_server()
    client = EngineClient(str(server.make_url("")).rstrip("/"), max_connections=4)
    sync = DiskWeightSync(
        [client],
        export=lambda path: tiny.save_policy(tiny.new_policy(1, dim=16), path),
        weights_dir=tmp_path,
    )
    try:
        held = await _held_request(engine, client)
        report = await sync.push(1)
        assert report.failed == []
        assert (await client.get_model_info()).weight_version == "1"
        assert not engine.paused
        answer = await asyncio.wait_for(held, 30)  # the held request finished after resuming
        assert answer.finish_type in ("stop", "length")
    finally:
        await client.close()
        await server.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
async def test_a_broadcast_push_with_a_held_request_updates_and_resumes() -> None:
    engine = TinyEngine(tiny.new_policy(0, dim=8), model_path="start", context_length=64)
    server = TestServer(build_app(engine), host="127.0.0.1")
    await server.start_server()
    client = EngineClient(str(server.make_url("")).rstrip("/"), max_connections=4)
    trained = tiny.new_policy(5, dim=8)
    sync = DistributedWeightSync(
        [client],
        tensors=lambda: list(trained.named_parameters()),
        master_address="127.0.0.1",
        master_port=_free_port(),
        backend="gloo",
        interface="lo",
        timeout_seconds=60.0,
    )
    try:
        held = await _held_request(engine, client)
        report = await sync.push(2)
        assert report.failed == []
        assert (await client.get_model_info()).weight_version == "2"
        assert not engine.paused  # resumed although the cache could not be flushed
        await asyncio.wait_for(held, 30)
    finally:
        sync.close()
        await client.close()
        await server.close()
