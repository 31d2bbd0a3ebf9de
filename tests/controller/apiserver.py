"""Helpers of the controller tests on the real API server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightkube import AsyncClient
from lightkube.config.kubeconfig import KubeConfig

from agentrl.controller.kube import LightkubeAPI
from agentrl.controller.reconciler import Reconciler
from agentrl.controller.settings import OperatorSettings
from agentrl.controller.workqueue import Key
from agentrl.devcluster.testing import Kubectl
from agentrl.reconcile.constants import FIELD_MANAGER


async def reconcile_once(kubeconfig: Path, namespace: str, name: str) -> None:
    """One reconcile of the job ``name`` by a fresh Reconciler (what an operator restart starts
    from), as whoever ``kubeconfig`` authenticates."""
    client = AsyncClient(config=KubeConfig.from_file(kubeconfig), field_manager=FIELD_MANAGER)
    try:
        await Reconciler(LightkubeAPI(client), OperatorSettings()).reconcile(Key(namespace, name))
    finally:
        await client.close()


async def apply_and_reconcile(
    kubectl: Kubectl, manifest: dict[str, Any], kubeconfig: Path, namespace: str
) -> None:
    """Applies the job ``manifest`` and reconciles it once (:func:`reconcile_once`)."""
    kubectl.apply(manifest)
    await reconcile_once(kubeconfig, namespace, manifest["metadata"]["name"])


def condition(kubectl: Kubectl, name: str, type_: str) -> dict[str, str]:
    """The job ``name``'s status condition ``type_``."""
    status = kubectl.json("get", "arj", name)["status"]
    return next(c for c in status["conditions"] if c["type"] == type_)
