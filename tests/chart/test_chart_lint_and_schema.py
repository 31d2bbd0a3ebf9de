"""``helm lint`` and values.schema.json: the chart lints clean in strict mode, and a wrong
value is refused before anything renders, with the field named. Offline."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart.charting import CHART, KUBE_VERSION, Helm, HelmError


def test_chart_passes_helm_lint_strict(helm: Helm) -> None:
    proc = helm.run("lint", str(CHART), "--strict")
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout


def test_helm_is_stamped_as_its_release_build_and_renders_with_no_flags(helm: Helm) -> None:
    """An unstamped helm reports v3.x-dev-ish versions and assumes Kubernetes v1.20 offline, so
    `helm template` without --kube-version refuses the chart's `kubeVersion: >=1.30.0-0`."""
    assert helm.run("version", "--template", "{{.Version}}").stdout.strip() == "v3.19.0"
    proc = helm.run("template", "rel", str(CHART))
    assert "kind: Deployment" in proc.stdout
    # the gate is real: a Kubernetes older than the chart's kubeVersion is refused by name
    old = helm.run("template", "rel", str(CHART), "--kube-version", "1.29.0", check=False)
    assert old.returncode != 0
    assert "kubeVersion" in old.stderr and ">=1.30.0-0" in old.stderr


def test_chart_passes_helm_lint_in_namespaced_peering_mode(helm: Helm) -> None:
    proc = helm.run("lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION,
                    "--set", "watchNamespaces={a,b}", "--set", "peering.enabled=true")
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize(
    ("values", "field", "words"),
    [
        ({"operator": {"logLevel": "verbose"}}, "/operator/logLevel", "'debug', 'info', 'warning'"),
        ({"operator": {"logFormat": "xml"}}, "/operator/logFormat", "'json', 'text'"),
        ({"operator": {"replicas": 0}}, "/operator/replicas", "minimum"),
        ({"operator": {"replicaCount": 2}}, "/operator", "replicaCount"),
        ({"operator": {"workers": 0}}, "/operator/workers", "minimum"),
        ({"watchNamespaces": ["Team_A"]}, "/watchNamespaces/0", "pattern"),
        ({"crds": {"install": "yes"}}, "/crds/install", "boolean"),
        ({"metrics": {"prometheusRule": {"infraErrorRatio": 5}}},
         "/metrics/prometheusRule/infraErrorRatio", "maximum"),
        ({"operator": {"image": {"digest": "latest"}}}, "/operator/image/digest", "pattern"),
    ],
    ids=["log-level", "log-format", "zero-replicas", "misspelt-key", "workers",
         "namespace-name", "crds-install-type", "ratio-above-one", "digest"],
)
def test_a_value_violating_the_schema_is_refused_naming_the_field(
    helm: Helm, values: dict[str, Any], field: str, words: str,
) -> None:
    with pytest.raises(HelmError) as err:
        helm.template(values)
    assert "values don't meet the specifications of the schema" in err.value.stderr
    assert f"at '{field}'" in err.value.stderr
    assert words in err.value.stderr


def test_more_than_one_replica_without_peering_is_refused_with_the_reason(helm: Helm) -> None:
    with pytest.raises(HelmError) as err:
        helm.template({"operator": {"replicas": 2}})
    assert "operator.replicas > 1 needs peering.enabled=true" in err.value.stderr


def test_standby_replicas_with_peering_draw_distinct_priorities(helm: Helm) -> None:
    # kopf pauses all peers of equal priority: every replica passes --priority=random
    from agentrl.controller.cli import operator

    assert [p for p in operator.params if "--priority" in p.opts]
    rendered = helm.template({"operator": {"replicas": 2}, "peering": {"enabled": True}})
    deployment = next(d for d in rendered if d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 2
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:3] == ["--peering", "--peering-name=agentrl", "--priority=random"]
