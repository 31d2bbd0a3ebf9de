"""Configured concurrency vs achieved concurrency of the rollout tier on the path the cluster
runs, side by side with a client left at library defaults.

What runs (all on 127.0.0.1):

* fake engines (``--engines`` processes): ``POST /generate`` is answered ``--llm-latency``
  seconds later in SGLang's response shape (``bash true`` until the episode's last turn, then
  ``submit``);
* a fake sandbox service (``--sandbox-servers`` processes; the provider places sandboxes on them
  round-robin): ``/exec`` is answered ``--tool-latency`` seconds later, ``/create`` and
  ``/close`` at once; each process logs when each sandbox was created and closed;
* by default (``--path ray``) the trainer's own path: one driver process starts a local Ray with
  ``--ray-cpus`` CPUs and ``--workers`` :class:`~agentrl.rollout.ray_workers.RolloutWorker`
  actors (``ray-cpus / workers`` CPUs each), and holds the one scheduler with the whole
  concurrency over :class:`~agentrl.rollout.ray_workers.RemoteEpisodes`, on asyncio's loop as
  the trainer's driver runs: it admits the in-effect concurrency plus as many again, the actors
  run the episodes in the slots it grants them and start a queued order the moment one of
  theirs ends, and trajectories stream back by long-polled ``collect`` calls. The actors build
  their parts with :func:`ray_worker_parts` (the fake sandbox provider, the bench tokenizer, the
  timed engine client), importing this module by name: the driver puts its directory on their
  ``PYTHONPATH`` and the rest they need in :data:`RAY_PARTS_ENV`. They run at the driver's
  niceness (``--ray-worker-niceness``): Ray's own default, 15, would put them below the fakes on
  shared cores, where the forked workers compete with the fakes as equals;
* or, with ``--path processes`` (a comparison: no cluster path runs it), forked rollout worker
  processes (``--workers``, default two per core): each runs
  :func:`agentrl.rollout.runtime.open_rollout` (its own scheduler, episode runner, token agent,
  engine pool and engine client) for its share of the spec's ``sandbox.concurrency``, on uvloop
  when it is installed (``--event-loop asyncio`` to compare).

Both paths run the spec the bench builds (:func:`bench_spec`, every pool derived from it) for
``--rounds`` episodes per slot. ``--scale-at SECONDS:N`` (ray path, repeatable) changes the
in-effect concurrency mid-run through the driver's own follower
(:class:`ScheduledConcurrency`), as ``kubectl scale`` does on a cluster.

The fakes are latency injectors, not the product: they are minimal HTTP/1.1 keep-alive servers
(:class:`FakeHttpServer`, a timer per request, uvloop when installed) so that on a small machine
the cores go to the rollout workers. They count requests in service, requests done, open
connections and their own CPU seconds. The fake sandbox provider reaches its service through
the engine client's keep-alive pool (``--sandbox-client aiohttp``: through an aiohttp session;
at N = 512 the workers then spent about 1.7 times the CPU per episode).

The baseline is the same run in one forked worker process with both HTTP clients at library
defaults (aiohttp's ``ClientSession()``: a 100-connection pool), stopped after the ideal wall
time + 1 s.

Figures (the baseline's computed the same way):

* ``achieved_ratio``: requests in service at the fake engines plus the fake sandbox, averaged over
  time from 1 s after the start to 1 s before the last episode ends, over the configured
  concurrency (1.0 = every episode is always being served). The servers integrate requests in
  service over time and the parent reads the integral every 0.25 s, so the average is exact.
  ``achieved_ratio_sampled`` is the former estimator, kept for comparison: the mean of the
  0.25 s readings of requests in service. It is biased whenever the episodes move in lockstep
  (here they do: every latency is the same), since the readings can keep landing in, or keep
  missing, the moments between calls; at N = 512 it read 0.997 where the integral gave 0.988;
* ``ideal_throughput_ratio``: work done (LLM calls × llm latency + execs × tool latency, in
  episode-equivalents) per second of wall time, over the ideal ``N / episode duration``. Wall
  time counts ramp-up (see below) and ends at the end of the last episode as its worker (ray:
  the driver) saw it (or the cap), not when the parent next polled for results;
* ``overhead_p50_ms``/``overhead_p99_ms``: client-observed LLM call latency minus the engine's
  injected latency;
* ``max_live_sandboxes``: the most sandboxes live at once over the whole job, replayed from the
  sandbox service's logs (:func:`live_sandboxes`); ``sandboxes_created_closed``;
  ``first_sandbox_seconds`` and ``all_slots_live_seconds``: the ramp, after the start;
* ``cpu_seconds`` (workers, engines, sandbox service; ray adds ``driver``, the driver process
  with Ray's threads in it, and ``ray_system``, the local Ray's GCS, raylet, agents and idle
  workers), and the same per 1,000 episodes (``cpu_seconds_per_1k_episodes``,
  ``driver_cpu_seconds_per_1k_episodes``, ``worker_cpu_seconds_per_1k_episodes``);
* ``pools``: per worker, the episodes it kept in flight (ray: its peak, never above its grant),
  its connections per engine and towards the sandbox service.

On the ray path (``"path": "ray"`` in the JSON) wall time starts when the driver's first orders
go out: Ray's start and the actors' opening are not counted, but reported as
``ray_startup_seconds`` (``init_seconds``, ``workers_open_seconds``); it ends when the driver
received the last trajectory. The timed client's samples are recorded in the actors, which write
them to a temporary directory when they close their provider (their last step), for the driver
to read. Extra keys: ``episodes_per_worker``, ``episodes_killed`` (running episodes the actors
cancelled: 0 unless the cap cut the run), ``actor_event_loop`` (Ray's choice), and with
``--scale-at`` the ``scale`` list (:func:`scale_report`: per change, how long the live sandboxes
took to reach the new figure, the most live after, creates that found the figure already live,
the achieved concurrency after). ``--profile-driver FILE`` writes a cProfile of the driver's
loop thread over the wall time, ``--profile-worker FILE`` one of worker 0's, in that thread's CPU
seconds. On the processes path wall time starts when the worker processes are forked.

Run: ``python bench/rollout_concurrency.py --concurrency 2048 --json`` (``--path processes``
for the comparison; ``--scale-at 9:1024 --scale-at 17:2048`` to scale mid-run).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

import aiohttp

from agentrl.api import AgentRLJobSpec
from agentrl.engine_client.client import (
    CONTROL_CONNECTIONS,
    EngineClient,
    GenerateResponse,
    SamplingParams,
)
from agentrl.engine_client.keepalive import HttpPool
from agentrl.rollout.runtime import (
    configure_worker_process,
    engine_pool_size,
    open_rollout,
    worker_concurrency,
)
from agentrl.rollout.tasks.model import NamedTestsVerification, Task
from agentrl.rollout.text_actions import parse_text_action
from agentrl.rollout.toolcalls import ParsedReply
from agentrl.sandbox.provider import ExecResult, SandboxBase, SandboxRequest

OBSERVATION_TOKEN = 2
PROMPT_TOKENS = 64
OUTPUT_TOKENS = 8
#: The generated ids of a reply that runs a command, and of one that submits.
BASH_TOKEN, SUBMIT_TOKEN = 7, 8
TEST_ID = "tests/test_bench.py::test_ok"


# ---------------------------------------------------------------------------------------------
# Fake servers (separate processes)


try:  # imported here, before the processes fork, as a Ray worker imports it when it starts
    import uvloop
except ImportError:  # pragma: no cover - uvloop comes with the ray extra
    uvloop = None  # type: ignore[assignment]


def default_event_loop() -> str:
    """``uvloop`` when it is installed, as Ray's workers do (``RAY_USE_UVLOOP``, on by
    default), else ``asyncio``."""
    return "asyncio" if uvloop is None else "uvloop"


def _run(main: Coroutine[Any, Any, Any], loop: str) -> Any:
    """Run ``main`` on a fresh event loop of the kind named."""
    if loop == "uvloop" and uvloop is not None:
        return uvloop.run(main)
    return asyncio.run(main)


class _Counters:
    """What a fake server counts. ``busy_seconds`` integrates requests in service over time
    (updated at every change), so the parent gets an exact time average between two reads."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.done = 0
        self.connections = 0
        self.busy_seconds = 0.0
        self._since = time.monotonic()

    def change(self, delta: int) -> None:
        now = time.monotonic()
        self.busy_seconds += self.in_flight * (now - self._since)
        self._since = now
        self.in_flight += delta
        if delta < 0:
            self.done -= delta

    def busy_now(self) -> float:
        return self.busy_seconds + self.in_flight * (time.monotonic() - self._since)


