"""The built-in sandbox-concurrency autoscaler (``spec.sandbox.autoscale``): one pure decision
from the engines' load, the sandbox pods that wait, the current concurrency and the clock.

The controller calls :func:`decide` on each reconcile of a job whose autoscaler is enabled,
with :class:`EngineMetrics` gathered by ``agentrl.controller.engine_metrics`` (SGLang's
``/metrics`` of every ready engine, or the synthetic-metrics hook in tests), and, when the
decision moves, writes the new number through the job's ``/scale`` subresource, records
:func:`record_move` in ``status.sandbox`` and posts :func:`move_event`. It never writes
``spec.sandbox.concurrency`` while the autoscaler is disabled: then a person, an HPA or KEDA
owns the field, and the two never fight.

The rule, per decision (engines are taken as one pool: the rollout tier balances requests over
them, so the mean is what more concurrency would add to):

* **Lower** when the engines saturate or sandboxes wait — any of: more requests queued per
  engine than ``targets.queueDepthPerEngine``; KV-cache usage (``sglang:token_usage``) above
  ``targets.kvCacheUsage``; sandbox pods the scheduler cannot place. The proposal is the lowest
  of: one full ``maxStepDown`` (a queue means requests wait whatever their number), the
  concurrency that brings KV usage back to target (``current × target / usage``), and the
  concurrency minus the unplaceable sandboxes.
* **Raise** while every engine signal has headroom — KV usage below its target, running
  requests below ``targets.runningRequestsShare × inference.maxRunningRequests`` and the queue
  within its target. The proposal tracks the tighter target proportionally, as an HPA does:
  ``ceil(current × min(kv target / kv usage, running target / running))``.
* Otherwise **hold**, saying which target has been reached.

Every move is bounded by ``maxStepUp``/``maxStepDown`` and ``[min, max]``, and none happens
within ``cooldownSeconds`` of the last (``status.sandbox.lastScaleTime``). Each decision carries
one sentence with the numbers behind it; that sentence becomes ``status.sandbox.lastScaleReason``
and the Event's message.
"""

from __future__ import annotations

import math
from datetime import datetime
from enum import StrEnum
from typing import Final

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from agentrl.api import AgentRLJob, AgentRLJobStatus, Reason
from agentrl.reconcile.constants import Component
from agentrl.reconcile.observed import Observed
from agentrl.reconcile.status import Event, format_time

#: Event reasons of the autoscaler's moves.
REASON_RAISED: Final = "SandboxConcurrencyRaised"
REASON_LOWERED: Final = "SandboxConcurrencyLowered"
REASON_BOUNDED: Final = "SandboxConcurrencyBounded"

#: Decimal places a proportional target is rounded to before ``ceil``/``floor``, so that float
#: noise (0.7 / 0.35 = 2.0000000000000004) never adds a sandbox.
_RATIO_DIGITS: Final = 6


class _Metrics(BaseModel):
    """camelCase JSON (the synthetic-metrics annotation), unknown keys refused."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class EngineSample(_Metrics):
    """One engine's load, read from its SGLang ``/metrics``."""

    pod: str = Field(min_length=1)
    """The engine pod."""
    running_requests: float = Field(ge=0)
    """``sglang:num_running_reqs``: requests being decoded."""
    queued_requests: float = Field(ge=0)
    """``sglang:num_queue_reqs``: requests waiting for a slot."""
    token_usage: float = Field(ge=0)
    """``sglang:token_usage``: KV-cache occupancy, 0 to 1."""


class EngineMetrics(_Metrics):
    """What the autoscaler decides from: every ready engine's load and the sandboxes that
    wait."""

    engines: tuple[EngineSample, ...] = ()
    """One sample per ready engine that answered; empty when none did."""
    sandboxes_pending: int = Field(default=0, ge=0)
    """Sandbox pods created but not running yet (scheduling, pulling the image, starting)."""
    sandboxes_unschedulable: int = Field(default=0, ge=0)
    """Of those, pods the scheduler cannot place (no node has room): the cluster holds fewer
    sandboxes than the concurrency asks for."""

    @property
    def mean_running(self) -> float:
        """Mean running requests per engine."""
        return _mean([e.running_requests for e in self.engines])

    @property
    def mean_queued(self) -> float:
        """Mean queued requests per engine."""
        return _mean([e.queued_requests for e in self.engines])

    @property
    def mean_token_usage(self) -> float:
        """Mean KV-cache usage."""
        return _mean([e.token_usage for e in self.engines])


class ScaleDirection(StrEnum):
    """Which way a decision moves concurrency."""

    UP = "up"
    DOWN = "down"
    HOLD = "hold"


