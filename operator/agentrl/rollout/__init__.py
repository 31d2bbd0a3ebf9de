"""The rollout tier: tasks, episodes, sandboxes' users, rewards and the scheduler that keeps the
configured concurrency in flight.

Modules: ``tasks`` (datasets), ``trajectory`` (the type the trainer consumes), ``agent`` (the
scaffolds), ``tools``, ``caps``, ``verifier``, ``episode`` (one episode, its terminal class and
retries), ``balancer`` (engines), ``admission`` (staleness bound), ``scheduler``, ``runtime``
(everything wired from a spec), ``metrics``, ``validate`` and ``cli`` (``agentrl tasks``).
See ``docs/rollout.md``.
"""

from agentrl.rollout.trajectory import Timings, Trajectory, TruncationCap, TurnRecord

__all__ = ["Timings", "Trajectory", "TruncationCap", "TurnRecord"]
