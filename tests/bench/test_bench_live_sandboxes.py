"""The rollout bench counts live sandboxes over the whole job from the logs of every process of
its fake sandbox service; here a hand-made log with hand-counted answers."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench" / "rollout_concurrency.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rollout_concurrency_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# process A: sandboxes [1, 3], [2, 6], [5, 7]; process B: [1.5, 4.5], [4, 8]
LOGS = [
    {"creates": [1.0, 2.0, 5.0], "closes": [3.0, 6.0, 7.0]},
    {"creates": [1.5, 4.0], "closes": [4.5, 8.0]},
]


def test_live_sandboxes_are_counted_across_the_processes_of_the_service() -> None:
    # live over time: 1 2 3 | 2 | 3 | 2 | 3 | 2 1 0 (at 1, 1.5, 2, 3, 4, 4.5, 5, 6, 7, 8)
    live = _bench().live_sandboxes(LOGS, target=3)
    assert live["max_live"] == 3
    assert (live["creates"], live["closes"]) == (5, 5)
    assert live["first_create_at"] == 1.0
    assert live["target_at"] == 2.0
    assert live["marks"] == []


def test_each_change_of_the_concurrency_is_followed_to_its_figure() -> None:
    live = _bench().live_sandboxes(LOGS, target=3, marks=[(5.5, 4), (2.5, 2), (9.0, 1)])
    down, up, late = live["marks"]
    # at 2.5 three are live: down to 2, reached at 3.0; the creates at 4 and 5 each found 2
    # live (over the cap), and 3 was the most live after reaching it, until the next change
    assert down == {
        "at": 2.5,
        "cap": 2,
        "live_at_mark": 3,
        "direction": "down",
        "reached_at": 3.0,
        "max_live_after_reached": 3,
        "creates_at_or_over_cap": 2,
    }
    # at 5.5 three are live: up to 4, never reached (everything ends)
    assert (up["live_at_mark"], up["direction"], up["reached_at"]) == (3, "up", None)
    assert up["creates_at_or_over_cap"] == 0
    # after the last close: nothing live
    assert (late["live_at_mark"], late["direction"], late["reached_at"]) == (0, "up", None)
