"""Every series the chart's Grafana dashboard (charts/agentrl/dashboards/agentrl.json) queries is
one the project really exports.

What "exported" means here, read from the exporters themselves rather than from a list:

* our series: the metric families the runtime declares, collected from prometheus_client after
  importing every module of the package that uses prometheus_client (the default registry: the
  operator, the trainer driver, its rollout workers' series, sandboxes, the engine client), plus
  the engine watchdog's own registry (:class:`agentrl.engine.watchdog.WatchdogMetrics`), each
  family expanded to the sample names the exposition format gives its type (a counter ``x`` is
  scraped as ``x_total``, a histogram as ``x_bucket``, ``x_count`` and ``x_sum``);
* ``sglang:`` series: the names the pinned SGLang's own collectors register (the probe of the
  environment ``agentrl dev prepare`` makes; without it these tests fail naming that command),
  a histogram's bare name excluded (only its suffixed samples are series).

The labels a query groups or matches by are checked too: those of our series against the label
names the metric objects declare (plus the labels Prometheus adds when it scrapes); a query on
an ``sglang:`` series uses only the latter.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from prometheus_client.registry import CollectorRegistry

from agentrl.rollout.metrics_export import SAMPLE_SUFFIXES

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "agentrl"
DASHBOARD = ROOT / "charts" / "agentrl" / "dashboards" / "agentrl.json"

#: Modules that use prometheus_client but export nothing of the runtime's: the probe runs inside
#: the SGLang environment, not in our processes.
NOT_EXPORTERS = {"agentrl.devcluster.sglang_probe"}


# ---- PromQL: the metric names an expression selects -------------------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(
    r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
             "group_left", "group_right", "inf", "nan", "atan2"}


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` selects: its identifiers once strings, label matchers, ranges,
    grouping clauses, function calls, keywords and numbers are taken out."""
    text = _STRING.sub(" ", expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        start, end = match.span()
        if start > 0 and (text[start - 1] in "$." or text[start - 1].isdigit()):
            continue  # a Grafana variable, or the exponent/fraction of a number
        if re.match(r"\s*\(", text[end:]):
            continue  # a function or aggregation
        if match.group().lower() in _KEYWORDS:
            continue
        names.add(match.group())
    return names


def test_metric_names_parses_the_shapes_the_dashboard_uses() -> None:
    assert metric_names(
        'histogram_quantile(0.99, sum by (le, provider) (rate('
        'agentrl_sandbox_startup_seconds_bucket{namespace=~"$namespace", agentrl_job=~"$job"}'
        "[$__rate_interval])))"
    ) == {"agentrl_sandbox_startup_seconds_bucket"}
    assert metric_names(
        'sum by (reason) (rate(a_total{x="by (y) z"}[5m])) * 3600 / on (pod) group_left b'
        " + sglang:token_usage offset 1h > bool 1e3"
    ) == {"a_total", "b", "sglang:token_usage"}
    assert _variable_names(_dashboard()) == {
        "variable namespace": {"agentrl_trainer_step"}, "variable job": {"agentrl_trainer_step"},
    }


# ---- the dashboard -------------------------------------------------------------------------


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # a collapsed row keeps its panels inside
    return [p for p in out if p["type"] != "row"]


def _variable_names(dashboard: dict[str, Any]) -> dict[str, set[str]]:
    """Template variable → the metric names its label_values()/query_result() query reads."""
    out = {}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]
        query = query["query"] if isinstance(query, dict) else query
        inner = re.fullmatch(r"\s*(?:label_values|query_result)\((.*)\)\s*", query, re.S)
        assert inner is not None, f"variable {variable['name']}: unexpected query {query!r}"
        selector = re.sub(r",\s*[A-Za-z_][A-Za-z0-9_]*\s*$", "", inner.group(1))
        out[f"variable {variable['name']}"] = metric_names(selector)
    return out


def _queried() -> dict[str, set[str]]:
    """Where the dashboard names a series (panel title or variable) → the names there."""
    dashboard = _dashboard()
    where: dict[str, set[str]] = {}
    for panel in _panels(dashboard):
        assert panel.get("targets"), f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            names = metric_names(target["expr"])
            assert names, f"panel {panel['title']!r}: no series in {target['expr']!r}"
            where.setdefault(f"panel {panel['title']!r}", set()).update(names)
    where.update(_variable_names(dashboard))
    return where


def _ours() -> dict[str, str]:
    """Sample name → the exporter (module or registry) it comes from."""
    modules = sorted(
        ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        for path in PACKAGE.rglob("*.py")
        if "prometheus_client" in path.read_text(encoding="utf-8")
    )
    for module in modules:
        if module not in NOT_EXPORTERS:
            importlib.import_module(module)
    from agentrl.engine.watchdog import WatchdogMetrics

    registries: list[tuple[str, CollectorRegistry]] = [
        ("the default registry", REGISTRY),
        ("the engine watchdog", WatchdogMetrics().registry),
    ]
    out: dict[str, str] = {}
    for source, registry in registries:
        for family in registry.collect():
            if family.name.startswith("agentrl_"):
                for suffix in SAMPLE_SUFFIXES[family.type]:
                    out[family.name + suffix] = source
    return out


#: Labels Prometheus adds when it scrapes (the PodMonitors' relabelling and its own target
#: labels), the driver adds to its rollout workers' series, and a histogram's samples carry.
TARGET_LABELS = {"namespace", "pod", "container", "instance", "job", "endpoint", "service",
                 "agentrl_job", "worker", "le"}


