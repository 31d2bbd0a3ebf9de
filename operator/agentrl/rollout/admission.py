"""Admission control: whether a new episode may start now, and under which policy version.

The trainer bounds staleness by *not starting* episodes that would be too old when trained on,
never by throwing finished work away (discarding biases training towards fast tasks). With
``B = trainer.trajectoriesPerStep``, ``S = trainer.async.maxStaleness`` and the trainer at policy
version ``v``, at most ``(S + v + 1) · B`` episodes may have been admitted in total; episodes
dropped for infra errors give their slot back (they will never be trained on).

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
    """Admit while ``admitted < (max_staleness + version + 1) × trajectories_per_step``."""

    def __init__(
        self, *, trajectories_per_step: int, max_staleness: int, policy_version: int = 0
    ) -> None:
        super().__init__()
        if trajectories_per_step < 1:
            raise ValueError("trajectories_per_step must be at least 1")
        self.trajectories_per_step = trajectories_per_step
        self.max_staleness = max_staleness
        self.policy_version = policy_version
        self.admitted = 0
        """Episodes admitted so far, minus those released."""

    @property
    def capacity(self) -> int:
        """Episodes that may have been admitted by now in total."""
        return (self.max_staleness + self.policy_version + 1) * self.trajectories_per_step

    def set_policy_version(self, version: int) -> None:
        """The trainer synced weights of ``version`` to the engines."""
        self.policy_version = version
        self._notify()

    def try_admit(self) -> int | None:
        if self.admitted >= self.capacity:
            metrics.ADMISSION_BLOCKED.set(1)
            return None
        metrics.ADMISSION_BLOCKED.set(0)
        self.admitted += 1
        return self.policy_version

    def release(self) -> None:
        self.admitted = max(0, self.admitted - 1)
        self._notify()
