"""``agentrl engine serve-tiny``: a CPU engine behind SGLang's HTTP API, serving the tiny torch
policy or any Hugging Face causal LM directory (``--model-path`` holding a ``config.json``:
``transformers`` on CPU, a KV cache per request; :mod:`agentrl.tiny.served`). The routes,
scheduler, metrics, faults and weight updates below are the same for both.

It is the engine of ``agentrl run`` and of the runtime's tests: rollout workers generate through
it, the trainer pushes weights into it, the watchdog probes it. It serves the subset of SGLang's
API listed in ``docs/design/toy-agent-contract.md`` with SGLang's shapes, so everything above it
runs unchanged against a real SGLang server.

Like SGLang it batches: a scheduler task decodes one token for every running request per step,
admits at most ``--max-running-requests`` at once (the rest wait in a queue, visible as
``sglang:num_queue_reqs``) and refuses prompts longer than ``--context-length``.

Fault injection, for the watchdog's tests and ``agentrl run --chaos``: after
``--fault-after-requests N`` answered ``/generate`` requests the engine writes ``--fault-line``
verbatim to stderr and ``--log-file`` and then, by ``--fault-mode``:

* ``crash`` exits with a non-zero status (what a HIP memory fault does to SGLang);
* ``hang`` stops answering HTTP on every route (a wedged server);
* ``stall`` keeps answering ``/health`` and ``/metrics`` — which report running requests — but
  generates no token (a dead inference thread behind a live HTTP server).

Apart from those, ``--fault-weight-updates-after N`` breaks the weight route alone: after N
weight updates taken, every weight-update route (``/update_weights_from_disk``,
``/init_weights_update_group``, ``/update_weights_from_distributed``) answers 503 and loads
nothing, while generation, ``/health`` and ``/model_info`` go on serving the last weights taken —
an engine whose weight loading broke behind a live server (the trainer's pushes fail, the
watchdog sees nothing to restart). 503, not 404: the route answered N times, so it is there and
failing, not gone; the client counts it as the engine unavailable (retryable), as it would a
real loader's failure behind a proxy. On a cluster a ``server: tiny`` job passes these flags in
``spec.inference.extraArgs`` (``--flag=value``).

A scheduler that fails (the model's forward raising: a bug, an allocation refused) is not
silent: the traceback is logged, every queued and running request answers 500 with the error,
and from then on every route answers 503 with it — ``/health`` included, so the watchdog
restarts the engine, as SGLang's server exits when its scheduler process dies.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import click
import torch
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from agentrl.engine_client.client import GenerateRequest
from agentrl.tiny import policy as tiny
from agentrl.tiny import weight_updates as tiny_weight_updates
from agentrl.tiny.served import HFServed, ServedModel, TinyServed, is_hf_model_dir

log = logging.getLogger("agentrl.tiny.policy")

FaultMode = Literal["crash", "hang", "stall"]


class FaultPlan:
    """When and how the engine breaks (all optional; no fault by default)."""

    def __init__(
        self,
        *,
        line: str | None,
        after_requests: int | None,
        mode: FaultMode | None,
        weight_updates_after: int | None = None,
    ) -> None:
        self.line = line
        self.after_requests = after_requests
        self.mode: FaultMode | None = mode
        self.fired = False
        self.weight_updates_after = weight_updates_after
        """Weight updates taken before every weight-update route answers 503 (None: never)."""

    @property
    def armed(self) -> bool:
        return self.mode is not None and self.after_requests is not None and not self.fired


@dataclass
class _Running:
    """One request being decoded."""

    rid: str
    ids: list[int]
    prompt_len: int
    max_new_tokens: int
    temperature: float
    top_p: float
    stop: list[str]
    state: Any
    """The served model's decoding state (:meth:`ServedModel.new_state`)."""
    done: asyncio.Future[dict[str, Any]]
    logprobs: list[float] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)


