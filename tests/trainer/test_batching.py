"""Which groups make a step, with which advantages, carrying loss or not; and the tokens of a
step's samples both backends score (:func:`~agentrl.trainer.batching.token_sequences`,
:func:`~agentrl.trainer.batching.flatten`)."""

from __future__ import annotations

import pytest

from agentrl.api.rollout import TerminalClass
from agentrl.api.trainer import Algorithm, ZeroVariancePolicy
from agentrl.trainer.batching import (
    TrainSample,
    flatten,
    generated_spans,
    select_step,
    token_sequences,
)
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


def _two_samples() -> list[TrainSample]:
    # Prompt, a generated turn, a tool reply, a generated turn: scored tokens at 1-2 and 4.
    first = make_trajectory(
        "a#0", 1.0, tokens=([7, 8, 9, 6, 5], [0.0, -0.1, -0.2, 0.0, -0.4], [0, 1, 1, 0, 1])
    )
    second = make_trajectory("a#0", 0.0, n=1, tokens=([7, 3, 4], [0.0, -0.5, -0.6], [0, 1, 1]))
    return [
        TrainSample(trajectory=first, advantage=0.5, carries_loss=True),
        TrainSample(trajectory=second, advantage=-0.5, carries_loss=False),
    ]


def test_token_sequences_keep_the_generated_runs_and_their_engine_logprobs() -> None:
    seqs = token_sequences(_two_samples())
    assert [s.index for s in seqs] == [0, 1]
    assert [s.spans for s in seqs] == [[(1, 3), (4, 5)], [(1, 3)]]
    assert [s.positions for s in seqs] == [[1, 2, 4], [1, 2]]
    assert [s.engine_logprobs for s in seqs] == [[-0.1, -0.2, -0.4], [-0.5, -0.6]]
    assert seqs[0].token_ids == [7, 8, 9, 6, 5]


def test_flatten_lays_out_one_entry_per_scored_token_trajectory_after_trajectory() -> None:
    flat = flatten(token_sequences(_two_samples()))
    assert flat.engine_logprobs == [-0.1, -0.2, -0.4, -0.5, -0.6]
    assert flat.advantages == [0.5, 0.5, 0.5, -0.5, -0.5]
    assert flat.mask == [1.0, 1.0, 1.0, 0.0, 0.0]  # the second carries no loss
    assert flat.seq_index == [0, 0, 0, 1, 1]


def test_a_gpt_scores_no_token_at_position_zero_the_tiny_policy_does() -> None:
    # The tiny policy predicts token 0 from its BOS input; a GPT fed the trajectory as it is
    # predicts token j from the logits at j − 1, so it starts at position 1.
    assert generated_spans([1, 1, 0, 1]) == [(0, 2), (3, 4)]
    assert generated_spans([1, 1, 0, 1], start=1) == [(1, 2), (3, 4)]
    t = make_trajectory("a#0", 1.0, tokens=([4, 5, 6], [-0.3, -0.2, -0.1], [1, 1, 1]))
    sample = TrainSample(trajectory=t, advantage=1.0, carries_loss=True)
    assert token_sequences([sample])[0].positions == [0, 1, 2]
    gpt = token_sequences([sample], first_position=1)[0]
    assert gpt.positions == [1, 2]
    assert gpt.engine_logprobs == [-0.2, -0.1]
