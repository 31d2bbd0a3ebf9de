"""The work queue: coalescing, one worker per key, delayed adds."""

from __future__ import annotations

import asyncio

from agentrl.controller.workqueue import Key, WorkQueue

A, B = Key("ns", "a"), Key("ns", "b")


async def test_a_key_added_twice_is_handed_out_once() -> None:
    q = WorkQueue()
    q.add(A)
    q.add(A)
    q.add(B)
    assert await q.get() == A
    assert await q.get() == B
    assert len(q) == 0


async def test_a_key_added_while_being_reconciled_comes_back_after_done() -> None:
    q = WorkQueue()
    q.add(A)
    key = await q.get()
    q.add(A)  # an event arrives during the reconcile
    assert len(q) == 0  # not handed to a second worker
    q.done(key)  # type: ignore[arg-type]
    assert await asyncio.wait_for(q.get(), 1) == A


async def test_a_delayed_key_arrives_after_its_delay() -> None:
    q = WorkQueue()
    q.add(A, after=0.2)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await asyncio.wait_for(q.get(), 2) == A
    assert loop.time() - started >= 0.19


async def test_close_releases_waiting_workers() -> None:
    q = WorkQueue()
    waiter = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    q.close()
    assert await asyncio.wait_for(waiter, 1) is None
