"""The group buffer: finished trajectories waiting to be trained on.

Pacing is the other half of the asynchronous loop and lives in
:mod:`agentrl.rollout.admission` (the trainer owns the ``StalenessAdmission``): new episodes are
held back so none is trained on more than ``maxStaleness`` versions after it started, and
finished trajectories are never thrown away for being stale — a discard policy keeps the fast
(easy) tasks and loses the slow ones, biasing training toward what the policy already solves.

:class:`GroupBuffer` collects finished trajectories by group and hands the trainer complete
groups in the order they completed, as soon as enough are there for a step: the step never
waits for the slowest group in flight, only for ``trajectoriesPerStep`` worth of finished ones.

Callers: :mod:`agentrl.trainer.loop` (the driver).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from pydantic import BaseModel, Field

from agentrl.api.rollout import ClassAction
from agentrl.rollout.trajectory import Trajectory


class Group(BaseModel):
    """The attempts at one task that were started together."""

    group_id: str
    task_id: str
    policy_version: int
    """Version its first finished member was admitted under."""
    expected: int = Field(ge=1)
    """Episodes started for it; the group is complete when this many have ended."""
    trajectories: list[Trajectory] = Field(default_factory=list)
    completed_at: float | None = None

    @property
    def complete(self) -> bool:
        return len(self.trajectories) >= self.expected

    def trainable(self) -> list[Trajectory]:
        """Members that take part in the group statistics (everything but drops)."""
        return [t for t in self.trajectories if t.training_action != ClassAction.DROP]


class GroupBuffer:
    """Finished trajectories, grouped; complete groups in completion order."""

    def __init__(self, group_size: int) -> None:
        self.group_size = group_size
        self._open: dict[str, Group] = {}
        self._ready: OrderedDict[str, Group] = OrderedDict()

    def add(self, trajectory: Trajectory, *, now: float) -> Group | None:
        """File a finished trajectory; returns its group if that completed it."""
        group = self._open.get(trajectory.group_id)
        if group is None:
            if trajectory.group_id in self._ready:
                raise ValueError(f"group {trajectory.group_id} already has {self.group_size}")
            group = Group(
                group_id=trajectory.group_id,
                task_id=trajectory.task_id,
                policy_version=trajectory.policy_version,
                expected=self.group_size,
            )
            self._open[group.group_id] = group
        group.trajectories.append(trajectory)
        if group.complete:
            group.completed_at = now
            del self._open[group.group_id]
            self._ready[group.group_id] = group
            return group
        return None

    @property
    def ready_groups(self) -> int:
        return len(self._ready)

    @property
    def open_groups(self) -> list[Group]:
        return list(self._open.values())

    def ready(self) -> Iterable[Group]:
        """Complete groups, oldest completion first."""
        return list(self._ready.values())

    def pop(self, group_id: str) -> Group:
        """Take a complete group out of the buffer."""
        return self._ready.pop(group_id)
