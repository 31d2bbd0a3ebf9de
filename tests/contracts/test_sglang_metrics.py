"""Every ``sglang:`` metric the runtime reads is one the pinned SGLang exports, and our
parsers read SGLang's own metrics page.

The names SGLang exports are those its scheduler's and tokenizer's collectors
(``sglang.srt.observability.metrics_collector`` in 0.5.15; ``sglang.srt.metrics.collector`` in
older releases) register in a Prometheus registry; the page is rendered by those collectors
with known values, with the label sets SGLang's scheduler gives them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from agentrl.controller import engine_metrics
from agentrl.engine import watchdog
from agentrl.engine_client import client

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "agentrl"

#: Where the runtime names SGLang metrics: the watchdog, the client, the controller's scrape,
#: the autoscaler, the planner and simulator, the API's autoscale targets, the tiny engine.
READERS = [
    "engine/watchdog.py",
    "engine_client/client.py",
    "tiny/server.py",
    "controller/engine_metrics.py",
    "reconcile/policies/autoscale.py",
    "api/sandbox.py",
    *(str(p.relative_to(PACKAGE)) for p in sorted((PACKAGE / "sim").rglob("*.py"))),
]


def _named_in_source() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for relative in READERS:
        text = (PACKAGE / relative).read_text(encoding="utf-8")
        for name in re.findall(r"sglang:[a-z_]+", text):
            found.setdefault(name, set()).add(relative)
    return found


def _tiny_exports() -> set[str]:
    from agentrl.tiny import policy as tiny
    from agentrl.tiny.server import TinyEngine

    engine = TinyEngine(tiny.new_policy(0, dim=16), model_path="mem", context_length=64)
    text = engine.render_metrics().decode()
    return {
        line.split("{")[0].split(" ")[0] for line in text.splitlines() if line.startswith("sglang:")
    }


def test_every_name_the_runtime_reads_is_exported(sglang: dict[str, Any]) -> None:
    exported = set(sglang["metrics"]["names"])
    named = _named_in_source()
    client_reads = {f"sglang:{field}" for field in client.EngineMetrics.model_fields}
    assert {"sglang:num_running_reqs", "sglang:token_usage"} <= set(named)
    missing = {name: sorted(where) for name, where in named.items() if name not in exported} | {
        name: ["engine_client/client.py EngineMetrics"] for name in client_reads - exported
    }
    assert missing == {}


def test_the_tiny_engine_exports_only_names_sglang_has(sglang: dict[str, Any]) -> None:
    exported = set(sglang["metrics"]["names"])
    assert sorted(_tiny_exports() - exported) == []


def test_the_client_reads_sglangs_own_page(sglang: dict[str, Any]) -> None:
    metrics = client.parse_metrics(sglang["metrics"]["exposition"])
    assert metrics.num_running_reqs == 3
    assert metrics.num_queue_reqs == 2
    assert metrics.token_usage == 0.25
    assert metrics.gen_throughput == 123.5
    assert metrics.num_used_tokens == 4096
    assert metrics.max_total_num_tokens == 16384
    assert metrics.cache_hit_rate == 0.5
    assert metrics.num_retracted_reqs == 1
    assert metrics.generation_tokens_total == 17
    assert metrics.prompt_tokens_total == 11


def test_the_watchdog_reads_sglangs_own_page(sglang: dict[str, Any]) -> None:
    load = watchdog.parse_engine_load(sglang["metrics"]["exposition"])
    assert (load.running_requests, load.queued_requests) == (3, 2)
    assert load.generation_tokens_total == 17
    assert load.gen_throughput == 123.5


def test_the_autoscalers_scrape_reads_sglangs_own_page(sglang: dict[str, Any]) -> None:
    sample = engine_metrics.parse_sglang_metrics("engine-0", sglang["metrics"]["exposition"])
    assert (sample.running_requests, sample.queued_requests) == (3, 2)
    assert sample.token_usage == pytest.approx(0.25)
