"""``trainer.backend: torch``: GRPO steps on CPU (``agentrl run``, tests) of the tiny policy or of
a Hugging Face causal LM (:mod:`agentrl.trainer.hf_model`: any directory ``AutoModelForCausalLM``
loads, such as the Qwen3 model ``agentrl model create`` makes).

One step: recompute the logprobs of every generated token with the weights at the start of the
step (the PPO "old" policy; timed as *logprob recomputation*), then AdamW updates on the
clipped, importance-corrected loss of :mod:`agentrl.trainer.loss` (timed as *actor update*):
one per mini-batch (``algorithm.miniBatches``, whole trajectories in order) and pass
(``algorithm.epochs``). The first update's policy is the one that recomputed, so its ratio is
exactly 1; every later one is off-policy with respect to the old logprobs and can be clipped.
The old logprobs of a mini-batch are recomputed in the same forward batch the update uses, so
that ratio of exactly 1 is not blurred by a different batching of the same arithmetic.
The scored tokens come from :func:`agentrl.trainer.batching.token_sequences` and
:func:`~agentrl.trainer.batching.flatten`, as in the megatron backend: an HF model scores token
``j`` from the logits at ``j − 1`` (``first_position=1``, as megatron does), the tiny policy
scores from its own features (``first_position=0``). Everything that differs between the two
models sits in one adapter (:class:`HFModel`, :class:`TinyModel`): which tokens are scored and
how, the tensors the distributed weight sync sends (HF: under the names of the safetensors
files), and the weight files: an HF model exports safetensors with its tokenizer files beside
them (:func:`~agentrl.trainer.hf_model.save_model`), which the CPU engine reloads, the tiny
policy its own format.
The megatron backend (:mod:`agentrl.trainer.megatron_backend`) has the same surface.

Callers: :mod:`agentrl.trainer.loop` drives it through its ``Backend`` protocol (it imports no
backend); it is built for ``trainer.backend: torch`` by the trainer pod's backend choice, by
:mod:`agentrl.local.runner` (``agentrl run``) and by ``bench/device/megatron_one_step.py``.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from agentrl.api.trainer import TrainerSpec
from agentrl.tiny import policy as tiny
from agentrl.trainer import batching, hf_model
from agentrl.trainer.batching import TrainSample, minibatch_bounds
from agentrl.trainer.loss import combine_updates, grpo_loss, mismatch_statistics
from agentrl.trainer.stats import LossStats, StepStats


class PackedBatch(Protocol):
    """Conversations packed back to back (:class:`agentrl.trainer.sft_batches.SFTBatch`)."""

    token_ids: list[int]
    loss_mask: list[int]
    cu_seqlens: list[int]


@dataclass(frozen=True)
class SFTStats:
    """One warm-start update."""

    loss: float
    """Mean negative logprob of the batch's trained tokens, before the update."""
    grad_norm: float
    tokens: int
    """Trained tokens (the loss's denominator)."""


@dataclass
class _MiniBatch:
    """One mini-batch, flat (one entry per generated token), with its old logprobs."""

    items: list[tuple[list[int], list[tuple[int, int]]]]
    engine_lp: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    seq_index: torch.Tensor
    logp_old: torch.Tensor
    logp_ref: torch.Tensor | None


class ModelAdapter(Protocol):
    """What differs between the models :class:`TorchBackend` trains; the rest is shared."""

    @property
    def first_position(self) -> int:
        """The first position of a sequence that can be scored
        (:func:`agentrl.trainer.batching.token_sequences`)."""
        ...

    def logprobs(self, module: Any, items: list[Any], *, temperature: float) -> torch.Tensor:
        """The logprobs of the scored tokens of ``items`` (``(ids, spans)``), concatenated in
        the order of :func:`agentrl.trainer.batching.flatten`."""
        ...

    def named_tensors(self, module: Any) -> list[tuple[str, torch.Tensor]]:
        """The weights as the engines name them (the distributed weight sync)."""
        ...

    def export(self, module: Any, directory: Path) -> None:
        """The weights in the format the engines load from disk."""
        ...

    def load(self, directory: Path) -> Any:
        """A module with the weights :meth:`export` wrote."""
        ...


@dataclass(frozen=True)
class HFModel:
    """A Hugging Face causal LM (:mod:`agentrl.trainer.hf_model`): token ``j`` scored from the
    logits at ``j − 1``; ``source`` is its directory, whose tokenizer files go beside every
    export."""

    source: Path
    first_position: int = 1

    def logprobs(self, module: Any, items: list[Any], *, temperature: float) -> torch.Tensor:
        return torch.cat(hf_model.token_logprobs(module, items, temperature=temperature))

    def named_tensors(self, module: Any) -> list[tuple[str, torch.Tensor]]:
        return hf_model.checkpoint_tensors(module)

    def export(self, module: Any, directory: Path) -> None:
        hf_model.save_model(module, directory, source=self.source)

    def load(self, directory: Path) -> Any:
        return hf_model.load_causal_lm(directory)


