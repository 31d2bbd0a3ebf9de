"""A work queue of job keys, as controller-runtime has it: a key queued twice is reconciled
once, a key being reconciled is not handed to a second worker (it is queued again for after),
and keys can be added with a delay (requeue-after, retry backoff).

Its depth is exported (``agentrl_operator_queue_depth``): the queue has no hidden cap, and the
number of workers draining it is a setting.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Key:
    """A job's namespace and name."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class WorkQueue:
    """Coalescing queue with delayed adds; safe for many producers and workers in one loop."""

    def __init__(self) -> None:
        self._ready: list[Key] = []
        self._queued: set[Key] = set()
        self._active: set[Key] = set()
        self._dirty: set[Key] = set()  # added while active: requeue when done
        self._delayed: list[tuple[float, int, Key]] = []
        self._counter = itertools.count()
        self._wakeup = asyncio.Event()
        self._closed = False

    def __len__(self) -> int:
        return len(self._ready) + len(self._delayed)

    def add(self, key: Key, *, after: float = 0.0) -> None:
        """Queue ``key`` now, or after ``after`` seconds."""
        if self._closed:
            return
        if after > 0:
            heapq.heappush(self._delayed, (time.monotonic() + after, next(self._counter), key))
            self._wakeup.set()
            return
        if key in self._active:
            self._dirty.add(key)
            return
        if key not in self._queued:
            self._queued.add(key)
            self._ready.append(key)
            self._wakeup.set()

    def _promote_due(self) -> float | None:
        now = time.monotonic()
        while self._delayed and self._delayed[0][0] <= now:
            _, _, key = heapq.heappop(self._delayed)
            self.add(key)
        return self._delayed[0][0] - now if self._delayed else None

    async def get(self) -> Key | None:
        """The next key to reconcile (None once closed); call :meth:`done` after."""
        while not self._closed:
            wait = self._promote_due()
            if self._ready:
                key = self._ready.pop(0)
                self._queued.discard(key)
                self._active.add(key)
                return key
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout=wait)
        return None

    def done(self, key: Key) -> None:
        """Mark ``key`` finished; a key added meanwhile is queued again."""
        self._active.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def close(self) -> None:
        self._closed = True
        self._wakeup.set()