def _label_names() -> dict[str, set[str]]:
    """Sample name → the label names its exporter declares, read from the metric objects of
    the exporting modules (imported by :func:`_ours`) and of the watchdog."""
    from prometheus_client.metrics import MetricWrapperBase

    from agentrl.engine.watchdog import WatchdogMetrics

    _ours()
    objects = [
        value
        for name, module in sorted(sys.modules.items())
        if name.startswith("agentrl.") and name not in NOT_EXPORTERS
        for value in vars(module).values()
        if isinstance(value, MetricWrapperBase)
    ]
    objects += [v for v in vars(WatchdogMetrics()).values() if isinstance(v, MetricWrapperBase)]
    out: dict[str, set[str]] = {}
    for metric in objects:
        for family in metric.describe():
            for suffix in SAMPLE_SUFFIXES[family.type]:
                out[family.name + suffix] = set(metric._labelnames)
    return out


_LABEL_CLAUSE = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^()]*)\)", re.IGNORECASE)
_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")


def labels_used(expr: str) -> set[str]:
    """The label names ``expr`` groups by or matches on."""
    text = _STRING.sub('""', expr)
    names = set()
    for clause in _LABEL_CLAUSE.finditer(text):
        names.update(n.strip() for n in clause.group(1).split(",") if n.strip())
    for block in _MATCHERS.finditer(text):
        names.update(_MATCHER.findall(block.group()))
    return names


def _sglangs(sglang: dict[str, Any]) -> set[str]:
    names = set(sglang["metrics"]["names"])
    return {
        n for n in names
        if not n.endswith("_created") and f"{n}_bucket" not in names and f"{n}_count" not in names
    }


def test_the_dashboard_queries_every_area_the_issue_names() -> None:
    queried = set().union(*_queried().values())
    for name in (
        "agentrl_trainer_step", "agentrl_trainer_reward_mean", "agentrl_trainer_eval_pass_at_1",
        "agentrl_trainer_trajectories_total", "agentrl_sandbox_live",
        "agentrl_sandbox_startup_seconds_bucket", "agentrl_trainer_ess",
        "agentrl_trainer_mismatch_abs_mean", "agentrl_trainer_grad_norm",
        "agentrl_trainer_clip_fraction", "agentrl_trainer_staleness_max",
        "agentrl_trainer_zero_variance_share", "agentrl_rollout_infra_retries_total",
        "agentrl_trainer_step_seconds_total", "agentrl_operator_reconciles_total",
        "sglang:token_usage", "sglang:num_queue_reqs", "sglang:gen_throughput",
        "sglang:time_to_first_token_seconds_bucket",
    ):
        assert name in queried, name


def test_every_agentrl_series_the_dashboard_queries_is_exported() -> None:
    ours = _ours()
    assert "agentrl_watchdog_faults_total" in ours and "agentrl_trainer_step" in ours
    missing = {
        where: sorted(n for n in names if not n.startswith("sglang:") and n not in ours)
        for where, names in _queried().items()
    }
    assert {where: names for where, names in missing.items() if names} == {}


def test_every_sglang_series_the_dashboard_queries_is_one_the_pinned_sglang_exports(
    sglang: dict[str, Any],
) -> None:
    exported = _sglangs(sglang)
    assert "sglang:token_usage" in exported
    assert "sglang:time_to_first_token_seconds" not in exported  # a histogram: only its samples
    missing = {
        where: sorted(n for n in names if n.startswith("sglang:") and n not in exported)
        for where, names in _queried().items()
    }
    assert {where: names for where, names in missing.items() if names} == {}


def test_every_label_a_query_groups_or_matches_by_is_one_its_series_carry() -> None:
    assert labels_used(
        'sum by (le, provider) (rate(x_bucket{namespace=~"$ns", a!="b=c"}[5m])) / on (pod) y'
    ) == {"le", "provider", "namespace", "a", "pod"}
    declared = _label_names()
    assert declared["agentrl_rollout_infra_retries_total"] == {"reason"}
    wrong = {}
    for panel in _panels(_dashboard()):
        for target in panel["targets"]:
            names = metric_names(target["expr"])
            if any(n.startswith("sglang:") for n in names):
                continue  # SGLang's labels are SGLang's; only Prometheus' are used on them
            carried = set().union(*(declared[n] for n in names)) | TARGET_LABELS
            if labels_used(target["expr"]) - carried:
                wrong[target["expr"]] = sorted(labels_used(target["expr"]) - carried)
    assert wrong == {}


def test_sglang_queries_use_only_the_labels_prometheus_adds() -> None:
    for panel in _panels(_dashboard()):
        for target in panel["targets"]:
            if any(n.startswith("sglang:") for n in metric_names(target["expr"])):
                assert labels_used(target["expr"]) <= TARGET_LABELS, target["expr"]


def test_every_panel_reads_the_dashboards_data_source_variable() -> None:
    dashboard = _dashboard()
    (variable,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert variable["query"] == "prometheus"
    expected = {"type": "prometheus", "uid": f"${{{variable['name']}}}"}
    for panel in _panels(dashboard):
        assert panel["datasource"] == expected, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == expected, panel["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("suffix", ["_bucket", "_count", "_sum"])
def test_a_histograms_bare_name_is_not_a_series(suffix: str) -> None:
    ours = _ours()
    assert "agentrl_sandbox_startup_seconds" not in ours
    assert f"agentrl_sandbox_startup_seconds{suffix}" in ours
