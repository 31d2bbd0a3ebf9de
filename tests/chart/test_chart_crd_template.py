"""The chart's CRD template is the generated CRD in crds/ plus the Helm wrapping, never a copy
that drifts: ``agentrl crds --helm`` generates it, and what Helm renders from it equals
crds/agentrl.dev_agentrljobs.yaml apart from ``helm.sh/resource-policy: keep``. Offline."""

from __future__ import annotations

import copy

import yaml
from click.testing import CliRunner

from agentrl.api import cli as api_cli
from tests.chart.charting import CHART, REPO, Helm, find

TEMPLATE_DIR = CHART / "templates" / "crds"
CRD_FILE = "agentrl.dev_agentrljobs.yaml"


def test_chart_crd_template_is_what_agentrl_crds_helm_generates() -> None:
    result = CliRunner().invoke(api_cli.crds, ["--helm", "--check", str(TEMPLATE_DIR)])
    assert result.exit_code == 0, result.output
    printed = CliRunner().invoke(api_cli.crds, ["--helm"]).output
    assert printed == (TEMPLATE_DIR / CRD_FILE).read_text()


def test_rendered_crd_equals_crds_directory_apart_from_the_keep_policy(helm: Helm) -> None:
    rendered = find(helm.template(), "CustomResourceDefinition")
    generated = yaml.safe_load((REPO / "crds" / CRD_FILE).read_text())
    expected = copy.deepcopy(generated)
    expected["metadata"]["annotations"] = {"helm.sh/resource-policy": "keep"}
    assert rendered == expected


def test_a_drifted_chart_template_is_reported_with_the_command_that_fixes_it(tmp_path) -> None:
    (tmp_path / CRD_FILE).write_text((TEMPLATE_DIR / CRD_FILE).read_text() + "# edited\n")
    result = CliRunner().invoke(api_cli.crds, ["--helm", "--check", str(tmp_path)])
    assert result.exit_code == 1
    assert f"run 'agentrl crds --helm --write {tmp_path}'" in result.output


def test_helm_template_wraps_the_crd_in_crds_install_only() -> None:
    text = (TEMPLATE_DIR / CRD_FILE).read_text()
    actions = [line.strip() for line in text.splitlines() if "{{" in line]
    assert actions[0] == "{{- if .Values.crds.install }}"
    assert actions[-1] == "{{- end }}"
    # every other action is a job default: `default: {{ toJson .Values.jobDefaults.KEY }}`
    # (the field's own default, or its entry in the whole-object default)
    inner = actions[1:-1]
    assert inner and all(".Values.jobDefaults." in a and "toJson" in a for a in inner)
    # 8 component defaults, each in two places, plus spec.imagePullSecrets in one
    assert len(inner) == 17
