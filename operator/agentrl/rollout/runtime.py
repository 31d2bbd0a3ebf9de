"""The rollout tier wired from a spec: the one entry point ``agentrl run`` and rollout workers
call.

:func:`open_rollout` builds, from ``AgentRLJobSpec`` and the engines' URLs, everything an
episode needs (one :class:`~agentrl.engine_client.client.EngineClient` per engine with its
pool sized by :func:`~agentrl.engine_client.client.connection_pool_size`, the
:class:`EnginePool` and its health loop,
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
import gc
import math
from collections.abc import AsyncIterator, Callable, Iterable, Sequence

from agentrl.api.job import AgentRLJobSpec
from agentrl.api.wire import CHAT_TEMPLATE_MOUNT_PATH
from agentrl.engine_client.client import CONTROL_CONNECTIONS, EngineClient, connection_pool_size
from agentrl.rollout.admission import Admission
from agentrl.rollout.agent import TokenAgent, TurnTokenizer, WordTurnTokenizer
from agentrl.rollout.balancer import EnginePool
from agentrl.rollout.caps import EpisodeCaps
from agentrl.rollout.concurrency_source import (
    ConcurrencySource,
    follow,
    share_of,
    split_concurrency,
)
from agentrl.rollout.episode import EpisodeRunner
from agentrl.rollout.scheduler import GatedEpisodes, RolloutScheduler
from agentrl.rollout.tasks.model import Task
from agentrl.sandbox.provider import SandboxProvider

#: Seconds between engine health probes of the pool (failover brings engines back this fast).
HEALTH_INTERVAL_SECONDS = 5.0

#: CPython's cyclic-GC thresholds in a process that only runs episodes (see
#: :func:`configure_worker_process`). At the default (700, 10, 10) a worker keeping a thousand
#: episodes in flight collected its young generation hundreds of times a run, nearly every
#: object surviving (an episode lives for seconds to hours), and spent about a quarter of its
#: CPU in the collector with pauses up to ~100 ms (``bench/rollout_concurrency.py``). 50,000
#: allocations between young collections keeps a pause to a few ms of work; full collections
#: still run (every 20 × 10 young ones, and CPython skips them until a quarter of the old
#: objects is new), so cyclic garbage of finished episodes is still freed.
WORKER_GC_THRESHOLDS = (50_000, 20, 10)


def configure_worker_process() -> None:
    """Tune a process that does nothing but run episodes (a Ray rollout actor, a benchmark
    worker), once its imports and setup are done: what exists now is moved out of the
    collector's sight (``gc.freeze``) and the thresholds become :data:`WORKER_GC_THRESHOLDS`.
    Not for processes that also train: a trainer's cyclic garbage may hold device memory."""
    gc.freeze()
    gc.set_threshold(*WORKER_GC_THRESHOLDS)


def worker_concurrency(spec: AgentRLJobSpec, workers: int, index: int) -> int:
    """This worker's share of ``spec.sandbox.concurrency``: an even split, the remainder going
    to the first workers, so the shares add up to exactly the spec's number."""
    return split_concurrency(spec.sandbox.concurrency, workers, index)


async def starting_concurrency(
    spec_share: int,
    source: ConcurrencySource | None,
    *,
    worker_index: int = 0,
    whole: bool = False,
) -> int:
    """The concurrency a scheduler starts from: its share of the figure in effect when
    ``source`` already holds one (the operator's, after suspension, quotas and provider
    limits), else ``spec_share``, its share of the spec's figure, until the source's first
    reading."""
    figures = await source.current() if source is not None else None
    if figures is None:
        return spec_share
    return share_of(figures, worker_index=worker_index, whole=whole)


def engine_pool_size(spec: AgentRLJobSpec, concurrency: int) -> int:
    """Connections of this worker's pool towards one engine: what one engine may get from the
    whole job (:func:`~agentrl.engine_client.client.connection_pool_size`), but never more than this
    worker's own episodes can have open (one LLM call each) plus the control connections."""
    if concurrency == 0:
        return CONTROL_CONNECTIONS
    return min(connection_pool_size(spec), concurrency + CONTROL_CONNECTIONS)


async def turn_tokenizer_for(
    client: EngineClient, spec: AgentRLJobSpec | None = None, *, config_map_dir: str | None = None
) -> TurnTokenizer:
    """The turn tokenizer matching the engine's ``/get_model_info`` ``tokenizer_path``: the tiny
    policy's word tokenizer, or the model's Hugging Face tokenizer and chat template
    (:mod:`agentrl.rollout.hf_tokenizer`). From ``spec``: ``spec.model.chatTemplate`` (a
    ConfigMap's template is read where it is mounted, ``config_map_dir``) and
    ``spec.model.toolCallParser``, with which the agent acts through native tool calls and the
    template is given the tool schemas of :func:`~agentrl.rollout.swe_tools.tool_schemas`."""
    from agentrl.tiny.tokenizer import TOKENIZER_NAME

    info = await client.get_model_info()
    if info.tokenizer_path in (None, TOKENIZER_NAME):
        return WordTurnTokenizer()
    from agentrl.rollout.conversations import job_turn_tokenizer
    from agentrl.rollout.hf_tokenizer import load_hf_turn_tokenizer
    from agentrl.rollout.tasks import offered_edits

    # Reads the tokenizer files and checks the template: off the event loop.
    if spec is None:
        return await asyncio.to_thread(load_hf_turn_tokenizer, info.tokenizer_path)
    return await asyncio.to_thread(
        job_turn_tokenizer,
        spec.model,
        model_dir=info.tokenizer_path,
        config_map_dir=config_map_dir,
        edits=offered_edits(spec.dataset),
    )