Route = Callable[[bytes], tuple[float, bytes]]
"""A fake endpoint: request body in, (seconds to hold the answer, JSON answer) out."""

#: The routes whose requests are work (in service while held, counted in ``done``).
SERVICE_PATHS = (b"/generate", b"/exec")


class FakeHttpServer(asyncio.Protocol):
    """A minimal HTTP/1.1 keep-alive server for the fakes (one protocol object per connection).

    The fakes are latency injectors, not the product, so they are kept as cheap as a server can
    be: a request is read off the buffer (request line, ``Content-Length``, body), its route
    runs, and the answer is written by a timer after the injected latency, with no task,
    router or request object per call. aiohttp's clients send one request at a time per
    connection, so answers never need reordering; chunked bodies are not spoken (none is sent).
    """

    def __init__(self, routes: dict[bytes, Route], counters: _Counters) -> None:
        self.routes, self.counters = routes, counters
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        self.counters.connections += 1

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buffer[:end]).lower()
            length = 0
            at = head.find(b"\r\ncontent-length:")
            if at >= 0:
                stop = head.find(b"\r\n", at + 2)
                length = int(head[at + 17 : stop if stop >= 0 else None])
            if len(buffer) < end + 4 + length:
                return
            body = bytes(buffer[end + 4 : end + 4 + length])
            del buffer[: end + 4 + length]
            path = head.split(b" ", 2)[1]
            route = self.routes.get(path)
            if route is None:
                self._write(b"404 Not Found", b"{}", counted=False)
                continue
            delay, answer = route(body)
            counted = path in SERVICE_PATHS
            if counted:
                self.counters.change(+1)
            if delay > 0:
                self.loop.call_later(delay, self._write, b"200 OK", answer, counted)
            else:
                self._write(b"200 OK", answer, counted)

    def _write(self, status: bytes, answer: bytes, counted: bool) -> None:
        if counted:
            self.counters.change(-1)
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.write(
            b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (status, len(answer), answer)
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.counters.connections -= 1


def _serve(
    routes: dict[bytes, Route],
    counters: _Counters,
    port: int,
    ready: Any,
    extra: Callable[[], dict[str, Any]] | None = None,
) -> None:
    """Serve ``routes`` (plus ``/stats``: the counters, and ``extra()``'s figures) on ``port``
    until killed; uvloop when installed."""

    def stats(_: bytes) -> tuple[float, bytes]:
        data = {
            "in_flight": counters.in_flight,
            "busy_seconds": counters.busy_now(),
            "done": counters.done,
            "connections": counters.connections,
            "cpu_seconds": time.process_time(),
        }
        return 0.0, json.dumps(data).encode()

    all_routes = {**routes, b"/stats": stats}
    if extra is not None:
        all_routes[b"/live"] = lambda _: (0.0, json.dumps(extra()).encode())

    async def main() -> None:
        loop = asyncio.get_running_loop()
        await loop.create_server(
            lambda: FakeHttpServer(all_routes, counters), "127.0.0.1", port, backlog=8192
        )
        ready.set()
        await asyncio.Event().wait()

    _run(main(), default_event_loop())  # the fakes: as cheap as they can be


def engine_server(port: int, latency: float, turns: int, ready: Any) -> None:
    counters = _Counters()
    def answer(text: str) -> bytes:
        ids = [SUBMIT_TOKEN if text == "submit" else BASH_TOKEN] * OUTPUT_TOKENS
        meta = {
            "id": "x",
            "finish_reason": {"type": "stop"},
            "prompt_tokens": -1,
            "completion_tokens": len(ids),
            "output_token_logprobs": [[-0.1, t, None] for t in ids],
            "weight_version": "0",
        }
        body = json.dumps({"text": text, "output_ids": ids, "meta_info": meta}).encode()
        return body.replace(b'"prompt_tokens": -1', b'"prompt_tokens": %d')

    answers = {False: answer("bash true"), True: answer("submit")}

    def generate(body: bytes) -> tuple[float, bytes]:
        # The bench's ids are 1 (prompt), 2 3 3 3 (an observation) and 7 (generated), and
        # ``input_ids`` is the body's first array: counting the digit 2 in it counts the
        # observations without decoding the JSON.
        start = body.index(b"[")
        end = body.index(b"]", start)
        observations = body.count(b"2", start, end)
        prompt_tokens = body.count(b",", start, end) + 1
        return latency, answers[observations >= turns - 1] % prompt_tokens

    def health(_: bytes) -> tuple[float, bytes]:
        return 0.0, b"{}"

    _serve({b"/generate": generate, b"/health": health}, counters, port, ready)


class SandboxLog:
    """When each sandbox of one process of the fake sandbox service was created and closed
    (``time.time()`` at the request's arrival). The parent merges the logs of every process into
    the exact count of live sandboxes over the whole job (:func:`live_sandboxes`): the same
    clock on one machine, and no process of the service has to see every sandbox."""

    def __init__(self) -> None:
        self.creates: list[float] = []
        self.closes: list[float] = []

    def reset(self) -> None:
        self.creates, self.closes = [], []

    def figures(self) -> dict[str, Any]:
        return {"creates": self.creates, "closes": self.closes}


def live_series(
    logs: Sequence[dict[str, Any]], start: float, step: float = 0.05
) -> list[tuple[float, int, int]]:
    """Live sandboxes over time from the service's logs, for ``--trace``: per ``step`` seconds
    after ``start``, the fewest and the most live in it (a dip between an episode's end and
    the next one's start shows here, not in a reading every 0.25 s)."""
    events = sorted(
        [(t, 1) for log in logs for t in log["creates"]]
        + [(t, -1) for log in logs for t in log["closes"]]
    )
    out: dict[int, list[int]] = {}
    live = 0
    for at, change in events:
        live += change
        bucket = out.setdefault(math.floor((at - start) / step), [live, live])
        bucket[0], bucket[1] = min(bucket[0], live), max(bucket[1], live)
    return [(round(b * step, 3), lo, hi) for b, (lo, hi) in sorted(out.items())]


def live_sandboxes(
    logs: Sequence[dict[str, Any]], *, target: int, marks: Sequence[tuple[float, int]] = ()
) -> dict[str, Any]:
    """Replay the creates and closes of every process of the sandbox service in time order:
    the most sandboxes live at once, when the first was created, when ``target`` were first
    live, and for each ``(time, figure)`` of ``marks`` (the driver applying a new in-effect
    concurrency): the live count then, whether it must rise or fall to the figure, when it first
    got there, the most live from then to the next mark, and the creates that found the figure
    already live (each one a sandbox over the cap)."""
    events = sorted(
        [(t, 1) for log in logs for t in log["creates"]]
        + [(t, -1) for log in logs for t in log["closes"]]
    )
    out: dict[str, Any] = {
        "max_live": 0,
        "creates": sum(len(log["creates"]) for log in logs),
        "closes": sum(len(log["closes"]) for log in logs),
        "first_create_at": None,
        "target_at": None,
        "marks": [],
    }
    pending = sorted(marks)
    live = 0
    mark: dict[str, Any] | None = None

    def open_mark(at: float, cap: int) -> dict[str, Any]:
        record = {
            "at": at,
            "cap": cap,
            "live_at_mark": live,
            "direction": "up" if cap > live else "down",
            "reached_at": None,
            "max_live_after_reached": None,
            "creates_at_or_over_cap": 0,
        }
        out["marks"].append(record)
        return record

    def track(now: float) -> None:
        if mark is None:
            return
        if mark["reached_at"] is not None:
            mark["max_live_after_reached"] = max(mark["max_live_after_reached"], live)
        elif (live >= mark["cap"]) if mark["direction"] == "up" else (live <= mark["cap"]):
            mark["reached_at"] = now
            mark["max_live_after_reached"] = live

    for at, change in events:
        while pending and pending[0][0] <= at:
            mark = open_mark(*pending.pop(0))
            track(mark["at"])
        if change > 0:
            if mark is not None and live >= mark["cap"]:
                mark["creates_at_or_over_cap"] += 1
            if out["first_create_at"] is None:
                out["first_create_at"] = at
        live += change
        out["max_live"] = max(out["max_live"], live)
        if out["target_at"] is None and live >= target > 0:
            out["target_at"] = at
        track(at)
    for at, cap in pending:  # after the last sandbox closed
        mark = open_mark(at, cap)
        track(at)
    return out


def sandbox_server(port: int, latency: float, ready: Any) -> None:
    counters = _Counters()
    log = SandboxLog()

    tests = json.dumps({"exit_code": 0, "stdout": f"PASSED {TEST_ID}\n"}).encode()
    other = json.dumps({"exit_code": 0, "stdout": ""}).encode()
    ok = b'{"ok": true}'

    def execute(body: bytes) -> tuple[float, bytes]:
        return latency, tests if b"pytest" in body else other

    def create(_: bytes) -> tuple[float, bytes]:
        log.creates.append(time.time())
        return 0.0, ok

    def close(_: bytes) -> tuple[float, bytes]:
        log.closes.append(time.time())
        return 0.0, ok

    def reset(_: bytes) -> tuple[float, bytes]:
        log.reset()
        return 0.0, ok

    routes = {b"/exec": execute, b"/create": create, b"/close": close, b"/reset": reset}
    _serve(routes, counters, port, ready, extra=log.figures)


# ---------------------------------------------------------------------------------------------
# Client side: an HTTP-backed sandbox provider, the bench tokenizer, timing


class SandboxClient(Protocol):
    """How the bench's provider reaches the fake sandbox service (a JSON POST)."""

    pool_size: int

    async def post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]: ...

    async def close(self) -> None: ...


