"""Spreading LLM calls over engines: least outstanding requests, sticky per episode, failover.

An episode's turns share a growing prefix, so its calls should land on the engine that already
holds that prefix in its cache (*sticky*). A new episode goes to the ready engine with the fewest
outstanding requests (*least outstanding*; ties go to the lower index, so the choice is
deterministic). When a call fails with
:class:`~agentrl.engine_client.client.EngineUnavailable`, that engine is marked unready and
the call is placed on another one (*failover*); a health loop (:meth:`EnginePool.watch_health`)
marks engines ready again once ``/health`` answers.

Callers: :mod:`agentrl.rollout.agent` (every LLM call goes through :meth:`EnginePool.call`) and
the scheduler's owner, which runs the pool's health loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from agentrl.engine_client.client import EngineUnavailable, GenerateResponse, SamplingParams
from agentrl.rollout import metrics

logger = logging.getLogger(__name__)

T = TypeVar("T")


class GenerateEngine(Protocol):
    """What the pool needs of an engine:
    :class:`agentrl.engine_client.client.EngineClient` has it."""

    base_url: str

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: SamplingParams,
        *,
        rid: str | None = None,
        timeout: float | None = None,
    ) -> GenerateResponse: ...

    async def health(self, *, timeout: float = 10.0) -> bool: ...


class NoReadyEngine(EngineUnavailable):
    """Every engine is unready; the episode is an infra error (retried within its budget)."""


@dataclass
class _EngineState:
    engine: GenerateEngine
    index: int
    outstanding: int = 0
    ready: bool = True

    def __post_init__(self) -> None:
        # The labelled gauge child, looked up once (a lookup takes a lock on every call).
        self.outstanding_gauge = metrics.ENGINE_OUTSTANDING.labels(self.engine.base_url)


class EnginePool:
    """Ready engines, their outstanding requests and the episode → engine stickiness."""

    def __init__(self, engines: Sequence[GenerateEngine], *, wait_ready_seconds: float = 0.0):
        if not engines:
            raise ValueError("EnginePool needs at least one engine")
        self._states = [_EngineState(engine, i) for i, engine in enumerate(engines)]
        self._sticky: dict[str, int] = {}
        self._ready_changed = asyncio.Event()
        self.wait_ready_seconds = wait_ready_seconds
        """How long a call waits for some engine to become ready before it fails."""
        self._health: asyncio.Task[None] | None = None
        for state in self._states:
            metrics.ENGINE_READY.labels(state.engine.base_url).set(1)

    @property
    def engines(self) -> list[GenerateEngine]:
        return [s.engine for s in self._states]

    def outstanding(self) -> list[int]:
        """Outstanding requests per engine, in engine order."""
        return [s.outstanding for s in self._states]

    def ready(self) -> list[bool]:
        """Readiness per engine, in engine order."""
        return [s.ready for s in self._states]

    def set_ready(self, index: int, ready: bool) -> None:
        """Mark one engine ready or unready (health loop, failover, tests)."""
        state = self._states[index]
        if state.ready != ready:
            logger.warning(
                "engine %s is now %s", state.engine.base_url, "ready" if ready else "unready"
            )
        state.ready = ready
        metrics.ENGINE_READY.labels(state.engine.base_url).set(1 if ready else 0)
        if ready:
            self._ready_changed.set()

    def pick(self, episode_id: str) -> int:
        """The engine index for the episode's next call (sticky while its engine is ready)."""
        index = self._sticky.get(episode_id)
        if index is not None and self._states[index].ready:
            return index
        candidates = [s for s in self._states if s.ready]
        if not candidates:
            urls = ",".join(s.engine.base_url for s in self._states)
            raise NoReadyEngine("no ready engine", url=urls)
        chosen = min(candidates, key=lambda s: (s.outstanding, s.index))
        if index is not None:
            metrics.ENGINE_FAILOVERS.inc()
        self._sticky[episode_id] = chosen.index
        return chosen.index

    def release(self, episode_id: str) -> None:
        """Forget an episode's stickiness (it ended)."""
        self._sticky.pop(episode_id, None)

    async def _pick_waiting(self, episode_id: str) -> int:
        deadline = time.monotonic() + self.wait_ready_seconds
        while True:
            try:
                return self.pick(episode_id)
            except NoReadyEngine:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise
                self._ready_changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._ready_changed.wait(), remaining)

    async def call(
        self, episode_id: str, request: Callable[[GenerateEngine], Awaitable[T]]
    ) -> tuple[T, str]:
        """One LLM call for an episode: placed, counted, timed, failed over.

        ``request`` sends the call to the engine it is given. A call that fails with
        :class:`EngineUnavailable` marks its engine unready and is retried once on another ready
        engine (the failed request produced nothing, so nothing enters the trajectory twice); a
        second failure propagates and the episode becomes an infra error. Returns the result and
        the engine's URL.
        """
        tried: set[int] = set()
        while True:
            index = await self._pick_waiting(episode_id)
            state = self._states[index]
            state.outstanding += 1
            state.outstanding_gauge.set(state.outstanding)
            metrics.LLM_CALLS_IN_FLIGHT.inc()
            start = time.monotonic()
            try:
                result = await request(state.engine)
            except EngineUnavailable as exc:
                metrics.LLM_CALL_ERRORS.labels(type(exc).__name__).inc()
                self.set_ready(index, False)
                tried.add(index)
                if len(tried) >= 2 or not any(s.ready for s in self._states):
                    raise
                continue
            finally:
                state.outstanding -= 1
                state.outstanding_gauge.set(state.outstanding)
                metrics.LLM_CALLS_IN_FLIGHT.dec()
            metrics.LLM_CALL_SECONDS.observe(time.monotonic() - start)
            return result, state.engine.base_url

    async def generate(
        self,
        episode_id: str,
        input_ids: Sequence[int],
        sampling_params: SamplingParams,
        *,
        timeout: float | None = None,
    ) -> tuple[GenerateResponse, str]:
        """``/generate`` through :meth:`call`."""
        return await self.call(
            episode_id,
            lambda engine: engine.generate(input_ids, sampling_params, timeout=timeout),
        )

    async def check_health(self) -> None:
        """Probe every engine's ``/health`` once and update readiness."""
        results = await asyncio.gather(*(s.engine.health() for s in self._states))
        for state, ok in zip(self._states, results, strict=True):
            self.set_ready(state.index, ok)

    def start_health(self, interval_seconds: float) -> None:
        """Run :meth:`watch_health` in the background until :meth:`stop_health`."""
        if self._health is None:
            self._health = asyncio.get_running_loop().create_task(
                self.watch_health(interval_seconds)
            )

    async def stop_health(self) -> None:
        """Stop the background health loop, if one runs."""
        if self._health is not None:
            self._health.cancel()
            await asyncio.gather(self._health, return_exceptions=True)
            self._health = None

    async def watch_health(self, interval_seconds: float) -> None:
        """Probe forever (cancel to stop); the scheduler's owner runs this beside episodes."""
        while True:
            await asyncio.sleep(interval_seconds)
            await self.check_health()
