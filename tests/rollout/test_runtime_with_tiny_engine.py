"""The rollout tier wired from a spec, end to end: the real tiny CPU engine over HTTP, local
sandboxes, toy tasks, the verifier. Trajectories carry exactly the engine's tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.api.rollout import TerminalClass
from agentrl.rollout.runtime import open_rollout
from agentrl.rollout.tasks import generate_toy_tasks
from agentrl.sandbox.local import LocalProvider
from tests.factories import make_job

torch = pytest.importorskip("torch", reason="the tiny engine needs the training extra")

pytestmark = pytest.mark.slow


#: Groups of 2, three turns of 8 tokens, four local sandboxes, steps of 4.
TOY = (
    make_job("toy", None)
    .with_model_path("tiny")
    .with_inference(contextLength=4096)
    .with_rollout(groupSize=2, maxTurns=3, maxTrajectoryTokens=4096, maxTokensPerTurn=8)
    .with_sandbox(provider="local", concurrency=4)
    .with_trainer(trajectoriesPerStep=4)
)


async def test_episodes_against_the_tiny_engine_record_its_tokens_and_logprobs(
    tmp_path: Path,
) -> None:
    from aiohttp.test_utils import TestServer

    from agentrl.tiny import policy as tiny
    from agentrl.tiny.server import TinyEngine, build_app

    model = tiny.initial_policy(0)
    engine = TinyEngine(model, model_path="tiny", context_length=4096)
    server = TestServer(build_app(engine), host="127.0.0.1")
    await server.start_server()
    try:
        job = TOY.obj()
        tasks = generate_toy_tasks()[:2]
        trajectories = []
        async with open_rollout(
            job.spec,
            provider=LocalProvider(base_dir=str(tmp_path)),
            engine_urls=[str(server.make_url("/")).rstrip("/")],
            tasks=tasks,
        ) as scheduler:
            async for trajectory in scheduler.trajectories():
                trajectories.append(trajectory)
    finally:
        await server.close()
    # 2 tasks × group size 2.
    assert len(trajectories) == 4
    assert sorted(t.task_id for t in trajectories) == sorted([tasks[0].id] * 2 + [tasks[1].id] * 2)
    for t in trajectories:
        assert t.terminal_class in (TerminalClass.COMPLETED, TerminalClass.TRUNCATED)
        assert t.reward in (0.0, 1.0)
        assert 1 <= len(t.turns) <= 3
        generated = [lp for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m]
        # Every generated token has the engine's logprob (≤ 0); each turn ≤ maxTokensPerTurn.
        assert len(generated) == sum(turn.generated_tokens for turn in t.turns)
        assert all(lp <= 0.0 for lp in generated)
        assert all(turn.generated_tokens <= 8 for turn in t.turns)
        assert t.weight_versions == ["0"] * len(t.turns)
