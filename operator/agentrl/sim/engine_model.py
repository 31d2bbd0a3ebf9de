"""One SGLang engine as a processor-sharing decoder with a finite KV pool.

Every running request advances one token per decode step, and a step costs
``overhead + per_sequence × running + kv_read × resident KV tokens``: small batches decode fast,
long contexts slow every request on the engine. Progress is kept in *virtual tokens* (``v``:
tokens each running request has decoded since the engine started), so a request admitted at
``v0`` needing ``k`` tokens finishes when ``v`` reaches ``v0 + k``; finishing times sit in a heap
and nothing is updated per token.

KV pressure follows SGLang: a request is admitted only when its context fits the free pool,
and when growing generations fill the pool the request with the fewest decoded tokens is
retracted to the head of the queue (its KV freed, its progress kept as prompt). A runaway
generation therefore holds its KV while the requests behind it queue, which is the stall the
report describes.

Used by ``agentrl.sim.simulation`` only; it holds no clock of its own (the caller passes time).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any

WAITING, RUNNING, DONE, CANCELLED = range(4)
_seq = itertools.count()


@dataclass(eq=False, slots=True)
class Request:
    """One LLM call inside an engine."""

    owner: Any
    """The episode that made the call (opaque to the engine)."""
    ctx: float
    """KV tokens the request holds when admitted (prompt plus history)."""
    need: float
    """Tokens still to decode."""
    submitted: float
    """When it reached the engine (s)."""
    runaway: bool = False
    """Whether this generation never stops by itself (for statistics)."""
    state: int = WAITING
    v0: float = 0.0
    token: int = 0
    admitted: float = -1.0


@dataclass(slots=True)
class EngineStats:
    """Integrals and peaks over the measurement window."""

    busy_seconds: float = 0.0
    running_seconds: float = 0.0
    queued_seconds: float = 0.0
    kv_token_seconds: float = 0.0
    window_seconds: float = 0.0
    kv_peak: float = 0.0
    queue_peak: int = 0
    retractions: int = 0
    timeouts: int = 0
    queue_wait_total: float = 0.0
    admitted: int = 0
    runaways_resident_at_first_stall: int | None = None


@dataclass(eq=False)
class Engine:
    """A decoder with ``pool`` KV tokens and at most ``max_running`` requests."""

    index: int
    pool: float
    max_running: int
    overhead_s: float
    per_seq_s: float
    kv_s_per_token: float
    reserve: float
    refresh_s: float
    t: float = 0.0
    v: float = 0.0
    n: int = 0
    sum_ctx: float = 0.0
    sum_v0: float = 0.0
    paused: bool = False
    version: int = 0
    measuring: bool = False
    queue: deque[Request] = field(default_factory=deque)
    running: set[Request] = field(default_factory=set)
    heap: list[tuple[float, int, Request, int]] = field(default_factory=list)
    stats: EngineStats = field(default_factory=EngineStats)
    _step: float = 0.0

    # ------------------------------------------------------------------ state

    def kv_used(self) -> float:
        """KV tokens resident now (contexts plus what running requests decoded)."""
        return self.sum_ctx + self.n * self.v - self.sum_v0

    def step_seconds(self) -> float:
        """Duration of one decode step at the current batch and KV."""
        return self.overhead_s + self.per_seq_s * self.n + self.kv_s_per_token * self.kv_used()

    def advance(self, now: float) -> None:
        """Move the engine's progress and statistics to ``now``."""
        dt = now - self.t
        if dt <= 0:
            return
        if self.measuring:
            s = self.stats
            s.window_seconds += dt
            s.running_seconds += self.n * dt
            s.queued_seconds += len(self.queue) * dt
            if self.n:
                s.busy_seconds += dt
            s.kv_token_seconds += self.kv_used() * dt
        if self.n and not self.paused and self._step > 0:
            self.v += dt / self._step
        self.t = now
        if self.measuring:
            self.stats.kv_peak = max(self.stats.kv_peak, self.kv_used() / self.pool)

    # ------------------------------------------------------------------ requests

    def submit(self, req: Request, now: float) -> list[Request]:
        """A request arrives; returns requests that finished while catching up (none)."""
        self.advance(now)
        req.state = WAITING
        self.queue.append(req)
        if self.measuring:
            self.stats.queue_peak = max(self.stats.queue_peak, len(self.queue))
        return []

    def _admit(self, now: float) -> None:
        while self.queue and self.n < self.max_running:
            req = self.queue[0]
            if req.state == CANCELLED:
                self.queue.popleft()
                continue
            free = self.pool - self.kv_used()
            if req.ctx + self.reserve > free and self.n > 0:
                self._note_stall()
                break
            self.queue.popleft()
            req.state = RUNNING
            req.v0 = self.v
            req.token += 1
            if req.admitted < 0:
                req.admitted = now
                if self.measuring:
                    self.stats.queue_wait_total += now - req.submitted
                    self.stats.admitted += 1
            self.running.add(req)
            self.n += 1
            self.sum_ctx += req.ctx
            self.sum_v0 += self.v
            heapq.heappush(self.heap, (self.v + req.need, next(_seq), req, req.token))

    def _note_stall(self) -> None:
        # The first time a queued request cannot get KV: record how many runaway generations
        # hold the pool (the report's "about 10 of them filled the cache").
        if self.stats.runaways_resident_at_first_stall is None:
            self.stats.runaways_resident_at_first_stall = sum(1 for r in self.running if r.runaway)

    def _remove(self, req: Request) -> None:
        self.running.discard(req)
        self.n -= 1
        self.sum_ctx -= req.ctx
        self.sum_v0 -= req.v0

    def cancel(self, req: Request, now: float) -> None:
        """The client gave up on ``req`` (LLM timeout): free its KV or its queue place."""
        self.advance(now)
        if req.state == RUNNING:
            self._remove(req)
        req.state = CANCELLED
        if self.measuring:
            self.stats.timeouts += 1

    def _retract_one(self) -> None:
        # SGLang retracts the request that decoded least: it loses the least work.
        victim = max(self.running, key=lambda r: r.v0)
        decoded = self.v - victim.v0
        self._remove(victim)
        victim.ctx += decoded
        victim.need -= decoded
        victim.state = WAITING
        self.queue.appendleft(victim)
        if self.measuring:
            self.stats.retractions += 1

    def process(self, now: float) -> list[Request]:
        """Catch up to ``now``: finish, retract and admit; returns the finished requests."""
        self.advance(now)
        done: list[Request] = []
        eps = 1e-6
        while self.heap and self.heap[0][0] <= self.v + eps:
            _, _, req, token = heapq.heappop(self.heap)
            if req.state != RUNNING or token != req.token:
                continue
            self._remove(req)
            req.state = DONE
            done.append(req)
        while self.n > 1 and self.kv_used() > self.pool + eps:
            self._retract_one()
        self._admit(now)
        return done

    def next_event(self, now: float) -> float | None:
        """When this engine next needs ``process`` (a finish, a full pool, or a refresh)."""
        while self.heap and (self.heap[0][2].state != RUNNING
                             or self.heap[0][3] != self.heap[0][2].token):
            heapq.heappop(self.heap)
        if self.paused or self.n == 0:
            return None
        self._step = self.step_seconds()
        t_next = now + self.refresh_s
        if self.heap:
            t_next = min(t_next, now + (self.heap[0][0] - self.v) * self._step)
        if self.n > 1:
            v_full = (self.pool - self.sum_ctx + self.sum_v0) / self.n
            if v_full > self.v:
                t_next = min(t_next, now + (v_full - self.v) * self._step)
        return max(t_next, now)

    def expired(self, now: float, timeout: float) -> list[Request]:
        """Requests waiting or running for longer than ``timeout``."""
        old = [r for r in self.queue if r.state == WAITING and now - r.submitted > timeout]
        old += [r for r in self.running if now - r.submitted > timeout]
        return old
