"""What the operator runs with; set from ``agentrl operator`` flags (and the Helm chart)."""

from __future__ import annotations

from dataclasses import dataclass, field

from agentrl.reconcile.context import Images
from agentrl.reconcile.priority import PriorityClasses


@dataclass(frozen=True, kw_only=True)
class OperatorSettings:
    """Operator-wide settings (per-job settings live in the AgentRLJob spec)."""

    namespaces: tuple[str, ...] = ()
    """Namespaces to watch; empty watches all of them (cluster-wide)."""
    images: Images = field(default_factory=Images)
    """Images the spec does not name (rollout workers, watchdog)."""
    priority_classes: PriorityClasses = field(default_factory=PriorityClasses)
    """PriorityClass of each kind of pod whose job names none (``--trainer-priority-class``
    and its siblings; the Helm chart's ``priorityClasses``)."""
    workers: int = 8
    """Jobs reconciled concurrently. Each job is reconciled by one worker at a time."""
    resync_seconds: float = 60.0
    """Every job is reconciled at least this often, besides watch events (status freshness,
    deadlines the requeue missed)."""
    metrics_port: int = 8080
    """Port of the Prometheus endpoint (/metrics); 0 disables it."""
    synthetic_engine_metrics: bool = False
    """Test flag (``--test-synthetic-engine-metrics``): honour the
    ``agentrl.dev/synthetic-engine-metrics`` annotation instead of scraping the engines. Off in
    production (the Helm chart never sets it): the autoscaler acts only on what engines report."""
    retry_base_seconds: float = 1.0
    """First delay after a failed reconcile; doubles per consecutive failure of that job."""
    retry_max_seconds: float = 300.0
    """Longest delay between retries of a failing job."""
