"""Which groups make a step, with which advantages, carrying loss or not."""

from __future__ import annotations

import pytest

from agentrl.api.rollout import TerminalClass
from agentrl.api.trainer import Algorithm, ZeroVariancePolicy
from agentrl.trainer.batching import select_step
from agentrl.trainer.buffer import GroupBuffer
from tests.trainer.factories import make_trajectory


def _buffer(*groups: list) -> GroupBuffer:  # type: ignore[type-arg]
    size = len(groups[0])
    buffer = GroupBuffer(size)
    for now, group in enumerate(groups):
        for t in group:
            buffer.add(t, now=float(now))
    return buffer


def test_a_group_completes_when_group_size_trajectories_arrived() -> None:
    buffer = GroupBuffer(2)
    assert buffer.add(make_trajectory("a#0", 1.0, n=0), now=0.0) is None
    completed = buffer.add(make_trajectory("a#0", 0.0, n=1), now=1.0)
    assert completed is not None and completed.complete
    assert [g.group_id for g in buffer.ready()] == ["a#0"]


def test_infra_errors_are_left_out_of_the_group_statistics_and_the_step() -> None:
    group = [
        make_trajectory("a#0", 1.0, n=0),
        make_trajectory("a#0", 0.0, n=1),
        make_trajectory("a#0", 0.0, n=2),
        make_trajectory("a#0", None, terminal=TerminalClass.INFRA_ERROR, n=3),
    ]
    sel = select_step(_buffer(group).ready(), trajectories_per_step=3, algorithm=Algorithm())
    assert sel is not None
    assert all(s.trajectory.terminal_class != TerminalClass.INFRA_ERROR for s in sel.samples)
    # rewards [1, 0, 0]: mean 1/3, sample std sqrt((4/9 + 1/9 + 1/9) / 2) = 0.57735
    assert [s.advantage for s in sel.samples] == pytest.approx(
        [1.1547, -0.57735, -0.57735], abs=1e-4
    )


def test_agent_timeouts_count_in_the_statistics_but_carry_no_loss() -> None:
    group = [
        make_trajectory("a#0", 1.0, n=0),
        make_trajectory("a#0", 0.0, terminal=TerminalClass.AGENT_TIMEOUT, n=1),
    ]
    sel = select_step(_buffer(group).ready(), trajectories_per_step=2, algorithm=Algorithm())
    assert sel is not None
    assert [s.carries_loss for s in sel.samples] == [True, False]
    # two members [1, 0]: ±0.5 / 0.70711
    assert [s.advantage for s in sel.samples] == pytest.approx([0.70711, -0.70711], abs=1e-4)


def test_drop_and_refill_leaves_flat_groups_out_and_fills_the_step_with_later_ones() -> None:
    flat = [make_trajectory("a#0", 0.0, n=i) for i in range(2)]
    useful = [make_trajectory("b#1", float(i), n=i) for i in range(2)]
    algo = Algorithm(zero_variance_groups=ZeroVariancePolicy.DROP_AND_REFILL)
    sel = select_step(_buffer(flat, useful).ready(), trajectories_per_step=2, algorithm=algo)
    assert sel is not None
    assert [g.group_id for g in sel.dropped] == ["a#0"]
    assert [g.group_id for g in sel.taken] == ["b#1"]
    assert sel.zero_variance == 1


def test_a_flat_group_alone_is_dropped_without_a_step() -> None:
    flat = [make_trajectory("a#0", 0.0, n=i) for i in range(2)]
    algo = Algorithm(zero_variance_groups=ZeroVariancePolicy.DROP_AND_REFILL)
    sel = select_step(_buffer(flat).ready(), trajectories_per_step=2, algorithm=algo)
    assert sel is not None and sel.samples == [] and len(sel.dropped) == 1


def test_mask_keeps_flat_groups_in_the_step_without_loss() -> None:
    flat = [make_trajectory("a#0", 1.0, n=i) for i in range(2)]
    algo = Algorithm(zero_variance_groups=ZeroVariancePolicy.MASK)
    sel = select_step(_buffer(flat).ready(), trajectories_per_step=2, algorithm=algo)
    assert sel is not None
    assert [s.carries_loss for s in sel.samples] == [False, False]
    assert [s.advantage for s in sel.samples] == [0.0, 0.0]


def test_keep_trains_flat_groups_with_zero_advantage() -> None:
    flat = [make_trajectory("a#0", 1.0, n=i) for i in range(2)]
    algo = Algorithm(zero_variance_groups=ZeroVariancePolicy.KEEP)
    sel = select_step(_buffer(flat).ready(), trajectories_per_step=2, algorithm=algo)
    assert sel is not None
    assert [s.carries_loss for s in sel.samples] == [True, True]


def test_the_step_waits_while_complete_groups_hold_too_few_trajectories() -> None:
    one = [make_trajectory("a#0", float(i), n=i) for i in range(2)]
    assert select_step(_buffer(one).ready(), trajectories_per_step=4, algorithm=Algorithm()) is None


def test_groups_enter_the_step_in_completion_order_and_stop_when_full() -> None:
    groups = [[make_trajectory(f"t{k}#{k}", float(i), n=i) for i in range(2)] for k in range(3)]
    sel = select_step(_buffer(*groups).ready(), trajectories_per_step=4, algorithm=Algorithm())
    assert sel is not None
    assert [g.group_id for g in sel.taken] == ["t0#0", "t1#1"]
