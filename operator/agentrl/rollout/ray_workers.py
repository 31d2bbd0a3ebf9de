"""Episodes spread over processes: one Ray actor per rollout worker.

One asyncio loop keeps thousands of episodes in flight, but it is one core: JSON, tokenisation
and TLS of every LLM call and exec would queue behind each other. So the rollout tier runs as
``spec.rollout.workers`` Ray actors (on a cluster, placed on the rollout worker pods that joined
the trainer's Ray head), each a :class:`RolloutWorker` running :func:`~agentrl.rollout.runtime.
open_rollout` with its share of the concurrency (:func:`~agentrl.rollout.concurrency_source.
split_concurrency`) and, where the ConfigMap is mounted, following the in-effect figure itself.

A worker's tasks are given whole (round-robin by task), so a GRPO group never straddles two
workers. Everything crossing the process boundary is a pydantic model dumped to JSON-able
dicts (the job manifest, tasks, trajectories): no live objects are pickled.

Limits, on purpose for now: :func:`run_on_actors` returns when every worker has finished its
tasks (no streaming of trajectories to the trainer as they finish), and a worker that dies loses
its unfinished episodes (its sandbox pods are reaped by the next incarnation's first create).

Placement: the actors go where the caller's scheduling strategies put them — the bundles of
the job's rollout placement group when started by :func:`agentrl.trainer.placement.
start_rollout_workers` (the same code places the trainer ranks and the driver).

``ray`` is the ``ray`` extra and is imported only here, inside the functions that need it.
Callers: the trainer's driver, tests.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentrl.rollout.tasks.model import Task
from agentrl.rollout.trajectory import Trajectory


class ActorPlacement(BaseModel):
    """Where an actor runs, as Ray's raylet granted it (:func:`current_placement`)."""

    placement_group_id: str | None
    bundle_index: int | None
    """From the names of the resources Ray granted the worker (``CPU_group_<i>_<pg>``)."""
    node_id: str
    pid: int
    gpu_ids: list[str] = Field(default_factory=list)


_GROUP_RESOURCE = re.compile(r"^[A-Za-z]+_group_(\d+)_([0-9a-f]+)$")


def current_placement() -> ActorPlacement:
    """Where the calling actor runs: its placement group and bundle as the raylet granted
    them (not as the caller asked), its node, its process and its GPUs."""
    import ray

    context = ray.get_runtime_context()
    bundle: int | None = None
    # The raylet grants a bundle's resources under names carrying the bundle's index.
    for name in context.worker.core_worker.resource_ids():
        match = _GROUP_RESOURCE.match(name)
        if match:
            bundle = int(match.group(1))
            break
    return ActorPlacement(
        placement_group_id=context.get_placement_group_id(),
        bundle_index=bundle,
        node_id=context.get_node_id(),
        pid=os.getpid(),
        gpu_ids=[str(g) for g in context.get_accelerator_ids().get("GPU", [])],
    )


class RolloutWorkerConfig(BaseModel):
    """What every worker actor needs to build its rollout tier."""

    model_config = ConfigDict(frozen=True)

    job: dict[str, Any]
    """The AgentRLJob manifest (the ConfigMap's ``job.yaml``: defaults resolved, uid set)."""
    engine_urls: list[str] = Field(min_length=1)
    """Base URLs of the inference engines."""
    workers: int = Field(ge=1)
    """Worker actors the job's concurrency is split over."""
    namespace: str | None = None
    """Namespace of sandbox pods (provider ``kubernetes``); the job's by default."""
    kubeconfig: str | None = None
    """Kubeconfig for the provider; None: in-cluster ServiceAccount or ``$KUBECONFIG``."""
    runtime_file: str | None = None
    """The mounted ``runtime.yaml`` to follow the in-effect concurrency from; None: keep the
    spec's figure."""
    sandbox_dir: str | None = None
    """Parent directory of ``local`` sandboxes; None: the system's temporary directory."""


class WorkerResult(BaseModel):
    """What one worker actor hands back."""

    worker_index: int
    pid: int
    """The actor's process (the episodes really ran outside the driver)."""
    concurrency: int
    """The worker's share of the concurrency when it finished."""
    peak_in_flight: int
    """Most episodes the worker had in flight at once."""
    trajectories: list[Trajectory]


