"""What ``helm template`` renders from charts/agentrl, read back as YAML and checked field by
field: the operator Deployment (hardening, probes, flags), the metrics objects, peering, and
the objects each value switches on or off. Offline: no cluster."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.chart.charting import CHART, Helm, HelmError, find, kinds


@pytest.fixture(scope="module")
def defaults(helm: Helm) -> list[dict[str, Any]]:
    return helm.template(release="rel", namespace="agentrl-system")


def _container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    pod = find(docs, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return container


def test_default_install_renders_exactly_the_operator_objects(
    defaults: list[dict[str, Any]],
) -> None:
    assert kinds(defaults) == [
        "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "Deployment",
        "PriorityClass", "PriorityClass", "PriorityClass", "PriorityClass", "PriorityClass",
        "Service", "ServiceAccount",
    ]
    cluster_scoped = ("ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                      "PriorityClass")
    for doc in defaults:
        if doc["kind"] not in cluster_scoped:
            assert doc["metadata"]["namespace"] == "agentrl-system", doc["kind"]


def test_operator_runs_hardened_non_root_with_a_read_only_root_filesystem(
    defaults: list[dict[str, Any]],
) -> None:
    pod = find(defaults, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    container = _container(defaults)
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
        "privileged": False, "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    # a read-only root still gets a writable, size-limited /tmp
    assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}]
    assert container["resources"] == {
        "requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "512Mi"},
    }
    assert pod["serviceAccountName"] == "rel-agentrl"


def test_operator_probes_kopf_health_endpoint_and_exposes_metrics(
    defaults: list[dict[str, Any]],
) -> None:
    container = _container(defaults)
    assert container["ports"] == [
        {"name": "metrics", "containerPort": 8080, "protocol": "TCP"},
        {"name": "health", "containerPort": 8081, "protocol": "TCP"},
    ]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    service = find(defaults, "Service", "rel-agentrl-metrics")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"},
    ]
    # the Service selects exactly the Deployment's pods
    deployment = find(defaults, "Deployment")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_default_operator_is_one_standalone_replica(defaults: list[dict[str, Any]]) -> None:
    deployment = find(defaults, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    container = _container(defaults)
    # the image tag defaults to the chart's appVersion (Chart.yaml: 0.1.0)
    assert container["image"] == "ghcr.io/agentrl/operator:0.1.0"
    assert container["args"] == [
        "--standalone",
        "--workers=8",
        "--resync-seconds=60",
        "--metrics-port=8080",
        "--health-port=8081",
        "--log-format=json",
        "--log-level=info",
        # the chart's PriorityClasses (tests/chart/test_chart_priority_classes.py)
        "--engine-priority-class=rel-agentrl-engines",
        "--rollout-priority-class=rel-agentrl-rollout",
        "--sandbox-priority-class=rel-agentrl-sandboxes",
        "--trainer-priority-class=rel-agentrl-trainer",
    ]


@pytest.mark.parametrize("values", [
    {},
    {"peering": {"enabled": True}},
    {"watchNamespaces": ["a"], "workloads": {"rolloutImage": {"repository": "r"},
                                             "watchdogImage": {"repository": "w"}}},
], ids=["defaults", "peering", "namespaced-with-images"])
def test_chart_passes_only_flags_agentrl_operator_accepts(
    helm: Helm, values: dict[str, Any],
) -> None:
    from agentrl.controller.cli import operator

    accepted = {opt for param in operator.params for opt in
                (*param.opts, *getattr(param, "secondary_opts", []))}
    flags = {arg.split("=")[0] for arg in _container(helm.template(values))["args"]}
    assert flags <= accepted, flags - accepted
    # test hooks (the synthetic engine metrics the autoscaler could act on) stay off
    assert not [f for f in flags if f.startswith("--test-")]


def test_values_reach_the_operator_command_line(helm: Helm) -> None:
    docs = helm.template({
        "watchNamespaces": ["team-a", "team-b"],
        "operator": {"logLevel": "debug", "logFormat": "text", "metricsPort": 9090,
                     "workers": 32, "resyncSeconds": 15,
                     "image": {"digest": "sha256:" + "ab" * 32},
                     "imagePullSecrets": [{"name": "ghcr"}],
                     "extraArgs": ["--some-flag"]},
        "workloads": {"rolloutImage": {"repository": "registry.local/rollout", "tag": "1"},
                      "watchdogImage": {"repository": "registry.local/agentrl"}},
    })
    container = _container(docs)
    assert container["image"] == "ghcr.io/agentrl/operator@sha256:" + "ab" * 32
    assert container["args"] == [
        "--namespace=team-a",
        "--namespace=team-b",
        "--standalone",
        "--workers=32",
        "--resync-seconds=15",
        "--metrics-port=9090",
        "--health-port=8081",
        "--log-format=text",
        "--log-level=debug",
        "--rollout-image=registry.local/rollout:1",
        "--watchdog-image=registry.local/agentrl:0.1.0",
        "--engine-priority-class=rel-agentrl-engines",
        "--rollout-priority-class=rel-agentrl-rollout",
        "--sandbox-priority-class=rel-agentrl-sandboxes",
        "--trainer-priority-class=rel-agentrl-trainer",
        "--some-flag",
    ]
    assert container["ports"][0] == {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}
    pod = find(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "ghcr"}]


def test_peering_runs_the_operator_with_a_named_peering_and_creates_it(helm: Helm) -> None:
    docs = helm.template({"peering": {"enabled": True}})
    container = _container(docs)
    assert container["args"][:3] == ["--peering", "--peering-name=agentrl", "--priority=random"]
    assert "--standalone" not in container["args"]
    peering = find(docs, "ClusterKopfPeering", "agentrl")
    assert peering["apiVersion"] == "kopf.dev/v1"
    rules = find(docs, "ClusterRole")["rules"]
    assert {"apiGroups": ["kopf.dev"], "resources": ["clusterkopfpeerings"],
            "verbs": ["get", "list", "watch", "patch"]} in rules


def test_peering_in_namespaced_mode_creates_one_kopf_peering_per_watched_namespace(
    helm: Helm,
) -> None:
    docs = helm.template({"peering": {"enabled": True, "name": "arl"},
                          "watchNamespaces": ["a", "b"]})
    peerings = [d for d in docs if d["kind"] == "KopfPeering"]
    assert sorted((p["metadata"]["namespace"], p["metadata"]["name"]) for p in peerings) == [
        ("a", "arl"), ("b", "arl"),
    ]
    assert not [d for d in docs if d["kind"] == "ClusterKopfPeering"]
    for role in (d for d in docs if d["kind"] == "Role"):
        assert {"apiGroups": ["kopf.dev"], "resources": ["kopfpeerings"],
                "verbs": ["get", "list", "watch", "patch"]} in role["rules"]
    assert not [rule for d in docs if d["kind"] == "ClusterRole" for rule in d["rules"]
                if rule["apiGroups"] == ["kopf.dev"]]


def test_chart_carries_kopf_peering_crds_in_its_crds_directory() -> None:
    import yaml

    from tests.chart.charting import CHART

    docs = list(yaml.safe_load_all((CHART / "crds" / "kopf-peering.yaml").read_text()))
    by_name = {d["metadata"]["name"]: d for d in docs}
    assert set(by_name) == {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}
    assert by_name["clusterkopfpeerings.kopf.dev"]["spec"]["scope"] == "Cluster"
    assert by_name["kopfpeerings.kopf.dev"]["spec"]["scope"] == "Namespaced"
    for crd in docs:
        (version,) = crd["spec"]["versions"]
        # kopf writes {identity: {priority, lifetime, lastseen}} into status: it must survive
        # structural pruning
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
        assert status["x-kubernetes-preserve-unknown-fields"] is True


def test_crds_install_false_leaves_the_crd_out(helm: Helm) -> None:
    docs = helm.template({"crds": {"install": False}})
    assert "CustomResourceDefinition" not in kinds(docs)
    assert "Deployment" in kinds(docs)


def test_monitoring_objects_render_only_when_enabled(
    helm: Helm, defaults: list[dict[str, Any]],
) -> None:
    for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule"):
        assert kind not in kinds(defaults)
    docs = helm.template({"metrics": {
        "serviceMonitor": {"enabled": True, "additionalLabels": {"release": "prom"}},
        "podMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
    }})
    monitor = find(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s"},
    ]
    assert monitor["spec"]["selector"]["matchLabels"] == (
        find(docs, "Service")["spec"]["selector"])
    pods = find(docs, "PodMonitor", "rel-agentrl-engines")
    # engine pods carry these labels (operator/agentrl/reconcile/labels.py) and a "watchdog" port
    assert pods["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/part-of": "agentrl", "app.kubernetes.io/component": "engine",
    }
    assert pods["spec"]["namespaceSelector"] == {"any": True}


def test_engine_pod_monitor_scrapes_the_watchdog_and_sglangs_own_metrics(helm: Helm) -> None:
    from agentrl.api.engine_flags import launch_args
    from agentrl.reconcile import engine
    from agentrl.reconcile.constants import LABEL_JOB
    from agentrl.reconcile.context import BuildContext
    from tests.factories import make_job

    docs = helm.template({"metrics": {"podMonitor": {"enabled": True}}})
    monitor = find(docs, "PodMonitor", "rel-agentrl-engines")
    # the ports the operator gives the engine pod: the watchdog sidecar's and the engine's
    # own, where SGLang (launched with --enable-metrics) serves its sglang:* series
    job = make_job("swe", "team-a").obj()
    template = engine.statefulset(job, BuildContext.for_job(job), replicas=1)["spec"]["template"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= (
        template["metadata"]["labels"].items())
    assert template["metadata"]["labels"][LABEL_JOB] == "swe"
    containers = template["spec"]["containers"]
    ports = {p["name"]: c["name"] for c in containers for p in c.get("ports", [])}
    assert ports["watchdog"] == "watchdog" and ports["http"] == "engine"
    assert "--enable-metrics" in launch_args(job)
    job_label = "__meta_kubernetes_pod_label_" + "".join(
        c if c.isalnum() else "_" for c in LABEL_JOB)
    copy_job = {"sourceLabels": [job_label], "targetLabel": "agentrl_job"}
    assert monitor["spec"]["podMetricsEndpoints"] == [
        {"port": "watchdog", "path": "/metrics", "interval": "30s", "relabelings": [copy_job]},
        {"port": "http", "path": "/metrics", "interval": "30s", "relabelings": [copy_job]},
    ]


def test_trainer_pod_monitor_scrapes_the_drivers_metrics_port_on_rank_0_only(
    helm: Helm,
) -> None:
    from agentrl.reconcile import trainer
    from agentrl.reconcile.constants import ANNOTATION_JOB_COMPLETION_INDEX
    from agentrl.reconcile.context import BuildContext
    from tests.factories import make_job

    docs = helm.template({"metrics": {"podMonitor": {
        "enabled": True, "interval": "15s", "additionalLabels": {"release": "prom"},
    }}, "watchNamespaces": ["team-a"]})
    monitor = find(docs, "PodMonitor", "rel-agentrl-trainers")
    assert monitor["metadata"]["namespace"] == "agentrl-system"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a"]}

    # what the operator builds: the selector picks trainer pods (not engines) by their labels,
    # and the endpoint's port is one the trainer container names
    job = make_job("swe", "team-a").with_trainer(nodes=2).obj()
    template = trainer.trainer_job(job, BuildContext.for_job(job))["spec"]["template"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= template["metadata"]["labels"].items()
    assert selector == {
        "app.kubernetes.io/part-of": "agentrl", "app.kubernetes.io/component": "trainer",
    }
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    ports = {p["name"] for p in template["spec"]["containers"][0]["ports"]}
    assert endpoint["port"] == "metrics" and "metrics" in ports
    assert (endpoint["path"], endpoint["interval"]) == ("/metrics", "15s")
    # Prometheus' name for the pod annotation Kubernetes sets to the completion index
    meta = "__meta_kubernetes_pod_annotation_" + "".join(
        c if c.isalnum() else "_" for c in ANNOTATION_JOB_COMPLETION_INDEX)
    assert endpoint["relabelings"] == [
        {"sourceLabels": [meta], "regex": "0", "action": "keep"},
        # the job's name, which the Grafana dashboard selects by
        {"sourceLabels": ["__meta_kubernetes_pod_label_agentrl_dev_job"],
         "targetLabel": "agentrl_job"},
    ]


def _alerts(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    rule = find(docs, "PrometheusRule")
    return {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}


def test_alerts_watch_job_conditions_engine_faults_and_infra_errors(helm: Helm) -> None:
    docs = helm.template({"metrics": {"prometheusRule": {
        "enabled": True, "engineFaultsPerHour": 6, "infraErrorRatio": 0.1, "rateWindow": "1h",
    }}})
    alerts = _alerts(docs)
    assert set(alerts) == {"AgentRLJobFailed", "AgentRLJobDegraded", "AgentRLOperatorDown",
                           "AgentRLEngineFaultRateHigh", "AgentRLInfraErrorRateHigh",
                           "AgentRLToolCallParseFailureRateHigh", "AgentRLNoToolCallRateHigh",
                           "AgentRLPrefixBreakRateHigh", "AgentRLWeightPushFailing",
                           "AgentRLCheckpointSaveFailing"}
    assert alerts["AgentRLJobFailed"]["expr"] == (
        'agentrl_jobs_by_condition{condition="Failed",status="True"} > 0')
    assert alerts["AgentRLJobDegraded"]["expr"] == (
        'agentrl_jobs_by_condition{condition="Degraded",status="True"} > 0')
    assert alerts["AgentRLJobFailed"]["for"] == "5m"
    # the watchdog's counter agentrl_watchdog_faults (prometheus_client appends _total)
    assert alerts["AgentRLEngineFaultRateHigh"]["expr"] == (
        "sum by (namespace, pod) (rate(agentrl_watchdog_faults_total[1h])) * 3600 > 6")
    infra = " ".join(alerts["AgentRLInfraErrorRateHigh"]["expr"].split())
    assert infra == (
        'sum by (namespace) (rate(agentrl_rollout_episodes_total{terminal_class="infra_error"}'
        "[1h])) / sum by (namespace) (rate(agentrl_rollout_episodes_total[1h])) > 0.1")
    assert alerts["AgentRLOperatorDown"]["expr"] == (
        'absent(up{job="rel-agentrl-metrics",namespace="agentrl-system"} == 1)')
    # Prometheus templates survive Helm's own templating untouched
    assert alerts["AgentRLEngineFaultRateHigh"]["annotations"]["summary"] == (
        "Engine {{ $labels.namespace }}/{{ $labels.pod }}: {{ $value | humanize }} faults/h")


def test_weight_push_alert_fires_on_failed_pushes_in_a_row_per_engine(helm: Helm) -> None:
    from agentrl.reconcile.status import WEIGHT_PUSH_FAILURES_DEGRADED
    from agentrl.trainer.weight_sync import CONSECUTIVE_FAILURES

    rule = _alerts(helm.template({"metrics": {"prometheusRule": {"enabled": True}}}))[
        "AgentRLWeightPushFailing"]
    # by default at the count from which the operator sets Degraded
    assert rule["expr"] == (
        "max by (namespace, agentrl_job, engine) (agentrl_weight_sync_consecutive_failures)"
        f" >= {WEIGHT_PUSH_FAILURES_DEGRADED}")
    assert rule["labels"] == {"severity": "warning"}
    assert rule["annotations"]["summary"] == (
        "{{ $labels.namespace }}/{{ $labels.agentrl_job }}: {{ $value }} weight pushes in a row"
        " to {{ $labels.engine }} failed")
    # the series the trainer exports, with the label the alert groups by
    assert CONSECUTIVE_FAILURES._name == "agentrl_weight_sync_consecutive_failures"
    assert CONSECUTIVE_FAILURES._labelnames == ("engine",)
    tuned = _alerts(helm.template({"metrics": {"prometheusRule": {
        "enabled": True, "weightPushFailures": 5}}}))["AgentRLWeightPushFailing"]
    assert tuned["expr"].endswith(">= 5")
    with pytest.raises(HelmError, match="prometheusRule/weightPushFailures"):
        helm.template({"metrics": {"prometheusRule": {"weightPushFailures": 0}}})


def test_checkpoint_save_alert_fires_on_failed_saves_in_a_row_per_job(helm: Helm) -> None:
    from agentrl.reconcile.status import CHECKPOINT_SAVE_FAILURES_DEGRADED
    from agentrl.trainer.checkpoint_saves import CONSECUTIVE_FAILURES

    rule = _alerts(helm.template({"metrics": {"prometheusRule": {"enabled": True}}}))[
        "AgentRLCheckpointSaveFailing"]
    # by default at the count from which the operator sets Degraded (the first failed save)
    assert rule["expr"] == (
        "max by (namespace, agentrl_job) (agentrl_trainer_checkpoint_consecutive_failures)"
        f" >= {CHECKPOINT_SAVE_FAILURES_DEGRADED}")
    assert rule["labels"] == {"severity": "critical"}
    assert rule["annotations"]["summary"] == (
        "{{ $labels.namespace }}/{{ $labels.agentrl_job }}: {{ $value }} checkpoint saves in a"
        " row failed")
    # the series the trainer exports (no label of its own: one trainer driver per job)
    assert CONSECUTIVE_FAILURES._name == "agentrl_trainer_checkpoint_consecutive_failures"
    assert CONSECUTIVE_FAILURES._labelnames == ()
    tuned = _alerts(helm.template({"metrics": {"prometheusRule": {
        "enabled": True, "checkpointSaveFailures": 2}}}))["AgentRLCheckpointSaveFailing"]
    assert tuned["expr"].endswith(">= 2")
    with pytest.raises(HelmError, match="prometheusRule/checkpointSaveFailures"):
        helm.template({"metrics": {"prometheusRule": {"checkpointSaveFailures": 0}}})


def test_tool_health_alerts_watch_parse_failures_turns_without_calls_and_prefix_breaks(
    helm: Helm,
) -> None:
    docs = helm.template({"metrics": {"prometheusRule": {
        "enabled": True, "toolCallParseFailureRatio": 0.3, "noToolCallRatio": 0.6,
        "prefixBreakRatio": 0.02, "toolRateWindow": "2h",
    }}})
    alerts = {name: " ".join(rule["expr"].split()) for name, rule in _alerts(docs).items()}
    by = "sum by (namespace, agentrl_job)"
    assert alerts["AgentRLToolCallParseFailureRateHigh"] == (
        f"{by} (rate(agentrl_rollout_tool_call_parse_failures_total[2h]))"
        f" / ({by} (rate(agentrl_rollout_tool_calls_parsed_total[2h]))"
        f" + {by} (rate(agentrl_rollout_tool_call_parse_failures_total[2h]))) > 0.3")
    assert alerts["AgentRLNoToolCallRateHigh"] == (
        f"{by} (rate(agentrl_rollout_turns_without_tool_call_total[2h]))"
        f" / {by} (rate(agentrl_rollout_llm_call_seconds_count[2h])) > 0.6")
    assert alerts["AgentRLPrefixBreakRateHigh"] == (
        f'{by} (rate(agentrl_rollout_tito_prefix_checks_total{{result="break"}}[2h]))'
        f" / {by} (rate(agentrl_rollout_tito_prefix_checks_total[2h])) > 0.02")
    rules = _alerts(docs)
    assert rules["AgentRLNoToolCallRateHigh"]["labels"] == {"severity": "warning"}
    assert rules["AgentRLNoToolCallRateHigh"]["annotations"]["summary"] == (
        "{{ $labels.namespace }}/{{ $labels.agentrl_job }}: {{ $value | humanizePercentage }}"
        " of turns call no tool")
    # the defaults of values.yaml
    defaults = {name: " ".join(rule["expr"].split())
                for name, rule in _alerts(helm.template(
                    {"metrics": {"prometheusRule": {"enabled": True}}})).items()}
    assert defaults["AgentRLToolCallParseFailureRateHigh"].endswith("[30m]))) > 0.2")
    assert defaults["AgentRLNoToolCallRateHigh"].endswith("[30m])) > 0.5")
    assert defaults["AgentRLPrefixBreakRateHigh"].endswith("[30m])) > 0.01")


def test_every_alert_reads_series_the_code_exports_with_labels_they_carry(helm: Helm) -> None:
    from tests.contracts.test_dashboard_metrics import (
        TARGET_LABELS,
        _label_names,
        _ours,
        labels_used,
        metric_names,
    )

    ours, carried = _ours(), _label_names()
    docs = helm.template({"metrics": {"prometheusRule": {"enabled": True}}})
    for name, rule in _alerts(docs).items():
        names = metric_names(rule["expr"])
        assert names, name
        if names == {"up"}:  # Prometheus' own series of a scrape target
            continue
        assert names <= set(ours), (name, sorted(names - set(ours)))
        labels = set().union(*(carried[n] for n in names)) | TARGET_LABELS
        assert labels_used(rule["expr"]) <= labels, (name, labels_used(rule["expr"]) - labels)


def test_alert_metric_names_are_the_ones_the_code_exports() -> None:
    from agentrl.api import ConditionType
    from agentrl.api.rollout import TerminalClass
    from agentrl.controller import metrics as operator_metrics
    from agentrl.engine.watchdog import WatchdogMetrics
    from agentrl.rollout import metrics as rollout_metrics

    assert operator_metrics.JOBS_BY_CONDITION._name == "agentrl_jobs_by_condition"
    assert operator_metrics.JOBS_BY_CONDITION._labelnames == ("condition", "status")
    assert {ConditionType.FAILED.value, ConditionType.DEGRADED.value} == {"Failed", "Degraded"}

    watchdog = WatchdogMetrics()
    exported = {m.name for m in watchdog.registry.collect()}
    # prometheus_client names a counter family without _total and its sample with it
    assert "agentrl_watchdog_faults" in exported
    assert rollout_metrics.EPISODES._name == "agentrl_rollout_episodes"
    assert rollout_metrics.EPISODES._labelnames == ("terminal_class",)
    assert TerminalClass.INFRA_ERROR.value == "infra_error"


def test_grafana_dashboard_configmap_renders_only_when_enabled(
    helm: Helm, defaults: list[dict[str, Any]],
) -> None:
    dashboard = CHART / "dashboards" / "agentrl.json"
    assert "ConfigMap" not in kinds(defaults)
    docs = helm.template({"metrics": {"grafanaDashboard": {"enabled": True}}})
    config = find(docs, "ConfigMap", "rel-agentrl-dashboard")
    assert config["metadata"]["namespace"] == "agentrl-system"
    # the label kube-prometheus-stack's Grafana sidecar looks for by default
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert "annotations" not in config["metadata"]
    # the dashboard file, byte for byte apart from the trailing newline
    assert config["data"]["agentrl.json"] == dashboard.read_text(encoding="utf-8").rstrip("\n")
    assert json.loads(config["data"]["agentrl.json"])["uid"] == "agentrl"


def test_grafana_dashboard_label_namespace_and_annotations_are_values(helm: Helm) -> None:
    docs = helm.template({"metrics": {"grafanaDashboard": {
        "enabled": True, "label": "example.com/dashboard", "labelValue": "agentrl",
        "namespace": "monitoring", "additionalLabels": {"team": "rl"},
        "annotations": {"grafana_folder": "AgentRL"},
    }}})
    config = find(docs, "ConfigMap", "rel-agentrl-dashboard")
    assert config["metadata"]["namespace"] == "monitoring"
    labels = config["metadata"]["labels"]
    assert (labels["example.com/dashboard"], labels["team"]) == ("agentrl", "rl")
    assert "grafana_dashboard" not in labels
    assert config["metadata"]["annotations"] == {"grafana_folder": "AgentRL"}
    with pytest.raises(HelmError, match="grafanaDashboard/label"):
        helm.template({"metrics": {"grafanaDashboard": {"label": "not a label"}}})


def test_operator_scheduling_values_reach_the_pod(helm: Helm) -> None:
    toleration = {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists",
                  "effect": "NoSchedule"}
    docs = helm.template({"operator": {
        "nodeSelector": {"agentrl.dev/node-pool": "system"},
        "tolerations": [toleration],
        "priorityClassName": "system-cluster-critical",
        "podLabels": {"team": "ml"},
    }})
    pod_template = find(docs, "Deployment")["spec"]["template"]
    assert pod_template["spec"]["nodeSelector"] == {"agentrl.dev/node-pool": "system"}
    assert pod_template["spec"]["tolerations"] == [toleration]
    assert pod_template["spec"]["priorityClassName"] == "system-cluster-critical"
    assert pod_template["metadata"]["labels"]["team"] == "ml"


def test_job_defaults_become_the_crds_schema_defaults(helm: Helm) -> None:
    values = {
        "jobDefaults": {
            "engineImage": "registry.local/sglang-engine:7",
            "trainerImage": "registry.local/rocm-trainer:7",
            "gpuResource": "amd.com/gpu",
            "gpuNodeSelector": {"amd.com/gpu.product-name": "AMD_Instinct_MI300X"},
            "gpuTolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "sandboxNodeSelector": {"pool": "sandbox"},
            "sandboxTolerations": [],
            "imagePullSecrets": ["hub"],
            "workloadImagePullSecrets": ["registry"],
        }
    }
    crd = next(d for d in helm.template(values) if d["kind"] == "CustomResourceDefinition")
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    inference = spec["properties"]["inference"]
    # both the field's own default and the whole-object default (an omitted `inference`)
    for default in (inference["default"], {
        k: v["default"] for k, v in inference["properties"].items() if "default" in v
    }):
        assert default["image"] == "registry.local/sglang-engine:7"
        assert default["nodeSelector"] == {"amd.com/gpu.product-name": "AMD_Instinct_MI300X"}
        assert default["tolerations"] == values["jobDefaults"]["gpuTolerations"]
    trainer = spec["properties"]["trainer"]
    assert trainer["default"]["image"] == "registry.local/rocm-trainer:7"
    assert trainer["properties"]["image"]["default"] == "registry.local/rocm-trainer:7"
    sandbox = spec["properties"]["sandbox"]
    assert sandbox["default"]["nodeSelector"] == {"pool": "sandbox"}
    assert spec["properties"]["dataset"]["default"]["imagePullSecrets"] == ["hub"]
    assert spec["properties"]["imagePullSecrets"]["default"] == ["registry"]


def test_a_job_default_of_the_wrong_type_is_refused_naming_it(helm: Helm) -> None:
    with pytest.raises(HelmError) as err:
        helm.template({"jobDefaults": {"gpuNodeSelector": ["not", "a", "map"]}})
    assert "jobDefaults/gpuNodeSelector" in err.value.stderr
