"""The rollout tier wired from a spec: the one entry point ``agentrl run`` and rollout workers
call.

:func:`open_rollout` builds, from ``AgentRLJobSpec`` and the engines' URLs, everything an
episode needs (one :class:`~agentrl.engine.client.EngineClient` per engine with its pool sized by
:func:`~agentrl.engine.client.connection_pool_size`, the :class:`EnginePool` and its health loop,
the token-level agent with the tokenizer the engines report, the episode runner with the spec's
caps and failure policy) and yields a :class:`RolloutScheduler` running this worker's share of
``spec.sandbox.concurrency``. The caller owns the sandbox provider, the task source and admission
control (the trainer's :class:`~agentrl.rollout.admission.StalenessAdmission`)::

    admission = StalenessAdmission(trajectories_per_step=..., max_staleness=...)
    async with open_rollout(spec, provider=provider, engine_urls=urls, tasks=tasks,
                            admission=admission) as scheduler:
        async for trajectory in scheduler.trajectories():
            ...
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Iterable, Sequence

from agentrl.api.job import AgentRLJobSpec
from agentrl.api.sandbox import SandboxProvider as ProviderName
from agentrl.engine.client import EngineClient, connection_pool_size
from agentrl.rollout.admission import Admission
from agentrl.rollout.agent import TokenAgent, TurnTokenizer, WordTurnTokenizer
from agentrl.rollout.balancer import EnginePool
from agentrl.rollout.caps import EpisodeCaps
from agentrl.rollout.concurrency_source import ConcurrencySource, follow, split_concurrency
from agentrl.rollout.episode import EpisodeRunner
from agentrl.rollout.scheduler import RolloutScheduler
from agentrl.rollout.tasks.model import Task
from agentrl.sandbox.provider import SandboxProvider

#: Seconds between engine health probes of the pool (failover brings engines back this fast).
HEALTH_INTERVAL_SECONDS = 5.0


def worker_concurrency(spec: AgentRLJobSpec, workers: int, index: int) -> int:
    """This worker's share of ``spec.sandbox.concurrency``: an even split, the remainder going
    to the first workers, so the shares add up to exactly the spec's number."""
    return split_concurrency(spec.sandbox.concurrency, workers, index)


async def turn_tokenizer_for(client: EngineClient) -> TurnTokenizer:
    """The turn tokenizer matching the engine's ``/get_model_info`` ``tokenizer_path``."""
    from agentrl.engine.tokenizer import TOKENIZER_NAME

    info = await client.get_model_info()
    if info.tokenizer_path in (None, TOKENIZER_NAME):
        return WordTurnTokenizer()
    raise NotImplementedError(
        f"token-level episodes for tokenizer {info.tokenizer_path!r} need its chat template; "
        "only the tiny policy's (agentrl:tiny) is wired so far"
    )


@contextlib.asynccontextmanager
async def open_rollout(
    spec: AgentRLJobSpec,
    *,
    provider: SandboxProvider,
    engine_urls: Sequence[str],
    tasks: Iterable[Task],
    admission: Admission | None = None,
    workers: int = 1,
    worker_index: int = 0,
    tokenizer: TurnTokenizer | None = None,
    concurrency_source: ConcurrencySource | None = None,
) -> AsyncIterator[RolloutScheduler]:
    """A running scheduler for this worker; engines closed and health loop stopped on exit.

    With ``concurrency_source`` (on a cluster: :func:`~agentrl.rollout.concurrency_source.
    source_for_worker`), the scheduler follows the in-effect concurrency the operator writes,
    starting from the spec's figure until the source's first reading."""
    concurrency = worker_concurrency(spec, workers, worker_index)
    pool_size = min(connection_pool_size(spec), concurrency + 4) if concurrency else 4
    clients = [
        EngineClient(
            url, max_connections=pool_size, timeout_seconds=spec.rollout.llm_timeout_seconds
        )
        for url in engine_urls
    ]
    health: asyncio.Task[None] | None = None
    follower: asyncio.Task[None] | None = None
    try:
        pool = EnginePool(clients)
        caps = EpisodeCaps.from_spec(spec)
        agent = TokenAgent(pool, tokenizer or await turn_tokenizer_for(clients[0]), caps)
        runner = EpisodeRunner(
            provider=provider,
            agent=agent,
            caps=caps,
            failure_policy=spec.rollout.failure_policy,
            on_release=pool.release,
        )
        provider_limit = None
        if spec.sandbox.provider == ProviderName.E2B and spec.sandbox.e2b is not None:
            provider_limit = math.ceil(spec.sandbox.e2b.max_concurrent / workers)
        scheduler = RolloutScheduler(
            runner=runner,
            tasks=tasks,
            concurrency=concurrency,
            group_size=spec.rollout.group_size,
            admission=admission,
            provider_limit=provider_limit,
            batch_size=spec.trainer.trajectories_per_step,
        )
        health = asyncio.create_task(pool.watch_health(HEALTH_INTERVAL_SECONDS))
        if concurrency_source is not None:
            follower = asyncio.create_task(
                follow(concurrency_source, scheduler, worker_index=worker_index),
                name="rollout-concurrency-follower",
            )
        async with scheduler:
            yield scheduler
    finally:
        for task in (follower, health):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        for client in clients:
            await client.close()
