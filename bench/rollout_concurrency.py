"""Configured concurrency vs achieved concurrency of the rollout tier, side by side with a client
left at library defaults.

What runs (all on 127.0.0.1):

* fake engines (``--engines`` processes): ``POST /generate`` sleeps ``--llm-latency`` seconds and
  answers SGLang's response shape (``bash true`` until the episode's last turn, then ``submit``);
* a fake sandbox service (one process): ``/exec`` sleeps ``--tool-latency`` seconds;
* rollout workers (``--workers`` processes, default one per core): each runs the real
  ``RolloutScheduler``, ``EpisodeRunner``, ``TokenAgent`` and ``EnginePool`` over the real
  ``agentrl.engine.client.EngineClient``, with pools sized from the concurrency;
  each worker keeps its share of ``--concurrency`` episodes in flight for ``--rounds`` rounds.

The baseline is the same run in one process with both HTTP clients at library defaults (aiohttp's
``ClientSession()``: a 100-connection pool), stopped after the same ideal wall time.

Figures:

* ``achieved_ratio``: time-averaged requests in service at the fake engines plus the fake
  sandbox, divided by the configured concurrency (1.0 = every episode is always being served);
* ``ideal_throughput_ratio``: work done (LLM calls × llm latency + execs × tool latency, in
  episode-equivalents) per second, over the ideal ``N / episode duration``;
* ``overhead_p50_ms``/``overhead_p99_ms``: client-observed LLM call latency minus the engine's
  injected latency.

Run: ``python bench/rollout_concurrency.py --concurrency 2048 --json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import aiohttp
from aiohttp import web

from agentrl.api.rollout import FailurePolicy
from agentrl.engine.client import EngineClient, GenerateResponse, SamplingParams
from agentrl.rollout.agent import TokenAgent
from agentrl.rollout.balancer import EnginePool
from agentrl.rollout.caps import EpisodeCaps
from agentrl.rollout.episode import EpisodeRunner
from agentrl.rollout.scheduler import RolloutScheduler
from agentrl.rollout.tasks.model import NamedTestsVerification, Task
from agentrl.sandbox.provider import ExecResult, SandboxBase, SandboxRequest

OBSERVATION_TOKEN = 2
PROMPT_TOKENS = 64
OUTPUT_TOKENS = 8
TEST_ID = "tests/test_bench.py::test_ok"


# ---------------------------------------------------------------------------------------------
# Fake servers (separate processes)


class _Counters:
    def __init__(self) -> None:
        self.in_flight = 0
        self.done = 0


def _stats_route(counters: _Counters) -> Any:
    async def stats(_: web.Request) -> web.Response:
        return web.json_response({"in_flight": counters.in_flight, "done": counters.done})

    return stats


def _serve(app: web.Application, port: int, ready: Any) -> None:
    async def main() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port, backlog=8192)
        await site.start()
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


def engine_server(port: int, latency: float, turns: int, ready: Any) -> None:
    counters = _Counters()

    async def generate(request: web.Request) -> web.Response:
        counters.in_flight += 1
        try:
            body = await request.json()
            observations = body["input_ids"].count(OBSERVATION_TOKEN)
            text = "submit" if observations >= turns - 1 else "bash true"
            await asyncio.sleep(latency)
            ids = [7] * OUTPUT_TOKENS
            return web.json_response(
                {
                    "text": text,
                    "output_ids": ids,
                    "meta_info": {
                        "id": "x",
                        "finish_reason": {"type": "stop"},
                        "prompt_tokens": len(body["input_ids"]),
                        "completion_tokens": len(ids),
                        "output_token_logprobs": [[-0.1, t, None] for t in ids],
                        "weight_version": "0",
                    },
                }
            )
        finally:
            counters.in_flight -= 1
            counters.done += 1

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_get("/health", health)
    app.router.add_get("/stats", _stats_route(counters))
    _serve(app, port, ready)


def sandbox_server(port: int, latency: float, ready: Any) -> None:
    counters = _Counters()

    async def execute(request: web.Request) -> web.Response:
        counters.in_flight += 1
        try:
            body = await request.json()
            await asyncio.sleep(latency)
            out = f"PASSED {TEST_ID}\n" if "pytest" in body["command"] else ""
            return web.json_response({"exit_code": 0, "stdout": out})
        finally:
            counters.in_flight -= 1
            counters.done += 1

    async def instant(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/exec", execute)
    app.router.add_post("/create", instant)
    app.router.add_post("/close", instant)
    app.router.add_get("/stats", _stats_route(counters))
    _serve(app, port, ready)


# ---------------------------------------------------------------------------------------------
# Client side: an HTTP-backed sandbox provider, the bench tokenizer, timing


class HttpSandbox(SandboxBase):
    def __init__(self, session: aiohttp.ClientSession, url: str, request: SandboxRequest):
        self._session, self._url = session, url
        self.id = request.episode_id
        self.workdir = request.workdir
        self.files: dict[str, bytes] = {}

    async def exec(
        self, command: str, *, timeout: float, cwd: str | None = None, env: Any = None
    ) -> ExecResult:
        async with self._session.post(f"{self._url}/exec", json={"command": command}) as resp:
            data = await resp.json()
        return ExecResult(exit_code=data["exit_code"], stdout=data["stdout"])

    async def write_file(self, path: str, data: bytes | str) -> None:
        self.files[path] = data.encode() if isinstance(data, str) else data

    async def read_file(self, path: str) -> bytes:
        if path not in self.files:
            raise FileNotFoundError(path)
        return self.files[path]

    async def close(self) -> None:
        async with self._session.post(f"{self._url}/close", json={}) as resp:
            await resp.read()


class HttpSandboxProvider:
    name = "bench"

    def __init__(self, url: str, session: aiohttp.ClientSession) -> None:
        self.url, self.session = url, session

    async def create(self, request: SandboxRequest) -> HttpSandbox:
        async with self.session.post(f"{self.url}/create", json={}) as resp:
            await resp.read()
        return HttpSandbox(self.session, self.url, request)

    async def aclose(self) -> None:
        await self.session.close()


class BenchTokenizer:
    def initial_ids(self, system: str, user: str) -> list[int]:
        return [1] * PROMPT_TOKENS

    def close_turn_ids(self, generated: Sequence[int]) -> list[int]:
        return []

    def observation_ids(self, observation: str) -> list[int]:
        return [OBSERVATION_TOKEN, 3, 3, 3]

    def decode(self, ids: Sequence[int]) -> str:
        return ""


class TimedEngine:
    """An engine client that records how long each generate took, client side."""

    def __init__(self, inner: EngineClient, samples: list[float]) -> None:
        self.inner, self.samples = inner, samples
        self.base_url = inner.base_url

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: SamplingParams,
        *,
        rid: str | None = None,
        timeout: float | None = None,
    ) -> GenerateResponse:
        start = time.perf_counter()
        result = await self.inner.generate(input_ids, sampling_params, rid=rid, timeout=timeout)
        self.samples.append(time.perf_counter() - start)
        return result

    async def health(self, *, timeout: float = 10.0) -> bool:
        return await self.inner.health(timeout=timeout)


class DefaultsEngineClient(EngineClient):
    """The engine client with aiohttp left at its defaults (a 100-connection pool)."""

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session


def bench_task(index: int) -> Task:
    return Task(
        id=f"bench-{index}",
        source="toy",
        instruction="bench",
        verification=NamedTestsVerification(fail_to_pass=[TEST_ID], test_command="pytest -rA"),
    )


async def worker_main(args: dict[str, Any], concurrency: int, defaults: bool) -> dict[str, Any]:
    samples: list[float] = []
    if defaults:
        clients: list[EngineClient] = [
            DefaultsEngineClient(u, max_connections=1) for u in args["engine_urls"]
        ]
        sandbox_session = aiohttp.ClientSession()
    else:
        # Every in-flight episode has at most one LLM call open; any engine may get them all.
        clients = [EngineClient(u, max_connections=concurrency + 4) for u in args["engine_urls"]]
        sandbox_session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=concurrency + 4)
        )
    pool = EnginePool([TimedEngine(c, samples) for c in clients])
    caps = EpisodeCaps(
        max_turns=args["turns"], max_trajectory_tokens=65536, max_tokens_per_turn=OUTPUT_TOKENS
    )
    runner = EpisodeRunner(
        provider=HttpSandboxProvider(args["sandbox_url"], sandbox_session),
        agent=TokenAgent(pool, BenchTokenizer(), caps),
        caps=caps,
        failure_policy=FailurePolicy(infra_retries=0),
        on_release=pool.release,
    )
    tasks = [bench_task(i) for i in range(concurrency * args["rounds"])]
    classes: dict[str, int] = {}
    deadline = args["deadline"]
    scheduler = RolloutScheduler(runner=runner, tasks=tasks, concurrency=concurrency)

    async def consume() -> None:
        async for trajectory in scheduler.trajectories():
            key = trajectory.terminal_class.value
            classes[key] = classes.get(key, 0) + 1

    scheduler.start()
    try:
        await asyncio.wait_for(consume(), max(0.1, deadline - time.time()))
    except TimeoutError:
        await scheduler.cancel()
    for client in clients:
        await client.close()
    await sandbox_session.close()
    return {"samples": samples, "classes": classes}


def worker_process(args: dict[str, Any], concurrency: int, defaults: bool, out: Any) -> None:
    out.put(asyncio.run(worker_main(args, concurrency, defaults)))


# ---------------------------------------------------------------------------------------------
# The parent: start servers, run a mode, sample the servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _stats(session: aiohttp.ClientSession, urls: list[str]) -> tuple[int, int]:
    """(requests in service, requests done) summed over ``urls``."""
    in_flight = done = 0
    for url in urls:
        async with session.get(f"{url}/stats") as resp:
            data = await resp.json()
        in_flight += data["in_flight"]
        done += data["done"]
    return in_flight, done


def run_mode(args: dict[str, Any], *, workers: int, defaults: bool, cap: float) -> dict[str, Any]:
    """Run the episodes over ``workers`` processes; stop after ``cap`` seconds at most."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    n = args["concurrency"]
    shares = [n // workers + (1 if i < n % workers else 0) for i in range(workers)]
    engines, sandbox = args["engine_urls"], [args["sandbox_url"]]

    async def observe() -> dict[str, Any]:
        async with aiohttp.ClientSession() as session:
            _, engine0 = await _stats(session, engines)
            _, sandbox0 = await _stats(session, sandbox)
            start = time.time()
            worker_args = {**args, "deadline": start + cap}
            procs = [
                ctx.Process(target=worker_process, args=(worker_args, share, defaults, out))
                for share in shares
            ]
            for proc in procs:
                proc.start()
            results: list[dict[str, Any]] = []
            series: list[tuple[float, int]] = []
            end = start
            while len(results) < workers:
                busy_e, _ = await _stats(session, engines)
                busy_s, _ = await _stats(session, sandbox)
                series.append((time.time(), busy_e + busy_s))
                while not out.empty():
                    results.append(out.get())
                    end = time.time()
                await asyncio.sleep(0.25)
            _, engine1 = await _stats(session, engines)
            _, sandbox1 = await _stats(session, sandbox)
            for proc in procs:
                proc.join(timeout=10)
        return {
            "results": results,
            "series": series,
            "start": start,
            "end": end,
            "llm_done": engine1 - engine0,
            "exec_done": sandbox1 - sandbox0,
        }

    seen = asyncio.run(observe())
    start, end = seen["start"], seen["end"]
    wall = end - start
    samples = [s for r in seen["results"] for s in r["samples"]]
    classes: dict[str, int] = {}
    for r in seen["results"]:
        for key, value in r["classes"].items():
            classes[key] = classes.get(key, 0) + value
    # Steady state: skip the first second (processes starting) and the last one (draining).
    window = [busy for t, busy in seen["series"] if start + 1.0 <= t <= end - 1.0]
    achieved = statistics.fmean(window) / n if window else 0.0
    work = seen["llm_done"] * args["llm_latency"] + seen["exec_done"] * args["tool_latency"]
    overhead = sorted((s - args["llm_latency"]) * 1000 for s in samples)
    return {
        "achieved_ratio": round(achieved, 4),
        "ideal_throughput_ratio": round(work / (n * wall), 4) if wall > 0 else 0.0,
        "episodes_completed": sum(classes.values()),
        "terminal_classes": classes,
        "wall_seconds": round(wall, 2),
        "llm_calls": len(samples),
        "overhead_p50_ms": round(_pct(overhead, 0.50), 2),
        "overhead_p99_ms": round(_pct(overhead, 0.99), 2),
    }


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    return values[min(len(values) - 1, int(q * len(values)))]


def _start_server(target: Any, *extra: Any) -> tuple[Any, str]:
    ctx = mp.get_context("fork")
    port = free_port()
    ready = ctx.Event()
    proc = ctx.Process(target=target, args=(port, *extra, ready), daemon=True)
    proc.start()
    if not ready.wait(30):
        raise RuntimeError(f"{target.__name__} did not start")
    return proc, f"http://127.0.0.1:{port}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=2048)
    parser.add_argument("--turns", type=int, default=5, help="LLM calls per episode")
    parser.add_argument("--llm-latency", type=float, default=1.0, help="seconds per LLM call")
    parser.add_argument("--tool-latency", type=float, default=0.5, help="seconds per tool call")
    parser.add_argument("--rounds", type=int, default=2, help="episodes per slot")
    parser.add_argument("--engines", type=int, default=2, help="fake engine processes")
    parser.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="rollout worker processes"
    )
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    opts = parser.parse_args(argv)

    servers: list[Any] = []
    try:
        engine_urls = []
        for _ in range(opts.engines):
            proc, url = _start_server(engine_server, opts.llm_latency, opts.turns)
            servers.append(proc)
            engine_urls.append(url)
        proc, sandbox_url = _start_server(sandbox_server, opts.tool_latency)
        servers.append(proc)
        # One episode: `turns` LLM calls, `turns - 1` tool calls and one verifier run.
        episode_seconds = opts.turns * (opts.llm_latency + opts.tool_latency)
        ideal_wall = episode_seconds * opts.rounds
        args: dict[str, Any] = {
            "concurrency": opts.concurrency,
            "turns": opts.turns,
            "llm_latency": opts.llm_latency,
            "tool_latency": opts.tool_latency,
            "rounds": opts.rounds,
            "engine_urls": engine_urls,
            "sandbox_url": sandbox_url,
        }
        report: dict[str, Any] = {
            "configured": opts.concurrency,
            "turns": opts.turns,
            "llm_latency_s": opts.llm_latency,
            "tool_latency_s": opts.tool_latency,
            "episode_seconds_ideal": episode_seconds,
            "rounds": opts.rounds,
            "workers": opts.workers,
            "engines": opts.engines,
        }
        report.update(
            run_mode(args, workers=opts.workers, defaults=False, cap=ideal_wall * 1.3 + 3)
        )
        if not opts.skip_baseline:
            # Library defaults, one process, measured over the same ideal wall time.
            base = run_mode(args, workers=1, defaults=True, cap=ideal_wall + 1)
            report.update({f"baseline_{k}": v for k, v in base.items()})
    finally:
        for proc in servers:
            proc.terminate()
        for proc in servers:
            proc.join(timeout=5)
    if opts.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:34} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