def remote_worker_pool_size(spec: AgentRLJobSpec) -> int:
    """Connections of a rollout worker actor's pool towards one engine. The driver decides how
    many episodes a worker holds, and may give one worker more than its even share (another
    worker died, the concurrency was raised live), so the pool does not depend on the
    concurrency: what one engine decodes at once plus what it may queue
    (``2 × inference.maxRunningRequests``, the bound of :func:`~agentrl.engine_client.client.
    connection_pool_size`) plus the control connections. Connections open on demand, so an
    unused allowance costs nothing."""
    return 2 * spec.inference.max_running_requests + CONTROL_CONNECTIONS


@contextlib.asynccontextmanager
async def open_episode_runner(
    spec: AgentRLJobSpec,
    *,
    provider: SandboxProvider,
    engine_urls: Sequence[str],
    pool_size: int,
    tokenizer: TurnTokenizer | None = None,
    engine_client: Callable[..., EngineClient] = EngineClient,
) -> AsyncIterator[EpisodeRunner]:
    """What one process needs to run episodes: an :class:`EngineClient` per engine (pools of
    ``pool_size``), the :class:`EnginePool` and its health loop, the token-level agent with the
    tokenizer the engines report, and the episode runner with the spec's caps and failure
    policy. Engines closed and the health loop stopped on exit. Used by :func:`open_rollout`
    and by the rollout worker actors (:mod:`agentrl.rollout.ray_workers`)."""
    clients = [
        engine_client(
            url, max_connections=pool_size, timeout_seconds=spec.rollout.llm_timeout_seconds
        )
        for url in engine_urls
    ]
    pool = EnginePool(clients)
    try:
        caps = EpisodeCaps.from_spec(spec)
        # A configMapKeyRef template is where the operator mounts it in the pods that run
        # episodes (reconcile.pods.chat_template_volumes).
        agent = TokenAgent(
            pool,
            tokenizer
            or await turn_tokenizer_for(clients[0], spec, config_map_dir=CHAT_TEMPLATE_MOUNT_PATH),
            caps,
        )
        runner = EpisodeRunner(
            provider=provider,
            agent=agent,
            caps=caps,
            failure_policy=spec.rollout.failure_policy,
            on_release=pool.release,
        )
        pool.start_health(HEALTH_INTERVAL_SECONDS)
        yield runner
    finally:
        await pool.stop_health()
        for client in clients:
            await client.close()


def provider_limit(
    spec: AgentRLJobSpec, workers: int = 1, source: ConcurrencySource | None = None
) -> int | None:
    """This scheduler's share of the provider's own limit on live sandboxes (E2B's plan,
    :meth:`~agentrl.api.sandbox.SandboxSpec.provider_cap`), or None when the provider has none
    or a ``source`` follows the operator's in-effect figure, which already applies it (it is
    applied once: by the operator on a cluster, here on one machine)."""
    cap = spec.sandbox.provider_cap()
    if cap is None or source is not None:
        return None
    return math.ceil(cap[0] / workers)


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
    engine_client: Callable[..., EngineClient] = EngineClient,
) -> AsyncIterator[RolloutScheduler]:
    """A running scheduler for this worker; engines closed and health loop stopped on exit.
    Its ``runner`` is the episode runner behind a :class:`~agentrl.rollout.scheduler.
    GatedEpisodes` (capacity: the effective concurrency), for a held-out evaluation to share.

    With ``concurrency_source`` (on a cluster: :func:`~agentrl.rollout.concurrency_source.
    source_for_worker`), the scheduler follows the in-effect concurrency the operator writes,
    starting from it when the source already holds it (:func:`starting_concurrency`), else from
    the spec's figure until the source's first reading. ``engine_client`` makes
    the client of one engine (called like :class:`EngineClient`); for benchmarks, which time
    calls and compare transports."""
    concurrency = worker_concurrency(spec, workers, worker_index)
    start = await starting_concurrency(concurrency, concurrency_source, worker_index=worker_index)
    async with open_episode_runner(
        spec,
        provider=provider,
        engine_urls=engine_urls,
        pool_size=engine_pool_size(spec, concurrency),
        tokenizer=tokenizer,
        engine_client=engine_client,
    ) as runner:
        scheduler = RolloutScheduler(
            # one gate of live episodes: a held-out evaluation over ``scheduler.runner`` shares
            # this worker's concurrency instead of adding to it
            runner=GatedEpisodes(runner, start),
            tasks=tasks,
            concurrency=start,
            group_size=spec.rollout.group_size,
            admission=admission,
            provider_limit=provider_limit(spec, workers, concurrency_source),
            batch_size=spec.trainer.trajectories_per_step,
        )
        async with (
            following(concurrency_source, scheduler, worker_index=worker_index),
            scheduler,
        ):
            yield scheduler


@contextlib.asynccontextmanager
async def following(
    source: ConcurrencySource | None,
    scheduler: RolloutScheduler,
    *,
    worker_index: int = 0,
    whole: bool = False,
) -> AsyncIterator[None]:
    """While inside, ``scheduler`` follows the in-effect concurrency of ``source`` (nothing
    when None): this worker's share, or ``whole`` the whole figure."""
    if source is None:
        yield
        return
    follower = asyncio.create_task(
        follow(source, scheduler, worker_index=worker_index, whole=whole),
        name="rollout-concurrency-follower",
    )
    try:
        yield
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
