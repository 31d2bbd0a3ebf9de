"""Checkpoints: the backend's weights and optimizer plus the driver's state (step, data order,
counters, restarts), written atomically every ``trainer.checkpoint.intervalSteps``.

A killed trainer resumes from the newest complete checkpoint: same step, same counters, and the
same data order — the tasks that were in flight when it was written are started again first,
then the order continues where it stopped. The counters agree with that replay: a trajectory is
counted when its group leaves the buffer (trained on or dropped), the moment its task leaves
``pending_positions``, so every task of the order is either counted once or pending (to be run
and counted after a resume), never both (:class:`Counters`). Layout::

    DIR/step-00000010/model/            weights (backend format)
    DIR/step-00000010/optimizer.pt      optimizer state
    DIR/step-00000010/driver.json       DriverState

The warm-start stage (:mod:`agentrl.trainer.warm_start`) checkpoints as step 0, rewriting it
as it goes; its progress is :attr:`DriverState.warm_start`.

A directory is renamed into place only once complete, so a crash mid-write leaves the previous
checkpoint as the newest. Callers: :mod:`agentrl.trainer.loop`, ``agentrl run --resume``.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, Field

from agentrl.api.rollout import TerminalClass
from agentrl.rollout.tool_health import ToolTally
from agentrl.rollout.trajectory import Trajectory

DRIVER_FILE = "driver.json"


class Counters(BaseModel):
    """Running totals over the whole job (they survive restarts), each trajectory counted once.

    A finished trajectory is counted when its group leaves the driver's buffer: trained on by a
    step, or dropped (no signal). Until then its task is pending, and a checkpoint written
    meanwhile restarts that task on resume: counting on arrival would count the group's
    trajectories in the checkpoint and again when the resumed run re-runs the task. Counted at
    that moment, the counters of a checkpoint cover exactly the tasks it does not replay. The
    cost: the figures trail by what waits in the buffer (at most about a step's worth)."""

    trajectories: int = 0
    """Finished trajectories of the groups trained on or dropped."""
    trained_trajectories: int = 0
    """Trajectories in a step (infra errors and ``drop`` classes left out)."""
    infra_errors: int = 0
    """Infra-error trajectories among ``trajectories`` (none of them trained on)."""
    infra_errors_in_training: int = 0
    """Infra-error trajectories that reached a loss: 0 by construction, counted to prove it."""
    dropped_groups: int = 0
    """Groups that left the buffer without training (fewer than two members with a reward,
    or equal rewards under ``dropAndRefill``)."""
    zero_variance_groups: int = 0
    """Groups whose rewards were all equal, counted when they left the buffer."""
    classes: dict[str, int] = Field(default_factory=dict)
    """Terminal class → trajectories (of ``trajectories``)."""
    tools: ToolTally = Field(default_factory=ToolTally)
    """Tool use over the same trajectories (``status.rollout.tools``); absent from a
    checkpoint written before it: counting starts again at the resume."""

    def add(self, trajectory: Trajectory) -> None:
        """Count one trajectory whose group left the buffer: ``trajectories``, ``classes``,
        ``infra_errors`` and ``tools``."""
        self.trajectories += 1
        cls = trajectory.terminal_class.value
        self.classes[cls] = self.classes.get(cls, 0) + 1
        self.tools.add(trajectory)
        if trajectory.terminal_class == TerminalClass.INFRA_ERROR:
            self.infra_errors += 1


class WarmStartProgress(BaseModel):
    """Where the warm-start stage is (:mod:`agentrl.trainer.warm_start`)."""

    epoch: int = 0
    """The epoch in progress (from 0; ``epochs`` once every one is done)."""
    batch: int = 0
    """Batches of that epoch trained."""
    updates: int = 0
    """Updates done over all epochs."""
    total_updates: int = 0
    """Updates of the whole stage (every epoch's batches)."""
    loss: float | None = None
    """Loss of the last update (mean negative logprob of its assistant tokens)."""
    first_loss: float | None = None
    """Loss of the first update."""
    trained_tokens: int = 0
    done: bool = False
    """Finished: RL has started (or starts) from its weights."""

    @property
    def fraction(self) -> float:
        """Share of the stage's updates done."""
        return 1.0 if self.done else self.updates / max(self.total_updates, 1)


class DriverState(BaseModel):
    """The driver's part of a checkpoint."""

    step: int = 0
    task_cursor: int = 0
    """Positions of the task order handed out so far."""
    pending_positions: list[int] = Field(default_factory=list)
    """Positions handed out but not yet trained on or dropped (restarted first on resume)."""
    restarts: int = 0
    """Times the trainer resumed from a checkpoint."""
    counters: Counters = Field(default_factory=Counters)
    infra_error_attempts: int = 0
    """Episode attempts that ended in an infra error, retried or not, counted when they end
    (``agentrl run``'s ``infra_errors``): they happened, so a replayed task's attempts add to
    them. Those after the newest checkpoint of a killed process are lost with it; absent from
    a checkpoint written before it (counting starts again at the resume)."""
    elapsed_seconds: float = 0.0
    """Wall time of the run before this checkpoint (summed over restarts)."""
    warm_start: WarmStartProgress | None = None
    """The warm-start stage's progress; None: the job has none (or it has not begun)."""


class Checkpointable(Protocol):
    """A backend's persistence surface."""

    def save_state(self, directory: Path) -> None: ...

    def load_state(self, directory: Path) -> None: ...


class CheckpointStore:
    """Numbered checkpoints under one directory; keeps the newest ``keep``."""

    def __init__(self, root: Path, *, keep: int = 3) -> None:
        self.root = root
        self.keep = keep

    def _dir(self, step: int) -> Path:
        return self.root / f"step-{step:08d}"

    def save(self, backend: Checkpointable, state: DriverState) -> Path:
        """Write a checkpoint of ``state.step``; returns its directory."""
        final = self._dir(state.step)
        tmp = self.root / f".tmp-{final.name}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        try:
            backend.save_state(tmp)
            (tmp / DRIVER_FILE).write_text(state.model_dump_json(indent=2))
        except BaseException:
            # a full volume: what was written of this try would only make the next one fail
            with contextlib.suppress(OSError):
                shutil.rmtree(tmp)
            raise
        if final.exists():  # the warm start rewrites step 0: the old one goes once replaced
            old = self.root / f".old-{final.name}"
            if old.exists():
                shutil.rmtree(old)
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old)
        else:
            tmp.rename(final)
        for old in self.steps()[: -self.keep]:
            shutil.rmtree(self._dir(old))
        return final

    def steps(self) -> list[int]:
        """Steps with a complete checkpoint, ascending."""
        if not self.root.is_dir():
            return []
        found = []
        for child in self.root.iterdir():
            if child.name.startswith("step-") and (child / DRIVER_FILE).is_file():
                found.append(int(child.name.removeprefix("step-")))
        return sorted(found)

    def latest(self) -> Path | None:
        steps = self.steps()
        return self._dir(steps[-1]) if steps else None

    def load(self, backend: Checkpointable, directory: Path | None = None) -> DriverState | None:
        """Restore the newest checkpoint (or ``directory``) into ``backend``; counts a restart."""
        directory = directory or self.latest()
        if directory is None:
            return None
        backend.load_state(directory)
        state = DriverState.model_validate_json((directory / DRIVER_FILE).read_text())
        state.restarts += 1
        return state
