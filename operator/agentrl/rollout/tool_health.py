"""Tool health: how the agent used its tools over a window of finished episodes, the figures of
``status.rollout.tools`` and of ``tools`` in ``steps.jsonl`` and ``summary.json``.

:class:`ToolTally` sums what each :class:`~agentrl.rollout.trajectory.Trajectory` records
(:class:`~agentrl.rollout.trajectory.ToolUse`, its turns, its end reason); the sums add up, so
one tally can run over the whole job (the driver keeps it in its checkpointed counters, the
window of the status's other rollout rates) and another over the episodes since the last step.
:meth:`ToolTally.health` turns a tally into the reported :class:`agentrl.api.wire.ToolHealth`:

* ``callsPerEpisode``: tool calls / episodes;
* ``parseFailureRate``: replies whose calls could not be read / replies;
* ``noToolCallRate``: replies that called no tool / replies;
* ``submitRate``: episodes ended by ``submit`` / episodes;
* ``prefixBreakRate``: episodes with a prefix break / episodes whose prefix was checked
  (native tool calls);
* ``endReasons``: episodes per :class:`~agentrl.rollout.trajectory.EndReason`.

Infra-error episodes are counted in ``endReasons`` only: a failed sandbox, engine or verifier
says nothing about the agent, so they are in no denominator. A rate whose denominator is 0 is
None (unknown), never 0 (which would read as healthy).

Pure and torch-free. Callers: :mod:`agentrl.trainer.loop` (the driver),
:mod:`agentrl.trainer.progress`, :mod:`agentrl.local.report`.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, Field

from agentrl.api.wire import EndReasonCounts, ToolHealth
from agentrl.rollout.trajectory import EndReason, Trajectory


def _rate(part: int, whole: int) -> float | None:
    return part / whole if whole else None


class ToolTally(BaseModel):
    """Sums over episodes, from which :meth:`health` computes the rates; JSON in the driver's
    checkpoint (``driver.json``), so a resumed run goes on counting."""

    episodes: int = 0
    """Episodes added that were not infra errors."""
    replies: int = 0
    """The model's replies (one turn each) in those episodes."""
    calls: int = 0
    """Tool calls read from those replies."""
    call_errors: int = 0
    """Replies whose calls could not be read."""
    turns_without_call: int = 0
    """Replies that called no tool."""
    checked_episodes: int = 0
    """Episodes checked against the template's rendering (native tool calls; the prefix
    check's denominator)."""
    prefix_breaks: int = 0
    """Checked episodes whose tokens broke from the template's rendering."""
    end_reasons: dict[str, int] = Field(default_factory=dict)
    """End reason (:class:`EndReason` value) → episodes, infra errors included."""

    @classmethod
    def of(cls, trajectories: Iterable[Trajectory]) -> ToolTally:
        """The tally of a window of trajectories."""
        tally = cls()
        for trajectory in trajectories:
            tally.add(trajectory)
        return tally

    def add(self, trajectory: Trajectory) -> None:
        """Count one finished episode."""
        reason = trajectory.end_reason
        self.end_reasons[reason.value] = self.end_reasons.get(reason.value, 0) + 1
        if reason == EndReason.INFRA_ERROR:
            return
        use = trajectory.tool_use
        self.episodes += 1
        self.replies += trajectory.num_turns
        self.calls += use.calls
        self.call_errors += use.call_errors
        self.turns_without_call += use.turns_without_call
        if use.prefix_checked:
            self.checked_episodes += 1
            self.prefix_breaks += use.prefix_break is not None

    def health(self) -> ToolHealth | None:
        """The reported figures; None when no episode was added at all."""
        if not self.end_reasons:
            return None
        submitted = self.end_reasons.get(EndReason.SUBMITTED.value, 0)
        return ToolHealth(
            episodes=self.episodes,
            replies=self.replies,
            calls_per_episode=_rate(self.calls, self.episodes),
            parse_failure_rate=_rate(self.call_errors, self.replies),
            no_tool_call_rate=_rate(self.turns_without_call, self.replies),
            submit_rate=_rate(submitted, self.episodes),
            prefix_break_rate=_rate(self.prefix_breaks, self.checked_episodes),
            end_reasons=EndReasonCounts.model_validate(self.end_reasons),
        )


def tool_health(trajectories: Iterable[Trajectory]) -> ToolHealth | None:
    """The tool health of a window of trajectories (None: an empty window)."""
    return ToolTally.of(trajectories).health()
