"""Every request the runtime sends an engine matches the pinned SGLang's route table and
request structures, and the runtime reads SGLang's real answers.

The requests are the ones our code really sends: :class:`~agentrl.engine_client.client.EngineClient`
(rollout workers and the trainer's weight sync, disk and distributed) and the watchdog's
:class:`~agentrl.engine.watchdog.HttpEngineEndpoints` are pointed at a recording server here,
and what it records goes to the probe. The route table is the FastAPI app of
``sglang.srt.entrypoints.http_server`` (imported in the pinned environment: method, path, and
the ``io_struct`` type FastAPI builds the body into); each body is converted into that type
as the server would, and must use only its fields and carry its required ones.

The answers the recording server gives are built from SGLang's own code: the finish classes'
``to_json()``, ``TokenizerManager.detokenize_logprob_tokens``, and the keys the handlers put in
their answers (read from the installed source with ``ast``, since the handlers need a running
tokenizer manager). ``/metrics`` is not in the app's route table: SGLang mounts it at start
when ``--enable-metrics`` is given (``add_prometheus_middleware``), which the launcher always
passes (test_sglang_flags.py); its page is checked in test_sglang_metrics.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from agentrl.devcluster import sglang_env
from agentrl.engine.watchdog import HttpEngineEndpoints
from agentrl.engine.weight_pointer import CurrentWeights
from agentrl.engine_client import client as engine_client
from agentrl.engine_client.client import EngineClient, GenerateResponse, SamplingParams

#: Values for the meta_info keys SGLang sets on every generation (the others vary per key).
LOGPROBS = [-0.5, -1.25, -0.125]
OUTPUT_IDS = [11, 12, 13]


def _generate_answer(sglang: dict[str, Any], finish: dict[str, Any]) -> dict[str, Any]:
    pieces = sglang["responses"]
    known: dict[str, Any] = {
        "id": "rid-1",
        "finish_reason": finish,
        "prompt_tokens": 5,
        "weight_version": "3",
        "num_retractions": 0,
        "reasoning_tokens": 0,
        "completion_tokens": len(OUTPUT_IDS),
        "cached_tokens": 0,
        "input_token_logprobs": [],
        "output_token_logprobs": pieces["output_token_logprobs"],
        "output_token_logprobs_length": len(OUTPUT_IDS),
    }
    keys = [*pieces["meta_info_keys"], *pieces["logprob_meta_info_keys"]]
    meta = {key: known.get(key) for key in keys}
    return {"text": "fix", "output_ids": OUTPUT_IDS, "meta_info": meta}


def _answer(sglang: dict[str, Any], path: str) -> web.Response:
    pieces = sglang["responses"]

    def keys(name: str, **values: Any) -> web.Response:
        return web.json_response({k: values.get(k) for k in pieces[name]})

    if path == "/generate":
        return web.json_response(_generate_answer(sglang, pieces["finish_reasons"][0]))
    if path == "/model_info":
        return keys(
            "model_info_keys",
            model_path="/ckpt/step-3",
            tokenizer_path="/models/qwen3",
            is_generation=True,
            weight_version="3",
            has_image_understanding=False,
            has_audio_understanding=False,
            model_type="qwen3_moe",
            architectures=["Qwen3MoeForCausalLM"],
        )
    if path == "/update_weights_from_disk":
        return keys(
            "update_weights_from_disk_keys", success=True, message="ok", num_paused_requests=0
        )
    if path in ("/init_weights_update_group", "/update_weights_from_distributed"):
        return keys(path.strip("/") + "_keys", success=True, message="ok")
    if path in ("/pause_generation", "/continue_generation"):
        return keys(path.strip("/") + "_keys", message="done", status="ok")
    if path == "/flush_cache":
        return web.Response(text="Cache flushed.\n")
    if path == "/metrics":
        return web.Response(text=sglang["metrics"]["exposition"])
    return web.Response(status=200)  # /health, /health_generate: an empty 200


@pytest.fixture(scope="module")
def recorded(sglang: dict[str, Any]) -> list[dict[str, Any]]:
    """What our code sends, each request once: method, path, JSON body (or None)."""
    import asyncio

    calls: list[dict[str, Any]] = []

    async def record(request: web.Request) -> web.Response:
        raw = await request.read()
        calls.append(
            {
                "method": request.method,
                "path": request.path,
                "body": json.loads(raw) if raw else None,
            }
        )
        return _answer(sglang, request.path)

    async def drive() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", record)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        url = str(server.make_url("")).rstrip("/")
        try:
            async with EngineClient(url, max_connections=2) as c:
                await c.generate([1, 2, 3], SamplingParams(max_new_tokens=8, stop=["</tool>"]))
                await c.generate([1], SamplingParams(), rid="episode-7-turn-2")
                assert await c.health() and await c.health_generate()
                info = await c.get_model_info()
                assert info.weight_version == "3"
                await c.metrics()
                await c.pause_generation(mode="in_place")
                await c.update_weights_from_disk(
                    "/ckpt/step-3", weight_version="3", load_format="safetensors"
                )
                await c.update_weights_from_disk("/ckpt/step-3")
                await c.flush_cache()
                await c.continue_generation()
                await c.init_weights_update_group(
                    master_address="10.0.0.1",
                    master_port=29600,
                    rank_offset=1,
                    world_size=3,
                    group_name="agentrl-weights",
                    backend="nccl",
                )
                await c.update_weights_from_distributed(
                    names=["model.embed_tokens.weight"],
                    dtypes=["bfloat16"],
                    shapes=[[151936, 2048]],
                    group_name="agentrl-weights",
                    weight_version="4",
                )
            endpoints = HttpEngineEndpoints(url)
            try:
                assert await endpoints.health_generate(5.0)
                assert await endpoints.load(5.0) is not None
                weights = CurrentWeights(model_path="/ckpt/step-3", weight_version="3")
                assert await endpoints.push_weights(weights, 5.0) is None
                weights = CurrentWeights(
                    model_path="/ckpt/step-3", weight_version="3", load_format="safetensors"
                )
                assert await endpoints.push_weights(weights, 5.0) is None
            finally:
                await endpoints.close()
        finally:
            await server.close()

    asyncio.run(drive())
    return calls


def _route(sglang: dict[str, Any], path: str) -> dict[str, Any] | None:
    return next((r for r in sglang["routes"] if r["path"] == path), None)


def test_every_path_and_method_we_use_is_a_route(
    sglang: dict[str, Any], recorded: list[dict[str, Any]]
) -> None:
    used = {(c["method"], c["path"]) for c in recorded}
    assert ("POST", "/generate") in used and ("GET", "/model_info") in used
    unknown = []
    for method, path in sorted(used):
        if path == "/metrics":  # mounted at start with --enable-metrics (module docstring)
            continue
        route = _route(sglang, path)
        if route is None or method not in route["methods"]:
            unknown.append((method, path, route and route["methods"]))
    assert unknown == []


def test_every_body_we_send_is_the_request_structure_sglang_builds(
    sglang: dict[str, Any], recorded: list[dict[str, Any]]
) -> None:
    with_body = [c for c in recorded if c["body"] is not None]
    items = []
    for call in with_body:
        route = _route(sglang, call["path"])
        assert route is not None and route["body"] is not None, call
        items.append({"struct": route["body"], "body": call["body"]})
    answers = sglang_env.probe("convert", items)
    problems = [
        (item["struct"], item["body"], answer)
        for item, answer in zip(items, answers, strict=True)
        if answer["unknown"] or answer["missing"] or answer["error"]
    ]
    assert problems == []
    assert {i["struct"] for i in items} >= {
        "GenerateReqInput",
        "UpdateWeightFromDiskReqInput",
        "InitWeightsUpdateGroupReqInput",
        "UpdateWeightsFromDistributedReqInput",
        "PauseGenerationReqInput",
        "ContinueGenerationReqInput",
    }


def test_no_deprecated_route_is_used(recorded: list[dict[str, Any]]) -> None:
    """``/get_model_info`` logs a deprecation warning per call in 0.5.15 (its handler says
    so); the runtime asks ``/model_info``."""
    assert "/get_model_info" not in {c["path"] for c in recorded}


def test_the_fields_we_read_are_ones_sglang_answers_with(sglang: dict[str, Any]) -> None:
    pieces = sglang["responses"]
    meta = {*pieces["meta_info_keys"], *pieces["logprob_meta_info_keys"]}
    assert set(engine_client.MetaInfo.model_fields) <= meta
    assert set(engine_client.GenerateResponse.model_fields) <= set(pieces["out_dict_keys"])
    assert set(engine_client.ModelInfo.model_fields) <= set(pieces["model_info_keys"])
    assert set(engine_client.UpdateWeightsResult.model_fields) <= set(
        pieces["update_weights_from_disk_keys"]
    )


@pytest.mark.parametrize("index", range(5))
def test_the_client_reads_every_finish_reason_sglang_gives(
    sglang: dict[str, Any], index: int
) -> None:
    finish = sglang["responses"]["finish_reasons"][index]
    answer = _generate_answer(sglang, finish)
    parsed = GenerateResponse.model_validate_json(json.dumps(answer))
    assert parsed.finish_type == finish["type"]
    assert parsed.logprobs == LOGPROBS
    assert [t for _, t, _ in parsed.meta_info.output_token_logprobs] == OUTPUT_IDS
    assert parsed.meta_info.weight_version == "3"
    # SGLang answers a batch (a list) the same way; the client takes the first
    batch = engine_client._RESPONSE_BATCH.validate_json(json.dumps([answer]))
    assert batch[0].finish_type == finish["type"]


# ---- the tiny engine answers the same shapes ---------------------------------------------


@pytest.fixture
async def tiny_url() -> AsyncIterator[str]:
    from agentrl.tiny import policy as tiny
    from agentrl.tiny.server import TinyEngine, build_app

    engine = TinyEngine(tiny.new_policy(0, dim=16), model_path="mem", context_length=64)
    server = TestServer(build_app(engine), host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def test_the_tiny_engine_answers_sglangs_shapes(
    sglang: dict[str, Any], tiny_url: str, tmp_path: Any
) -> None:
    import aiohttp

    from agentrl.tiny import policy as tiny

    pieces = sglang["responses"]
    finish_keys = {f["type"]: set(f) for f in pieces["finish_reasons"]}
    async with aiohttp.ClientSession() as http:
        generate = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}}
        async with http.post(f"{tiny_url}/generate", json=generate) as r:
            answer = await r.json()
        finish = answer["meta_info"]["finish_reason"]
        assert set(finish) == finish_keys[finish["type"]]
        unconditional = {
            "id",
            "finish_reason",
            "prompt_tokens",
            "weight_version",
            "num_retractions",
            "reasoning_tokens",
            "completion_tokens",
            "cached_tokens",
            "input_token_logprobs",
            "output_token_logprobs",
            "output_token_logprobs_length",
        }
        assert unconditional <= set(pieces["meta_info_keys"]) | set(
            pieces["logprob_meta_info_keys"]
        )
        assert unconditional <= set(answer["meta_info"])
        async with http.get(f"{tiny_url}/model_info") as r:
            assert set(await r.json()) == set(pieces["model_info_keys"])
        for path in ("/pause_generation", "/continue_generation"):
            async with http.post(f"{tiny_url}{path}", json={}) as r:
                assert set(await r.json()) == set(pieces[path.strip("/") + "_keys"])
        tiny.save_policy(tiny.new_policy(0, dim=16), tmp_path / "w")
        body = {"model_path": str(tmp_path / "w"), "weight_version": "2"}
        async with http.post(f"{tiny_url}/update_weights_from_disk", json=body) as r:
            assert set(await r.json()) == set(pieces["update_weights_from_disk_keys"])
        async with http.post(
            f"{tiny_url}/update_weights_from_disk", json={"model_path": "/no"}
        ) as r:
            assert r.status == 400
            assert set(await r.json()) == set(pieces["update_weights_from_disk_keys"])