class RolloutWorker:
    """The body of one worker actor (wrapped by ``ray.remote`` in :func:`start_workers`)."""

    def __init__(self, config: dict[str, Any], index: int) -> None:
        self.config = RolloutWorkerConfig.model_validate(config)
        self.index = index

    def where(self) -> dict[str, Any]:
        """Where this actor runs (placement group, bundle, node, process)."""
        return current_placement().model_dump()

    async def run(self, tasks: list[dict[str, Any]]) -> dict[str, Any]:
        """Run ``tasks`` (groups of ``rollout.groupSize`` episodes each) to the end."""
        from agentrl.api import AgentRLJob
        from agentrl.rollout.concurrency_source import RuntimeFileSource
        from agentrl.rollout.runtime import configure_worker_process, open_rollout
        from agentrl.sandbox import open_provider

        configure_worker_process()  # this actor's process only runs episodes
        config = self.config
        job = AgentRLJob.model_validate(config.job)
        provider = open_provider(
            job.spec.sandbox,
            job=job,
            namespace=config.namespace,
            worker_id=f"{job.metadata.name}-rollout-{self.index}",
            kubeconfig=config.kubeconfig,
            local_base_dir=config.sandbox_dir,
        )
        source = RuntimeFileSource(config.runtime_file) if config.runtime_file else None
        trajectories: list[Trajectory] = []
        try:
            async with open_rollout(
                job.spec,
                provider=provider,
                engine_urls=config.engine_urls,
                tasks=[Task.model_validate(t) for t in tasks],
                workers=config.workers,
                worker_index=self.index,
                concurrency_source=source,
            ) as scheduler:
                async for trajectory in scheduler.trajectories():
                    trajectories.append(trajectory)
        finally:
            await provider.aclose()
        return WorkerResult(
            worker_index=self.index,
            pid=os.getpid(),
            concurrency=scheduler.concurrency,
            peak_in_flight=scheduler.peak_in_flight,
            trajectories=trajectories,
        ).model_dump(mode="json")


def init_ray(*, num_cpus: int, address: str | None = None) -> None:
    """Join the Ray cluster at ``address`` (the trainer's head), or start a local one with an
    explicit CPU count (never Ray's guess of the machine) and no dashboard."""
    import ray

    if ray.is_initialized():
        return
    if address is not None:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
        return
    ray.init(
        num_cpus=num_cpus,
        include_dashboard=False,
        log_to_driver=False,
        # The object store only carries task lists and trajectories: a small one leaves the
        # memory to the sandboxes.
        object_store_memory=100 * 1024 * 1024,
    )


def split_tasks(tasks: Sequence[Task], workers: int) -> list[list[Task]]:
    """Whole tasks, round-robin: worker ``i`` gets tasks ``i, i + workers, ...``."""
    return [list(tasks[index::workers]) for index in range(workers)]


def start_workers(
    config: RolloutWorkerConfig,
    *,
    cpus_per_worker: float = 1.0,
    strategies: Sequence[Any] | None = None,
) -> list[Any]:
    """One actor per worker, each reserving ``cpus_per_worker`` so Ray spreads them over cores
    (and over the rollout worker pods of a cluster).

    ``strategies``: one Ray scheduling strategy per worker — the bundles of the job's rollout
    placement group (:func:`agentrl.trainer.placement.start_rollout_workers`); None lets Ray
    choose."""
    import ray

    if strategies is not None and len(strategies) != config.workers:
        raise ValueError(f"{len(strategies)} scheduling strategies for {config.workers} workers")
    actor = ray.remote(num_cpus=cpus_per_worker)(RolloutWorker)
    payload = config.model_dump(mode="json")
    return [
        (
            actor if strategies is None else actor.options(scheduling_strategy=strategies[index])
        ).remote(payload, index)
        for index in range(config.workers)
    ]


async def run_on_actors(
    config: RolloutWorkerConfig,
    tasks: Sequence[Task],
    *,
    cpus_per_worker: float = 1.0,
    strategies: Sequence[Any] | None = None,
) -> list[WorkerResult]:
    """Run ``tasks`` over ``config.workers`` actors (placed by ``strategies``, as in
    :func:`start_workers`); one result per worker, in worker order."""
    import ray

    actors = start_workers(config, cpus_per_worker=cpus_per_worker, strategies=strategies)
    try:
        shares = split_tasks(tasks, config.workers)
        refs = [
            worker.run.remote([task.model_dump(mode="json") for task in share])
            for worker, share in zip(actors, shares, strict=True)
        ]
        results = await asyncio.gather(*refs)
    finally:
        for worker in actors:
            ray.kill(worker)
    return [WorkerResult.model_validate(result) for result in results]
