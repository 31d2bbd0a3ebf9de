"""Several optimizer updates per step (``algorithm.miniBatches``, ``epochs``): the first update is
on-policy (ratio exactly 1, nothing clipped), later ones are off-policy with respect to the old
logprobs recomputed before the step, and the clip fraction reported is the share of tokens whose
clipped term won, worked out here from logprobs computed outside the backend."""

from __future__ import annotations

import copy

import pytest
import torch

from agentrl.api.trainer import TrainerSpec
from agentrl.tiny import policy as tiny
from agentrl.trainer.batching import TrainSample, generated_spans, minibatch_bounds
from agentrl.trainer.megatron_backend import shard_minibatches
from agentrl.trainer.torch_backend import TorchBackend
from tests.trainer.factories import make_trajectory

CLIP_LOW, CLIP_HIGH = 0.2, 0.28


def _spec(mini_batches: int, epochs: int = 1) -> TrainerSpec:
    return TrainerSpec(
        backend="torch",
        gpus_per_node=0,
        trajectories_per_step=4,
        optimizer={"lr": 0.3, "weight_decay": 0.0},  # large: one update moves ratios past the clip
        algorithm={
            "miniBatches": mini_batches,
            "epochs": epochs,
            "clipLow": CLIP_LOW,
            "clipHigh": CLIP_HIGH,
            "klCoef": 0.0,
            "offPolicyCorrection": {"mode": "none"},
        },
    )


def _samples() -> list[TrainSample]:
    """Four trajectories of a prompt token and eight generated ones, advantages ±1."""
    out = []
    for n, adv in enumerate([1.0, -1.0, 1.0, -1.0]):
        ids = [2, *[5 + (7 * n + 3 * j) % 40 for j in range(8)]]
        t = make_trajectory(
            "g#0", 1.0 if adv > 0 else 0.0, n=n, tokens=(ids, [0.0] * 9, [0] + [1] * 8)
        )
        out.append(TrainSample(trajectory=t, advantage=adv, carries_loss=True))
    return out


def _items(samples: list[TrainSample]) -> list[tuple[list[int], list[tuple[int, int]]]]:
    return [(s.trajectory.token_ids, generated_spans(s.trajectory.loss_mask)) for s in samples]


def _clipped_share(ratio: torch.Tensor, advantages: torch.Tensor) -> float:
    """Tokens whose clipped term is the PPO minimum: ratio above 1 + ε_high with a positive
    advantage, or below 1 − ε_low with a negative one."""
    above = (ratio > 1 + CLIP_HIGH) & (advantages > 0)
    below = (ratio < 1 - CLIP_LOW) & (advantages < 0)
    return float((above | below).double().mean())


@pytest.mark.parametrize(
    ("n", "count", "expected"),
    [
        (4, 1, [(0, 4)]),
        (4, 2, [(0, 2), (2, 4)]),
        (10, 3, [(0, 4), (4, 7), (7, 10)]),
        (5, 5, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]),
    ],
)
def test_mini_batches_are_whole_trajectories_in_order_sizes_within_one(
    n: int, count: int, expected: list[tuple[int, int]]
) -> None:
    assert minibatch_bounds(n, count) == expected


def test_more_mini_batches_than_trajectories_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot split 3 trajectories into 4"):
        minibatch_bounds(3, 4)


def test_each_mini_batch_is_dealt_round_robin_over_data_parallel_ranks() -> None:
    # 8 trajectories, 2 mini-batches of 4, 2 ranks: rank 1 gets positions 1, 3 then 5, 7
    assert shard_minibatches(8, mini_batches=2, dp_rank=1, dp_size=2) == [[1, 3], [5, 7]]
    with pytest.raises(ValueError, match="cannot feed 4 data-parallel ranks"):
        shard_minibatches(8, mini_batches=4, dp_rank=0, dp_size=4)


def test_two_mini_batches_make_the_second_update_off_policy_and_its_clips_are_counted() -> None:
    start = tiny.new_policy(0, dim=16)
    samples = _samples()
    backend = TorchBackend(copy.deepcopy(start), _spec(mini_batches=2), temperature=1.0)
    stats = backend.train_step(samples)

    assert len(stats.updates) == 2
    first, second = stats.updates
    # The first update's policy is the one that recomputed the old logprobs.
    assert first.clip_fraction == 0.0
    assert first.ratio_min == first.ratio_max == 1.0

    # The weights the second update starts from: one update on the first mini-batch alone
    # (the same loss on the same trajectories, from the same start, with a fresh AdamW).
    after_first = TorchBackend(copy.deepcopy(start), _spec(mini_batches=1), temperature=1.0)
    after_first.train_step(samples[:2])
    with torch.no_grad():
        old = torch.cat(tiny.batch_logprobs(start, _items(samples[2:])))
        new = torch.cat(tiny.batch_logprobs(after_first.model, _items(samples[2:])))
    ratio = torch.exp(new - old)
    advantages = torch.tensor([s.advantage for s in samples[2:] for _ in range(8)])
    expected = _clipped_share(ratio, advantages)

    assert float((ratio - 1).abs().max()) > 0.05  # off-policy: the ratio moved
    assert 0.0 < expected < 1.0  # the case exercises both clipped and unclipped tokens
    assert second.clip_fraction == pytest.approx(expected)
    assert second.ratio_min == pytest.approx(float(ratio.min()), rel=1e-5)
    assert second.ratio_max == pytest.approx(float(ratio.max()), rel=1e-5)
    # The step's figure weighs both updates by their loss tokens (8 + 8 of each: 16 and 16).
    assert stats.loss_stats.clip_fraction == pytest.approx(expected / 2)
    assert stats.loss_stats.tokens == 32


def test_a_second_epoch_revisits_the_batch_off_policy() -> None:
    start = tiny.new_policy(0, dim=16)
    samples = _samples()
    backend = TorchBackend(copy.deepcopy(start), _spec(mini_batches=1, epochs=2), temperature=1.0)
    stats = backend.train_step(samples)

    assert len(stats.updates) == 2
    assert stats.updates[0].ratio_min == stats.updates[0].ratio_max == 1.0
    # The second pass starts from the weights one update on the whole batch gives.
    once = TorchBackend(copy.deepcopy(start), _spec(mini_batches=1), temperature=1.0)
    once.train_step(samples)
    with torch.no_grad():
        old = torch.cat(tiny.batch_logprobs(start, _items(samples)))
        new = torch.cat(tiny.batch_logprobs(once.model, _items(samples)))
    ratio = torch.exp(new - old)
    advantages = torch.tensor([s.advantage for s in samples for _ in range(8)])
    assert stats.updates[1].clip_fraction == pytest.approx(_clipped_share(ratio, advantages))
    assert stats.updates[1].ratio_max == pytest.approx(float(ratio.max()), rel=1e-5)
    # The step's tokens are counted once, not once per pass.
    assert stats.loss_stats.tokens == 32


def test_one_mini_batch_and_one_epoch_is_a_single_on_policy_update() -> None:
    backend = TorchBackend(tiny.new_policy(0, dim=16), _spec(mini_batches=1), temperature=1.0)
    stats = backend.train_step(_samples())
    assert len(stats.updates) == 1
    assert stats.loss_stats.clip_fraction == 0.0
    assert stats.loss_stats.ratio_min == stats.loss_stats.ratio_max == 1.0
