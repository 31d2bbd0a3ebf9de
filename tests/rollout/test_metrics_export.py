"""Workers' metrics merged into the driver's one /metrics: snapshots, the merged exposition (parsed
back with prometheus_client's own text and OpenMetrics parsers), and the HTTP server.

Registries made here stand for a worker's or the driver's process; one test runs real worker
processes and scrapes the merged result over HTTP.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import urllib.error
import urllib.request
from collections import Counter as Tally
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import generate_latest as text_exposition
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_exposition
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families as parse_text

from agentrl.rollout import metrics as rollout_metrics
from agentrl.rollout import metrics_export
from agentrl.sandbox import metrics as sandbox_metrics

ROOT = Path(__file__).parents[2]


def _worker_registry(episodes: int, turns: list[float]) -> CollectorRegistry:
    """A registry standing for one worker's process, with the rollout tier's metric shapes."""
    registry = CollectorRegistry()
    counter = Counter("agentrl_t_episodes", "Episodes.", ["terminal_class"], registry=registry)
    for _ in range(episodes):
        counter.labels("completed").inc()
    hist = Histogram("agentrl_t_turns", "Turns.", buckets=(1, 5, 10), registry=registry)
    for value in turns:
        hist.observe(value)
    Gauge("agentrl_t_in_flight", "In flight.", registry=registry).set(episodes)
    Counter("agentrl_t_unused", "Never incremented.", ["reason"], registry=registry)
    Gauge("other_t_gauge", "Not ours.", registry=registry).set(7)
    return registry


def _driver_registry() -> CollectorRegistry:
    """The driver's own: the same counter and histogram (it imports the same modules), plus a
    family only it has."""
    registry = CollectorRegistry()
    counter = Counter("agentrl_t_episodes", "Episodes.", ["terminal_class"], registry=registry)
    counter.labels("completed").inc(2)
    Histogram("agentrl_t_turns", "Turns.", buckets=(1, 5, 10), registry=registry)
    Gauge("agentrl_t_step", "Step.", registry=registry).set(4)
    return registry


def _assert_valid(text: str) -> dict[str, object]:
    """Every family's HELP and TYPE once; both parsers accept it. Returns families by name."""
    lines = text.splitlines()
    for kind in ("# HELP ", "# TYPE "):
        names = Tally(line.split()[2] for line in lines if line.startswith(kind))
        assert [n for n, c in names.items() if c > 1] == [], kind
    families = {f.name: f for f in parse_text(text)}
    assert len(families) == sum(1 for line in lines if line.startswith("# TYPE "))
    return families


def _value(families: dict[str, object], sample: str, **labels: str) -> float:
    """The one sample named ``sample`` with exactly ``labels``."""
    (value,) = [
        s.value
        for family in families.values()
        for s in family.samples  # type: ignore[attr-defined]
        if s.name == sample and s.labels == labels
    ]
    return float(value)


def test_a_snapshot_holds_only_our_families_with_samples_and_no_created_times() -> None:
    data = metrics_export.snapshot(_worker_registry(3, [2.0, 7.0]))
    assert [f["name"] for f in data] == [
        "agentrl_t_episodes",
        "agentrl_t_turns",
        "agentrl_t_in_flight",
    ]
    episodes = data[0]
    assert episodes["type"] == "counter"
    assert episodes["documentation"] == "Episodes."
    assert episodes["samples"] == [
        {
            "name": "agentrl_t_episodes_total",
            "labels": {"terminal_class": "completed"},
            "value": 3.0,
        }
    ]
    turns = {(s["name"], s["labels"].get("le")): s["value"] for s in data[1]["samples"]}
    assert turns == {
        ("agentrl_t_turns_bucket", "1.0"): 0.0,
        ("agentrl_t_turns_bucket", "5.0"): 1.0,
        ("agentrl_t_turns_bucket", "10.0"): 2.0,
        ("agentrl_t_turns_bucket", "+Inf"): 2.0,
        ("agentrl_t_turns_count", None): 2.0,
        ("agentrl_t_turns_sum", None): 9.0,
    }


def test_a_snapshot_is_strict_json_even_with_infinite_values() -> None:
    registry = CollectorRegistry()
    Gauge("agentrl_t_limit", "Limit.", ["kind"], registry=registry).labels("a").set(math.inf)
    Gauge("agentrl_t_nan", "NaN.", registry=registry).set(math.nan)
    text = json.dumps(metrics_export.snapshot(registry), allow_nan=False)
    workers = metrics_export.WorkerMetrics(CollectorRegistry())
    workers.update("1", json.loads(text))
    families = _assert_valid(text_exposition(workers).decode())
    assert _value(families, "agentrl_t_limit", kind="a", worker="1") == math.inf
    assert math.isnan(_value(families, "agentrl_t_nan", worker="1"))