class AiohttpSandboxClient:
    """Through an aiohttp session (the pool given, or aiohttp's defaults)."""

    def __init__(self, url: str, session: aiohttp.ClientSession) -> None:
        self.url, self.session = url, session
        self.pool_size = session.connector.limit if session.connector is not None else 0

    async def post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        async with self.session.post(self.url + path, json=payload) as resp:
            data: dict[str, Any] = json.loads(await resp.read())
        return data

    async def close(self) -> None:
        await self.session.close()


class KeepAliveSandboxClient:
    """Through the engine client's keep-alive pool
    (:class:`agentrl.engine_client.keepalive.HttpPool`)."""

    def __init__(self, url: str, pool_size: int) -> None:
        self.pool = HttpPool(url, max_connections=pool_size)
        self.pool_size = pool_size

    async def post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        _, body = await self.pool.request("POST", path, json.dumps(payload).encode(), timeout=600)
        data: dict[str, Any] = json.loads(body)
        return data

    async def close(self) -> None:
        await self.pool.close()


class HttpSandbox(SandboxBase):
    def __init__(self, client: SandboxClient, request: SandboxRequest):
        self._client = client
        self.id = request.episode_id
        self.workdir = request.workdir
        self.files: dict[str, bytes] = {}

    async def exec(
        self, command: str, *, timeout: float, cwd: str | None = None, env: Any = None
    ) -> ExecResult:
        data = await self._client.post("/exec", {"command": command})
        return ExecResult(exit_code=data["exit_code"], stdout=data["stdout"])

    async def write_file(self, path: str, data: bytes | str) -> None:
        self.files[path] = data.encode() if isinstance(data, str) else data

    async def read_file(self, path: str) -> bytes:
        if path not in self.files:
            raise FileNotFoundError(path)
        return self.files[path]

    async def close(self) -> None:
        await self._client.post("/close", {})


class HttpSandboxProvider:
    """Sandboxes on the fake service's processes, round-robin (a sandbox stays where it was
    created)."""

    name = "bench"

    def __init__(self, clients: Sequence[SandboxClient]) -> None:
        self.clients = list(clients)
        self._next = 0

    async def create(self, request: SandboxRequest) -> HttpSandbox:
        client = self.clients[self._next % len(self.clients)]
        self._next += 1
        await client.post("/create", {})
        return HttpSandbox(client, request)

    async def aclose(self) -> None:
        for client in self.clients:
            await client.close()


