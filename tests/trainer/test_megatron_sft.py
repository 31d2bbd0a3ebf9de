"""The megatron backend's warm start, the parts that need neither megatron-core nor a GPU: a packed
warm-start batch as the backend's sequences (:mod:`agentrl.trainer.megatron_sft`), their share per
data-parallel rank, the optimizer's learning rate and Adam moments between the warm start and RL
(on torch's own AdamW, which megatron's optimizer wraps), and the driver's
:class:`~agentrl.trainer.ranks.RemoteBackend` handing ``sft_step`` and ``finish_warm_start`` to
rank 0.

Expected values are worked out by hand from the batches written here, or come from a fresh torch
AdamW (what "fresh moments" means)."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl.trainer.megatron_backend import packed_row
from agentrl.trainer.megatron_sft import (
    data_parallel_share,
    inner_optimizers,
    learning_rates,
    reset_adam_moments,
    set_learning_rate,
    sft_sequences,
    trained_tokens,
)
from agentrl.trainer.ranks import RemoteBackend, TrainerRank
from agentrl.trainer.sft_batches import SFTBatch
from agentrl.trainer.torch_backend import SFTStats

#: Three conversations back to back: A (5 tokens, trained on 12 and 13), B (4 tokens, trained on
#: 21 and 23: two assistant turns), C (3 tokens, nothing trained: a prompt alone).
BATCH = SFTBatch(
    token_ids=[10, 11, 12, 13, 14, 20, 21, 22, 23, 30, 31, 32],
    loss_mask=[0, 0, 1, 1, 0, 0, 1, 0, 1, 0, 0, 0],
    cu_seqlens=[0, 5, 9, 12],
    lines=[7, 3, 9],
)


def test_each_conversation_is_a_sequence_of_its_own_scored_on_its_loss_mask_tokens() -> None:
    seqs = sft_sequences(BATCH)
    # C has no trained token: it adds nothing to the loss and is not fed
    assert [s.index for s in seqs] == [0, 1]
    assert seqs[0].token_ids == [10, 11, 12, 13, 14] and seqs[0].spans == [(2, 4)]
    assert seqs[1].token_ids == [20, 21, 22, 23] and seqs[1].spans == [(1, 2), (3, 4)]
    # positions within the conversation: 12, 13 of A; 21, 23 of B
    assert [s.positions for s in seqs] == [[2, 3], [1, 3]]
    assert all(s.carries_loss for s in seqs)
    # the loss's denominator: every 1 of the loss mask
    assert trained_tokens(seqs) == 4 == BATCH.trained_tokens


def test_packed_again_the_positions_restart_and_no_token_is_predicted_across_a_boundary() -> None:
    seqs = sft_sequences(BATCH)
    row = packed_row([s.token_ids for s in seqs])
    assert row.position_ids == [0, 1, 2, 3, 4, 0, 1, 2, 3]
    assert row.cu_seqlens == [0, 5, 9] and row.offsets == [0, 5]
    # each scored token (row index) is predicted from the row index before it, in its own
    # conversation: 12 ← 11, 13 ← 12, 21 ← 20, 23 ← 22
    pairs = [
        (row.token_ids[o + j - 1], row.token_ids[o + j])
        for s, o in zip(seqs, row.offsets, strict=True)
        for j in s.positions
    ]
    assert pairs == [(11, 12), (12, 13), (20, 21), (22, 23)]


def test_a_first_token_is_never_scored_even_when_marked() -> None:
    # sft_batches refuses such a conversation; the conversion still never predicts position 0
    batch = SFTBatch(token_ids=[1, 2, 3], loss_mask=[1, 0, 1], cu_seqlens=[0, 3], lines=[1])
    assert [s.positions for s in sft_sequences(batch)] == [[2]]


def test_conversations_are_shared_over_ranks_longest_first_to_the_least_loaded() -> None:
    batch = SFTBatch(
        token_ids=list(range(24)),
        loss_mask=[0] + [1] * 9 + [0, 1, 1] + [0] + [1] * 6 + [0, 1, 1, 1],
        cu_seqlens=[0, 10, 13, 20, 24],  # lengths 10, 3, 7, 4
        lines=[1, 2, 3, 4],
    )
    seqs = sft_sequences(batch)
    # 10 → rank 0 (10), 7 → rank 1 (7), 4 → rank 1 (11), 3 → rank 0 (13); batch order kept
    shares = [data_parallel_share(seqs, dp_rank=r, dp_size=2) for r in range(2)]
    assert [[s.index for s in share] for share in shares] == [[0, 1], [2, 3]]
    assert [s.index for s in data_parallel_share(seqs, dp_rank=0, dp_size=1)] == [0, 1, 2, 3]


def test_a_rank_left_without_a_conversation_runs_a_stand_in_that_carries_no_loss() -> None:
    seqs = sft_sequences(BATCH)
    shares = [data_parallel_share(seqs, dp_rank=r, dp_size=3) for r in range(3)]
    assert [[(s.index, s.carries_loss) for s in share] for share in shares] == [
        [(0, True)],
        [(1, True)],
        [(0, False)],  # A again, at loss weight 0: it only joins the gradient reduction
    ]
    with pytest.raises(ValueError, match="without a trained token"):
        data_parallel_share([], dp_rank=0, dp_size=1)


# -- the optimizer between the stages ----------------------------------------------------------


class _Wrapped:
    """What megatron's optimizers look like from outside: the torch optimizer in
    ``.optimizer``, its groups promoted (one part of a ``ChainedOptimizer``)."""

    def __init__(self, inner: torch.optim.Optimizer) -> None:
        self.optimizer = inner

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups


class _Chained:
    def __init__(self, parts: list[_Wrapped]) -> None:
        self.chained_optimizers = parts

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for p in self.chained_optimizers for g in p.param_groups]


def _loss(params: list[torch.nn.Parameter], target: float) -> torch.Tensor:
    return sum(((p - target) ** 2).sum() for p in params)  # type: ignore[return-value]


def _adamw(params: list[torch.nn.Parameter], lr: float) -> torch.optim.AdamW:
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98), weight_decay=0.1)


def test_the_learning_rate_is_set_on_every_group_times_its_multiplier() -> None:
    a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    first, second = _adamw([a], 1e-3), _adamw([b], 1e-3)
    second.param_groups[0]["lr_mult"] = 0.5
    chained = _Chained([_Wrapped(first), _Wrapped(second)])
    assert inner_optimizers(chained) == [first, second]
    assert inner_optimizers(_Wrapped(first)) == [first]
    set_learning_rate(chained, 2e-5)
    assert learning_rates(chained) == [2e-5, 1e-5]


def test_after_the_reset_the_next_update_is_a_fresh_adamws_first() -> None:
    torch.manual_seed(0)
    start = [torch.randn(3), torch.randn(4)]
    params = [torch.nn.Parameter(t.clone()) for t in start]
    used = _Chained([_Wrapped(_adamw(params, 1e-2))])
    for _ in range(3):  # the warm start: moments and step counts build up
        used.chained_optimizers[0].optimizer.zero_grad()
        _loss(params, 1.0).backward()
        used.chained_optimizers[0].optimizer.step()
    reset_adam_moments(used)
    set_learning_rate(used, 1e-3)
    state = used.chained_optimizers[0].optimizer.state
    assert all(float(s["step"]) == 0 and not s["exp_avg"].any() for s in state.values())

    # the same weights under a new AdamW at the RL rate: the expected next weights
    fresh_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    fresh = _adamw(fresh_params, 1e-3)
    for optimizer, ps in ((used.chained_optimizers[0].optimizer, params), (fresh, fresh_params)):
        optimizer.zero_grad()
        _loss(ps, -1.0).backward()
        optimizer.step()
    for p, q in zip(params, fresh_params, strict=True):
        assert torch.equal(p, q)


# -- the driver's view of rank 0 ---------------------------------------------------------------


class _Recorder:
    """A backend on rank 0 that records what it is asked."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def sft_step(self, batch: SFTBatch, *, lr: float) -> SFTStats:
        self.calls.append(("sft_step", (batch, lr)))
        return SFTStats(loss=2.5, grad_norm=0.75, tokens=batch.trained_tokens)

    def finish_warm_start(self) -> None:
        self.calls.append(("finish_warm_start", None))

    def save_state(self, directory: Path) -> None:
        self.calls.append(("save_state", directory))


class _Handle:
    """A Ray actor handle on an object in this process: ``handle.method.remote(*args)``."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def __getattr__(self, name: str) -> Any:
        return types.SimpleNamespace(remote=getattr(self.target, name))


def test_the_driver_hands_the_warm_start_to_rank_0(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_ray = types.ModuleType("ray")
    fake_ray.get = lambda ref: ref  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", fake_ray)
    rank0 = TrainerRank(rank=0, world_size=2, ranks_per_node=2)
    recorder = _Recorder()
    rank0.backend = recorder
    remote = RemoteBackend(_Handle(rank0))

    stats = remote.sft_step(BATCH, lr=3e-5)
    remote.finish_warm_start()
    remote.save_state(Path("/ckpt/step-00000000"))

    assert stats == SFTStats(loss=2.5, grad_norm=0.75, tokens=4)
    (op, (batch, lr)), *rest = recorder.calls
    assert op == "sft_step" and batch == BATCH and lr == 3e-5  # across JSON and back
    assert rest == [("finish_warm_start", None), ("save_state", Path("/ckpt/step-00000000"))]