def test_merged_exposition_is_valid_and_labels_each_workers_series() -> None:
    workers = metrics_export.WorkerMetrics(_driver_registry())
    workers.update("1", metrics_export.snapshot(_worker_registry(3, [2.0])))
    workers.update("2", json.loads(json.dumps(metrics_export.snapshot(_worker_registry(5, [])))))

    families = _assert_valid(text_exposition(workers).decode())
    total = "agentrl_t_episodes_total"
    assert _value(families, total, terminal_class="completed") == 2.0
    assert _value(families, total, terminal_class="completed", worker="1") == 3
    assert _value(families, total, terminal_class="completed", worker="2") == 5
    # the driver's histogram is empty; worker 1 observed one episode of 2 turns
    assert _value(families, "agentrl_t_turns_count") == 0.0
    assert _value(families, "agentrl_t_turns_bucket", le="5.0", worker="1") == 1
    assert _value(families, "agentrl_t_turns_bucket", le="1.0", worker="1") == 0
    assert _value(families, "agentrl_t_turns_sum", worker="1") == 2.0
    # families only workers have appear once, with every worker's series
    assert _value(families, "agentrl_t_in_flight", worker="1") == 3.0
    assert _value(families, "agentrl_t_in_flight", worker="2") == 5.0
    assert _value(families, "agentrl_t_step") == 4.0
    assert "other_t_gauge" not in families
    # the driver's series carry no worker label, every worker series carries one
    labels = [s.labels for s in families["agentrl_t_episodes"].samples]  # type: ignore[attr-defined]
    assert labels == [
        {"terminal_class": "completed"},
        {"terminal_class": "completed", "worker": "1"},
        {"terminal_class": "completed", "worker": "2"},
    ]


def test_merged_exposition_is_valid_openmetrics_too() -> None:
    workers = metrics_export.WorkerMetrics(_driver_registry())
    workers.update("1", metrics_export.snapshot(_worker_registry(3, [2.0, 12.0])))
    workers.update("2", metrics_export.snapshot(_worker_registry(1, [0.5])))
    # the OpenMetrics parser is strict: one block per family, complete histograms, an EOF
    families = {f.name: f for f in parse_openmetrics(openmetrics_exposition(workers).decode())}
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for s in families["agentrl_t_turns"].samples
    }
    assert samples[("agentrl_t_turns_bucket", (("le", "+Inf"), ("worker", "1")))] == 2.0
    assert samples[("agentrl_t_turns_bucket", (("le", "1.0"), ("worker", "2")))] == 1.0
    assert samples[("agentrl_t_turns_count", (("worker", "2"),))] == 1.0


def test_a_new_snapshot_replaces_the_previous_one_and_forget_drops_the_worker() -> None:
    workers = metrics_export.WorkerMetrics(_driver_registry())
    workers.update("1", metrics_export.snapshot(_worker_registry(3, [])))
    workers.update("1", metrics_export.snapshot(_worker_registry(4, [])))
    workers.update("2", metrics_export.snapshot(_worker_registry(1, [])))
    families = _assert_valid(text_exposition(workers).decode())
    total = "agentrl_t_episodes_total"
    # cumulative per process: the latest value, not the sum of the two snapshots
    assert _value(families, total, terminal_class="completed", worker="1") == 4

    workers.forget("1")
    workers.forget("never-seen")
    assert workers.workers == ["2"]
    families = _assert_valid(text_exposition(workers).decode())
    labels = {s.labels.get("worker") for s in families["agentrl_t_episodes"].samples}  # type: ignore[attr-defined]
    assert labels == {None, "2"}


def test_a_workers_own_worker_label_is_kept_as_exported_worker() -> None:
    registry = CollectorRegistry()
    Gauge("agentrl_t_thing", "Thing.", ["worker"], registry=registry).labels("inner").set(1)
    workers = metrics_export.WorkerMetrics(CollectorRegistry())
    workers.update("7", metrics_export.snapshot(registry))
    families = _assert_valid(text_exposition(workers).decode())
    (sample,) = families["agentrl_t_thing"].samples  # type: ignore[attr-defined]
    assert sample.labels == {"worker": "7", "exported_worker": "inner"}


def test_a_worker_family_of_another_type_is_left_out_and_the_rest_stays_valid() -> None:
    driver = CollectorRegistry()
    Gauge("agentrl_t_episodes", "A gauge here.", registry=driver).set(1)
    workers = metrics_export.WorkerMetrics(driver)
    workers.update("1", metrics_export.snapshot(_worker_registry(3, [])))
    families = _assert_valid(text_exposition(workers).decode())
    assert [s.labels for s in families["agentrl_t_episodes"].samples] == [{}]  # type: ignore[attr-defined]
    assert _value(families, "agentrl_t_in_flight", worker="1") == 3.0


