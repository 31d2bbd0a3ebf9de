"""Engine load balancing: least outstanding requests, sticky episodes, failover."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.engine_client.client import EngineUnavailable, SamplingParams
from agentrl.rollout.balancer import EnginePool, NoReadyEngine
from tests.rollout.fakes import ScriptedEngine


def engines(n: int, **kw: object) -> list[ScriptedEngine]:
    return [ScriptedEngine(["submit"], base_url=f"http://e{i}", **kw) for i in range(n)]  # type: ignore[arg-type]


async def test_new_episodes_go_to_the_engine_with_fewest_outstanding_requests() -> None:
    gate = asyncio.Event()
    pool = EnginePool(engines(3, gate=gate))
    calls = [asyncio.create_task(pool.generate(f"ep{i}", [1], SamplingParams())) for i in range(5)]
    await asyncio.sleep(0.01)
    # Five episodes over three idle engines: e0, e1, e2, then e0, e1 again.
    assert pool.outstanding() == [2, 2, 1]
    gate.set()
    urls = [url for _, url in await asyncio.gather(*calls)]
    assert urls == ["http://e0", "http://e1", "http://e2", "http://e0", "http://e1"]


async def test_an_episode_sticks_to_its_engine_for_prefix_cache_reuse() -> None:
    gate = asyncio.Event()
    slow, other = engines(2)
    pool = EnginePool([slow, other])
    _, first = await pool.generate("ep", [1], SamplingParams())
    assert first == "http://e0"
    # Another episode now holds a request open on e0, so least outstanding would pick e1 ...
    slow.gate = gate
    busy = [asyncio.create_task(pool.generate("other", [1], SamplingParams()))]
    await asyncio.sleep(0.01)
    assert pool.outstanding() == [1, 0]
    slow.gate = None
    # ... yet the episode's next turn still goes to e0, where its prefix is cached.
    _, again = await pool.generate("ep", [1, 2], SamplingParams())
    assert again == "http://e0"
    gate.set()
    await asyncio.gather(*busy)


async def test_an_engine_that_fails_is_marked_unready_and_the_call_fails_over() -> None:
    broken, healthy = engines(2)
    broken.fail_calls = 1
    pool = EnginePool([broken, healthy])
    response, url = await pool.generate("ep", [1], SamplingParams())
    assert url == "http://e1"
    assert pool.ready() == [False, True]
    assert response.output_ids  # the answer came from the healthy engine


async def test_with_every_engine_unready_the_call_is_an_engine_error() -> None:
    pool = EnginePool(engines(2))
    pool.set_ready(0, False)
    pool.set_ready(1, False)
    with pytest.raises(NoReadyEngine):
        await pool.generate("ep", [1], SamplingParams())
    assert issubclass(NoReadyEngine, EngineUnavailable)


async def test_the_health_check_brings_a_recovered_engine_back() -> None:
    a, b = engines(2)
    pool = EnginePool([a, b])
    pool.set_ready(0, False)
    await pool.check_health()
    assert pool.ready() == [True, True]
    b.healthy = False
    await pool.check_health()
    assert pool.ready() == [True, False]


async def test_the_background_health_loop_probes_until_stopped() -> None:
    a, b = engines(2)
    pool = EnginePool([a, b])
    pool.set_ready(0, False)
    pool.start_health(0.01)
    for _ in range(100):  # the loop's first probe is after one interval
        await asyncio.sleep(0.01)
        if pool.ready() == [True, True]:
            break
    assert pool.ready() == [True, True]
    await pool.stop_health()
    pool.set_ready(0, False)
    await asyncio.sleep(0.05)  # stopped: nothing probes engine 0 back to ready
    assert pool.ready() == [False, True]