class BenchTokenizer:
    """Fixed ids: a prompt of ``PROMPT_TOKENS``, each observation ``2 3 3 3``; a reply of
    ``SUBMIT_TOKEN`` ids submits, any other runs ``bash true`` (text actions)."""

    observation_role = "tool"

    def task_message(self, task: Task) -> str:
        return task.instruction

    def initial_ids(self, system: str, user: str) -> list[int]:
        return [1] * PROMPT_TOKENS

    def parse_reply(self, generated: Sequence[int]) -> ParsedReply:
        submits = bool(generated) and generated[0] == SUBMIT_TOKEN
        return parse_text_action("submit" if submits else "bash true")

    def close_turn_ids(self, generated: Sequence[int]) -> list[int]:
        return []

    def tool_results_ids(self, results: Sequence[str]) -> list[int]:
        return [OBSERVATION_TOKEN, 3, 3, 3]

    def append_ids(self, messages: Sequence[Any]) -> list[int]:
        return [OBSERVATION_TOKEN, 3, 3, 3]

    def prefix_checker(self) -> None:
        return None

    def decode(self, ids: Sequence[int]) -> str:
        return ""


class TimedEngineClient(EngineClient):
    """The engine client, recording how long each generate took, client side."""

    def __init__(self, *args: Any, samples: list[float], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.samples = samples

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: SamplingParams,
        *,
        rid: str | None = None,
        timeout: float | None = None,
    ) -> GenerateResponse:
        start = time.perf_counter()
        result = await super().generate(input_ids, sampling_params, rid=rid, timeout=timeout)
        self.samples.append(time.perf_counter() - start)
        return result


class AiohttpDefaultsTransport:
    """The engine client's transport through aiohttp's ``ClientSession()`` at its defaults (a
    100-connection pool): what a client left at library defaults does."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.session: aiohttp.ClientSession | None = None

    async def request(
        self, method: str, path: str, body: bytes | None = None, *, timeout: float
    ) -> tuple[int, bytes]:
        if self.session is None:
            self.session = aiohttp.ClientSession()
        headers = {"Content-Type": "application/json"} if body is not None else None
        try:
            async with self.session.request(
                method,
                self.base_url + path,
                data=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as resp:
                return resp.status, await resp.read()
        except aiohttp.ClientError as exc:
            raise ConnectionError(str(exc)) from exc

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()


class DefaultsEngineClient(TimedEngineClient):
    """The engine client over aiohttp left at its defaults."""

    def _ensure_transport(self) -> AiohttpDefaultsTransport:
        if self._transport is None:
            self._transport = AiohttpDefaultsTransport(self.base_url)
        return self._transport  # type: ignore[return-value]


def bench_group_size(concurrency: int, workers: int, rounds: int) -> int:
    """The largest GRPO group (8, 4 or 2) that divides every worker's ``share × rounds``
    episodes, so that no worker runs a partial extra round."""
    shares = [
        concurrency // workers + (1 if i < concurrency % workers else 0) for i in range(workers)
    ]
    for size in (8, 4, 2):
        if all(share * rounds % size == 0 for share in shares):
            return size
    return 2  # an odd share × rounds: one episode more than the rounds ask for


def bench_spec(args: dict[str, Any], workers: int) -> AgentRLJobSpec:
    """The job the bench runs: its concurrency, workers, caps, and engines that decode every
    request they get at once (the fakes have no batch limit)."""
    engines = len(args["engine_urls"])
    group = bench_group_size(args["concurrency"], workers, args["rounds"])
    return AgentRLJobSpec.model_validate(
        {
            "model": {"source": {"path": "bench"}},
            "sandbox": {"provider": "local", "concurrency": args["concurrency"]},
            "inference": {
                "engines": engines,
                "maxRunningRequests": min(4096, max(1, math.ceil(args["concurrency"] / engines))),
            },
            "rollout": {
                "groupSize": group,
                "workers": workers,
                "maxTurns": args["turns"],
                "maxTokensPerTurn": OUTPUT_TOKENS,
            },
        }
    )


def bench_task(index: int) -> Task:
    return Task(
        id=f"bench-{index}",
        source="toy",
        instruction="bench",
        verification=NamedTestsVerification(fail_to_pass=[TEST_ID], test_command="pytest -rA"),
    )


async def worker_main(
    args: dict[str, Any], workers: int, index: int, defaults: bool
) -> dict[str, Any]:
    """One rollout worker: ``open_rollout`` (the wiring Ray actors run) with this worker's share
    of the spec's concurrency, for ``rounds`` episodes per slot."""
    configure_worker_process()  # what a Ray rollout actor does when it starts
    profile = None
    if args.get("profile_worker") and index == 0 and not defaults:
        import cProfile

        profile = cProfile.Profile(time.thread_time)
        profile.enable()
    cpu0 = time.process_time()
    samples: list[float] = []
    spec = bench_spec(args, workers)
    share = worker_concurrency(spec, workers, index)
    sandboxes: list[SandboxClient] = []
    for url in args["sandbox_urls"]:
        if defaults:
            sandboxes.append(AiohttpSandboxClient(url, aiohttp.ClientSession()))
            continue
        # The provider's pool towards one process of the service: one connection per episode
        # of this worker (an episode has one call open at a time).
        size = share + CONTROL_CONNECTIONS
        if args["sandbox_client"] == "keepalive":
            sandboxes.append(KeepAliveSandboxClient(url, size))
        else:
            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=size))
            sandboxes.append(AiohttpSandboxClient(url, session))
    engine_client: Any = functools.partial(
        DefaultsEngineClient if defaults else TimedEngineClient, samples=samples
    )
    groups = math.ceil(share * args["rounds"] / spec.rollout.group_size)
    tasks = [bench_task(i) for i in range(groups)]
    provider = HttpSandboxProvider(sandboxes)
    classes: dict[str, int] = {}
    deadline = args["deadline"]
    async with open_rollout(
        spec,
        provider=provider,
        engine_urls=args["engine_urls"],
        tasks=tasks,
        workers=workers,
        worker_index=index,
        tokenizer=BenchTokenizer(),
        engine_client=engine_client,
    ) as scheduler:

        async def consume() -> None:
            async for trajectory in scheduler.trajectories():
                key = trajectory.terminal_class.value
                classes[key] = classes.get(key, 0) + 1

        try:
            await asyncio.wait_for(consume(), max(0.1, deadline - time.time()))
        except TimeoutError:
            await scheduler.cancel()
        finished_at = min(time.time(), deadline)
        cpu = time.process_time() - cpu0
    await provider.aclose()
    if profile is not None:
        profile.disable()
        profile.dump_stats(args["profile_worker"])
    return {
        "samples": samples,
        "classes": classes,
        "finished_at": finished_at,
        "cpu": cpu,
        "pools": {
            "episodes_in_flight": share,
            "engine_connections_per_engine": (
                100 if defaults else engine_pool_size(spec, share)  # aiohttp's default
            ),
            "sandbox_connections": sum(c.pool_size for c in sandboxes),
        },
    }


