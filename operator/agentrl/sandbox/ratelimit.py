"""A token bucket that paces sandbox creations (``spec.sandbox.maxCreatesPerSecond``, or the E2B
plan's ``maxCreatesPerSecond``).

It protects the API server or the provider's quota; the rate is a spec field and exported as
``agentrl_sandbox_create_rate_limit_per_second``. Waiting callers are served first come, first
served (an asyncio lock), so a burst of episodes starts evenly instead of stampeding.

Callers: the kubernetes and e2b providers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved up."""

    def __init__(
        self,
        rate: float,
        burst: float | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = rate
        self.burst = burst if burst is not None else max(1.0, rate)
        self._tokens = self.burst
        self._clock = clock
        self._sleep = sleep
        self._updated = clock()
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate)
        self._updated = now

    async def acquire(self) -> float:
        """Take one token, waiting as long as needed; returns the seconds waited."""
        waited = 0.0
        async with self._lock:
            self._refill()
            while self._tokens < 1.0:
                delay = (1.0 - self._tokens) / self.rate
                await self._sleep(delay)
                waited += delay
                self._refill()
            self._tokens -= 1.0
        return waited
