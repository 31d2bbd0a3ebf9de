"""``agentrl tasks validate --provider kubernetes`` against a real API server: the sandbox pod
template comes from the applied job's ConfigMap, as the rollout workers get it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from agentrl.api import AgentRLJob
from agentrl.cli import main
from agentrl.devcluster.testing import ClusterHandle, Kubectl
from agentrl.reconcile.configmap import config_map
from agentrl.reconcile.context import BuildContext
from agentrl.reconcile.policies.suspend import workload_scale
from agentrl.rollout.tasks.cli import applied_sandbox_pods
from tests.factories import make_job

pytestmark = [pytest.mark.apiserver, pytest.mark.usefixtures("crd_installed")]


def test_an_unapplied_job_is_refused_with_the_apply_to_run(
    cluster: ClusterHandle, kubectl: Kubectl, tmp_path: Path
) -> None:
    manifest = tmp_path / "job.yaml"
    manifest.write_text(
        yaml.safe_dump(make_job("absent", kubectl.namespace).with_model_path("tiny").manifest())
    )
    result = CliRunner().invoke(
        main,
        [
            "tasks",
            "validate",
            "toy",
            "--provider",
            "kubernetes",
            "--manifest",
            str(manifest),
            "--kubeconfig",
            str(cluster.kubeconfig),
        ],
    )
    assert result.exit_code == 1, result.output
    assert f"job absent is not applied in namespace {kubectl.namespace}" in result.output
    assert f"kubectl apply -f {manifest}" in result.output


def test_the_template_is_the_one_in_the_applied_jobs_configmap(
    cluster: ClusterHandle, kubectl: Kubectl
) -> None:
    kubectl.apply(make_job("applied", None).with_model_path("tiny").manifest())
    job = AgentRLJob.model_validate(kubectl.json("get", "arj", "applied"))
    uid = job.metadata.model_extra["uid"]  # type: ignore[index]
    # what the operator writes for it (its own builder; no operator runs in this suite)
    kubectl.apply(config_map(job, BuildContext.for_job(job), workload_scale(job)))
    pods = applied_sandbox_pods("applied", kubectl.namespace, kubeconfig=str(cluster.kubeconfig))
    assert pods.name_prefix == "applied-sbx-"
    assert pods.selector == {"agentrl.dev/job": "applied", "app.kubernetes.io/component": "sandbox"}
    (owner,) = pods.template["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("AgentRLJob", "applied", uid)
    assert pods.template["metadata"]["namespace"] == kubectl.namespace
