"""Scraping the engines' load for the autoscaler: SGLang's gauges per engine, the engines that
do not answer left out, and the synthetic-metrics hook used by tests and dry runs."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from agentrl.controller.engine_metrics import (
    ANNOTATION_SYNTHETIC_ENGINE_METRICS,
    SYNTHETIC_IGNORED,
    EnginePod,
    MetricsParseError,
    StaticFetch,
    collect_engine_metrics,
    parse_sglang_metrics,
    ready_engine_pods,
)
from agentrl.reconcile.observed import observe
from agentrl.reconcile.policies.autoscale import EngineMetrics, EngineSample
from tests.factories import make_pod

#: What an SGLang engine with two data-parallel ranks serves (abridged).
SGLANG_METRICS = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="qwen3",dp_rank="0"} 12.0
sglang:num_running_reqs{model_name="qwen3",dp_rank="1"} 9.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="qwen3",dp_rank="0"} 1.0
sglang:num_queue_reqs{model_name="qwen3",dp_rank="1"} 2.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="qwen3",dp_rank="0"} 0.31
sglang:token_usage{model_name="qwen3",dp_rank="1"} 0.27
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{model_name="qwen3",dp_rank="0"} 1500.0
"""

IDLE_METRICS = """\
sglang:num_running_reqs{model_name="qwen3"} 0
sglang:num_queue_reqs{model_name="qwen3"} 0
sglang:token_usage{model_name="qwen3"} 0.05
"""


def engine_pod(name: str, ip: str, *, ready: bool = True) -> dict[str, Any]:
    pod = make_pod(name, "engine").running(ready=ready).obj()
    pod["status"]["podIP"] = ip
    return pod


def job_body(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "demo", "namespace": "team", "annotations": annotations or {}}}


def test_an_engines_ranks_are_summed_and_its_fullest_kv_cache_counts() -> None:
    # running 12 + 9 = 21, queued 1 + 2 = 3, token usage max(0.31, 0.27) = 0.31
    assert parse_sglang_metrics("demo-engine-0", SGLANG_METRICS) == EngineSample(
        pod="demo-engine-0", running_requests=21, queued_requests=3, token_usage=0.31
    )


def test_metrics_without_the_gauges_are_refused_naming_what_is_missing() -> None:
    with pytest.raises(MetricsParseError, match="sglang:token_usage"):
        parse_sglang_metrics("e", 'sglang:num_running_reqs 1\nsglang:num_queue_reqs 0\n')


def test_only_ready_engine_pods_with_an_address_are_scraped() -> None:
    no_ip = make_pod("demo-engine-3", "engine").running().obj()
    pods = [
        engine_pod("demo-engine-1", "10.0.0.2"),
        engine_pod("demo-engine-0", "10.0.0.1"),
        engine_pod("demo-engine-2", "10.0.0.3", ready=False),
        no_ip,
        make_pod("demo-sbx-a", "sandbox").running().obj(),
    ]
    assert ready_engine_pods(pods) == [
        EnginePod(name="demo-engine-0", ip="10.0.0.1"),
        EnginePod(name="demo-engine-1", ip="10.0.0.2"),
    ]
    assert EnginePod(name="e", ip="fd00::5").metrics_url() == "http://[fd00::5]:30000/metrics"


async def test_engines_that_do_not_answer_are_left_out_and_sandboxes_are_counted() -> None:
    pods = [engine_pod("demo-engine-0", "10.0.0.1"), engine_pod("demo-engine-1", "10.0.0.2")]
    sandboxes = [
        make_pod("demo-sbx-a", "sandbox").unschedulable("0/6 nodes are available").obj(),
        make_pod("demo-sbx-b", "sandbox").obj(),
    ]
    fetch = StaticFetch({"http://10.0.0.1:30000/metrics": SGLANG_METRICS})  # engine 1 is down
    metrics = await collect_engine_metrics(
        job_body(), pods + sandboxes, observe(pods=pods + sandboxes), fetch=fetch
    )
    assert sorted(fetch.requested) == [
        "http://10.0.0.1:30000/metrics", "http://10.0.0.2:30000/metrics"
    ]
    assert metrics == EngineMetrics(
        engines=(EngineSample(pod="demo-engine-0", running_requests=21, queued_requests=3,
                              token_usage=0.31),),
        sandboxes_pending=2,
        sandboxes_unschedulable=1,
    )


