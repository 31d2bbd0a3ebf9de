"""Checkpoint saves that fail: retried with backoff, counted, reported, and never silent.

A save (:meth:`agentrl.trainer.checkpoint.CheckpointStore.save`) that raises — a full volume, a
permission refused, a storage I/O error — is tried ``spec.trainer.checkpoint.saveAttempts``
times in all, waiting ``retryBackoffSeconds`` before the second try and twice as long before
each further one (:class:`SavePolicy`); a failed try leaves no partial directory behind. A save
still failing after its last try counts one failed save (:class:`CheckpointSaver`):

* ``agentrl_trainer_checkpoint_save_failures_total`` counts failed saves,
  ``agentrl_trainer_checkpoint_save_retries_total`` the tries after the first, and
  ``agentrl_trainer_checkpoint_consecutive_failures`` holds the failed saves in a row (0 once
  a save succeeds; the chart's ``AgentRLCheckpointSaveFailing`` alert reads it);
  ``agentrl_trainer_checkpoint_step`` is the step of the newest checkpoint written;
* :attr:`CheckpointSaver.failure` (a :class:`~agentrl.api.wire.CheckpointSaveFailure`: the
  count in a row, the step, the last error) goes into the driver's ``agentrl.dev/progress``
  annotation, which the operator turns into ``CheckpointSaved=False`` and
  ``Degraded``/``CheckpointSaveFailing`` at the next reconcile;
* the trainer's log has a line per failed try and one per failed save.

What happens next (the driver, :mod:`agentrl.trainer.loop`):

* **At an interval, training goes on.** The steps since the last checkpoint are at risk (a
  crash would repeat them) but none is lost yet, and the next interval saves again: a checkpoint
  then covers them. Stopping here would throw them away for certain.
* **After ``checkpoint.maxFailedSaves`` failed saves in a row**, :class:`CheckpointSaveError`
  is raised: the trainer exits with an error, and the operator restarts it from the last
  checkpoint (one restart of ``trainer.backoffLimit``; a cause that persists ends in
  ``Failed`` with this error in the trainer's last words). Training on without saving would
  spend GPU hours on steps that cannot be kept.
* **A save at the end of training or at a stop** has no later interval to make up for it: it
  raises after its tries (``final``), so a job never completes, nor suspends as if saved, on a
  checkpoint it did not write.

Callers: :mod:`agentrl.trainer.loop` (the driver).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from prometheus_client import Counter, Gauge
from pydantic import BaseModel, ConfigDict, Field

from agentrl.api.trainer import Checkpoint as CheckpointSpec
from agentrl.api.wire import CHECKPOINT_SAVE_ERROR_CHARS, CheckpointSaveFailure
from agentrl.trainer.checkpoint import Checkpointable, CheckpointStore, DriverState

log = logging.getLogger(__name__)

SAVE_FAILURES = Counter(
    "agentrl_trainer_checkpoint_save_failures",
    "Checkpoint saves that failed after every try (checkpoint.saveAttempts).",
)
SAVE_RETRIES = Counter(
    "agentrl_trainer_checkpoint_save_retries",
    "Tries of a checkpoint save after its first (with backoff between them).",
)
CONSECUTIVE_FAILURES = Gauge(
    "agentrl_trainer_checkpoint_consecutive_failures",
    "Checkpoint saves in a row that failed (0 once one succeeds).",
)
CHECKPOINT_STEP = Gauge(
    "agentrl_trainer_checkpoint_step",
    "Step of the newest checkpoint the trainer wrote.",
)

#: Sleeps ``seconds`` (``asyncio.sleep``; tests pass a fake clock's).
Sleep = Callable[[float], Awaitable[None]]


class CheckpointSaveError(RuntimeError):
    """Checkpoint saves failed once too often: ``maxFailedSaves`` in a row, or a final one.
    The trainer exits with it (the operator restarts it from the last checkpoint)."""

    def __init__(self, failure: CheckpointSaveFailure, *, last_checkpoint: int, why: str) -> None:
        super().__init__(
            f"checkpoint save of step {failure.step} failed ({failure.failures} in a row, "
            f"{why}): {failure.error}; the last checkpoint is step {last_checkpoint}"
        )
        self.failure = failure


class SavePolicy(BaseModel):
    """How often one save is tried, the waits between tries, and how many failed saves in a
    row the trainer goes on after."""

    model_config = ConfigDict(frozen=True)

    attempts: int = Field(default=3, ge=1)
    """Tries of one save (``checkpoint.saveAttempts``)."""
    backoff_seconds: float = Field(default=2.0, ge=0.0)
    """Wait before the second try; doubled before each further one
    (``checkpoint.retryBackoffSeconds``)."""
    max_failed_saves: int = Field(default=3, ge=1)
    """Failed saves in a row at which the trainer gives up (``checkpoint.maxFailedSaves``)."""

    @classmethod
    def from_spec(cls, spec: CheckpointSpec) -> SavePolicy:
        """The policy of ``spec.trainer.checkpoint``."""
        return cls(
            attempts=spec.save_attempts,
            backoff_seconds=spec.retry_backoff_seconds,
            max_failed_saves=spec.max_failed_saves,
        )

    def waits(self) -> list[float]:
        """The wait before each try after the first: ``b, 2b, 4b, ...``."""
        return [self.backoff_seconds * 2**i for i in range(self.attempts - 1)]


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text[:CHECKPOINT_SAVE_ERROR_CHARS]


class CheckpointSaver:
    """Saves into a :class:`CheckpointStore` under a :class:`SavePolicy`, keeping the failed
    saves in a row (:attr:`failure`) and the metrics above."""

    def __init__(
        self, store: CheckpointStore, policy: SavePolicy, *, sleep: Sleep | None = None
    ) -> None:
        """``sleep``: between tries; None is ``asyncio.sleep`` (tests pass a fake clock's)."""
        self.store = store
        self.policy = policy
        self.sleep: Sleep = sleep or asyncio.sleep
        self.failure: CheckpointSaveFailure | None = None
        """The saves failing now (None: the last save succeeded, or none failed yet)."""
        CONSECUTIVE_FAILURES.set(0)

    async def save(
        self,
        backend: Checkpointable,
        state: DriverState,
        *,
        last_checkpoint: int,
        final: bool = False,
    ) -> Path | None:
        """Write a checkpoint of ``state``; its directory, or None when every try failed and
        training may go on (the failure is counted, logged and in :attr:`failure`).

        Raises:
            CheckpointSaveError: every try failed and this is the ``max_failed_saves``-th
                failed save in a row, or a ``final`` one (the end of training, a stop).
        """
        outcome = await self._tries(backend, state)
        if isinstance(outcome, Path):
            if self.failure is not None:
                log.warning(
                    "checkpoint of step %d saved after %d failed saves in a row",
                    state.step,
                    self.failure.failures,
                )
            self.failure = None
            CONSECUTIVE_FAILURES.set(0)
            CHECKPOINT_STEP.set(state.step)
            return outcome
        error = outcome
        failures = (self.failure.failures if self.failure is not None else 0) + 1
        self.failure = CheckpointSaveFailure(failures=failures, step=state.step, error=error)
        SAVE_FAILURES.inc()
        CONSECUTIVE_FAILURES.set(failures)
        log.error(
            "checkpoint save of step %d failed after %d tries (%d failed saves in a row; the "
            "trainer gives up at %d; the last checkpoint is step %d): %s",
            state.step,
            self.policy.attempts,
            failures,
            self.policy.max_failed_saves,
            last_checkpoint,
            error,
        )
        if final:
            raise CheckpointSaveError(
                self.failure, last_checkpoint=last_checkpoint, why="no later save makes up for it"
            )
        if failures >= self.policy.max_failed_saves:
            raise CheckpointSaveError(
                self.failure,
                last_checkpoint=last_checkpoint,
                why=f"checkpoint.maxFailedSaves is {self.policy.max_failed_saves}",
            )
        return None

    async def _tries(self, backend: Checkpointable, state: DriverState) -> Path | str:
        """Try the save up to ``attempts`` times: the checkpoint's directory once one
        succeeds, else the last try's error."""
        waits = self.policy.waits()
        attempt = 0
        while True:
            try:
                return self.store.save(backend, state)
            except Exception as exc:  # a failed save is counted and reported, never silent
                error = _describe(exc)
            if attempt == len(waits):
                return error
            log.warning(
                "checkpoint save of step %d failed (try %d of %d), trying again in %.1f s: %s",
                state.step,
                attempt + 1,
                self.policy.attempts,
                waits[attempt],
                error,
            )
            SAVE_RETRIES.inc()
            await self.sleep(waits[attempt])
            attempt += 1