@dataclass(frozen=True)
class TinyModel:
    """The tiny policy (:mod:`agentrl.tiny.policy`), which scores from its own features."""

    first_position: int = 0

    def logprobs(self, module: Any, items: list[Any], *, temperature: float) -> torch.Tensor:
        return torch.cat(tiny.batch_logprobs(module, items, temperature=temperature))

    def named_tensors(self, module: Any) -> list[tuple[str, torch.Tensor]]:
        return [(name, p.detach()) for name, p in module.named_parameters()]

    def export(self, module: Any, directory: Path) -> None:
        tiny.save_policy(module, directory)

    def load(self, directory: Path) -> Any:
        return tiny.load_policy(directory)


def adapter_for(model: Any, source: Path | None) -> ModelAdapter:
    """The adapter of ``model``: the tiny policy's, else an HF model's (``source`` its
    directory)."""
    if isinstance(model, tiny.TinyPolicy):
        return TinyModel()
    if source is None:
        raise ValueError("an HF model needs its source directory (tokenizer files)")
    return HFModel(source)


class TorchBackend:
    """AdamW on the tiny policy or an HF causal LM: ``miniBatches × epochs`` updates per step.

    ``source`` is the HF model's directory (its tokenizer files go beside every export); None
    for the tiny policy."""

    def __init__(
        self,
        model: Any,
        spec: TrainerSpec,
        *,
        temperature: float,
        source: Path | None = None,
    ) -> None:
        self.model = model
        self.adapter = adapter_for(model, source)
        self.spec = spec
        self.temperature = temperature
        opt = spec.optimizer
        self.optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=opt.lr,
            betas=(opt.beta1, opt.beta2),
            weight_decay=opt.weight_decay,
        )
        self._sft_optimizer: torch.optim.Optimizer | None = None
        """The warm start's AdamW (:meth:`sft_step`), made on its first step."""
        # The KL term compares with the initial policy, kept frozen.
        self.reference: Any = copy.deepcopy(model).eval() if spec.algorithm.kl_coef > 0 else None

    @property
    def first_position(self) -> int:
        return self.adapter.first_position

    def train_step(self, samples: Sequence[TrainSample]) -> StepStats:
        """One GRPO step on ``samples``."""
        with tiny.single_thread():
            return self._step(samples)

    def _logprobs(self, model: Any, items: list[Any]) -> torch.Tensor:
        return self.adapter.logprobs(model, items, temperature=self.temperature)

    def _prepare(self, samples: Sequence[TrainSample]) -> _MiniBatch:
        seqs = batching.token_sequences(samples, first_position=self.first_position)
        items = [(s.token_ids, s.spans) for s in seqs]
        flat = batching.flatten(seqs)
        with torch.no_grad():
            logp_old = self._logprobs(self.model, items)
            logp_ref = self._logprobs(self.reference, items) if self.reference is not None else None
        dtype = logp_old.dtype
        return _MiniBatch(
            items=items,
            engine_lp=torch.tensor(flat.engine_logprobs, dtype=dtype),
            advantages=torch.tensor(flat.advantages, dtype=dtype),
            mask=torch.tensor(flat.mask, dtype=dtype),
            seq_index=torch.tensor(flat.seq_index, dtype=torch.long),
            logp_old=logp_old,
            logp_ref=logp_ref,
        )

    def _update(self, batch: _MiniBatch) -> tuple[float, float, LossStats]:
        """One AdamW update on one mini-batch: (loss, gradient norm, statistics)."""
        self.model.train()
        logp = self._logprobs(self.model, batch.items)
        loss, stats = grpo_loss(
            logp=logp,
            logp_old=batch.logp_old,
            logp_engine=batch.engine_lp,
            advantages=batch.advantages,
            mask=batch.mask,
            seq_index=batch.seq_index,
            num_seqs=len(batch.items),
            algorithm=self.spec.algorithm,
            logp_ref=batch.logp_ref,
        )
        self.optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), self.spec.optimizer.grad_clip
        )
        self.optimizer.step()
        self.model.eval()
        return float(loss.detach()), float(grad_norm), stats

    def _step(self, samples: Sequence[TrainSample]) -> StepStats:
        algorithm = self.spec.algorithm
        t0 = time.monotonic()
        # Every mini-batch's old logprobs come from the weights at the start of the step.
        batches = [
            self._prepare(samples[a:b])
            for a, b in minibatch_bounds(len(samples), algorithm.mini_batches)
        ]
        t1 = time.monotonic()
        losses: list[float] = []
        norms: list[float] = []
        updates: list[LossStats] = []
        for _ in range(algorithm.epochs):
            for batch in batches:
                loss, norm, stats = self._update(batch)
                losses.append(loss)
                norms.append(norm)
                updates.append(stats)
        t2 = time.monotonic()
        mismatch = mismatch_statistics(
            logp_old=torch.cat([b.logp_old for b in batches]),
            logp_engine=torch.cat([b.engine_lp for b in batches]),
            mask=torch.cat([b.mask for b in batches]),
            correction=algorithm.off_policy_correction,
        )
        return StepStats(
            loss=sum(losses) / len(losses),
            grad_norm=sum(norms) / len(norms),
            loss_stats=combine_updates(updates, mismatch),
            recompute_seconds=t1 - t0,
            update_seconds=t2 - t1,
            updates=updates,
        )

    # -- warm start (SFT) ----------------------------------------------------------------------

    def sft_step(self, batch: PackedBatch, *, lr: float) -> SFTStats:
        """One AdamW update of the warm-start stage on a packed batch: the mean negative
        logprob (temperature 1) of its trained tokens, each predicted from the tokens before
        it in its own conversation (one forward per conversation: no attention across the
        packing). Its own AdamW (``lr``; the other settings ``spec.optimizer``'s), so RL
        starts with fresh optimizer moments."""
        if not isinstance(self.adapter, HFModel):
            raise ValueError("the warm start trains HF models; the tiny policy has no template")
        optimizer = self.sft_step_optimizer(lr)
        trained = sum(batch.loss_mask)
        if trained == 0:
            raise ValueError("a warm-start batch without a trained token")
        with tiny.single_thread():
            self.model.train()
            total = torch.zeros(())
            for a, b in zip(batch.cu_seqlens, batch.cu_seqlens[1:], strict=False):
                ids = batch.token_ids[a:b]
                positions = [j for j in range(1, b - a) if batch.loss_mask[a + j]]
                if not positions:
                    continue
                logp = hf_model.token_logprobs(
                    self.model, [(ids, [(j, j + 1) for j in positions])], temperature=1.0
                )[0]
                total = total - logp.sum()
            loss = total / trained
            optimizer.zero_grad()
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(
                self.model.parameters(), self.spec.optimizer.grad_clip
            )
            optimizer.step()
            self.model.eval()
        return SFTStats(loss=float(loss.detach()), grad_norm=float(grad_norm), tokens=trained)

    def sft_step_optimizer(self, lr: float | None = None) -> torch.optim.Optimizer:
        """The warm start's AdamW, made on first use (``lr``, else the RL learning rate until
        a step sets it; the other settings ``spec.optimizer``'s)."""
        opt = self.spec.optimizer
        if self._sft_optimizer is None:
            self._sft_optimizer = torch.optim.AdamW(
                self.model.parameters(),
                lr=lr if lr is not None else opt.lr,
                betas=(opt.beta1, opt.beta2),
                weight_decay=opt.weight_decay,
            )
        if lr is not None:
            for group in self._sft_optimizer.param_groups:
                group["lr"] = lr
        return self._sft_optimizer

    def finish_warm_start(self) -> None:
        """RL starts from the warm-started weights: they become the KL reference, and the warm
        start's optimizer is dropped."""
        self._sft_optimizer = None
        if self.reference is not None:
            self.reference.load_state_dict(self.model.state_dict())

    # -- persistence -------------------------------------------------------------------------

    def export_weights(self, directory: Path) -> None:
        """Write the weights in the format the CPU engine loads (HF: safetensors and the
        tokenizer files)."""
        self.adapter.export(self.model, directory)

    def named_tensors(self) -> list[tuple[str, torch.Tensor]]:
        """The current weights as (name the engines load, tensor), for the distributed weight
        sync (:func:`agentrl.trainer.factories.build_weight_sync`)."""
        return self.adapter.named_tensors(self.model)

    def save_state(self, directory: Path) -> None:
        """Weights plus optimizer state (a checkpoint)."""
        self.export_weights(directory / "model")
        state: dict[str, Any] = {"optimizer": self.optimizer.state_dict()}
        if self.reference is not None:
            state["reference"] = self.reference.state_dict()
        if self._sft_optimizer is not None:
            state["sft_optimizer"] = self._sft_optimizer.state_dict()
        torch.save(state, directory / "optimizer.pt")

    def load_state(self, directory: Path) -> None:
        """Inverse of :meth:`save_state`."""
        self.model.load_state_dict(self.adapter.load(directory / "model").state_dict())
        state = torch.load(directory / "optimizer.pt", weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        if self.reference is not None and "reference" in state:
            self.reference.load_state_dict(state["reference"])
        if "sft_optimizer" in state:  # saved in the middle of the warm start
            self.sft_step_optimizer().load_state_dict(state["sft_optimizer"])
