"""Admission control: whether a new episode may start now, and under which policy version.

The trainer bounds staleness by *not starting* episodes that would be too old when trained on,
never by throwing finished work away (discarding biases training towards fast tasks). With
``B = trainer.trajectoriesPerStep``, ``S = trainer.async.maxStaleness`` and the trainer at policy
version ``v``, at most ``(S + v + 1) · B`` episodes may have been admitted in total; episodes
dropped for infra errors give their slot back (they will never be trained on).

With ``group_size`` G, a GRPO group is admitted whole: its first episode starts only if all G fit
under the limit, and the rest of a started group are always admitted (the scheduler hands out a
group's episodes one after another). So no group is ever left half-admitted waiting for the
trainer, which matters because the trainer in turn may wait for an old group to finish before it
advances (the hard staleness bound, :mod:`agentrl.trainer.loop`); without whole groups the two
could wait for each other.

This limit is the pacing of the normal case: it keeps at most about ``(S + 1) · B`` episodes
outstanding, so they are consumed within ``S`` versions unless one is much slower than the rest.
The trainer's gate makes the bound hard for that rare straggler.

Callers: the trainer owns the :class:`StalenessAdmission` and calls
:meth:`~StalenessAdmission.set_policy_version` after each weight sync; the scheduler calls
:meth:`~Admission.try_admit` before every episode and :meth:`~Admission.release` for dropped ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from agentrl.rollout import metrics


class Admission(Protocol):
    """The scheduler's view of admission control."""

    def try_admit(self) -> int | None:
        """The policy version a new episode starts under, or None to hold it back."""
        ...

    def release(self) -> None:
        """An admitted episode will never be trained on (dropped); free its slot."""
        ...

    def subscribe(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` whenever admission may have opened up."""
        ...


class _Notifier:
    def __init__(self) -> None:
        self._subscribers: list[Callable[[], None]] = []

    def subscribe(self, wake: Callable[[], None]) -> None:
        self._subscribers.append(wake)

    def _notify(self) -> None:
        for wake in self._subscribers:
            wake()


class OpenAdmission(_Notifier):
    """Admit everything (evaluation, ``tasks validate``, benchmarks); the version is settable."""

    def __init__(self, policy_version: int = 0) -> None:
        super().__init__()
        self.policy_version = policy_version

    def set_policy_version(self, version: int) -> None:
        self.policy_version = version
        self._notify()

    def try_admit(self) -> int | None:
        return self.policy_version

    def release(self) -> None:
        return None


class StalenessAdmission(_Notifier):
    """Admit whole groups while ``admitted + group_size ≤ (max_staleness + version + 1) ×
    trajectories_per_step``; the other episodes of a started group always."""

    def __init__(
        self,
        *,
        trajectories_per_step: int,
        max_staleness: int,
        policy_version: int = 0,
        group_size: int = 1,
    ) -> None:
        super().__init__()
        if trajectories_per_step < 1:
            raise ValueError("trajectories_per_step must be at least 1")
        if group_size < 1:
            raise ValueError("group_size must be at least 1")
        self.trajectories_per_step = trajectories_per_step
        self.max_staleness = max_staleness
        self.policy_version = policy_version
        self.group_size = group_size
        self.admitted = 0
        """Episodes admitted so far, minus those released."""
        self._owed = 0
        """Episodes of the last started group not admitted yet."""

    @property
    def capacity(self) -> int:
        """Episodes that may have been admitted by now in total."""
        return (self.max_staleness + self.policy_version + 1) * self.trajectories_per_step

    def set_policy_version(self, version: int) -> None:
        """The trainer synced weights of ``version`` to the engines."""
        self.policy_version = version
        self._notify()

    def resume_at(self, step: int) -> None:
        """A run resumed from the checkpoint of ``step``: the engines hold that step's weights
        and every episode of the steps before it counts as admitted (nothing is outstanding
        after a restart: the checkpoint holds no trajectory in flight)."""
        self.policy_version = step
        self.admitted = step * self.trajectories_per_step
        self._owed = 0
        self._notify()

    def try_admit(self) -> int | None:
        if self._owed == 0:
            # A new group: only if the whole group fits (a group smaller than the limit
            # itself would never fit, so the limit then counts for one group at a time).
            need = min(self.group_size, self.capacity)
            if self.admitted + need > self.capacity:
                metrics.ADMISSION_BLOCKED.set(1)
                return None
            self._owed = self.group_size
        metrics.ADMISSION_BLOCKED.set(0)
        self._owed -= 1
        self.admitted += 1
        return self.policy_version

    def release(self) -> None:
        self.admitted = max(0, self.admitted - 1)
        self._notify()
