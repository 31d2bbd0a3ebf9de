"""The files the cluster path on one machine is run with (docs/cluster-run.md) name exactly the
images ``agentrl dev images`` builds and the real node's placement, so a version bump or a
renamed image cannot leave them pointing at something the node never imported."""

from __future__ import annotations

from pathlib import Path

import yaml

from agentrl.api.validation import load_job
from agentrl.devcluster import images
from agentrl.devcluster.node.config import REAL_NODE_LABELS, REAL_NODE_TAINT

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ON_REAL_NODE = {"agentrl.dev/real-node": REAL_NODE_LABELS["agentrl.dev/real-node"]}
TOLERATION = {
    "key": REAL_NODE_TAINT["key"],
    "operator": "Exists",
    "effect": REAL_NODE_TAINT["effect"],
}


def test_the_chart_values_run_the_local_operator_image_on_the_real_node() -> None:
    values = yaml.safe_load((EXAMPLES / "helm" / "local-cluster-values.yaml").read_text())
    image = values["operator"]["image"]
    assert f"{image['repository']}:{image['tag']}" == images.OPERATOR_IMAGE
    assert image["pullPolicy"] == "Never"  # no registry: the node imported it
    assert values["operator"]["nodeSelector"] == ON_REAL_NODE
    assert values["operator"]["tolerations"] == [TOLERATION]


def test_the_cluster_quickstart_runs_the_local_images_on_the_real_node() -> None:
    job = load_job((EXAMPLES / "quickstart-cluster.yaml").read_text())
    spec = job.spec
    assert spec.inference.image == images.ENGINE_IMAGE
    assert spec.trainer.image == images.TRAINER_IMAGE
    assert spec.sandbox.image == images.SANDBOX_IMAGE
    for placed in (spec.inference, spec.rollout, spec.sandbox):
        assert placed.node_selector == ON_REAL_NODE
        assert [t.model_dump(exclude_none=True) for t in placed.tolerations] == [TOLERATION]
