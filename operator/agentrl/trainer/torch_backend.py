"""``trainer.backend: torch``: GRPO steps of the tiny policy on CPU (``agentrl run``, tests).

One step: recompute the logprobs of every generated token with the weights at the start of the
step (the PPO "old" policy; timed as *logprob recomputation*), then one AdamW update on the
clipped, importance-corrected loss of :mod:`agentrl.trainer.loss` (timed as *actor update*).
The megatron backend (:mod:`agentrl.trainer.megatron_backend`) has the same surface.

Callers: :mod:`agentrl.trainer.loop`.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

from agentrl.api.trainer import TrainerSpec
from agentrl.engine import tiny
from agentrl.trainer.batching import TrainSample
from agentrl.trainer.loss import LossStats, grpo_loss


class StepStats(BaseModel):
    """What a backend reports for one step."""

    loss: float
    grad_norm: float
    loss_stats: LossStats
    recompute_seconds: float
    update_seconds: float


def generated_spans(loss_mask: Sequence[int]) -> list[tuple[int, int]]:
    """Maximal runs ``[a, b)`` of 1s in a loss mask (the agent's turns)."""
    spans: list[tuple[int, int]] = []
    start: int | None = None
    for i, m in enumerate(loss_mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(loss_mask)))
    return spans


class TorchBackend:
    """AdamW on the tiny policy, one update per step."""

    def __init__(self, model: tiny.TinyPolicy, spec: TrainerSpec, *, temperature: float) -> None:
        self.model = model
        self.spec = spec
        self.temperature = temperature
        opt = spec.optimizer
        self.optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=opt.lr,
            betas=(opt.beta1, opt.beta2),
            weight_decay=opt.weight_decay,
        )
        # The KL term compares with the initial policy, kept frozen.
        self.reference: tiny.TinyPolicy | None = (
            copy.deepcopy(model).eval() if spec.algorithm.kl_coef > 0 else None
        )

    def train_step(self, samples: Sequence[TrainSample]) -> StepStats:
        """One GRPO update on ``samples``."""
        with tiny.single_thread():
            return self._step(samples)

    def _step(self, samples: Sequence[TrainSample]) -> StepStats:
        items = [(s.trajectory.token_ids, generated_spans(s.trajectory.loss_mask)) for s in samples]
        engine_lp: list[float] = []
        advantages: list[float] = []
        mask: list[float] = []
        seq_index: list[int] = []
        for i, (s, (_, spans)) in enumerate(zip(samples, items, strict=False)):
            n = sum(b - a for a, b in spans)
            for a, b in spans:
                engine_lp.extend(s.trajectory.logprobs[a:b])
            advantages.extend([s.advantage] * n)
            mask.extend([1.0 if s.carries_loss else 0.0] * n)
            seq_index.extend([i] * n)

        t0 = time.monotonic()
        with torch.no_grad():
            logp_old = torch.cat(
                tiny.batch_logprobs(self.model, items, temperature=self.temperature)
            )
            logp_ref = (
                torch.cat(tiny.batch_logprobs(self.reference, items, temperature=self.temperature))
                if self.reference is not None
                else None
            )
        t1 = time.monotonic()
        self.model.train()
        logp = torch.cat(tiny.batch_logprobs(self.model, items, temperature=self.temperature))
        loss, stats = grpo_loss(
            logp=logp,
            logp_old=logp_old,
            logp_engine=torch.tensor(engine_lp, dtype=logp.dtype),
            advantages=torch.tensor(advantages, dtype=logp.dtype),
            mask=torch.tensor(mask, dtype=logp.dtype),
            seq_index=torch.tensor(seq_index, dtype=torch.long),
            num_seqs=len(samples),
            algorithm=self.spec.algorithm,
            logp_ref=logp_ref,
        )
        self.optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), self.spec.optimizer.grad_clip
        )
        self.optimizer.step()
        self.model.eval()
        t2 = time.monotonic()
        return StepStats(
            loss=float(loss.detach()),
            grad_norm=float(grad_norm),
            loss_stats=stats,
            recompute_seconds=t1 - t0,
            update_seconds=t2 - t1,
        )

    # -- persistence -------------------------------------------------------------------------

    def export_weights(self, directory: Path) -> None:
        """Write the weights in the format the tiny engine loads."""
        tiny.save_policy(self.model, directory)

    def save_state(self, directory: Path) -> None:
        """Weights plus optimizer state (a checkpoint)."""
        tiny.save_policy(self.model, directory / "model")
        state: dict[str, Any] = {"optimizer": self.optimizer.state_dict()}
        if self.reference is not None:
            state["reference"] = self.reference.state_dict()
        torch.save(state, directory / "optimizer.pt")

    def load_state(self, directory: Path) -> None:
        """Inverse of :meth:`save_state`."""
        self.model.load_state_dict(tiny.load_policy(directory / "model").state_dict())
        state = torch.load(directory / "optimizer.pt", weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        if self.reference is not None and "reference" in state:
            self.reference.load_state_dict(state["reference"])
