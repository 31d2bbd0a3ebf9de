"""The warm-start stage (``spec.trainer.warmStart``): supervised fine-tuning before RL.

What it does, in order:

1. reads ``warmStart.dataset`` with the rollout's own turn tokenizer (template, tools, tool-call
   parser: :func:`agentrl.rollout.conversations.read_warm_start`). A refused line stops the job
   before anything is trained (:class:`WarmStartDataError` lists every one with its line), so a
   bad line never reaches the loss silently;
2. trains ``epochs`` passes of packed batches (:func:`agentrl.trainer.sft_batches.
   epoch_batches`, the order drawn from ``warmStart.seed`` per epoch), one
   ``backend.sft_step(batch, lr=warmStart.lr)`` each;
3. checkpoints every ``trainer.checkpoint.intervalSteps`` updates and at the end of each epoch
   (a checkpoint of step 0 whose :class:`~agentrl.trainer.checkpoint.DriverState` carries the
   stage's :class:`~agentrl.trainer.checkpoint.WarmStartProgress`): a restarted trainer resumes
   at the next batch of the same epoch, with the same weights and warm-start optimizer moments,
   and trains the same batches an uninterrupted run would;
4. ends with ``backend.finish_warm_start()`` (the SFT weights become the KL reference) and a
   checkpoint marked done, so a restart during RL never repeats it.

Progress (:class:`~agentrl.trainer.checkpoint.WarmStartProgress`: updates done of the total, last
loss) goes to ``on_progress`` after every update; the trainer pod turns it into the
``agentrl.dev/progress`` annotation (status: stage ``WarmingUp``), ``agentrl run`` into its
display. The caller then pushes the weights to the engines (the engines serve the SFT weights
before the first rollout) and starts RL: :func:`agentrl.trainer.assembly.warm_up`.

Callers: :mod:`agentrl.trainer.assembly` (for both the trainer pod and ``agentrl run``), tests.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from agentrl.api.trainer import TrainerSpec, WarmStartSpec
from agentrl.rollout.conversations import WarmStartReport
from agentrl.trainer.checkpoint import CheckpointStore, DriverState, WarmStartProgress
from agentrl.trainer.sft_batches import SFTBatch, epoch_batches

log = logging.getLogger(__name__)

WARM_START_LOG = "warm_start.jsonl"
"""One line per warm-start update, beside ``steps.jsonl``."""


class WarmStartDataError(ValueError):
    """The warm-start file has lines the job would not train on."""


class SFTBackend(Protocol):
    """What the stage needs of a backend (:class:`agentrl.trainer.torch_backend.TorchBackend`)."""

    def sft_step(self, batch: SFTBatch, *, lr: float) -> Any:
        """One update; returns stats with ``loss``, ``grad_norm`` and ``tokens``."""
        ...

    def finish_warm_start(self) -> None: ...

    def save_state(self, directory: Path) -> None: ...

    def load_state(self, directory: Path) -> None: ...


def checked_conversations(report: WarmStartReport, path: str) -> WarmStartReport:
    """``report`` when every line is good; else :class:`WarmStartDataError` naming each refused
    line (``FILE:LINE: reason``) and the check to run before the job starts."""
    if report.errors:
        lines = "\n".join(e.render(path) for e in report.errors[:20])
        more = len(report.errors) - 20
        raise WarmStartDataError(
            f"spec.trainer.warmStart.dataset has {len(report.errors)} refused line(s) of "
            f"{len(report.errors) + len(report.conversations)}:\n{lines}"
            + (f"\n… and {more} more" if more > 0 else "")
            + "\nFix or drop them; `agentrl tasks validate --manifest JOB.yaml --warm-start "
            "FILE` checks the file before the job starts."
        )
    if not report.conversations:
        raise WarmStartDataError(f"spec.trainer.warmStart.dataset {path} has no conversation")
    return report


class WarmStart:
    """The stage over conversations already read and checked; see the module docstring."""

    def __init__(
        self,
        spec: WarmStartSpec,
        trainer: TrainerSpec,
        report: WarmStartReport,
        *,
        backend: SFTBackend,
        checkpoints: CheckpointStore,
        state: DriverState,
        log_path: Path | None = None,
        on_progress: Callable[[WarmStartProgress], None] | None = None,
    ) -> None:
        self.spec = spec
        self.conversations = report.conversations
        self.backend = backend
        self.checkpoints = checkpoints
        self.state = state
        self.checkpoint_every = trainer.checkpoint.interval_steps
        self.log_path = log_path
        self.on_progress = on_progress
        self.batches_per_epoch = [len(self._batches(epoch)) for epoch in range(spec.epochs)]
        if state.warm_start is None:
            state.warm_start = WarmStartProgress(total_updates=sum(self.batches_per_epoch))

    @property
    def progress(self) -> WarmStartProgress:
        assert self.state.warm_start is not None
        return self.state.warm_start

    def _batches(self, epoch: int) -> list[SFTBatch]:
        return epoch_batches(
            self.conversations,
            tokens_per_batch=self.spec.tokens_per_batch,
            seed=self.spec.seed,
            epoch=epoch,
        )

    def run(self, *, should_stop: Callable[[], bool] = lambda: False) -> WarmStartProgress:
        """Train what is left of the stage (nothing when it is done). ``should_stop``: asked
        before every update; when it answers True the stage checkpoints where it is and
        returns unfinished (a SIGTERM)."""
        progress = self.progress
        if progress.done:
            return progress
        self._truncate_log(progress.updates)
        if progress.updates:
            log.info(
                "resuming the warm start at epoch %d, batch %d (%d of %d updates done)",
                progress.epoch + 1,
                progress.batch + 1,
                progress.updates,
                progress.total_updates,
            )
        while progress.epoch < self.spec.epochs:
            batches = self._batches(progress.epoch)
            while progress.batch < len(batches):
                if should_stop():
                    self._checkpoint()
                    return progress
                self._update(batches[progress.batch])
                if progress.updates % self.checkpoint_every == 0:
                    self._checkpoint()
            progress.epoch += 1
            progress.batch = 0
            self._checkpoint()
        self.backend.finish_warm_start()
        progress.done = True
        self._checkpoint()
        log.info(
            "warm start done: %d updates over %d epochs, loss %.4f → %.4f",
            progress.updates,
            self.spec.epochs,
            progress.first_loss or 0.0,
            progress.loss or 0.0,
        )
        return progress

    def _update(self, batch: SFTBatch) -> None:
        progress = self.progress
        started = time.monotonic()
        stats = self.backend.sft_step(batch, lr=self.spec.lr)
        progress.batch += 1
        progress.updates += 1
        progress.loss = float(stats.loss)
        if progress.first_loss is None:
            progress.first_loss = progress.loss
        progress.trained_tokens += int(stats.tokens)
        if self.log_path is not None:
            line = {
                "update": progress.updates,
                "epoch": progress.epoch,
                "batch": progress.batch,
                "loss": progress.loss,
                "grad_norm": float(stats.grad_norm),
                "tokens": int(stats.tokens),
                "conversations": len(batch.lines),
                "seconds": time.monotonic() - started,
            }
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(line, sort_keys=True) + "\n")
        if self.on_progress is not None:
            self.on_progress(progress.model_copy())

    def _truncate_log(self, updates: int) -> None:
        """Drop the log lines of updates after the checkpoint resumed from (they are trained
        again); a fresh stage starts an empty log."""
        if self.log_path is None or not self.log_path.exists():
            return
        kept = [
            line
            for line in self.log_path.read_text(encoding="utf-8").splitlines()
            if line.strip() and json.loads(line)["update"] <= updates
        ]
        self.log_path.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")

    def _checkpoint(self) -> None:
        self.checkpoints.save(self.backend, self.state)
