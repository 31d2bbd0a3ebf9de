"""The warm-start stage (``spec.trainer.warmStart``) on the megatron backend: what
:meth:`agentrl.trainer.megatron_backend.MegatronBackend.sft_step` feeds the model and how it
switches the optimizer between the warm start and RL.

* **Batches** — a packed warm-start batch (:class:`agentrl.trainer.sft_batches.SFTBatch`) becomes
  one :class:`~agentrl.trainer.batching.TokenSequence` per conversation (:func:`sft_sequences`):
  the backend packs them into micro-batches of the ``thd`` format exactly as it packs GRPO
  trajectories (positions restarting per sequence, attention not crossing one), so no
  conversation sees another. Each is scored on its loss-mask tokens from position 1 on (token
  ``j`` predicted from the logits at ``j − 1`` of its own conversation), which is what the torch
  backend trains on.
* **Data parallelism** — :func:`data_parallel_share`: whole conversations per data-parallel rank,
  balanced by tokens; a rank left without one (a batch of fewer conversations than ranks) runs
  the first one at loss weight 0, so it still joins the gradient reduction.
* **Optimizer** — one megatron optimizer serves both stages (its fp32 main weights carry over
  from the warm start into RL; a second distributed optimizer would hold them, and the Adam
  moments, twice). Every update sets the learning rate of its stage
  (:func:`set_learning_rate`: ``warmStart.lr`` for the warm start, ``optimizer.lr`` for RL), and
  the end of the warm start zeroes the Adam moments and step counts
  (:func:`reset_adam_moments`), so RL's first update is a fresh Adam's, as on the torch backend
  (which gives the warm start an AdamW of its own and drops it). The moments are kept in place
  (zeroed, not deleted) so the checkpoint written right after has the same layout as every
  other.

Pure apart from the optimizer helpers, which touch the optimizer's tensors through their own
methods (no torch import). Callers: :mod:`agentrl.trainer.megatron_backend`, tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from agentrl.trainer.batching import TokenSequence, generated_spans
from agentrl.trainer.sft_batches import SFTBatch


def sft_sequences(batch: SFTBatch) -> list[TokenSequence]:
    """Each conversation of ``batch`` as a sequence of its own, scored on its loss-mask tokens
    from position 1 on; ``index`` is its place in the batch. A conversation without a trained
    token is left out (it adds nothing to the loss). The engine logprobs and advantage of a
    GRPO trajectory have no meaning here: zeros."""
    out: list[TokenSequence] = []
    for i, (a, b) in enumerate(pairwise(batch.cu_seqlens)):
        spans = generated_spans(batch.loss_mask[a:b], start=1)
        if not spans:
            continue
        scored = sum(e - s for s, e in spans)
        out.append(
            TokenSequence(
                index=i,
                token_ids=list(batch.token_ids[a:b]),
                spans=spans,
                engine_logprobs=[0.0] * scored,
                advantage=0.0,
                carries_loss=True,
            )
        )
    return out


def trained_tokens(seqs: Sequence[TokenSequence]) -> int:
    """The tokens the batch's loss is the mean over (its denominator)."""
    return sum(len(s.positions) for s in seqs)


def data_parallel_share(
    seqs: Sequence[TokenSequence], *, dp_rank: int, dp_size: int
) -> list[TokenSequence]:
    """The conversations data-parallel rank ``dp_rank`` trains on, in batch order: each one goes,
    longest first, to the rank with the fewest tokens so far (ties: the lowest rank), the same
    on every rank. A rank that gets none trains on a copy of the first conversation with
    ``carries_loss`` False (loss weight 0): it must still take part in the gradient reduction.

    Raises:
        ValueError: ``seqs`` is empty.
    """
    if not seqs:
        raise ValueError("a warm-start batch without a trained token")
    load = [0] * dp_size
    owner: dict[int, int] = {}
    for i in sorted(range(len(seqs)), key=lambda i: -len(seqs[i].token_ids)):
        rank = min(range(dp_size), key=lambda r: (load[r], r))
        owner[i] = rank
        load[rank] += len(seqs[i].token_ids)
    mine = [s for i, s in enumerate(seqs) if owner[i] == dp_rank]
    return mine or [dataclasses.replace(seqs[0], carries_loss=False)]


# -- the optimizer between the stages ----------------------------------------------------------


def inner_optimizers(optimizer: Any) -> list[Any]:
    """The torch optimizers inside a megatron optimizer (a ``ChainedOptimizer``'s parts, each
    wrapping one in ``.optimizer``)."""
    parts = getattr(optimizer, "chained_optimizers", None)
    return [p.optimizer for p in (parts if parts is not None else [optimizer])]


def set_learning_rate(optimizer: Any, lr: float) -> None:
    """Every parameter group of ``optimizer`` at ``lr`` (times the group's ``lr_mult``, as
    megatron's scheduler sets it; this backend runs no scheduler, so the rate stays until set
    again)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_mult", 1.0)


def learning_rates(optimizer: Any) -> list[float]:
    """The learning rate of each parameter group."""
    return [float(group["lr"]) for group in optimizer.param_groups]


#: Adam's per-parameter state that a fresh optimizer starts at zero (anything else in the state,
#: such as a precision-aware optimizer's master weights, is left alone).
ADAM_STATE = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step")


def reset_adam_moments(optimizer: Any) -> None:
    """Adam's state as a fresh optimizer's: moments and step counts zeroed in place (the next
    update is bias-corrected as a first one). The fp32 main weights are left as they are."""
    for inner in inner_optimizers(optimizer):
        for state in inner.state.values():
            for key in ADAM_STATE:
                value = state.get(key)
                if hasattr(value, "zero_"):
                    value.zero_()
                elif value is not None:
                    state[key] = 0
        for group in inner.param_groups:
            if "step" in group:  # TE's FusedAdam counts steps per group
                group["step"] = 0