class TinyEngine:
    """The serving state: model, scheduler, counters, fault plan."""

    def __init__(
        self,
        model: Any,
        *,
        model_path: str,
        served_model_name: str = "policy",
        weight_version: str = "0",
        context_length: int = 4096,
        max_running_requests: int = 64,
        max_total_tokens: int | None = None,
        seed: int = 0,
        fault: FaultPlan | None = None,
        log_file: Path | None = None,
        served: ServedModel | None = None,
    ) -> None:
        """``model`` is the tiny policy (or a module only weights are pushed into); an HF model
        comes as ``served`` (:class:`~agentrl.tiny.served.HFServed`), its module ignored."""
        self.served: ServedModel = served or TinyServed(model)
        self.model = self.served.module.eval()
        self.model_path = model_path
        self.served_model_name = served_model_name
        self.weight_version = weight_version
        limit = self.served.max_context
        self.context_length = min(context_length, limit) if limit else context_length
        self.max_running_requests = max_running_requests
        self.max_total_tokens = max_total_tokens or self.context_length * max_running_requests
        self.generator = torch.Generator().manual_seed(seed)
        self.fault = fault or FaultPlan(line=None, after_requests=None, mode=None)
        self.log_file = log_file
        self.queue: list[_Running] = []
        self.running: list[_Running] = []
        self.paused = False
        self.hung = asyncio.Event()  # set: never; awaited forever by a hung server
        self.stalled = False
        self.answered = 0
        self.weight_updates = 0
        """Weight updates taken (from disk or by broadcast): ``--fault-weight-updates-after``."""
        self._wake = asyncio.Event()
        self._rid = itertools.count()
        self._recent: list[tuple[float, int]] = []  # (time, tokens) of recent decode steps
        self._scheduler: asyncio.Task[None] | None = None
        self._hanging = False
        self.failed: str | None = None
        """Why the scheduler stopped (it raised); every route then answers 503 with it."""
        self._init_metrics()

    # -- metrics -----------------------------------------------------------------------------

    def _init_metrics(self) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"sglang:{name}", doc, labels, registry=self.registry)

        self.g_running = gauge("num_running_reqs", "Running requests.")
        self.g_queue = gauge("num_queue_reqs", "Queued requests.")
        self.g_usage = gauge("token_usage", "Share of the token pool in use.")
        self.g_used = gauge("num_used_tokens", "Tokens held by running requests.")
        self.g_max = gauge("max_total_num_tokens", "Size of the token pool.")
        self.g_throughput = gauge("gen_throughput", "Generated tokens per second (last 5 s).")
        self.g_cache = gauge("cache_hit_rate", "Prefix cache hit rate (no cache: 0).")
        self.c_gen = Counter(
            "sglang:generation_tokens", "Generated tokens.", labels, registry=self.registry
        )
        self.c_prompt = Counter(
            "sglang:prompt_tokens", "Prompt tokens.", labels, registry=self.registry
        )
        self.c_requests = Counter(
            "sglang:num_requests", "Finished requests.", labels, registry=self.registry
        )
        self.g_max.labels(self.served_model_name).set(self.max_total_tokens)
        self.g_cache.labels(self.served_model_name).set(0.0)

    def render_metrics(self) -> bytes:
        name = self.served_model_name
        now = time.monotonic()
        self._recent = [(t, n) for t, n in self._recent if now - t <= 5.0]
        used = sum(len(r.ids) for r in self.running)
        self.g_running.labels(name).set(len(self.running))
        self.g_queue.labels(name).set(len(self.queue))
        self.g_used.labels(name).set(used)
        self.g_usage.labels(name).set(used / self.max_total_tokens)
        self.g_throughput.labels(name).set(sum(n for _, n in self._recent) / 5.0)
        return generate_latest(self.registry)

    # -- logging and faults ------------------------------------------------------------------

    def write_line(self, line: str) -> None:
        """Write one line verbatim to stderr and the log file (the watchdog reads both)."""
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
        if self.log_file is not None:
            with self.log_file.open("a", encoding="utf-8") as fh:
                fh.write(line + "\n")

    def maybe_fault(self) -> None:
        """Fire the planned fault once its request count is reached."""
        if not self.fault.armed or self.answered < (self.fault.after_requests or 0):
            return
        self.fault.fired = True
        if self.fault.line is not None:
            self.write_line(self.fault.line)
        if self.fault.mode == "crash":
            logging.shutdown()
            os._exit(1)
        elif self.fault.mode == "hang":
            self._hanging = True
        elif self.fault.mode == "stall":
            self.stalled = True

    async def guard(self) -> None:
        """Await forever when the server is hung, answer 503 when its scheduler failed (every
        route calls this first)."""
        if self._hanging:
            await self.hung.wait()
        if self.failed is not None:
            raise web.HTTPServiceUnavailable(text=self.failed)

    def weight_route_fault(self, route: str) -> web.Response | None:
        """The 503 a weight-update route answers once ``--fault-weight-updates-after`` updates
        were taken; None while it still takes them (every weight-update route asks first)."""
        after = self.fault.weight_updates_after
        if after is None or self.weight_updates < after:
            return None
        text = (
            f"{route} is failing: this engine took {self.weight_updates} weight updates and "
            f"takes no more (--fault-weight-updates-after {after})"
        )
        log.warning("refused %s: weight updates are failing", route)
        return web.Response(status=503, text=text)

    def weight_update_taken(self) -> None:
        """Count one weight update taken (towards ``--fault-weight-updates-after``)."""
        self.weight_updates += 1

    # -- scheduling --------------------------------------------------------------------------

    def start(self) -> None:
        self.maybe_fault()  # --fault-after-requests 0 fires at start-up
        self._scheduler = asyncio.get_running_loop().create_task(self._schedule())

    async def stop(self) -> None:
        if self._scheduler is not None:
            self._scheduler.cancel()
            await asyncio.gather(self._scheduler, return_exceptions=True)
        for req in self.queue + self.running:
            if not req.done.done():
                req.done.cancel()

    def submit(self, request: GenerateRequest) -> _Running:
        """Queue a request; its future resolves to SGLang's response body."""
        ids = list(request.input_ids)
        if not ids:
            raise web.HTTPBadRequest(text="input_ids is empty")
        vocab = self.served.vocab_size
        if any(not 0 <= i < vocab for i in ids):
            raise web.HTTPBadRequest(text=f"input_ids outside the vocabulary [0, {vocab})")
        if len(ids) >= self.context_length:
            raise web.HTTPBadRequest(
                text=f"The input ({len(ids)} tokens) is longer than the model's context length "
                f"({self.context_length} tokens)."
            )
        sp = request.sampling_params
        req = _Running(
            rid=request.rid or uuid.uuid4().hex,
            ids=ids,
            prompt_len=len(ids),
            # SGLang trims max_new_tokens to what fits the context.
            max_new_tokens=min(sp.max_new_tokens, self.context_length - len(ids)),
            temperature=sp.temperature,
            top_p=sp.top_p,
            stop=list(sp.stop or []),
            state=self.served.new_state(ids),
            done=asyncio.get_running_loop().create_future(),
        )
        self.c_prompt.labels(self.served_model_name).inc(len(ids))
        self.queue.append(req)
        self._wake.set()
        return req

    async def _schedule(self) -> None:
        try:
            await self._schedule_steps()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the model's forward raised: fail loudly, not hang
            self._fail(exc)

    def _fail(self, exc: Exception) -> None:
        """The scheduler stopped on ``exc``: answer every request it held with a 500 and mark the
        engine failed (:meth:`guard`)."""
        self.failed = f"the engine's scheduler failed: {type(exc).__name__}: {exc}"
        log.error("%s", self.failed, exc_info=exc)
        held, self.queue, self.running = self.queue + self.running, [], []
        for req in held:
            if not req.done.done():
                req.done.set_exception(web.HTTPInternalServerError(text=self.failed))

    async def _schedule_steps(self) -> None:
        while True:
            if self.stalled:
                # A dead inference thread behind a live server: requests are taken in and
                # reported as running, and no token ever comes.
                while self.queue and len(self.running) < self.max_running_requests:
                    self.running.append(self.queue.pop(0))
            if self.paused or self.stalled or not (self.queue or self.running):
                self._wake.clear()
                await self._wake.wait()
                continue
            while self.queue and len(self.running) < self.max_running_requests:
                self.running.append(self.queue.pop(0))
            finished_now = [r for r in self.running if r.max_new_tokens <= 0]
            for req in finished_now:
                self._finish(req, "length")
            if self.running:
                self._decode_step()
            await asyncio.sleep(0)  # let HTTP handlers in between steps

    def _decode_step(self) -> None:
        batch = list(self.running)
        logits = self.served.next_logits([(req.state, req.ids) for req in batch])
        temps = torch.tensor([max(r.temperature, 1e-6) for r in batch]).unsqueeze(1)
        logp = torch.log_softmax(logits / temps, dim=-1)
        tokens: list[int] = []
        for i, req in enumerate(batch):
            if req.temperature <= 0.0:
                tokens.append(int(torch.argmax(logp[i])))
                continue
            probs = logp[i].exp()
            if req.top_p < 1.0:
                probs = _top_p_filter(probs, req.top_p)
            tokens.append(int(torch.multinomial(probs, 1, generator=self.generator)))
        self._recent.append((time.monotonic(), len(batch)))
        self.c_gen.labels(self.served_model_name).inc(len(batch))
        for i, (req, token) in enumerate(zip(batch, tokens, strict=False)):
            req.logprobs.append(float(logp[i, token]))
            self.served.push(req.state, len(req.ids), token)
            req.ids.append(token)
            generated = len(req.ids) - req.prompt_len
            if token in self.served.eos_ids:
                self._finish(req, "stop", matched=token)
            elif req.stop and (hit := self._stop_hit(req)) is not None:
                self._finish(req, "stop", matched=hit)
            elif generated >= req.max_new_tokens or len(req.ids) >= self.context_length:
                self._finish(req, "length")

    def _stop_hit(self, req: _Running) -> str | None:
        text = self.served.decode(req.ids[req.prompt_len :])
        return next((s for s in req.stop if s in text), None)

    def _finish(
        self, req: _Running, kind: str, *, matched: int | str | None = None, message: str = ""
    ) -> None:
        if req in self.running:
            self.running.remove(req)
        elif req in self.queue:
            self.queue.remove(req)
        out = req.ids[req.prompt_len :]
        # SGLang 0.5.15's finish_reason shapes (FINISH_MATCHED_*, FINISH_LENGTH, FINISH_ABORT
        # .to_json()) and meta_info keys; tests/contracts/test_sglang_responses.py holds them
        # equal.
        finish: dict[str, Any] = {"type": kind}
        if kind == "stop":
            finish["matched"] = matched
        elif kind == "length":
            finish["length"] = len(out)
        else:
            finish.update(message=message or "Aborted", status_code=None, err_type=None)
        logprobs = [[lp, t, None] for lp, t in zip(req.logprobs, out, strict=False)]
        body = {
            "text": self.served.decode(out),
            "output_ids": out,
            "meta_info": {
                "id": req.rid,
                "finish_reason": finish,
                "prompt_tokens": req.prompt_len,
                "weight_version": self.weight_version,
                "num_retractions": 0,
                "input_token_logprobs": [],
                "output_token_logprobs": logprobs,
                "output_token_logprobs_length": len(logprobs),
                "reasoning_tokens": 0,
                "completion_tokens": len(out),
                "cached_tokens": 0,
                "e2e_latency": time.monotonic() - req.started,
            },
        }
        self.c_requests.labels(self.served_model_name).inc()
        if not req.done.done():
            req.done.set_result(body)

    def abort_all(self) -> int:
        """Finish every queued and running request with ``finish_reason.type == "abort"``."""
        victims = self.queue + self.running
        for req in victims:
            self._finish(req, "abort", message="aborted by pause_generation")
        return len(victims)

    # -- weights -----------------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        """No request queued or running (paused in place ones included): SGLang's scheduler
        flushes its cache only then (``Scheduler.flush_cache``, ``is_fully_idle``)."""
        return not (self.queue or self.running)

    def cache_flush_refused(self) -> str:
        """SGLang's words when it will not flush a busy cache."""
        return (
            "Cache not flushed because there are pending requests. "
            f"#queue-req: {len(self.queue)}, #running-req: {len(self.running)}"
        )

    def load_weights(self, path: str, weight_version: str | None) -> None:
        self.served.load_weights(path)
        self.model_path = path
        self.weight_version = weight_version if weight_version is not None else path


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_p, order = torch.sort(probs, descending=True)
    keep = torch.cumsum(sorted_p, 0) - sorted_p < top_p
    filtered = torch.zeros_like(probs)
    filtered[order[keep]] = sorted_p[keep]
    return filtered / filtered.sum()