async def test_the_synthetic_annotation_replaces_scraping_and_keeps_the_observed_sandboxes(
) -> None:
    synthetic = {"engines": [{"pod": "fake-0", "runningRequests": 4, "queuedRequests": 0,
                              "tokenUsage": 0.2}]}
    sandboxes = [make_pod("demo-sbx-a", "sandbox").unschedulable("no room").obj()]
    fetch = StaticFetch({})
    metrics = await collect_engine_metrics(
        job_body({ANNOTATION_SYNTHETIC_ENGINE_METRICS: json.dumps(synthetic)}),
        [engine_pod("demo-engine-0", "10.0.0.1")],
        observe(pods=sandboxes),
        allow_synthetic=True,
        fetch=fetch,
    )
    assert fetch.requested == []
    assert metrics.engines == (
        EngineSample(pod="fake-0", running_requests=4, queued_requests=0, token_usage=0.2),
    )
    # not given in the annotation: taken from the cluster
    assert (metrics.sandboxes_pending, metrics.sandboxes_unschedulable) == (1, 1)


async def test_sandbox_counts_given_in_the_synthetic_annotation_win() -> None:
    synthetic = {"engines": [], "sandboxesPending": 7, "sandboxesUnschedulable": 5}
    metrics = await collect_engine_metrics(
        job_body({ANNOTATION_SYNTHETIC_ENGINE_METRICS: json.dumps(synthetic)}), [],
        observe(pods=[]), allow_synthetic=True, fetch=StaticFetch({}),
    )
    assert (metrics.sandboxes_pending, metrics.sandboxes_unschedulable) == (7, 5)


async def test_without_the_test_flag_the_annotation_is_ignored_and_the_engines_scraped() -> None:
    """What every production operator does (the chart never passes the test flag)."""
    synthetic = {"engines": [{"pod": "fake-0", "runningRequests": 60, "queuedRequests": 40,
                              "tokenUsage": 0.99}]}
    pods = [engine_pod("demo-engine-0", "10.0.0.1")]
    fetch = StaticFetch({"http://10.0.0.1:30000/metrics": IDLE_METRICS})
    before = SYNTHETIC_IGNORED._value.get()
    metrics = await collect_engine_metrics(
        job_body({ANNOTATION_SYNTHETIC_ENGINE_METRICS: json.dumps(synthetic)}), pods,
        observe(pods=pods), fetch=fetch,
    )
    assert fetch.requested == ["http://10.0.0.1:30000/metrics"]
    assert [e.pod for e in metrics.engines] == ["demo-engine-0"]
    assert [e.token_usage for e in metrics.engines] == [0.05]
    assert SYNTHETIC_IGNORED._value.get() == before + 1


async def test_a_malformed_synthetic_annotation_falls_back_to_scraping() -> None:
    pods = [engine_pod("demo-engine-0", "10.0.0.1")]
    fetch = StaticFetch({"http://10.0.0.1:30000/metrics": IDLE_METRICS})
    metrics = await collect_engine_metrics(
        job_body({ANNOTATION_SYNTHETIC_ENGINE_METRICS: '{"engines": [{"pod": 1'}), pods,
        observe(pods=pods), allow_synthetic=True, fetch=fetch,
    )
    assert [e.token_usage for e in metrics.engines] == [0.05]


@pytest.fixture
async def metrics_server() -> AsyncIterator[int]:
    """A real HTTP server on 127.0.0.1 serving SGLANG_METRICS at /metrics; yields its port."""
    app = web.Application()

    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=SGLANG_METRICS, content_type="text/plain")

    app.router.add_get("/metrics", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield port
    finally:
        await runner.cleanup()


async def test_engines_are_scraped_over_http(metrics_server: int) -> None:
    pods = [engine_pod("demo-engine-0", "127.0.0.1")]
    metrics = await collect_engine_metrics(job_body(), pods, observe(pods=pods),
                                           port=metrics_server, timeout_seconds=5)
    assert metrics.engines == (
        EngineSample(pod="demo-engine-0", running_requests=21, queued_requests=3,
                     token_usage=0.31),
    )


async def test_an_engine_that_refuses_connections_is_left_out_over_http() -> None:
    # port 9 (discard) on loopback: nothing listens, the connection is refused at once
    pods = [engine_pod("demo-engine-0", "127.0.0.1")]
    metrics = await collect_engine_metrics(job_body(), pods, observe(pods=pods), port=9,
                                           timeout_seconds=2)
    assert metrics.engines == ()
