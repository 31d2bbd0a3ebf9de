"""Prometheus metrics of the rollout tier, declared once.

Callers: the scheduler, episodes, the engine pool and the verifier record into these; rollout
workers expose them with ``prometheus_client.start_http_server`` (and the local run on its own
port). The pure helper :func:`long_tail_share` computes the report's long-tail figure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from prometheus_client import Counter, Gauge, Histogram

_TURN_BUCKETS = (1, 2, 3, 5, 8, 10, 15, 20, 30, 50, 75, 100, 200, 500, 1000)
_TOKEN_BUCKETS = (64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 1048576)
_LLM_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300, 600)
_EPISODE_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400)

EPISODES = Counter(
    "agentrl_rollout_episodes_total",
    "Finished episodes by terminal class (infra errors count once per attempt).",
    ["terminal_class"],
)
TRUNCATIONS = Counter(
    "agentrl_rollout_truncations_total",
    "Truncated episodes by the cap that ended them.",
    ["cap"],
)
TURN_CUTS = Counter(
    "agentrl_rollout_turn_token_cap_hits_total",
    "Agent replies cut at maxTokensPerTurn (the episode goes on).",
)
TOOL_OUTPUT_CUTS = Counter(
    "agentrl_rollout_tool_output_truncated_total",
    "Tool outputs cut to toolOutputMaxBytes before the agent saw them.",
)
TOOL_CALLS_PARSED = Counter(
    "agentrl_rollout_tool_calls_parsed_total",
    "Tool calls read from the model's replies in its own syntax, by tool.",
    ["tool"],
)
TOOL_CALL_PARSE_FAILURES = Counter(
    "agentrl_rollout_tool_call_parse_failures_total",
    "Replies whose tool calls could not be read (sent back to the model as an error), by "
    "reason: malformed_json, unclosed_tag, bad_structure, unknown_tool, missing_argument.",
    ["reason"],
)
TURNS_WITHOUT_TOOL_CALL = Counter(
    "agentrl_rollout_turns_without_tool_call_total",
    "Replies that called no tool (and had no malformed call).",
)
TITO_PREFIX_CHECKS = Counter(
    "agentrl_rollout_tito_prefix_checks_total",
    "Checks that the chat template's rendering of the conversation equals the trajectory's "
    "token ids, by result (match, break); the break rate is break / all.",
    ["result"],
)
EPISODE_TURNS = Histogram(
    "agentrl_rollout_episode_turns", "Agent turns (LLM calls) per episode.", buckets=_TURN_BUCKETS
)
EPISODE_TOKENS = Histogram(
    "agentrl_rollout_episode_tokens",
    "Trajectory tokens (prompt, generations and observations) per episode.",
    buckets=_TOKEN_BUCKETS,
)
EPISODE_GENERATED_TOKENS = Histogram(
    "agentrl_rollout_episode_generated_tokens",
    "Tokens the policy generated per episode.",
    buckets=_TOKEN_BUCKETS,
)
EPISODE_SECONDS = Histogram(
    "agentrl_rollout_episode_seconds",
    "Wall time of an episode attempt from admission to reward.",
    buckets=_EPISODE_BUCKETS,
)
EPISODE_REWARD = Histogram(
    "agentrl_rollout_episode_reward",
    "Verifier reward of scored episodes.",
    buckets=(0.0, 0.25, 0.5, 0.75, 1.0),
)
LLM_CALL_SECONDS = Histogram(
    "agentrl_rollout_llm_call_seconds",
    "Latency of one /generate or chat call as the rollout worker saw it.",
    buckets=_LLM_BUCKETS,
)
LLM_CALL_ERRORS = Counter(
    "agentrl_rollout_llm_call_errors_total",
    "LLM calls that failed (connection error, 5xx, timeout).",
    ["error"],
)
LLM_CALLS_IN_FLIGHT = Gauge(
    "agentrl_rollout_llm_calls_in_flight", "LLM calls this worker has open right now."
)
VERIFIER_SECONDS = Histogram(
    "agentrl_rollout_verifier_seconds",
    "Wall time of the verifier (tests after submit).",
    buckets=_EPISODE_BUCKETS,
)
EPISODES_IN_FLIGHT = Gauge(
    "agentrl_rollout_episodes_in_flight", "Episodes this worker runs right now."
)
CONCURRENCY_CONFIGURED = Gauge(
    "agentrl_rollout_concurrency_configured",
    "Episodes this worker is asked to keep in flight (its share of spec.sandbox.concurrency).",
)
CONCURRENCY_EFFECTIVE = Gauge(
    "agentrl_rollout_concurrency_effective",
    "Episodes this worker may keep in flight after provider limits (E2B plan).",
)
ADMISSION_BLOCKED = Gauge(
    "agentrl_rollout_admission_blocked",
    "1 while the staleness bound stops new episodes from starting.",
)
INFRA_RETRIES = Counter(
    "agentrl_rollout_infra_retries_total",
    "Episode attempts retried after an infra error, by reason.",
    ["reason"],
)
INFRA_DROPPED = Counter(
    "agentrl_rollout_infra_dropped_total",
    "Episodes dropped from training after their infra-error retry budget, by reason.",
    ["reason"],
)
ENGINE_READY = Gauge(
    "agentrl_rollout_engine_ready",
    "Whether the rollout tier routes calls to an engine.",
    ["engine"],
)
ENGINE_OUTSTANDING = Gauge(
    "agentrl_rollout_engine_outstanding_requests",
    "Requests this worker has open on an engine.",
    ["engine"],
)
ENGINE_FAILOVERS = Counter(
    "agentrl_rollout_engine_failovers_total",
    "Episodes moved to another engine because theirs went unready.",
)
LONG_TAIL_SHARE = Gauge(
    "agentrl_rollout_long_tail_share",
    "Share of the last batch's wall time spent after 90% of its episodes had finished.",
)
LONG_TAIL_SHARE_HISTOGRAM = Histogram(
    "agentrl_rollout_batch_long_tail_share",
    "Share of each batch's wall time spent after 90% of its episodes had finished.",
    buckets=(0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0),
)


def long_tail_share(start: float, finishes: Sequence[float], quantile: float = 0.9) -> float:
    """Share of a batch's wall time spent after ``quantile`` of its episodes finished.

    ``start`` is when the batch's first episode started; ``finishes`` are the finish times.
    With n episodes, the 90% point is the ``ceil(0.9 n)``-th finish; the share is
    ``(last − that) / (last − start)``. 0 for an empty or instantaneous batch.
    """
    if not finishes:
        return 0.0
    ordered = sorted(finishes)
    last = ordered[-1]
    if last <= start:
        return 0.0
    at_quantile = ordered[max(1, math.ceil(quantile * len(ordered))) - 1]
    return (last - at_quantile) / (last - start)


ROLLOUT_WORKERS_ALIVE = Gauge(
    "agentrl_rollout_workers_alive",
    "Rollout worker actors the driver can still hand episodes to.",
)
ROLLOUT_WORKER_RESTARTS = Counter(
    "agentrl_rollout_worker_restarts_total",
    "Rollout worker actors the driver gave episodes again after Ray restarted them (their "
    "process or rollout pod died: evicted, OOM-killed, replaced by a rolling update).",
)
WORKER_SLOTS = Gauge(
    "agentrl_rollout_worker_slots",
    "Episodes the driver lets this rollout worker run at once (its slot grant; the grants of "
    "all workers never let live episodes exceed the in-effect concurrency).",
)
PREFETCHED_ORDERS = Gauge(
    "agentrl_rollout_prefetched_orders",
    "Admitted episodes waiting in this rollout worker to start the moment one of its episodes "
    "ends (the driver prefetches up to the in-effect concurrency over all workers).",
)
