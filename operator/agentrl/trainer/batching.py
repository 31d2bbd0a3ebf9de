"""From complete groups to one training step's samples: who is in, with what advantage, and
whether they carry loss.

Rules, in order, for each complete group (oldest completion first):

1. Members whose terminal class maps to ``drop`` (always: infra errors) are left out entirely —
   they have no reward and take no part in the group's statistics.
2. A group with fewer than two remaining members has no relative signal: dropped.
3. Advantages are computed over the remaining members
   (:func:`agentrl.trainer.grpo.group_advantages`); whether their rewards are all equal by
   :func:`agentrl.trainer.grpo.zero_variance`.
4. Members whose class maps to ``mask`` (by default ``agent_timeout``) keep their place in the
   statistics but carry no loss.
5. Groups whose rewards are all equal follow ``algorithm.zeroVarianceGroups``: ``keep`` (advantage
   0, only the KL term acts), ``mask`` (in the step, no loss) or ``dropAndRefill`` (out of the
   step; later groups fill it).

Groups are taken until the step holds ``trajectoriesPerStep`` members. Callers:
:mod:`agentrl.trainer.loop`; the tests build groups by hand.

Then, for the backends, the one token flattener: :func:`token_sequences` gives each sample's
tokens, the runs of them the policy is scored on (:func:`generated_spans` of the loss mask) and
the engine's logprobs of those, and :func:`flatten` lays a list of them out one entry per
scored token (advantage, loss mask, trajectory index), in the order the loss
(:func:`agentrl.trainer.loss.grpo_loss`) takes them. Both backends use them
(:mod:`agentrl.trainer.torch_backend` per mini-batch, :mod:`agentrl.trainer.megatron_backend`
per trajectory), so they score the same tokens in the same order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel

from agentrl.api.rollout import ClassAction
from agentrl.api.trainer import Algorithm, ZeroVariancePolicy
from agentrl.rollout.trajectory import Trajectory
from agentrl.trainer import grpo
from agentrl.trainer.buffer import Group


class TrainSample(BaseModel):
    """One trajectory in a step."""

    trajectory: Trajectory
    advantage: float
    carries_loss: bool
    """False for masked members and masked zero-variance groups."""


class StepSelection(BaseModel):
    """What :func:`select_step` took and what it threw out."""

    taken: list[Group]
    dropped: list[Group]
    """Groups removed from the buffer without training (no signal)."""
    zero_variance: int
    """Groups among ``taken`` + ``dropped`` whose rewards were all equal."""
    samples: list[TrainSample]
    zero_variance_dropped: int = 0
    """Of ``zero_variance``, the groups in ``dropped`` (they leave the buffer now; the taken
    ones only once the step trains: the driver counts each group once, when it leaves)."""

    @property
    def trajectories(self) -> int:
        return len(self.samples)


def group_samples(group: Group, algorithm: Algorithm) -> tuple[list[TrainSample], bool]:
    """Samples of one group and whether its rewards were all equal."""
    members = group.trainable()
    rewards = [t.reward if t.reward is not None else 0.0 for t in members]
    zero_variance = grpo.zero_variance(rewards)
    advantages = grpo.group_advantages(rewards, len(members), std_normalize=algorithm.std_normalize)
    mask_group = zero_variance and algorithm.zero_variance_groups == ZeroVariancePolicy.MASK
    samples = [
        TrainSample(
            trajectory=t,
            advantage=a,
            carries_loss=(t.training_action == ClassAction.TRAIN) and not mask_group,
        )
        for t, a in zip(members, advantages, strict=False)
    ]
    return samples, zero_variance


def select_step(
    ready: Iterable[Group], *, trajectories_per_step: int, algorithm: Algorithm
) -> StepSelection | None:
    """Take complete groups, in order, until the step is full; ``None`` while it cannot be.

    Groups with no usable signal are reported in ``dropped`` even when the step is not full yet,
    so the caller can retire them from the buffer (and admit their replacements).
    """
    taken: list[Group] = []
    dropped: list[Group] = []
    samples: list[TrainSample] = []
    zero_variance = 0  # among taken groups
    zero_variance_dropped = 0
    for group in ready:
        if len(samples) >= trajectories_per_step:
            break
        if len(group.trainable()) < 2:
            dropped.append(group)
            continue
        group_part, flat = group_samples(group, algorithm)
        if flat and algorithm.zero_variance_groups == ZeroVariancePolicy.DROP_AND_REFILL:
            zero_variance_dropped += 1
            dropped.append(group)
            continue
        zero_variance += flat
        taken.append(group)
        samples.extend(group_part)
    if len(samples) < trajectories_per_step:
        if not dropped:
            return None
        # Not enough for a step, but the signal-less groups can leave now (and be refilled).
        return StepSelection(
            taken=[],
            dropped=dropped,
            zero_variance=zero_variance_dropped,
            samples=[],
            zero_variance_dropped=zero_variance_dropped,
        )
    return StepSelection(
        taken=taken,
        dropped=dropped,
        zero_variance=zero_variance + zero_variance_dropped,
        samples=samples,
        zero_variance_dropped=zero_variance_dropped,
    )


def minibatch_bounds(n: int, count: int) -> list[tuple[int, int]]:
    """``[a, b)`` of each of ``count`` mini-batches of a step of ``n`` trajectories
    (``algorithm.miniBatches``): in order, whole trajectories, sizes differing by at most one
    (the first ``n mod count`` get the extra one).

    Raises:
        ValueError: ``count`` is below 1 or above ``n`` (the spec's rule keeps ``miniBatches``
            at most ``trajectoriesPerStep``, and a step holds at least that many).
    """
    if not 1 <= count <= n:
        raise ValueError(f"cannot split {n} trajectories into {count} mini-batches")
    size, extra = divmod(n, count)
    bounds: list[tuple[int, int]] = []
    start = 0
    for i in range(count):
        stop = start + size + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


# -- from samples to scored tokens -------------------------------------------------------------


def generated_spans(loss_mask: Sequence[int], *, start: int = 0) -> list[tuple[int, int]]:
    """Maximal runs ``[a, b)`` of 1s in a loss mask (the agent's turns), from position
    ``start`` on."""
    spans: list[tuple[int, int]] = []
    run: int | None = None
    for i in range(start, len(loss_mask)):
        if loss_mask[i] and run is None:
            run = i
        elif not loss_mask[i] and run is not None:
            spans.append((run, i))
            run = None
    if run is not None:
        spans.append((run, len(loss_mask)))
    return spans


@dataclass(frozen=True)
class TokenSequence:
    """One trajectory of a step as a backend feeds it: its tokens and which of them are
    scored."""

    index: int
    """Position in the list it came from (its ``seq_index`` in :func:`flatten`)."""
    token_ids: list[int]
    spans: list[tuple[int, int]]
    """Runs ``[a, b)`` of the generated tokens the policy is scored on, in order."""
    engine_logprobs: list[float]
    """The engine's logprob of each scored token, in order."""
    advantage: float
    carries_loss: bool

    @property
    def positions(self) -> list[int]:
        """Indices of the scored tokens in ``token_ids``, in order."""
        return [j for a, b in self.spans for j in range(a, b)]


def token_sequences(
    samples: Sequence[TrainSample], *, first_position: int = 0
) -> list[TokenSequence]:
    """Each sample's tokens and the generated ones among them, from ``first_position`` on: 0
    for the tiny policy (it scores token 0 from its BOS input), 1 for a GPT fed the trajectory
    as it is (token ``j`` is predicted from the logits at ``j − 1``; a trajectory always starts
    with a prompt, so nothing generated is lost)."""
    out: list[TokenSequence] = []
    for i, s in enumerate(samples):
        t = s.trajectory
        spans = generated_spans(t.loss_mask, start=first_position)
        out.append(
            TokenSequence(
                index=i,
                token_ids=list(t.token_ids),
                spans=spans,
                engine_logprobs=[lp for a, b in spans for lp in t.logprobs[a:b]],
                advantage=s.advantage,
                carries_loss=s.carries_loss,
            )
        )
    return out


@dataclass(frozen=True)
class FlatTokens:
    """Sequences laid out one entry per scored token, as :func:`~agentrl.trainer.loss.grpo_loss`
    takes them (the backends make tensors of these lists)."""

    engine_logprobs: list[float]
    advantages: list[float]
    """The token's trajectory's advantage."""
    mask: list[float]
    """1.0 where the trajectory carries loss, else 0.0."""
    seq_index: list[int]
    """Position of the token's trajectory in the flattened list."""


def flatten(seqs: Sequence[TokenSequence]) -> FlatTokens:
    """``seqs``' scored tokens, trajectory after trajectory."""
    flat = FlatTokens(engine_logprobs=[], advantages=[], mask=[], seq_index=[])
    for i, s in enumerate(seqs):
        n = len(s.engine_logprobs)
        flat.engine_logprobs.extend(s.engine_logprobs)
        flat.advantages.extend([s.advantage] * n)
        flat.mask.extend([1.0 if s.carries_loss else 0.0] * n)
        flat.seq_index.extend([i] * n)
    return flat