def worker_process(
    args: dict[str, Any], workers: int, index: int, defaults: bool, out: Any
) -> None:
    out.put(_run(worker_main(args, workers, index, defaults), args["event_loop"]))


# ---------------------------------------------------------------------------------------------
# The Ray path: the trainer's driver, episodes in RolloutWorker actors

#: Environment variable carrying into the worker actors (by inheritance: the driver sets it
#: before it starts the local Ray) what :func:`ray_worker_parts` needs, as JSON.
RAY_PARTS_ENV = "AGENTRL_BENCH_ROLLOUT"
#: Ray's setting (read by the raylet from its environment) of its workers' niceness.
RAY_NICENESS_ENV = "RAY_worker_niceness"
#: :attr:`RolloutWorkerConfig.parts` of the bench: this module, imported by name in the actors
#: (the driver puts its directory on their ``PYTHONPATH``).
RAY_PARTS = f"{os.path.splitext(os.path.basename(__file__))[0]}:ray_worker_parts"


class RecordingProvider(HttpSandboxProvider):
    """The sandbox provider of a worker actor. The actor closes its provider last (after its
    engine clients), so on close this writes what the bench needs from the actor's process to
    ``path``: the timed engine client's samples and the provider's connections."""

    def __init__(
        self,
        clients: Sequence[SandboxClient],
        *,
        samples: list[float],
        path: str,
        profile: str | None = None,
    ) -> None:
        super().__init__(clients)
        self.samples, self.path = samples, path
        self.profile: Any = None
        self.profile_path = profile
        if profile is not None:
            import cProfile

            # The loop thread's CPU time (see --profile-driver), from the actor's opening on.
            self.profile = cProfile.Profile(time.thread_time)
            self.profile.enable()

    async def aclose(self) -> None:
        if self.profile is not None:
            self.profile.disable()
            self.profile.dump_stats(self.profile_path)
        await super().aclose()
        record = {
            "pid": os.getpid(),
            "samples": self.samples,
            "sandbox_connections": sum(c.pool_size for c in self.clients),
            "event_loop": type(asyncio.get_running_loop()).__module__.split(".")[0],
        }
        with open(self.path, "w") as fh:
            json.dump(record, fh)


def ray_worker_parts(config: Any, index: int) -> Any:
    """:attr:`~agentrl.rollout.ray_workers.RolloutWorkerConfig.parts` of the bench, called in
    worker actor ``index``: the fake sandbox service's provider (recording on close), the
    bench tokenizer and the timed engine client."""
    from agentrl.api import AgentRLJob
    from agentrl.rollout.ray_workers import WorkerParts

    settings = json.loads(os.environ[RAY_PARTS_ENV])
    spec = AgentRLJob.model_validate(config.job).spec
    # The driver decides how many episodes a worker holds (as for its engine pools,
    # :func:`~agentrl.rollout.runtime.remote_worker_pool_size`): a pool towards each process of
    # the service that one connection per episode of the whole job fits, opened on demand.
    size = spec.sandbox.concurrency + CONTROL_CONNECTIONS
    clients: list[SandboxClient] = []
    for url in settings["sandbox_urls"]:
        if settings["sandbox_client"] == "keepalive":
            clients.append(KeepAliveSandboxClient(url, size))
        else:
            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=size))
            clients.append(AiohttpSandboxClient(url, session))
    samples: list[float] = []
    path = os.path.join(settings["out_dir"], f"worker-{index}.json")
    profile = settings.get("profile_worker") if index == 0 else None
    return WorkerParts(
        provider=RecordingProvider(clients, samples=samples, path=path, profile=profile),
        tokenizer=BenchTokenizer(),
        engine_client=functools.partial(TimedEngineClient, samples=samples),
    )


def bench_job(args: dict[str, Any], workers: int) -> dict[str, Any]:
    """The AgentRLJob manifest of :func:`bench_spec` (what the worker actors are given)."""
    from agentrl.api import AgentRLJob

    job = AgentRLJob.model_validate(
        {
            "metadata": {"name": "bench"},
            "spec": bench_spec(args, workers).model_dump(mode="json", by_alias=True),
        }
    )
    return job.model_dump(mode="json", by_alias=True, exclude_none=True)


def _cpu_of(pids: Sequence[int]) -> float:
    """User + system CPU seconds of these processes (those gone count nothing)."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def _ray_processes() -> list[int]:
    """Every process under this one: the local Ray's GCS, raylet, agents and workers."""
    import psutil

    return [p.pid for p in psutil.Process().children(recursive=True)]


class ScheduledConcurrency:
    """The in-effect concurrency as the operator would write it after ``kubectl scale``: a
    :class:`~agentrl.rollout.concurrency_source.ConcurrencySource` the driver follows exactly as
    it follows the mounted ``runtime.yaml`` (:func:`~agentrl.rollout.runtime.following`), minus
    the kubelet's file sync. It yields the initial figure, then each ``(seconds, figure)`` of
    ``schedule`` that many seconds after :meth:`begin`, recording when it handed each over (the
    driver applies it in the same turn of its loop)."""

    def __init__(self, initial: int, schedule: Sequence[tuple[float, int]]) -> None:
        self.initial, self.schedule = initial, list(schedule)
        self._began = asyncio.Event()
        self._start = 0.0
        self.applied: list[tuple[float, int]] = []
        """(time, figure) of each change the driver was handed."""

    def begin(self, start: float) -> None:
        self._start = start
        self._began.set()

    async def current(self) -> Any:
        from agentrl.rollout.concurrency_source import InEffect

        return InEffect(concurrency=self.initial)

    async def changes(self) -> Any:
        from agentrl.rollout.concurrency_source import InEffect

        yield InEffect(concurrency=self.initial)
        await self._began.wait()
        for at, figure in self.schedule:
            await asyncio.sleep(max(0.0, self._start + at - time.time()))
            self.applied.append((time.time(), figure))
            yield InEffect(concurrency=figure)


