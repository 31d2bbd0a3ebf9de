"""The rollout tier's HTTP pools come from the spec: one client per engine, each with this
worker's connections towards that engine."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, ClassVar

import pytest

from agentrl.api import AgentRLJobSpec
from agentrl.engine_client.client import EngineClient
from agentrl.rollout.concurrency_source import RuntimeFileSource
from agentrl.rollout.runtime import (
    engine_pool_size,
    open_rollout,
    provider_limit,
    worker_concurrency,
)
from agentrl.sandbox.fake import FakeProvider


def _spec(concurrency: int, running: int, workers: int) -> AgentRLJobSpec:
    return AgentRLJobSpec.model_validate(
        {
            "model": {"source": {"path": "tiny"}},
            "sandbox": {"provider": "local", "concurrency": concurrency},
            "inference": {"engines": 2, "maxRunningRequests": running},
            "rollout": {"workers": workers, "llmTimeoutSeconds": 77},
        }
    )


@pytest.mark.parametrize(
    ("concurrency", "running", "workers", "index", "expected"),
    [
        # 2048 over 2 workers: 1024 episodes here, at most one LLM call each, + 4 control.
        (2048, 1024, 2, 0, 1024 + 4),
        # The job-wide bound is lower: 2 × 64 running + 4 control, whatever this worker has.
        (384, 64, 2, 1, 2 * 64 + 4),
        # 5 over 2 workers: the first gets 3, the second 2.
        (5, 64, 2, 0, 3 + 4),
        (5, 64, 2, 1, 2 + 4),
        # A worker with no share keeps only the control connections.
        (1, 64, 2, 1, 4),
    ],
)
def test_a_workers_engine_pool_is_its_share_capped_by_the_job_wide_size(
    concurrency: int, running: int, workers: int, index: int, expected: int
) -> None:
    spec = _spec(concurrency, running, workers)
    assert engine_pool_size(spec, worker_concurrency(spec, workers, index)) == expected


class RecordingClient(EngineClient):
    made: ClassVar[list[tuple[str, int, float]]] = []

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        RecordingClient.made.append((url, self.max_connections, self.timeout_seconds))


async def test_open_rollout_gives_every_engine_a_client_sized_from_the_spec() -> None:
    RecordingClient.made = []
    spec = _spec(concurrency=300, running=1000, workers=3)
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    async with open_rollout(
        spec,
        provider=FakeProvider(),
        engine_urls=urls,
        tasks=[],  # nothing to run: only the wiring is looked at
        workers=3,
        worker_index=2,
        tokenizer=_NoTokenizer(),
        engine_client=RecordingClient,
    ) as scheduler:
        assert scheduler.concurrency == 100
    # 300 over 3 workers: 100 episodes, one open LLM call each at most, + 4 control.
    assert RecordingClient.made == [(urls[0], 104, 77.0), (urls[1], 104, 77.0)]


def _e2b_spec(concurrency: int, max_concurrent: int) -> AgentRLJobSpec:
    return AgentRLJobSpec.model_validate(
        {
            "model": {"source": {"path": "tiny"}},
            "sandbox": {
                "provider": "e2b",
                "concurrency": concurrency,
                "e2b": {"apiKeySecretRef": {"name": "e2b"}, "maxConcurrent": max_concurrent},
            },
        }
    )


def test_the_e2b_plan_limit_is_applied_here_only_without_the_operators_figure(
    tmp_path: Any,
) -> None:
    spec = _e2b_spec(concurrency=384, max_concurrent=100)
    # One machine (no operator): this process applies the plan's 100, split over 3 workers.
    assert provider_limit(spec) == 100
    assert provider_limit(spec, 3) == 34  # ceil(100 / 3)
    # A cluster: the operator's in-effect figure already carries it (reconcile.concurrency).
    source = RuntimeFileSource(tmp_path / "runtime.yaml")
    assert provider_limit(spec, 3, source) is None
    # Providers without a limit of their own.
    assert provider_limit(_spec(concurrency=384, running=64, workers=1)) is None


async def test_open_rollout_on_one_machine_caps_at_the_e2b_plan() -> None:
    spec = _e2b_spec(concurrency=384, max_concurrent=100)
    async with open_rollout(
        spec,
        provider=FakeProvider(),
        engine_urls=["http://127.0.0.1:1"],
        tasks=[],
        tokenizer=_NoTokenizer(),
    ) as scheduler:
        assert (scheduler.concurrency, scheduler.effective_concurrency) == (384, 100)


class _NoTokenizer:
    def initial_ids(self, system: str, user: str) -> list[int]:
        return []

    def close_turn_ids(self, generated: Any) -> list[int]:
        return []

    def observation_ids(self, observation: str) -> list[int]:
        return []

    def decode(self, ids: Any) -> str:
        return ""


def test_a_worker_process_freezes_its_setup_and_collects_young_objects_less_often() -> None:
    # In a child process: the collector's settings are process-wide.
    code = (
        "import gc\n"
        "from agentrl.rollout.runtime import configure_worker_process\n"
        "before = gc.get_freeze_count()\n"
        "configure_worker_process()\n"
        "print(gc.get_threshold(), before == 0 and gc.get_freeze_count() > 1000)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    ).stdout
    assert out.strip() == "(50000, 20, 10) True"
