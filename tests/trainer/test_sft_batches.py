"""Warm-start packing: conversations back to back without padding, never more than the budget
per batch, every conversation once per epoch, boundaries recorded for the attention reset, and
the trained-token count the loss is divided by."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest

from agentrl.rollout.conversations import RenderedConversation
from agentrl.trainer.sft_batches import SFTBatch, epoch_batches, epoch_order, pack


def conversation(line: int, length: int, trained: int) -> RenderedConversation:
    """``length`` tokens numbered from ``line * 1000`` (to tell them apart), the last
    ``trained`` of them trained on."""
    ids = [line * 1000 + i for i in range(length)]
    mask = [0] * (length - trained) + [1] * trained
    return RenderedConversation(line=line, token_ids=ids, loss_mask=mask)


# Lengths from 20 to 97 tokens: several fit one batch of 256, never all of them.
CONVERSATIONS = [conversation(n, 20 + (n * 37) % 78, 1 + n % 9) for n in range(1, 41)]


def test_two_conversations_are_laid_back_to_back_with_their_boundaries() -> None:
    a, b = conversation(1, 5, 2), conversation(2, 3, 1)
    (batch,) = pack([a, b], [1, 0], tokens_per_batch=8)
    assert batch.token_ids == [2000, 2001, 2002, 1000, 1001, 1002, 1003, 1004]
    assert batch.loss_mask == [0, 0, 1, 0, 0, 0, 1, 1]
    assert batch.cu_seqlens == [0, 3, 8]
    assert batch.position_ids() == [0, 1, 2, 0, 1, 2, 3, 4]
    assert batch.spans() == [(0, 3), (3, 8)]
    assert batch.lines == [2, 1]
    assert (batch.tokens, batch.trained_tokens, batch.max_seqlen) == (8, 3, 5)


def test_a_conversation_goes_into_the_first_open_batch_it_fits() -> None:
    sizes = {1: 60, 2: 60, 3: 40, 4: 40, 5: 30}
    convs = [conversation(n, sizes[n], 1) for n in sorted(sizes)]
    batches = pack(convs, [0, 1, 2, 3, 4], tokens_per_batch=100)
    # 60 | 60 → two batches; 40 fills the first, 40 the second; 30 fits neither: a third
    assert [b.lines for b in batches] == [[1, 3], [2, 4], [5]]
    assert [b.tokens for b in batches] == [100, 100, 30]


@pytest.mark.parametrize("epoch", [0, 1, 2])
def test_every_conversation_is_in_exactly_one_batch_of_an_epoch_within_the_budget(
    epoch: int,
) -> None:
    batches = epoch_batches(CONVERSATIONS, tokens_per_batch=256, seed=7, epoch=epoch)
    seen = Counter(line for b in batches for line in b.lines)
    assert seen == Counter(c.line for c in CONVERSATIONS)
    by_line = {c.line: c for c in CONVERSATIONS}
    for batch in batches:
        assert batch.tokens <= 256
        members = [by_line[line] for line in batch.lines]
        # no padding: exactly the members' tokens and masks, in batch order
        assert batch.token_ids == [t for c in members for t in c.token_ids]
        assert batch.loss_mask == [m for c in members for m in c.loss_mask]
        assert batch.cu_seqlens[0] == 0 and batch.cu_seqlens[-1] == batch.tokens
        assert [b - a for a, b in batch.spans()] == [c.tokens for c in members]
        assert batch.trained_tokens == sum(c.trained_tokens for c in members)
        # no trained token is predicted across a boundary: each conversation starts untrained
        assert all(batch.loss_mask[a] == 0 for a, _ in batch.spans())
    total = sum(c.tokens for c in CONVERSATIONS)
    assert sum(b.tokens for b in batches) == total
    assert len(batches) < total / 256 + 2  # packed, not one conversation a batch


def test_the_order_is_a_permutation_fixed_by_seed_and_epoch() -> None:
    first = epoch_order(40, seed=3, epoch=0)
    assert sorted(first) == list(range(40))
    assert epoch_order(40, seed=3, epoch=0) == first
    assert epoch_order(40, seed=3, epoch=1) != first
    assert epoch_order(40, seed=4, epoch=0) != first
    same = epoch_batches(CONVERSATIONS, tokens_per_batch=256, seed=3, epoch=1)
    again = epoch_batches(CONVERSATIONS, tokens_per_batch=256, seed=3, epoch=1)
    assert [b.lines for b in same] == [b.lines for b in again]


def test_the_order_is_the_same_in_another_interpreter() -> None:
    # Seeded from a string: no hash randomisation between processes.
    code = (
        "from agentrl.trainer.sft_batches import epoch_order\n"
        "print(epoch_order(40, seed=3, epoch=0))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "123"},
    )
    assert done.stdout.strip() == str(epoch_order(40, seed=3, epoch=0))


def test_a_conversation_over_the_budget_or_starting_trained_is_refused() -> None:
    with pytest.raises(ValueError, match="line 2 has 9 tokens, more than tokensPerBatch"):
        pack([conversation(1, 4, 1), conversation(2, 9, 1)], [0, 1], tokens_per_batch=8)
    trained_first = RenderedConversation(line=5, token_ids=[1, 2], loss_mask=[1, 1])
    with pytest.raises(ValueError, match="line 5 is empty or starts with a trained token"):
        pack([trained_first], [0], tokens_per_batch=8)


def test_a_batch_round_trips_as_json() -> None:
    (batch,) = pack([conversation(1, 4, 2)], [0], tokens_per_batch=8)
    assert SFTBatch.model_validate_json(batch.model_dump_json()) == batch


def test_packing_imports_without_torch() -> None:
    code = (
        "import sys\n"
        "sys.modules['torch'] = None  # any import of torch now raises ImportError\n"
        "import agentrl.trainer.sft_batches\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