async def ray_driver_main(
    args: dict[str, Any], workers: int, cap: float, out: Any, timings: dict[str, float]
) -> dict[str, Any]:
    """The trainer's driver path: the scheduler with the whole concurrency over
    :class:`~agentrl.rollout.ray_workers.RemoteEpisodes` of ``workers`` started actors, for
    ``rounds`` episodes per slot, following ``scale_at``'s changes of the in-effect
    concurrency; tells the parent (``out``) when the first order goes out."""
    import ray

    from agentrl.api import AgentRLJob
    from agentrl.rollout.ray_workers import (
        RemoteEpisodes,
        RolloutWorkerConfig,
        open_remote_rollout,
        start_workers,
    )

    config = RolloutWorkerConfig(
        job=bench_job(args, workers),
        engine_urls=args["engine_urls"],
        workers=workers,
        parts=RAY_PARTS,
    )
    spec = AgentRLJob.model_validate(config.job).spec
    groups = math.ceil(args["concurrency"] * args["rounds"] / spec.rollout.group_size)
    tasks = [bench_task(i) for i in range(groups)]
    source = None
    if args.get("scale_at"):
        source = ScheduledConcurrency(args["concurrency"], args["scale_at"])
    began = time.time()
    actors = start_workers(config, cpus_per_worker=args["ray_cpus"] / workers)
    episodes = RemoteEpisodes(actors, spec)
    classes: dict[str, int] = {}
    profile = None
    try:
        async with open_remote_rollout(
            spec, episodes, tasks=tasks, concurrency_source=source
        ) as scheduler:
            # The actors are open. The CPU bookkeeping first (it blocks this loop): the
            # scheduler's first orders go out at this code's first await.
            actor_pids = [w.pid for w in episodes.workers]
            system_pids = [p for p in _ray_processes() if p not in actor_pids]
            cpu0 = time.process_time(), _cpu_of(actor_pids), _cpu_of(system_pids)
            start = time.time()
            timings["workers_open_seconds"] = start - began
            out.put({"started": start})
            if source is not None:
                source.begin(start)
            if args.get("profile_driver"):
                import cProfile

                # The loop thread's CPU time, not wall time: on shared cores, time preempted
                # would land on whatever function was running.
                profile = cProfile.Profile(time.thread_time)
                profile.enable()

            async def consume() -> None:
                async for trajectory in scheduler.trajectories():
                    key = trajectory.terminal_class.value
                    classes[key] = classes.get(key, 0) + 1

            try:
                await asyncio.wait_for(consume(), max(0.1, start + cap - time.time()))
            except TimeoutError:
                await scheduler.cancel()
            finished_at = min(time.time(), start + cap)
            if profile is not None:
                profile.disable()
                profile.dump_stats(args["profile_driver"])
            cpu = {
                "driver": time.process_time() - cpu0[0],
                "workers": _cpu_of(actor_pids) - cpu0[1],
                "ray_system": _cpu_of(system_pids) - cpu0[2],
            }
    finally:
        for actor in actors:
            ray.kill(actor)
    stats = {s.worker_index: s for s in episodes.final_stats}
    samples: list[float] = []
    pools: list[dict[str, Any]] = []
    loops: set[str] = set()
    for index in range(workers):
        with open(os.path.join(args["ray_out_dir"], f"worker-{index}.json")) as fh:
            record = json.load(fh)
        samples.extend(record["samples"])
        loops.add(record["event_loop"])
        pools.append(
            {
                "episodes_in_flight": stats[index].peak_in_flight,
                "engine_connections_per_engine": stats[index].engine_pool_size,
                "sandbox_connections": record["sandbox_connections"],
            }
        )
    return {
        "samples": samples,
        "classes": classes,
        "finished_at": finished_at,
        "cpu": cpu,
        "pools": pools,
        "episodes_per_worker": [stats[i].episodes for i in range(workers)],
        "episodes_killed": sum(stats[i].cancelled for i in range(workers)),
        "actor_event_loop": "+".join(sorted(loops)),
        "scale_applied": [] if source is None else source.applied,
    }


def ray_driver_process(args: dict[str, Any], workers: int, cap: float, out: Any) -> None:
    """The driver's process: a local Ray with ``ray_cpus`` CPUs (its start timed apart), then
    :func:`ray_driver_main` on asyncio's loop (as the trainer's driver runs). The actors inherit
    this process's environment: the bench's directory on ``PYTHONPATH`` and
    :data:`RAY_PARTS_ENV`."""
    import tempfile
    import traceback

    from agentrl.ray_cluster.node import init_ray

    try:
        import ray

        with tempfile.TemporaryDirectory(prefix="bench-rollout-") as out_dir:
            here = os.path.dirname(os.path.abspath(__file__))
            path = os.environ.get("PYTHONPATH")
            os.environ["PYTHONPATH"] = here if not path else os.pathsep.join((here, path))
            os.environ[RAY_PARTS_ENV] = json.dumps(
                {
                    "sandbox_urls": args["sandbox_urls"],
                    "sandbox_client": args["sandbox_client"],
                    "out_dir": out_dir,
                    "profile_worker": args.get("profile_worker"),
                }
            )
            # Ray runs its workers at nice 15 unless told otherwise; the forked workers run at
            # the bench's niceness, so on shared cores each path would meet the fakes on
            # different terms.
            os.environ[RAY_NICENESS_ENV] = str(args["ray_worker_niceness"])
            began = time.time()
            init_ray(num_cpus=args["ray_cpus"])
            timings = {"init_seconds": time.time() - began}
            try:
                result = asyncio.run(
                    ray_driver_main({**args, "ray_out_dir": out_dir}, workers, cap, out, timings)
                )
            finally:
                ray.shutdown()
        result["ray_startup_seconds"] = {k: round(v, 2) for k, v in timings.items()}
        out.put(result)
    except BaseException:
        out.put({"error": traceback.format_exc()})
        raise


# ---------------------------------------------------------------------------------------------
# The parent: start servers, run a mode, sample the servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _stats(session: aiohttp.ClientSession, urls: list[str]) -> dict[str, float]:
    """Requests in service, requests done, open connections and CPU seconds, summed over
    ``urls``."""
    total: dict[str, float] = {}
    for url in urls:
        async with session.get(f"{url}/stats") as resp:
            data = await resp.json()
        for key, value in data.items():
            total[key] = total.get(key, 0) + value
    return total


def _processes(
    ctx: Any,
    out: Any,
    args: dict[str, Any],
    path: str,
    workers: int,
    defaults: bool,
    cap: float,
) -> tuple[list[Any], float | None]:
    """The processes of a run (not started yet) and its start: now for worker processes; for
    the Ray driver, the time it reports its first orders going out (after Ray's start)."""
    if path == "ray":
        return [ctx.Process(target=ray_driver_process, args=(args, workers, cap, out))], None
    start = time.time()
    worker_args = {**args, "deadline": start + cap}
    procs = [
        ctx.Process(target=worker_process, args=(worker_args, workers, i, defaults, out))
        for i in range(workers)
    ]
    return procs, start


def _receive(out: Any, results: list[dict[str, Any]]) -> float | None:
    """Move the processes' results from ``out`` to ``results``; the start a driver reported,
    if it did. A process's error is raised here."""
    started = None
    while not out.empty():
        message = out.get()
        if "error" in message:
            raise RuntimeError(message["error"])
        if "started" in message:
            started = message["started"]
        else:
            results.append(message)
    return started