# ---------------------------------------------------------------------------------------------
# HTTP routes

ENGINE_KEY: web.AppKey[TinyEngine] = web.AppKey("engine", TinyEngine)

#: The assertion SGLang's scheduler fails when a weight update's flush meets held requests
#: (``WeightUpdater.flush_cache_after_weight_update``).
FLUSH_AFTER_UPDATE_FAILED = "Cache flush failed after updating weights"


def build_app(engine: TinyEngine) -> web.Application:  # noqa: C901 - one small handler per route
    """The aiohttp application serving ``engine`` (tests run it in-process)."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[ENGINE_KEY] = engine

    async def on_startup(_: web.Application) -> None:
        engine.start()

    async def on_shutdown(_: web.Application) -> None:
        # before the runner waits for open handlers: the requests the engine holds end (a stall
        # fault's never would), so a SIGTERM stops it within its grace period
        await engine.stop()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)

    async def generate(request: web.Request) -> web.Response:
        await engine.guard()
        try:
            body = GenerateRequest.model_validate(await request.json())
        except ValueError as exc:
            raise web.HTTPBadRequest(text=f"invalid /generate request: {exc}") from exc
        req = engine.submit(body)
        result = await req.done
        await engine.guard()  # a server that hung meanwhile answers nothing
        engine.answered += 1
        # The fault fires just after this answer leaves, so "after N requests" means N answers.
        asyncio.get_running_loop().call_later(0.05, engine.maybe_fault)
        return web.json_response(result)

    async def health(_: web.Request) -> web.Response:
        await engine.guard()
        return web.Response(text="")

    async def health_generate(_: web.Request) -> web.Response:
        await engine.guard()
        probe = GenerateRequest(
            input_ids=engine.served.probe_ids(),
            sampling_params={"max_new_tokens": 1, "temperature": 0.0},  # type: ignore[arg-type]
            rid=f"health-{uuid.uuid4().hex[:8]}",
        )
        await engine.submit(probe).done
        return web.Response(text="")

    async def model_info(_: web.Request) -> web.Response:
        await engine.guard()
        # SGLang 0.5.15's keys (tests/contracts/test_sglang_responses.py holds them equal)
        return web.json_response(
            {
                "model_path": engine.model_path,
                "tokenizer_path": engine.served.tokenizer_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": engine.weight_version,
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": engine.served.model_type,
                "architectures": engine.served.architectures,
            }
        )

    async def server_info(_: web.Request) -> web.Response:
        await engine.guard()
        return web.json_response(
            {
                "model_path": engine.model_path,
                "served_model_name": engine.served_model_name,
                "context_length": engine.context_length,
                "max_running_requests": engine.max_running_requests,
                "max_total_num_tokens": engine.max_total_tokens,
                "weight_version": engine.weight_version,
            }
        )

    async def update_from_disk(request: web.Request) -> web.Response:
        await engine.guard()
        if (refused := engine.weight_route_fault("/update_weights_from_disk")) is not None:
            return refused
        body = await request.json()
        path = body.get("model_path")
        if not isinstance(path, str):
            raise web.HTTPBadRequest(text="model_path is required")
        try:
            engine.load_weights(path, body.get("weight_version"))
        except (OSError, ValueError, RuntimeError) as exc:
            # SGLang answers a failed load with success=false and keeps the old weights.
            return web.json_response(
                {"success": False, "message": str(exc), "num_paused_requests": 0}, status=400
            )
        if body.get("flush_cache", True) and not engine.idle:
            # SGLang 0.5.15 flushes after loading unless told not to, and asserts that the
            # flush worked: with requests held (paused in place) its scheduler dies.
            engine.write_line(f"AssertionError: {FLUSH_AFTER_UPDATE_FAILED}")
            raise web.HTTPInternalServerError(text=FLUSH_AFTER_UPDATE_FAILED)
        engine.weight_update_taken()
        log.info("weights loaded from %s (version %s)", path, engine.weight_version)
        return web.json_response(
            {
                "success": True,
                "message": "Succeeded to update model weights.",
                "num_paused_requests": 0,
            }
        )

    async def flush_cache(_: web.Request) -> web.Response:
        await engine.guard()
        if not engine.idle:  # SGLang answers 400 and keeps the cache
            return web.Response(status=400, text=engine.cache_flush_refused() + "\n")
        return web.Response(text="Cache flushed.\n")

    async def pause(request: web.Request) -> web.Response:
        await engine.guard()
        body = await request.json() if request.can_read_body else {}
        mode = body.get("mode", "abort")
        engine.paused = True
        if mode == "abort":
            engine.abort_all()
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def resume(_: web.Request) -> web.Response:
        await engine.guard()
        engine.paused = False
        engine._wake.set()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def metrics(_: web.Request) -> web.Response:
        await engine.guard()
        return web.Response(
            body=engine.render_metrics(), content_type="text/plain", charset="utf-8"
        )

    app.add_routes(
        [
            web.post("/generate", generate),
            web.get("/health", health),
            web.get("/health_generate", health_generate),
            web.get("/model_info", model_info),
            web.get("/get_model_info", model_info),  # SGLang's deprecated name, still served
            web.get("/get_server_info", server_info),
            web.post("/update_weights_from_disk", update_from_disk),
            web.post("/flush_cache", flush_cache),
            web.get("/flush_cache", flush_cache),
            web.post("/pause_generation", pause),
            web.post("/continue_generation", resume),
            web.get("/metrics", metrics),
        ]
    )
    tiny_weight_updates.add_routes(app, engine)  # weightSync.mode: distributed
    return app


def load_model(model_path: str, *, seed: int, edit_names: tuple[str, ...]) -> ServedModel:
    """``tiny`` builds the initial policy; a directory with a ``config.json`` is an HF causal
    LM; anything else is a directory from ``save_policy``."""
    if model_path == tiny.BUILTIN_PATH:
        return TinyServed(
            tiny.initial_policy(seed, edit_names=edit_names or tiny.DEFAULT_PRIOR_EDITS)
        )
    if is_hf_model_dir(model_path):
        return HFServed(model_path)
    return TinyServed(tiny.load_policy(model_path))


@click.command("serve-tiny")
@click.option(
    "--model-path",
    default=tiny.BUILTIN_PATH,
    show_default=True,
    help="An HF model directory (config.json, safetensors, tokenizer), a directory the "
    "trainer wrote, or 'tiny' for the built-in initial policy.",
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option(
    "--port",
    default=30000,
    show_default=True,
    type=int,
    help="Port to listen on; 0 picks a free one (printed on stderr).",
)
@click.option("--served-model-name", default="policy", show_default=True)
@click.option("--weight-version", default="0", show_default=True)
@click.option("--context-length", default=4096, show_default=True, type=int)
@click.option("--max-running-requests", default=64, show_default=True, type=int)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--edit-name",
    "edit_names",
    multiple=True,
    help="Edit names the built-in initial policy spreads over (repeatable).",
)
@click.option(
    "--log-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the engine's log lines here (the watchdog tails it).",
)
@click.option(
    "--fault-line", help="Line written verbatim to stderr and the log when the fault fires."
)
@click.option(
    "--fault-after-requests",
    type=click.IntRange(min=0),
    help="Fire the fault after this many answered /generate requests (0: at start).",
)
@click.option(
    "--fault-mode",
    type=click.Choice(["crash", "hang", "stall"]),
    help="crash: exit non-zero; hang: stop answering HTTP; stall: no tokens, "
    "running requests still reported.",
)
@click.option(
    "--fault-weight-updates-after",
    type=click.IntRange(min=0),
    help="After this many weight updates taken, every weight-update route answers 503 "
    "(generation goes on with the last weights taken; independent of --fault-mode).",
)
def serve_tiny(
    model_path: str,
    host: str,
    port: int,
    served_model_name: str,
    weight_version: str,
    context_length: int,
    max_running_requests: int,
    seed: int,
    edit_names: tuple[str, ...],
    log_file: Path | None,
    fault_line: str | None,
    fault_after_requests: int | None,
    fault_mode: FaultMode | None,
    fault_weight_updates_after: int | None,
) -> None:
    """Serve the tiny policy or an HF causal LM on CPU behind SGLang's HTTP API (for agentrl
    run and tests)."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file is not None:
        handlers.append(logging.FileHandler(log_file, encoding="utf-8"))
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(message)s", handlers=handlers, force=True
    )
    if fault_mode is not None and fault_after_requests is None:
        raise click.UsageError("--fault-mode needs --fault-after-requests")
    torch.set_num_threads(1)  # one core per engine: the rest belong to sandboxes and trainer
    served = load_model(model_path, seed=seed, edit_names=edit_names)
    engine = TinyEngine(
        served.module,
        served=served,
        model_path=model_path,
        served_model_name=served_model_name,
        weight_version=weight_version,
        context_length=context_length,
        max_running_requests=max_running_requests,
        seed=seed,
        fault=FaultPlan(
            line=fault_line,
            after_requests=fault_after_requests,
            mode=fault_mode,
            weight_updates_after=fault_weight_updates_after,
        ),
        log_file=log_file,
    )
    asyncio.run(_serve(engine, host, port))


async def _serve(engine: TinyEngine, host: str, port: int) -> None:
    runner = web.AppRunner(build_app(engine), handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    engine.write_line(f"agentrl tiny engine serving on http://{host}:{bound}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        engine.hung.set()  # release handlers parked by a hang fault so shutdown can finish
        await runner.cleanup()
