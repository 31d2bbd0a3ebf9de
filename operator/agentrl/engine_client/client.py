"""The one HTTP client of SGLang engines: rollout workers, the trainer's weight sync and the
watchdog all talk to engines through :class:`EngineClient`.

It speaks the subset of SGLang's HTTP API the runtime uses (``docs/design/toy-agent-contract.md``)
with SGLang's documented request and response shapes, so the same client drives a real SGLang
server on a GPU and ``agentrl engine serve-tiny`` on a laptop. The request/response types are
pydantic models; nothing untyped crosses this module's boundary.

No hidden caps: the connection pool (:class:`~agentrl.engine_client.keepalive.HttpPool`, a lean
HTTP/1.1 keep-alive pool: at thousands of episodes per worker, aiohttp's client costs two to
three and a half times its CPU per call) has exactly ``max_connections`` connections, the
caller derives that number from the manifest with :func:`connection_pool_size`, and the size is
exported as ``agentrl_engine_client_pool_size`` (open connections:
``agentrl_engine_client_connections``).

The hot path (:meth:`EngineClient.generate`) serialises its request straight to JSON bytes and
validates the answer straight from them (pydantic-core both ways): no intermediate dicts, no
second decoding pass.

Errors are grouped by what the caller does next::

    EngineError
    ├── EngineUnavailable      connection refused/reset, 5xx, timeout: an infra error, retry
    │   └── EngineTimeout      the request outlived its timeout
    └── EngineRequestError     4xx: the request itself is wrong; retrying will not help
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Literal, Protocol, Self

from prometheus_client import Gauge
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from agentrl.api import AgentRLJobSpec
from agentrl.engine_client.keepalive import HttpPool, HttpProtocolError

POOL_SIZE = Gauge(
    "agentrl_engine_client_pool_size",
    "Connection slots of an engine client's HTTP pool (derived from the spec).",
    ["engine"],
)
IN_FLIGHT = Gauge(
    "agentrl_engine_client_in_flight",
    "Requests an engine client has in flight.",
    ["engine"],
)
CONNECTIONS = Gauge(
    "agentrl_engine_client_connections",
    "Connections an engine client's HTTP pool has open (at most its pool size).",
    ["engine"],
)

#: SGLang's model-info route. ``/get_model_info`` is its deprecated name in 0.5.15: the server
#: logs a warning for every call, and the trainer and the watchdog call it after every push.
MODEL_INFO_PATH = "/model_info"

#: Connections kept for control traffic (health probes, weight updates, metrics scrapes) on top
#: of the generation slots, so a probe never queues behind a full pool of generations.
CONTROL_CONNECTIONS = 4


def connection_pool_size(spec: AgentRLJobSpec) -> int:
    """Connections one client needs towards one engine.

    Every in-flight episode has at most one LLM call open, and episodes are spread over the
    engines, but any engine may get all of them while the others restart. So one engine's pool
    is sized for the whole sandbox concurrency, capped by what the engine decodes at once plus
    what it may queue (another ``maxRunningRequests``: beyond that a request just waits in our
    pool instead of the engine's queue), plus :data:`CONTROL_CONNECTIONS`.
    """
    generation = min(spec.sandbox.concurrency, 2 * spec.inference.max_running_requests)
    return max(generation, 1) + CONTROL_CONNECTIONS


# ---------------------------------------------------------------------------------------------
# Request and response shapes (SGLang's documented ones)


class SamplingParams(BaseModel):
    """``sampling_params`` of ``/generate``."""

    model_config = ConfigDict(extra="allow")

    max_new_tokens: int = Field(default=128, ge=0)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: list[str] | None = None


class GenerateRequest(BaseModel):
    """Body of ``POST /generate`` with token ids in (TITO: tokens in, tokens out)."""

    input_ids: list[int]
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    return_logprob: bool = True
    rid: str | None = None


class FinishReason(BaseModel):
    """``meta_info.finish_reason``."""

    model_config = ConfigDict(extra="allow")

    type: Literal["stop", "length", "abort"]
    matched: int | str | None = None
    message: str | None = None


class MetaInfo(BaseModel):
    """``meta_info`` of a ``/generate`` response."""

    model_config = ConfigDict(extra="allow")

    id: str = ""
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    output_token_logprobs: list[tuple[float, int, str | None]] = Field(default_factory=list)
    weight_version: str | None = None

    @field_validator("weight_version", mode="before")
    @classmethod
    def _as_str(cls, value: Any) -> Any:
        return None if value is None else str(value)


class GenerateResponse(BaseModel):
    """A ``/generate`` response."""

    model_config = ConfigDict(extra="allow")

    text: str = ""
    output_ids: list[int] = Field(default_factory=list)
    meta_info: MetaInfo = Field(default_factory=MetaInfo)

    @property
    def logprobs(self) -> list[float]:
        """The engine's logprob of each generated token, in order."""
        return [lp for lp, _, _ in self.meta_info.output_token_logprobs]

    @property
    def finish_type(self) -> str:
        """``stop``, ``length`` or ``abort`` (``abort`` when the engine said nothing)."""
        fr = self.meta_info.finish_reason
        return fr.type if fr is not None else "abort"


class ModelInfo(BaseModel):
    """``GET /model_info`` (SGLang 0.5.15 also answers the older ``/get_model_info``, but logs
    a deprecation warning on every call)."""

    model_config = ConfigDict(extra="allow")

    model_path: str
    tokenizer_path: str | None = None
    is_generation: bool = True
    weight_version: str | None = None

    @field_validator("weight_version", mode="before")
    @classmethod
    def _as_str(cls, value: Any) -> Any:
        return None if value is None else str(value)


class UpdateWeightsResult(BaseModel):
    """Response of the weight-update endpoints."""

    model_config = ConfigDict(extra="allow")

    success: bool
    message: str = ""


class EngineMetrics(BaseModel):
    """The ``sglang:`` gauges and counters the runtime reads from ``/metrics`` (summed over
    label sets; absent ones stay ``None``)."""

    num_running_reqs: float | None = None
    num_queue_reqs: float | None = None
    token_usage: float | None = None
    gen_throughput: float | None = None
    num_used_tokens: float | None = None
    max_total_num_tokens: float | None = None
    cache_hit_rate: float | None = None
    num_retracted_reqs: float | None = None
    generation_tokens_total: float | None = None
    prompt_tokens_total: float | None = None


def parse_metrics(text: str) -> EngineMetrics:
    """Read SGLang's Prometheus text into :class:`EngineMetrics`."""
    wanted = set(EngineMetrics.model_fields)
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removeprefix("sglang:")
            if sample.name.startswith("sglang:") and name in wanted:
                values[name] = values.get(name, 0.0) + float(sample.value)
    return EngineMetrics(**values)


# ---------------------------------------------------------------------------------------------
# Errors


class EngineError(Exception):
    """Base of every engine client error; ``url`` names the engine."""

    def __init__(self, message: str, *, url: str, status: int | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.status = status


class EngineUnavailable(EngineError):
    """The engine could not answer (down, restarting, overloaded): an infra error, retryable."""


class EngineTimeout(EngineUnavailable):
    """The request took longer than its timeout."""


class EngineRequestError(EngineError):
    """The engine rejected the request (4xx): retrying the same request will not help."""


# ---------------------------------------------------------------------------------------------
# The client


class Transport(Protocol):
    """How :class:`EngineClient` sends one request:
    :class:`~agentrl.engine_client.keepalive.HttpPool` by default; a benchmark swaps in another
    HTTP library to compare.

    It raises :class:`TimeoutError` past ``timeout``, :class:`OSError` when the engine cannot
    be reached or drops the connection, :class:`HttpProtocolError` when it does not speak
    HTTP."""

    async def request(
        self, method: str, path: str, body: bytes | None = None, *, timeout: float
    ) -> tuple[int, bytes]: ...

    async def close(self) -> None: ...


_RESPONSE_BATCH = TypeAdapter(list[GenerateResponse])


class EngineClient:
    """Async client of one engine. Use as ``async with EngineClient(url, max_connections=n)``.

    Args:
        base_url: ``http://host:port`` of the engine.
        max_connections: HTTP pool size; derive it with :func:`connection_pool_size`.
        timeout_seconds: default limit of one request (``rollout.llmTimeoutSeconds`` for
            generation; control calls pass their own).
        api_key: sent as a bearer token when the engine was started with ``--api-key``.
    """

    def __init__(
        self,
        base_url: str,
        *,
        max_connections: int,
        timeout_seconds: float = 600.0,
        api_key: str | None = None,
    ) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.base_url = base_url.rstrip("/")
        self.max_connections = max_connections
        self.timeout_seconds = timeout_seconds
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._transport: Transport | None = None
        # Label lookups take a lock and a dict probe: done once, not per call.
        self._in_flight = IN_FLIGHT.labels(engine=self.base_url)
        self._connections = CONNECTIONS.labels(engine=self.base_url)
        POOL_SIZE.labels(engine=self.base_url).set(max_connections)

    async def __aenter__(self) -> Self:
        self._ensure_transport()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _ensure_transport(self) -> Transport:
        if self._transport is None:
            self._transport = HttpPool(
                self.base_url, max_connections=self.max_connections, headers=self._headers
            )
        return self._transport

    async def close(self) -> None:
        """Close the pool (a later call opens a new one)."""
        if self._transport is not None:
            await self._transport.close()
            self._transport = None
            self._connections.set(0)

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        timeout: float | None = None,
    ) -> bytes:
        """One request; the body of a 2xx answer, else the error class the status calls for."""
        transport = self._ensure_transport()
        limit = timeout or self.timeout_seconds
        url = self.base_url + path
        self._in_flight.inc()
        try:
            status, data = await transport.request(method, path, body, timeout=limit)
        except TimeoutError as exc:
            raise EngineTimeout(f"{method} {url}: no answer within {limit:g}s", url=url) from exc
        except (OSError, HttpProtocolError) as exc:
            raise EngineUnavailable(
                f"{method} {url}: {type(exc).__name__}: {exc}", url=url
            ) from exc
        finally:
            self._in_flight.dec()
            if isinstance(transport, HttpPool):
                self._connections.set(transport.open_connections)
        if status >= 400:
            text = data[:200].decode(errors="replace")
            error = EngineUnavailable if status >= 500 else EngineRequestError
            raise error(f"{method} {url}: HTTP {status}: {text}", url=url, status=status)
        return data

    async def _request_json(
        self,
        method: str,
        path: str,
        *,
        json_body: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Any:
        body = None if json_body is None else json.dumps(json_body).encode()
        data = await self._request(method, path, body=body, timeout=timeout)
        try:
            return json.loads(data)
        except ValueError as exc:
            url = self.base_url + path
            raise EngineUnavailable(
                f"{method} {url}: response is not JSON: {data[:200]!r}", url=url
            ) from exc

    async def _request_text(
        self,
        method: str,
        path: str,
        *,
        json_body: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> str:
        body = None if json_body is None else json.dumps(json_body).encode()
        data = await self._request(method, path, body=body, timeout=timeout)
        return data.decode(errors="replace")

    # -- generation --------------------------------------------------------------------------

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: SamplingParams,
        *,
        rid: str | None = None,
        timeout: float | None = None,
    ) -> GenerateResponse:
        """``POST /generate`` with token ids, returning output ids and their logprobs."""
        # Built, not validated: the arguments are typed and ``sampling_params`` is a validated
        # model already, and re-validating every token id of a long trajectory on every turn
        # is O(trajectory) CPU per call (the engine checks the request anyway).
        request = GenerateRequest.model_construct(
            input_ids=list(input_ids), sampling_params=sampling_params, rid=rid
        )
        body = request.model_dump_json(exclude_none=True).encode()
        data = await self._request("POST", "/generate", body=body, timeout=timeout)
        try:
            if data.lstrip()[:1] == b"[":  # SGLang answers a batch with a list; we send one
                batch = _RESPONSE_BATCH.validate_json(data)
                if not batch:
                    raise ValueError("an empty batch")
                return batch[0]
            return GenerateResponse.model_validate_json(data)
        except (ValidationError, ValueError) as exc:
            url = self.base_url + "/generate"
            raise EngineUnavailable(
                f"POST {url}: not a /generate response: {exc}; body: {data[:200]!r}", url=url
            ) from exc

    # -- health and info ---------------------------------------------------------------------

    async def health(self, *, timeout: float = 10.0) -> bool:
        """``GET /health``: the server process answers (cheap; says nothing about the GPU)."""
        try:
            await self._request("GET", "/health", timeout=timeout)
        except EngineError:
            return False
        return True

    async def health_generate(self, *, timeout: float = 60.0) -> bool:
        """``GET /health_generate``: the engine can still generate a token (the deep probe)."""
        try:
            await self._request("GET", "/health_generate", timeout=timeout)
        except EngineError:
            return False
        return True

    async def get_model_info(self, *, timeout: float = 30.0) -> ModelInfo:
        """``GET /model_info``: model path, tokenizer, served weight version."""
        return ModelInfo.model_validate(
            await self._request_json("GET", MODEL_INFO_PATH, timeout=timeout)
        )

    async def metrics(self, *, timeout: float = 10.0) -> EngineMetrics:
        """``GET /metrics`` parsed into :class:`EngineMetrics`."""
        text = await self._request_text("GET", "/metrics", timeout=timeout)
        return parse_metrics(text)

    # -- weights -----------------------------------------------------------------------------

    async def update_weights_from_disk(
        self,
        model_path: str,
        *,
        weight_version: str | None = None,
        load_format: str | None = None,
        flush_cache: bool | None = None,
        timeout: float = 600.0,
    ) -> UpdateWeightsResult:
        """``POST /update_weights_from_disk``: load new weights from a path the engine sees.

        ``flush_cache=False`` while generation is paused in place: SGLang flushes after the
        load by default and asserts the flush worked, which it cannot while requests are held
        (its scheduler then dies)."""
        body: dict[str, Any] = {"model_path": model_path}
        if weight_version is not None:
            body["weight_version"] = weight_version
        if load_format is not None:
            body["load_format"] = load_format
        if flush_cache is not None:
            body["flush_cache"] = flush_cache
        result = UpdateWeightsResult.model_validate(
            await self._request_json(
                "POST", "/update_weights_from_disk", json_body=body, timeout=timeout
            )
        )
        return result

    async def init_weights_update_group(
        self,
        *,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str,
        timeout: float = 600.0,
    ) -> UpdateWeightsResult:
        """``POST /init_weights_update_group``: join the trainer's broadcast group."""
        body = {
            "master_address": master_address,
            "master_port": master_port,
            "rank_offset": rank_offset,
            "world_size": world_size,
            "group_name": group_name,
            "backend": backend,
        }
        return UpdateWeightsResult.model_validate(
            await self._request_json(
                "POST", "/init_weights_update_group", json_body=body, timeout=timeout
            )
        )

    async def update_weights_from_distributed(
        self,
        *,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str,
        weight_version: str | None = None,
        flush_cache: bool | None = None,
        timeout: float = 600.0,
    ) -> UpdateWeightsResult:
        """``POST /update_weights_from_distributed``: receive the named tensors by broadcast
        (``flush_cache`` as for :meth:`update_weights_from_disk`)."""
        body: dict[str, Any] = {
            "names": names,
            "dtypes": dtypes,
            "shapes": shapes,
            "group_name": group_name,
        }
        if weight_version is not None:
            body["weight_version"] = weight_version
        if flush_cache is not None:
            body["flush_cache"] = flush_cache
        return UpdateWeightsResult.model_validate(
            await self._request_json(
                "POST", "/update_weights_from_distributed", json_body=body, timeout=timeout
            )
        )

    async def flush_cache(self, *, timeout: float = 60.0) -> bool:
        """``POST /flush_cache``: drop the prefix cache (stale after a weight update). False
        when SGLang refuses because requests are queued or running (it answers 400 and keeps
        the cache; nothing is wrong with the engine)."""
        try:
            await self._request_text("POST", "/flush_cache", timeout=timeout)
        except EngineRequestError as exc:
            if exc.status == 400:
                return False
            raise
        return True

    async def pause_generation(
        self, *, mode: Literal["abort", "retract", "in_place"] = "retract", timeout: float = 60.0
    ) -> None:
        """``POST /pause_generation``: hold decoding while weights change."""
        await self._request_text(
            "POST", "/pause_generation", json_body={"mode": mode}, timeout=timeout
        )

    async def continue_generation(self, *, timeout: float = 60.0) -> None:
        """``POST /continue_generation``: resume after :meth:`pause_generation`."""
        await self._request_text("POST", "/continue_generation", json_body={}, timeout=timeout)

    async def wait_healthy(self, *, deadline_seconds: float, interval: float = 0.2) -> None:
        """Poll ``/health`` until it answers or ``deadline_seconds`` pass (then raise)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline_seconds
        while loop.time() < end:
            if await self.health(timeout=max(interval, 1.0)):
                return
            await asyncio.sleep(interval)
        raise EngineUnavailable(
            f"{self.base_url} not healthy within {deadline_seconds:g}s", url=self.base_url
        )