def run_mode(
    args: dict[str, Any], *, workers: int, defaults: bool, cap: float, path: str = "processes"
) -> dict[str, Any]:
    """Run the episodes over ``workers`` processes (``path`` ``processes``: each with its own
    scheduler; ``ray``: actors under one driver process); stop after ``cap`` seconds at most."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    n = args["concurrency"]
    engines, sandbox = args["engine_urls"], args["sandbox_urls"]

    async def observe() -> dict[str, Any]:
        async with aiohttp.ClientSession() as session:
            for url in sandbox:  # live sandboxes are counted per run
                async with session.post(f"{url}/reset", json={}) as resp:
                    resp.raise_for_status()
            engine0 = await _stats(session, engines)
            sandbox0 = await _stats(session, sandbox)
            procs, start = _processes(ctx, out, args, path, workers, defaults, cap)
            for proc in procs:
                proc.start()
            results: list[dict[str, Any]] = []
            series: list[tuple[float, float, float]] = []  # (time, in service, busy seconds)
            while len(results) < len(procs):
                busy_e = await _stats(session, engines)
                busy_s = await _stats(session, sandbox)
                series.append(
                    (
                        time.time(),
                        busy_e["in_flight"] + busy_s["in_flight"],
                        busy_e["busy_seconds"] + busy_s["busy_seconds"],
                    )
                )
                alive = any(proc.is_alive() for proc in procs)
                start = _receive(out, results) or start
                if not alive and len(results) < len(procs):
                    raise RuntimeError(f"{path}: a process exited without its results")
                await asyncio.sleep(0.25)
            engine1 = await _stats(session, engines)
            sandbox1 = await _stats(session, sandbox)
            logs = []
            for url in sandbox:
                async with session.get(f"{url}/live") as resp:
                    logs.append(await resp.json())
            for proc in procs:
                proc.join(timeout=30)
        assert start is not None
        return {
            "results": results,
            "series": series,
            "start": start,
            # When the last worker (the driver) saw its last episode finish (or the cap).
            "end": max(r["finished_at"] for r in results),
            "llm_done": engine1["done"] - engine0["done"],
            "exec_done": sandbox1["done"] - sandbox0["done"],
            "cpu_engines": engine1["cpu_seconds"] - engine0["cpu_seconds"],
            "cpu_sandbox": sandbox1["cpu_seconds"] - sandbox0["cpu_seconds"],
            "connections": engine1["connections"] + sandbox1["connections"],
            "logs": logs,
        }

    seen = asyncio.run(observe())
    if args.get("trace"):
        with open(args["trace"], "a") as fh:
            series = [(round(t - seen["start"], 3), busy) for t, busy, _ in seen["series"]]
            live = live_series(seen["logs"], seen["start"])
            record = {"defaults": defaults, "path": path, "in_service": series, "live": live}
            fh.write(json.dumps(record) + "\n")
    start, end = seen["start"], seen["end"]
    wall = end - start
    samples = [s for r in seen["results"] for s in r["samples"]]
    classes: dict[str, int] = {}
    for r in seen["results"]:
        for key, value in r["classes"].items():
            classes[key] = classes.get(key, 0) + value
    # Steady state: skip the first second (processes starting) and the last one (draining).
    # The servers integrate requests in service over time; the difference between two reads
    # over the time between them is the exact average (samples every 0.25 s of a workload
    # whose episodes move in lockstep may all fall in, or all miss, the gaps between calls).
    window = [(t, busy) for t, _, busy in seen["series"] if start + 1.0 <= t <= end - 1.0]
    achieved = 0.0
    if len(window) >= 2 and window[-1][0] > window[0][0]:
        (t0, busy0), (t1, busy1) = window[0], window[-1]
        achieved = (busy1 - busy0) / (t1 - t0) / n
    sampled = [busy for t, busy, _ in seen["series"] if start + 1.0 <= t <= end - 1.0]
    achieved_sampled = statistics.fmean(sampled) / n if sampled else 0.0
    work = seen["llm_done"] * args["llm_latency"] + seen["exec_done"] * args["tool_latency"]
    overhead = sorted((s - args["llm_latency"]) * 1000 for s in samples)
    pools = [p for r in seen["results"] for p in (r["pools"] if path == "ray" else [r["pools"]])]
    if path == "ray":  # one result: the driver's (workers, driver, the rest of Ray)
        raw_cpu = dict(seen["results"][0]["cpu"])
    else:
        raw_cpu = {"workers": sum(r["cpu"] for r in seen["results"])}
    cpu = {key: round(value, 2) for key, value in raw_cpu.items()}
    report = {
        "achieved_ratio": round(achieved, 4),
        "achieved_ratio_sampled": round(achieved_sampled, 4),
        "ideal_throughput_ratio": round(work / (n * wall), 4) if wall > 0 else 0.0,
        "episodes_completed": sum(classes.values()),
        "terminal_classes": classes,
        "wall_seconds": round(wall, 2),
        "llm_calls": len(samples),
        "overhead_p50_ms": round(_pct(overhead, 0.50), 2),
        "overhead_p99_ms": round(_pct(overhead, 0.99), 2),
        "pools": {key: [p[key] for p in pools] for key in POOL_KEYS},
        "cpu_seconds": {
            **cpu,
            "engines": round(seen["cpu_engines"], 2),
            "sandbox": round(seen["cpu_sandbox"], 2),
        },
    }
    per_1k = {
        key: round(value * 1000 / report["episodes_completed"], 3) if classes else None
        for key, value in raw_cpu.items()
    }
    report["cpu_seconds_per_1k_episodes"] = per_1k
    report["driver_cpu_seconds_per_1k_episodes"] = per_1k.get("driver")
    report["worker_cpu_seconds_per_1k_episodes"] = per_1k.get("workers")
    report.update(_sandbox_figures(seen, n, path))
    if path == "ray":
        (result,) = seen["results"]
        report["ray_startup_seconds"] = result["ray_startup_seconds"]
        report["episodes_per_worker"] = result["episodes_per_worker"]
        report["episodes_killed"] = result["episodes_killed"]
        report["actor_event_loop"] = result["actor_event_loop"]
    return report


def _sandbox_figures(seen: dict[str, Any], n: int, path: str) -> dict[str, Any]:
    """What the sandbox service's logs say (:func:`live_sandboxes`): the most live at once, the
    ramp (seconds after the start until the first sandbox, and until ``n`` were live), creates
    and closes, and with ``--scale-at`` each change (:func:`scale_report`)."""
    start, end = seen["start"], seen["end"]
    applied = seen["results"][0].get("scale_applied", []) if path == "ray" else []
    live = live_sandboxes(seen["logs"], target=n, marks=[tuple(m) for m in applied])
    figures: dict[str, Any] = {
        "max_live_sandboxes": live["max_live"],
        "first_sandbox_seconds": _since(live["first_create_at"], start),
        "all_slots_live_seconds": _since(live["target_at"], start),
        "sandboxes_created_closed": [live["creates"], live["closes"]],
    }
    if live["marks"]:
        figures["scale"] = scale_report(live["marks"], seen["series"], start, end)
    return figures


def _since(moment: float | None, start: float) -> float | None:
    return None if moment is None else round(moment - start, 3)


def scale_report(
    marks: list[dict[str, Any]], series: list[tuple[float, float, float]], start: float, end: float
) -> list[dict[str, Any]]:
    """Each change of the in-effect concurrency: when (seconds after the start), from what live
    count to what figure, how long the live sandboxes took to get there (up: every slot
    filled; down: the running episodes over the new figure ended, none was stopped), the most
    live after that, the creates that found the figure already live, and the achieved
    concurrency (requests in service, as ``achieved_ratio``) over the new figure from then to
    the next change (or 1 s before the end)."""
    out = []
    for number, mark in enumerate(marks):
        until = marks[number + 1]["at"] if number + 1 < len(marks) else end - 1.0
        reached = mark["reached_at"]
        phase = {
            "at_seconds": round(mark["at"] - start, 2),
            "live_at_change": mark["live_at_mark"],
            "to": mark["cap"],
            "direction": mark["direction"],
            "reached_after_seconds": None if reached is None else round(reached - mark["at"], 3),
            "max_live_after_reached": mark["max_live_after_reached"],
            "creates_at_or_over_cap": mark["creates_at_or_over_cap"],
            "achieved_ratio_after": None,
        }
        after = reached if reached is not None else math.inf
        window = [(t, busy) for t, _, busy in series if after <= t <= until]
        if len(window) >= 2 and window[-1][0] > window[0][0] and mark["cap"] > 0:
            (t0, busy0), (t1, busy1) = window[0], window[-1]
            phase["achieved_ratio_after"] = round((busy1 - busy0) / (t1 - t0) / mark["cap"], 4)
        out.append(phase)
    return out


POOL_KEYS = ("episodes_in_flight", "engine_connections_per_engine", "sandbox_connections")


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


def _scale_point(text: str) -> tuple[float, int]:
    """``SECONDS:CONCURRENCY`` of ``--scale-at``."""
    at, sep, figure = text.partition(":")
    try:
        point = float(at), int(figure)
    except ValueError:
        point = (-1.0, -1)
    if not sep or point[0] < 0 or point[1] < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: want SECONDS:CONCURRENCY, both ≥ 0")
    return point


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=2048)
    parser.add_argument("--turns", type=int, default=5, help="LLM calls per episode")
    parser.add_argument("--llm-latency", type=float, default=1.0, help="seconds per LLM call")
    parser.add_argument("--tool-latency", type=float, default=0.5, help="seconds per tool call")
    parser.add_argument(
        "--rounds", type=int, default=3, help="episodes per slot (ramp-up counts once)"
    )
    parser.add_argument("--engines", type=int, default=2, help="fake engine processes")
    parser.add_argument(
        "--sandbox-servers", type=int, default=2, help="processes of the fake sandbox service"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=2 * (os.cpu_count() or 1),
        help="rollout worker processes (default two per core: a worker's episodes move in "
        "lockstep, and its bursts of calls are half as long)",
    )
    parser.add_argument(
        "--sandbox-client",
        choices=("keepalive", "aiohttp"),
        default="keepalive",
        help="HTTP client of the fake sandbox provider",
    )
    parser.add_argument(
        "--event-loop",
        choices=("uvloop", "asyncio"),
        default=default_event_loop(),
        help="event loop of the rollout workers (default: uvloop when installed, as Ray does)",
    )
    parser.add_argument(
        "--path",
        choices=("ray", "processes"),
        default="ray",
        help="ray (what the cluster runs): the trainer's driver admits the whole concurrency and "
        "RolloutWorker actors on a local Ray run the episodes in the slots it grants them; "
        "processes (a comparison): forked worker processes each schedule a share themselves",
    )
    parser.add_argument(
        "--scale-at",
        action="append",
        default=[],
        metavar="SECONDS:CONCURRENCY",
        type=_scale_point,
        help="--path ray: change the in-effect concurrency to CONCURRENCY this many seconds "
        "after the first orders (repeat for more changes, up or down, as kubectl scale does)",
    )
    parser.add_argument(
        "--ray-cpus",
        type=int,
        default=os.cpu_count() or 1,
        help="--path ray: CPUs of the local Ray, shared evenly by the worker actors",
    )
    parser.add_argument(
        "--ray-worker-niceness",
        type=int,
        default=os.nice(0),
        help="--path ray: niceness of the actors (default: this process's, as the forked "
        "workers have; Ray's own default is 15, below the fakes on shared cores)",
    )
    parser.add_argument(
        "--profile-driver", help="--path ray: write the driver's cProfile stats to this file"
    )
    parser.add_argument(
        "--profile-worker",
        help="write rollout worker 0's cProfile stats (its loop thread's CPU time; --path ray: "
        "actor 0 from its opening to its close) to this file",
    )
    parser.add_argument(
        "--trace",
        help="append the time series to this file: requests in service (every 0.25 s) and "
        "live sandboxes (fewest and most per 50 ms)",
    )
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    opts = parser.parse_args(argv)
    if opts.scale_at and opts.path != "ray":
        parser.error("--scale-at follows the driver's in-effect concurrency: --path ray only")
    scale_at = sorted(opts.scale_at)

    servers: list[Any] = []
    try:
        engine_urls = []
        for _ in range(opts.engines):
            proc, url = _start_server(engine_server, opts.llm_latency, opts.turns)
            servers.append(proc)
            engine_urls.append(url)
        sandbox_urls = []
        for _ in range(opts.sandbox_servers):
            proc, url = _start_server(sandbox_server, opts.tool_latency)
            servers.append(proc)
            sandbox_urls.append(url)
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
            "sandbox_urls": sandbox_urls,
            "sandbox_client": opts.sandbox_client,
            "event_loop": opts.event_loop,
            "trace": opts.trace,
            "ray_cpus": opts.ray_cpus,
            "ray_worker_niceness": opts.ray_worker_niceness,
            "profile_driver": opts.profile_driver,
            "profile_worker": opts.profile_worker,
            "scale_at": scale_at,
        }
        report: dict[str, Any] = {
            "path": opts.path,
            "configured": opts.concurrency,
            "turns": opts.turns,
            "llm_latency_s": opts.llm_latency,
            "tool_latency_s": opts.tool_latency,
            "episode_seconds_ideal": episode_seconds,
            "rounds": opts.rounds,
            "workers": opts.workers,
            "engines": opts.engines,
            "sandbox_servers": opts.sandbox_servers,
            "sandbox_client": opts.sandbox_client,
            "event_loop": opts.event_loop,
        }
        if opts.path == "ray":
            report.update(
                {
                    "ray_cpus": opts.ray_cpus,
                    "ray_worker_niceness": opts.ray_worker_niceness,
                    "driver_event_loop": "asyncio",
                }
            )
        cap = ideal_wall * 1.3 + 3
        if scale_at:
            report["scale_at"] = [list(point) for point in scale_at]
            report["in_effect_max"] = max([opts.concurrency, *(c for _, c in scale_at)])
            # The same episodes at a lower figure for a while take longer: room for a run at
            # the lowest figure throughout, so the cap never cuts an episode.
            lowest = min([opts.concurrency, *(c for _, c in scale_at)])
            cap = ideal_wall * opts.concurrency / max(lowest, 1) * 1.3 + scale_at[-1][0] + 3
        report.update(run_mode(args, workers=opts.workers, defaults=False, cap=cap, path=opts.path))
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