class ScaleDecision(BaseModel):
    """One decision of the autoscaler."""

    model_config = ConfigDict(frozen=True)

    concurrency: int | None
    """The concurrency to write through ``/scale``; None leaves it as it is."""
    direction: ScaleDirection
    """Up, down or hold."""
    reason: str
    """One sentence with the numbers: ``status.sandbox.lastScaleReason`` and the Event."""
    recheck_after_seconds: float | None = None
    """When a decision could next move (the cooldown's end); None when the autoscaler is off."""
    event_reason: str | None = None
    """The Event's reason for a move (:data:`REASON_RAISED`, ...); None for a hold."""

    @property
    def moved(self) -> bool:
        """Whether the controller has something to write."""
        return self.concurrency is not None


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _hold(reason: str, recheck: float | None = None) -> ScaleDecision:
    return ScaleDecision(
        concurrency=None,
        direction=ScaleDirection.HOLD,
        reason=reason,
        recheck_after_seconds=recheck,
    )


def _fmt(value: float) -> str:
    """A figure for a sentence: integers plainly, others with up to two decimals."""
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.2f}".rstrip("0").rstrip(".")


def count_waiting_sandboxes(observed: Observed) -> tuple[int, int]:
    """``(pending, unschedulable)`` sandbox pods in ``observed``, for
    :attr:`EngineMetrics.sandboxes_pending` and :attr:`EngineMetrics.sandboxes_unschedulable`."""
    pods = observed.pods_of(Component.SANDBOX)
    pending = [p for p in pods if p.phase == "Pending"]
    unschedulable = [
        p
        for p in pending
        if (c := p.condition("PodScheduled")) is not None
        and c.status == "False"
        and c.reason == Reason.UNSCHEDULABLE
    ]
    return len(pending), len(unschedulable)


def _pressure(job: AgentRLJob, m: EngineMetrics, current: int) -> list[tuple[int, str]]:
    """Why to lower: ``(proposed concurrency, the reason in words)`` per signal that fires."""
    targets = job.spec.sandbox.autoscale.targets
    step = job.spec.sandbox.autoscale.max_step_down
    out: list[tuple[int, str]] = []
    queued, usage = m.mean_queued, m.mean_token_usage
    if queued > targets.queue_depth_per_engine:
        out.append(
            (
                current - step,
                f"{_fmt(queued)} requests queued per engine > target "
                f"{targets.queue_depth_per_engine}",
            )
        )
    if usage > targets.kv_cache_usage:
        proposal = math.floor(round(current * targets.kv_cache_usage / usage, _RATIO_DIGITS))
        out.append(
            (
                proposal,
                f"KV-cache usage {_fmt(usage)} > target {_fmt(targets.kv_cache_usage)} "
                f"(back to target at about {proposal})",
            )
        )
    if m.sandboxes_unschedulable > 0:
        n = m.sandboxes_unschedulable
        out.append(
            (
                current - n,
                f"{n} sandbox pod{'s' if n != 1 else ''} cannot be scheduled",
            )
        )
    return out


def _lower(job: AgentRLJob, current: int, pressure: list[tuple[int, str]]) -> ScaleDecision:
    auto = job.spec.sandbox.autoscale
    why = "; ".join(text for _, text in pressure)
    proposal = min(p for p, _ in pressure)
    new = max(proposal, current - auto.max_step_down, auto.min)
    cooldown = float(auto.cooldown_seconds)
    if new >= current:
        return _hold(
            f"holding concurrency at {current}, the autoscale minimum, although engines are "
            f"saturated or sandboxes wait: {why}",
            cooldown,
        )
    limits = []
    if new > proposal and new == current - auto.max_step_down:
        limits.append(f"limited to maxStepDown {auto.max_step_down}")
    if new > proposal and new == auto.min:
        limits.append(f"limited by autoscale.min {auto.min}")
    tail = f" ({', '.join(limits)})" if limits else ""
    return ScaleDecision(
        concurrency=new,
        direction=ScaleDirection.DOWN,
        event_reason=REASON_LOWERED,
        reason=f"lowered sandbox concurrency {current} → {new} ({new - current:+d}){tail}: {why}",
        recheck_after_seconds=cooldown,
    )


