"""Warm-start batches: rendered conversations packed, without padding, into batches of at most
``spec.trainer.warmStart.tokensPerBatch`` tokens, in an order drawn per epoch from the seed.

Each batch lays its conversations back to back (``token_ids``, ``loss_mask``) and records
where each one starts (``cu_seqlens``, ``[0, n0, n0 + n1, …]``, as megatron's packed ``thd``
format and flash-attention's varlen kernels take them), so the backend restarts attention and
positions (:meth:`SFTBatch.position_ids`) at every conversation: no conversation sees another.
``loss_mask[i]`` is 1 when token ``i`` is trained on, predicted from the tokens before it in
its own conversation; the first token of every conversation is a prompt token (0), so no
target is predicted across a boundary. :attr:`SFTBatch.trained_tokens` is what the batch's loss
is divided by (the mean over assistant tokens).

Order and packing (:func:`epoch_batches`): the conversations are shuffled with a generator
seeded by ``(seed, epoch)``, then each goes into the first of the last :data:`OPEN_BATCHES`
opened batches it fits in, or opens a new one (the oldest open batch is then closed). Every
conversation is in exactly one batch of each epoch; the same seed and epoch give the same
batches. Batches come in the order they were opened.

Pure: no torch (an import-linter contract holds it to that). Callers: the trainer's warm-start
stage, with :func:`agentrl.rollout.conversations.read_warm_start`'s conversations.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from itertools import pairwise

from agentrl.rollout.conversations import MaskedTokens, RenderedConversation

#: Batches still open to later conversations while packing: a conversation goes into the first
#: of them with room. More packs tighter; 8 leaves little room unused at a bounded cost.
OPEN_BATCHES = 8


class SFTBatch(MaskedTokens):
    """Conversations packed back to back, without padding (``loss_mask``: 1 on an assistant
    turn's tokens, its end-of-turn token included)."""

    cu_seqlens: list[int]
    """Boundaries: ``[0, n0, n0 + n1, …, len(token_ids)]``."""
    lines: list[int]
    """The warm-start line of each conversation, in batch order."""

    @property
    def max_seqlen(self) -> int:
        """The longest conversation's length."""
        return max((b - a for a, b in pairwise(self.cu_seqlens)), default=0)

    def position_ids(self) -> list[int]:
        """Positions restarting at 0 for every conversation."""
        return [p for a, b in pairwise(self.cu_seqlens) for p in range(b - a)]

    def spans(self) -> list[tuple[int, int]]:
        """``(start, end)`` of each conversation in the batch."""
        return list(pairwise(self.cu_seqlens))


def epoch_order(count: int, *, seed: int, epoch: int) -> list[int]:
    """The conversations' order in ``epoch`` (a permutation of ``range(count)``), the same for
    the same seed and epoch on every machine and Python run."""
    order = list(range(count))
    random.Random(f"agentrl-warm-start:{seed}:{epoch}").shuffle(order)
    return order


def pack(
    conversations: Sequence[RenderedConversation],
    order: Sequence[int],
    *,
    tokens_per_batch: int,
) -> list[SFTBatch]:
    """``conversations`` taken in ``order`` (indices) and packed (see the module docstring).
    ValueError for a conversation longer than ``tokens_per_batch`` or one whose first token is
    trained on (nothing before it to predict it from); :func:`~agentrl.rollout.conversations.
    read_warm_start` refuses both before."""
    for i in order:
        c = conversations[i]
        if c.tokens > tokens_per_batch:
            raise ValueError(
                f"the conversation of line {c.line} has {c.tokens} tokens, more than "
                f"tokensPerBatch ({tokens_per_batch})"
            )
        if not c.token_ids or c.loss_mask[0]:
            raise ValueError(
                f"the conversation of line {c.line} is empty or starts with a trained token"
            )
    batches: list[list[int]] = []
    used: list[int] = []
    first_open = 0
    for i in order:
        n = conversations[i].tokens
        into = next(
            (b for b in range(first_open, len(batches)) if used[b] + n <= tokens_per_batch), None
        )
        if into is None:
            batches.append([])
            used.append(0)
            into = len(batches) - 1
            first_open = max(first_open, len(batches) - OPEN_BATCHES)
        batches[into].append(i)
        used[into] += n
    return [_batch([conversations[i] for i in members]) for members in batches]


def _batch(members: Sequence[RenderedConversation]) -> SFTBatch:
    ids: list[int] = []
    mask: list[int] = []
    cu = [0]
    for c in members:
        ids.extend(c.token_ids)
        mask.extend(c.loss_mask)
        cu.append(len(ids))
    return SFTBatch(token_ids=ids, loss_mask=mask, cu_seqlens=cu, lines=[c.line for c in members])


def epoch_batches(
    conversations: Sequence[RenderedConversation],
    *,
    tokens_per_batch: int,
    seed: int,
    epoch: int,
) -> list[SFTBatch]:
    """The batches of one epoch: :func:`pack` in :func:`epoch_order`."""
    order = epoch_order(len(conversations), seed=seed, epoch=epoch)
    return pack(conversations, order, tokens_per_batch=tokens_per_batch)
