"""Every metric the operator exports, declared once (Prometheus, served on
``--metrics-port``)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter(
    "agentrl_operator_reconciles_total",
    "Reconciles of AgentRLJobs, by result (ok, error, invalid, gone).",
    ["result"],
)
RECONCILE_ERRORS = Counter(
    "agentrl_operator_reconcile_errors_total",
    "Failed reconciles, by the kind of error (api, conflict, unexpected).",
    ["kind"],
)
RECONCILE_SECONDS = Histogram(
    "agentrl_operator_reconcile_duration_seconds",
    "Wall time of one reconcile (observe, apply, status write).",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
API_REQUESTS = Counter(
    "agentrl_operator_api_requests_total",
    "Requests the operator sent to the Kubernetes API, by verb and kind.",
    ["verb", "kind"],
)
STATUS_WRITES = Counter(
    "agentrl_operator_status_writes_total",
    "Status patches written (a reconcile that changes nothing writes none).",
)
QUEUE_DEPTH = Gauge(
    "agentrl_operator_queue_depth",
    "Jobs waiting in the work queue (including delayed requeues).",
)
WORKERS = Gauge(
    "agentrl_operator_workers",
    "Reconcile workers (the --workers setting): jobs reconciled concurrently.",
)
JOBS_BY_CONDITION = Gauge(
    "agentrl_jobs_by_condition",
    "AgentRLJobs by condition type and status, as last reconciled.",
    ["condition", "status"],
)
