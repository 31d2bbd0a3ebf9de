"""Slot grants keep the job's live episodes under the in-effect concurrency while each worker
refills on its own: hand-computed cases, and the safety rule checked by brute force."""

from __future__ import annotations

import random

import pytest

from agentrl.rollout.slots import grant_slots, shares, water_fill


@pytest.mark.parametrize(
    ("capacity", "alive", "expected"),
    [
        (10, [True, True], [5, 5]),
        (11, [True, True, True], [4, 4, 3]),
        (10, [True, False, True], [5, 0, 5]),
        (1, [True, True], [1, 0]),
        (0, [True, True], [0, 0]),
    ],
)
def test_shares_split_the_concurrency_evenly_over_the_live_workers(
    capacity: int, alive: list[bool], expected: list[int]
) -> None:
    assert shares(capacity, alive) == expected


@pytest.mark.parametrize(
    ("case", "capacity", "shares_", "holding", "expected"),
    [
        ("start: nothing held, every worker gets its share", 10, [5, 5], [0, 0], [5, 5]),
        ("steady state: each holds its share and keeps it", 10, [5, 5], [5, 5], [5, 5]),
        ("raised 10 -> 12: the shares at once", 12, [6, 6], [5, 5], [6, 6]),
        # 8 = 3 + 5 = 5 + 3: a start on either leaves the other's 5 and its own 3
        ("lowered 10 -> 8 under 10 running: 3 each", 8, [4, 4], [5, 5], [3, 3]),
        ("lowered 10 -> 4 under 10 running: nobody starts", 4, [2, 2], [5, 5], [0, 0]),
        # worker 0 drained to 3, worker 1 still 5: 0 may go back to 3, 1 refills below 4
        ("uneven drain, total at the cap", 8, [4, 4], [3, 5], [3, 4]),
        # one slot of room: worker 0 may take it (2 + 1 + 5 = 8)
        ("uneven drain, one slot of room", 8, [4, 4], [2, 5], [3, 4]),
        # worker 3 holds 7 of its 4: room 16 - 12 = 4 over deficits 1, 3, 3 -> one each (the
        # first is full), then the last unit to the lowest index
        ("room split evenly, smallest first", 16, [4, 4, 4, 4], [3, 1, 1, 7], [4, 3, 2, 4]),
        ("a dead worker holds nothing and gets nothing", 10, [5, 0, 5], [5, 0, 2], [5, 0, 5]),
    ],
)
def test_grants_by_hand(
    case: str, capacity: int, shares_: list[int], holding: list[int], expected: list[int]
) -> None:
    assert grant_slots(capacity, shares_, holding) == expected, case


def test_water_fill_fills_the_smallest_rooms_first_and_never_overfills() -> None:
    assert water_fill(10, {0: 2, 1: 5, 2: 5}) == {0: 2, 1: 4, 2: 4}
    assert water_fill(3, {0: 5, 1: 5}) == {0: 2, 1: 1}
    assert water_fill(100, {0: 1, 1: 0}) == {0: 1, 1: 0}
    assert water_fill(0, {0: 3}) == {0: 0}


def _worst_case_after_a_start(w: int, grants: list[int], holding: list[int]) -> int:
    """Live episodes when worker ``w`` starts one while every other worker holds the most it
    can: its grant or what it holds already, whichever is larger."""
    others = [max(g, h) for v, (g, h) in enumerate(zip(grants, holding, strict=True)) if v != w]
    return grants[w] + sum(others)


def test_no_grant_ever_lets_a_start_exceed_the_capacity() -> None:
    rng = random.Random(21)
    for _ in range(5000):
        workers = rng.randint(1, 6)
        capacity = rng.randint(0, 40)
        alive = [rng.random() < 0.9 for _ in range(workers)]
        if not any(alive):
            continue
        share = shares(capacity, alive)
        # what each may hold: anything up to twice an old, larger concurrency
        holding = [rng.randint(0, 2 * (capacity // workers + 5)) if a else 0 for a in alive]
        grants = grant_slots(capacity, share, holding)
        for w in range(workers):
            assert 0 <= grants[w] <= share[w]
            if grants[w] > 0:
                assert _worst_case_after_a_start(w, grants, holding) <= capacity, (
                    capacity,
                    share,
                    holding,
                    grants,
                )
        if sum(holding) <= capacity and all(h <= s for h, s in zip(holding, share, strict=True)):
            assert grants == share  # nobody over its share: nothing to hold back


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="shares"):
        grant_slots(4, [2, 2], [0])
    with pytest.raises(ValueError, match="≥ 0"):
        grant_slots(-1, [0], [0])
