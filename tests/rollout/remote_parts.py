"""What the tests of rollout worker actors share: the real tiny engine served in the test's own
event loop over HTTP, and a small toy job's :class:`RolloutWorkerConfig` against it (local
sandboxes, two-turn episodes, groups of 2)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentrl.rollout.ray_workers import RolloutWorkerConfig

#: The engine's ``maxRunningRequests`` in the job.
MAX_RUNNING = 8


@contextlib.asynccontextmanager
async def tiny_engine_url() -> AsyncIterator[str]:
    """The tiny engine (an initial policy) on a free local port; its base URL."""
    pytest.importorskip("torch", reason="the tiny engine needs the training extra")
    from aiohttp.test_utils import TestServer

    from agentrl.tiny import policy as tiny
    from agentrl.tiny.server import TinyEngine, build_app

    model = tiny.initial_policy(0, steps=50)
    server = TestServer(
        build_app(TinyEngine(model, model_path="tiny", context_length=4096)), host="127.0.0.1"
    )
    await server.start_server()
    try:
        yield str(server.make_url("/")).rstrip("/")
    finally:
        await server.close()


def worker_config(
    url: str,
    tmp_path: Path,
    *,
    workers: int = 2,
    concurrency: int = 4,
    infra_retries: int = 1,
) -> RolloutWorkerConfig:
    """A toy job's worker configuration: ``workers`` actors, ``concurrency`` sandboxes, lost
    episodes retried ``infra_retries`` times without backoff."""
    job: dict[str, Any] = {
        "apiVersion": "agentrl.dev/v1alpha1",
        "kind": "AgentRLJob",
        "metadata": {"name": "toy"},
        "spec": {
            "model": {"source": {"path": "tiny"}},
            "inference": {"contextLength": 4096, "maxRunningRequests": MAX_RUNNING},
            "rollout": {
                "groupSize": 2,
                "maxTurns": 2,
                "maxTrajectoryTokens": 4096,
                "maxTokensPerTurn": 8,
                "workers": workers,
                "failurePolicy": {"infraRetries": infra_retries, "infraRetryBackoffSeconds": 0},
            },
            "sandbox": {"provider": "local", "concurrency": concurrency},
        },
    }
    return RolloutWorkerConfig(
        job=job, engine_urls=[url], workers=workers, sandbox_dir=str(tmp_path)
    )