def _raise(job: AgentRLJob, m: EngineMetrics, current: int) -> ScaleDecision:
    auto = job.spec.sandbox.autoscale
    targets = auto.targets
    cooldown = float(auto.cooldown_seconds)
    max_running = job.spec.inference.max_running_requests
    running_target = targets.running_requests_share * max_running
    usage, running, queued = m.mean_token_usage, m.mean_running, m.mean_queued
    kv_text = f"KV-cache usage {_fmt(usage)}"
    running_text = f"{_fmt(running)} running requests per engine"
    running_target_text = (
        f"target {_fmt(targets.running_requests_share)} × maxRunningRequests {max_running} = "
        f"{_fmt(running_target)}"
    )
    at_target = []
    if usage >= targets.kv_cache_usage:
        at_target.append(f"{kv_text} ≥ target {_fmt(targets.kv_cache_usage)}")
    if running >= running_target:
        at_target.append(f"{running_text} ≥ {running_target_text}")
    if at_target:
        return _hold(
            f"holding sandbox concurrency at {current}: engines are at target: "
            + "; ".join(at_target),
            cooldown,
        )
    headroom = (
        f"engines have headroom: {kv_text} < target {_fmt(targets.kv_cache_usage)}, "
        f"{running_text} < {running_target_text}, "
        f"{_fmt(queued)} queued per engine ≤ target {targets.queue_depth_per_engine}"
    )
    if current >= auto.max:
        return _hold(
            f"holding sandbox concurrency at {current}, the autoscale maximum, although "
            + headroom,
            cooldown,
        )
    ratios = [
        targets.kv_cache_usage / usage if usage > 0 else math.inf,
        running_target / running if running > 0 else math.inf,
    ]
    ratio = min(ratios)
    proposal = math.inf if math.isinf(ratio) else math.ceil(round(current * ratio, _RATIO_DIGITS))
    new = int(min(max(proposal, current + 1), current + auto.max_step_up, auto.max))
    limits = []
    if new < proposal and new == current + auto.max_step_up:
        limits.append(f"limited to maxStepUp {auto.max_step_up}")
    if new < proposal and new == auto.max:
        limits.append(f"limited by autoscale.max {auto.max}")
    tail = f" ({', '.join(limits)})" if limits else ""
    estimate = "" if math.isinf(proposal) else f"; targets reached at about {int(proposal)}"
    return ScaleDecision(
        concurrency=new,
        direction=ScaleDirection.UP,
        event_reason=REASON_RAISED,
        reason=f"raised sandbox concurrency {current} → {new} (+{new - current}){tail}: "
        f"{headroom}{estimate}",
        recheck_after_seconds=cooldown,
    )


def decide(
    job: AgentRLJob,
    engine_metrics: EngineMetrics,
    *,
    current: int,
    last_scale_time: datetime | None,
    now: datetime,
) -> ScaleDecision:
    """The autoscaler's decision for ``job`` at ``now``.

    ``current``: ``spec.sandbox.concurrency`` as read; ``last_scale_time``: the autoscaler's
    last move (``status.sandbox.lastScaleTime``), None if it never moved.
    """
    auto = job.spec.sandbox.autoscale
    if not auto.enabled:
        return _hold(
            "the built-in autoscaler is disabled: spec.sandbox.concurrency belongs to a person, "
            "an HPA or KEDA"
        )
    if job.spec.suspend:
        return _hold("the job is suspended: the autoscaler waits for it to resume")
    bounded = min(max(current, auto.min), auto.max)
    if bounded != current:
        # The API server refuses such a value while autoscale is enabled, so this only meets a
        # job written before its bounds were; bringing it back is not a load decision, no
        # cooldown applies.
        return ScaleDecision(
            concurrency=bounded,
            direction=ScaleDirection.UP if bounded > current else ScaleDirection.DOWN,
            event_reason=REASON_BOUNDED,
            reason=f"set sandbox concurrency {current} → {bounded}: outside autoscale "
            f"[min, max] = [{auto.min}, {auto.max}]",
            recheck_after_seconds=float(auto.cooldown_seconds),
        )
    if last_scale_time is not None:
        elapsed = (now - last_scale_time).total_seconds()
        if elapsed < auto.cooldown_seconds:
            left = auto.cooldown_seconds - elapsed
            return _hold(
                f"holding sandbox concurrency at {current}: cooling down, the last move was "
                f"{_fmt(round(elapsed))} s ago and cooldownSeconds is {auto.cooldown_seconds}",
                left,
            )
    if not engine_metrics.engines:
        return _hold(
            f"holding sandbox concurrency at {current}: no engine metrics yet (no ready engine "
            "answered /metrics)",
            float(auto.cooldown_seconds),
        )
    pressure = _pressure(job, engine_metrics, current)
    if pressure:
        return _lower(job, current, pressure)
    return _raise(job, engine_metrics, current)


def record_move(
    status: AgentRLJobStatus, decision: ScaleDecision, now: datetime
) -> AgentRLJobStatus:
    """``status`` with the move recorded in ``status.sandbox`` (``lastScaleTime``,
    ``lastScaleReason``, ``desired``); unchanged when the decision holds."""
    if decision.concurrency is None:
        return status
    sandbox = status.sandbox.model_copy(
        update={
            "desired": decision.concurrency,
            "last_scale_time": format_time(now),
            "last_scale_reason": decision.reason,
        }
    )
    return status.model_copy(update={"sandbox": sandbox})


def move_event(decision: ScaleDecision) -> Event | None:
    """The Normal Event of a move, None for a hold (holds repeat every reconcile)."""
    if decision.concurrency is None or decision.event_reason is None:
        return None
    return Event(type="Normal", reason=decision.event_reason, message=decision.reason)
