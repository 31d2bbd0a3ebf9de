"""Slot grants: how many episodes each rollout worker may run at once.

On a cluster the driver owns the job's in-effect concurrency ``C`` (the cap of live sandboxes)
but the rollout worker actors start episodes on their own: each holds a *grant* of slots and
starts a prefetched order the moment one of its episodes ends, without asking the driver
(:mod:`agentrl.rollout.ray_workers`). The driver keeps the cap by choosing the grants; this
module is that choice, pure, so it is tested with hand-computed cases.

What the driver knows of worker ``w`` is ``holding[w]``: the most episodes ``w`` may be running
now or later without a new grant — the larger of what ``w`` last reported running and every
grant ``w`` may be applying (sent and not yet acknowledged, or acknowledged). Reports are
stale, but only on the safe side: a worker over its grant starts nothing, so its count only
falls.

A grant ``g[w]`` lets ``w`` start an episode while it runs fewer than ``g[w]``. The grants are
safe when, for every worker that may start one (``g[w] > 0``)::

    g[w] + Σ_{v ≠ w} max(g[v], holding[v]) ≤ C

— a start on ``w`` leaves at most ``g[w]`` there, and every other worker holds at most the
larger of its grant and what it holds now. :func:`grant_slots` returns the safe grants closest
to each worker's even share of ``C`` (``shares``):

* ``Σ holding ≤ C``: workers at or over their share get their share (they start nothing until
  they are back under it); the others get what they hold plus an even part of the room left
  (``C − Σ holding``), up to their share. In steady state every worker gets its share.
* ``Σ holding > C`` (the concurrency was lowered under the episodes running): no episode may
  start until enough of them ended, so each worker gets ``C − Σ holding + holding[w]`` (at most
  its share, at least 0): a worker frees what the others hold too much before it refills. Nothing
  running is ever stopped; the grants rise again as the driver hears of the episodes that ended.

Callers: :class:`~agentrl.rollout.ray_workers.RemoteEpisodes` after every report, change of the
concurrency or lost worker.
"""

from __future__ import annotations

from collections.abc import Sequence


def shares(capacity: int, alive: Sequence[bool]) -> list[int]:
    """Each worker's even share of ``capacity`` over the live ones (the remainder to the first
    live workers; a dead worker's share is 0), adding up to exactly ``capacity``."""
    live = [i for i, up in enumerate(alive) if up]
    out = [0] * len(alive)
    for rank, index in enumerate(live):
        out[index] = capacity // len(live) + (1 if rank < capacity % len(live) else 0)
    return out


def grant_slots(capacity: int, shares: Sequence[int], holding: Sequence[int]) -> list[int]:
    """The safe grant of each worker closest to its share (see the module's docstring)."""
    if len(shares) != len(holding):
        raise ValueError(f"{len(shares)} shares for {len(holding)} workers")
    if capacity < 0 or any(h < 0 for h in holding) or any(s < 0 for s in shares):
        raise ValueError("capacity, shares and holdings must be ≥ 0")
    held = sum(holding)
    if held >= capacity:
        return [max(0, min(s, capacity - held + h)) for s, h in zip(shares, holding, strict=True)]
    room = {w: s - h for w, (s, h) in enumerate(zip(shares, holding, strict=True)) if s > h}
    extra = water_fill(capacity - held, room)
    return [
        h + extra[w] if w in room else s
        for w, (s, h) in enumerate(zip(shares, holding, strict=True))
    ]


def water_fill(budget: int, room: dict[int, int]) -> dict[int, int]:
    """Split ``budget`` units over the keys of ``room``, none getting more than its room, as
    evenly as they allow (the smallest rooms fill first; a remainder too small to split goes one
    unit each to the lowest keys)."""
    give = dict.fromkeys(room, 0)
    open_ = sorted((k for k in room if room[k] > 0), key=lambda k: (room[k], k))
    while open_ and budget > 0:
        level = budget // len(open_)
        if level == 0:
            for key in sorted(open_)[:budget]:
                give[key] += 1
            break
        step = min(level, room[open_[0]] - give[open_[0]])
        for key in open_:
            give[key] += step
        budget -= step * len(open_)
        open_ = [k for k in open_ if give[k] < room[k]]
    return give