@pytest.mark.parametrize(
    ("snapshot", "message"),
    [
        ([{"name": "agentrl_a", "type": "counter", "samples": [{"name": "agentrl_b_total",
          "labels": {}, "value": 1}]}], "does not belong"),
        ([{"name": "agentrl_a", "type": "nonsense", "samples": []}], "unknown type"),
        ([{"name": "agentrl_a", "type": "gauge", "samples": [{"name": "agentrl_a",
          "value": "many"}]}], "not a number"),
        ([{"name": "agentrl_a", "samples": []}], "malformed"),
        ([{"name": "agentrl_a", "type": "gauge", "samples": []}] * 2, "appears twice"),
    ],
)  # fmt: skip
def test_a_malformed_snapshot_is_refused_and_keeps_the_previous_one(
    snapshot: list[dict[str, object]], message: str
) -> None:
    workers = metrics_export.WorkerMetrics(CollectorRegistry())
    workers.update("1", metrics_export.snapshot(_worker_registry(3, [])))
    with pytest.raises(ValueError, match=message):
        workers.update("1", snapshot)
    families = _assert_valid(text_exposition(workers).decode())
    assert _value(families, "agentrl_t_in_flight", worker="1") == 3.0


def test_registering_the_view_in_the_registry_it_merges_fails_loudly() -> None:
    registry = _driver_registry()
    workers = metrics_export.WorkerMetrics(registry)
    registry.register(workers)
    with pytest.raises(RuntimeError, match="registered in the registry it merges"):
        text_exposition(registry)


# ---- real processes and HTTP -------------------------------------------------------------------

_CHILD = """
import json, sys
from agentrl.rollout import metrics
from agentrl.rollout.metrics_export import snapshot
from agentrl.sandbox.metrics import SANDBOX_CREATES
n = int(sys.argv[1])
for _ in range(n):
    metrics.EPISODES.labels("completed").inc()
    metrics.EPISODE_TURNS.observe(4)
metrics.EPISODES_IN_FLIGHT.set(10 * n)
SANDBOX_CREATES.labels("local").inc(n + 1)
print(json.dumps(snapshot()))
"""


def _scrape(port: int, *, query: str = "", accept: str = "text/plain") -> str:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics{query}", headers={"Accept": accept}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(response.read().decode())


def test_worker_processes_snapshots_merge_into_the_drivers_served_metrics() -> None:
    children = {
        worker: subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(n)], cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        for worker, n in (("1", 3), ("2", 5))
    }
    # this process is the driver: it declares the same families and records some itself
    rollout_metrics.EPISODES.labels("completed").inc()
    sandbox_metrics.SANDBOX_CREATES.labels("local").inc()
    driver_episodes = REGISTRY.get_sample_value(
        "agentrl_rollout_episodes_total", {"terminal_class": "completed"}
    )
    workers = metrics_export.WorkerMetrics()  # over this process's default registry
    for worker, child in children.items():
        out, _ = child.communicate(timeout=120)
        assert child.returncode == 0
        workers.update(worker, json.loads(out))

    with metrics_export.serve(0, host="127.0.0.1", workers=workers) as server:
        families = _assert_valid(_scrape(server.port))
        for worker, n in (("1", 3), ("2", 5)):
            episodes = _value(
                families,
                "agentrl_rollout_episodes_total",
                terminal_class="completed",
                worker=worker,
            )
            assert episodes == n
            turns = _value(
                families, "agentrl_rollout_episode_turns_bucket", le="5.0", worker=worker
            )
            assert turns == n
            assert _value(families, "agentrl_rollout_episodes_in_flight", worker=worker) == 10 * n
            creates = _value(
                families, "agentrl_sandbox_creates_total", provider="local", worker=worker
            )
            assert creates == n + 1
        # the driver's own series, unlabelled, in the same family
        driver = _value(families, "agentrl_rollout_episodes_total", terminal_class="completed")
        assert driver == driver_episodes
        assert _value(families, "agentrl_sandbox_creates_total", provider="local") >= 1
        assert "python_info" in families

        accept = "application/openmetrics-text; version=1.0.0"
        parsed = {f.name for f in parse_openmetrics(_scrape(server.port, accept=accept))}
        assert "agentrl_rollout_episodes" in parsed

        only = _scrape(server.port, query="?name[]=agentrl_rollout_episodes_total")
        samples = [s for f in parse_text(only) for s in f.samples]
        assert {s.name for s in samples} == {"agentrl_rollout_episodes_total"}
        assert {s.labels.get("worker") for s in samples} >= {"1", "2"}
        port = server.port
    with pytest.raises(urllib.error.URLError):
        _scrape(port)


def test_serve_without_workers_serves_the_default_registry_on_the_port_it_bound() -> None:
    gauge = Gauge("agentrl_t_served_probe", "A probe of the default registry.")
    try:
        gauge.set(42)
        with metrics_export.serve(0, host="127.0.0.1") as server:
            assert server.port > 0
            families = _assert_valid(_scrape(server.port))
            assert _value(families, "agentrl_t_served_probe") == 42
    finally:
        REGISTRY.unregister(gauge)


def test_serve_refuses_a_port_in_use() -> None:
    with metrics_export.serve(0, host="127.0.0.1") as server, pytest.raises(OSError):
        metrics_export.serve(server.port, host="127.0.0.1")
