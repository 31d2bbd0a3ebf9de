"""The trainer pod's processes: what ``agentrl trainer`` (:mod:`agentrl.trainer.cli`) runs.

What one pod of the Indexed Job ``NAME-trainer`` does:

1. Reads the resolved manifest (``$AGENTRL_CONFIG``, the ConfigMap mount) and ``runtime.yaml``
   beside it (engine URLs, rendezvous), and the environment the operator sets
   (:class:`TrainerEnv`: ``NODE_RANK``, ``NNODES``, ``GPUS_PER_NODE``, ``MASTER_ADDR/PORT``...).
2. With Ray (the default where it is installed): pod 0 starts the Ray head (the rollout worker
   pods join it too), the other pods join it as Ray nodes offering their GPUs and CPU request,
   and pod 0 places the job (:mod:`agentrl.ray_cluster.placement`): one placement group with a
   bundle per rank and one for the driver, ready within ``--placement-timeout``. Every rank is
   a :class:`~agentrl.trainer.ranks.TrainerRank` actor in its bundle; they open
   ``torch.distributed`` (nccl/RCCL on GPUs, gloo otherwise) at rank 0's node.
   ``--no-ray``: each pod starts one rank process per GPU itself (rank = ``NODE_RANK ×
   GPUS_PER_NODE + local rank``), rank 0 at ``MASTER_ADDR``.
3. Builds the backend of ``spec.trainer.backend`` on every rank. The driver
   (:class:`agentrl.trainer.loop.TrainingDriver`) runs the rollout tier over the engine URLs
   and checkpoints on the checkpoint volume, stepping rank 0 — under Ray from its own actor,
   through :class:`~agentrl.trainer.ranks.RemoteBackend`, with the weight sync of
   ``spec.trainer.weightSync.mode`` in rank 0; without Ray in rank 0's process. The other ranks
   follow rank 0 (:meth:`MegatronBackend.follow`).
4. After every step, the driver writes :class:`~agentrl.api.wire.TrainerProgress` on
   pod 0 as the ``agentrl.dev/progress`` annotation (:mod:`agentrl.trainer.progress`), and
   every weight push records ``current-weights.json`` on the checkpoint volume for the engines'
   watchdogs (:mod:`agentrl.engine.weight_pointer`).

5. SIGTERM (the job is suspended, the node drained, the pod deleted) stops the driver cleanly
   (:mod:`agentrl.trainer.stopping`): it finishes the step in progress, checkpoints it, reports
   the checkpoint and exits 143; the other ranks and the other pods' Ray nodes ignore the signal
   and keep serving the driver until it releases them. The pod's
   ``terminationGracePeriodSeconds`` (``spec.trainer.checkpoint.stopGracePeriodSeconds``)
   bounds all of it.

``--dry-run`` does 1 and builds everything of 3 on this process (backend, engine clients,
weight sync, checkpoint store, task order) without starting ranks, contacting engines or
training, then prints what it built as JSON.

The rollout tier: under Ray, the episodes run in ``spec.rollout.workers`` rollout worker actors,
placed in the job's rollout placement group (on the rollout worker pods, which joined the head),
and stream their trajectories back to the driver (:mod:`agentrl.rollout.ray_workers`); the
driver keeps the scheduler with the job's whole in-effect concurrency (followed from the mounted
``runtime.yaml``), admission and the task order. ``--no-ray``: the episodes run in rank 0's
process (one asyncio loop).

The run itself is wired by :mod:`agentrl.trainer.assembly` (as for ``agentrl run``); this
module supplies the cluster's inputs to it: the backend (:mod:`agentrl.trainer.factories`, or
rank 0's actor), the engine Services' clients and weight sync, the checkpoint volume, the
rollout tier (:func:`cluster_rollout`), progress reporting, task images and ``/metrics``; and
it owns the process topology: rank processes, rank and driver actors, the Ray node's lifecycle.

Callers: :mod:`agentrl.trainer.cli`, tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, Field

from agentrl.api.wire import RAY_HEAD_PORT
from agentrl.ray_cluster.node import (
    agree_on_ray_auth,
    join_head,
    start_ray_node,
    stop_ray_node,
    wait_reachable,
)
from agentrl.trainer.assembly import (
    RunParts,
    SessionOptions,
    TaskSplit,
    build_parts,
    open_session,
    peek_state,
    restore_state,
    sandbox_provider,
    warm_up,
)
from agentrl.trainer.checkpoint_saves import CheckpointSaveError
from agentrl.trainer.config import (
    CHECKPOINT_SUBDIR,
    TrainerConfig,
    TrainerEnv,
    runtime_file,
)
from agentrl.trainer.factories import (
    MegatronPlan,
    build_backend,
    build_weight_sync,
    dry_run_backend,
)
from agentrl.trainer.stopping import STOPPED_EXIT_CODE, StopRequest, ignore_stop, on_stop_signals

log = logging.getLogger("agentrl.trainer")


class Built(BaseModel):
    """What ``--dry-run`` reports."""

    job: str
    backend: str
    weight_sync: str
    engines: list[str]
    world_size: int
    rank: int
    checkpoint_dir: str
    resume_step: int
    train_tasks: int
    megatron: dict[str, Any] | None = None
    """The derived megatron configuration (megatron backend only)."""
    rollout_workers: list[dict[str, Any]] = Field(default_factory=list)
    """What each rollout worker actor did (:class:`agentrl.rollout.ray_workers.WorkerStats`:
    its process, episodes, peak in flight); empty when the episodes ran in the driver."""
    stopped: str | None = None
    """What stopped the driver before ``maxSteps`` (``SIGTERM``); None: it ran to the end."""

    @property
    def exit_code(self) -> int:
        """The process's: :data:`~agentrl.trainer.stopping.STOPPED_EXIT_CODE` after a stop
        (a deleted pod must not count as a completed index of the Job), else 0."""
        return STOPPED_EXIT_CODE if self.stopped else 0


# -- running ---------------------------------------------------------------------------------


async def drive(
    config: TrainerConfig,
    backend: Any,
    *,
    dry_run: bool = False,
    rollout_workers: list[Any] | None = None,
    stop: StopRequest | None = None,
) -> Built:
    """Rank 0: the driver loop over the rollout tier (or, ``dry_run``, only build it).

    ``rollout_workers``: the rollout worker actors that run the episodes (under Ray); None
    runs them in this process. ``stop``: stops the loop cleanly once requested; SIGTERM
    requests it where this runs on the main thread (elsewhere the caller forwards it)."""
    from agentrl.engine_client.client import EngineClient, connection_pool_size
    from agentrl.rollout.metrics_export import WorkerMetrics, serve
    from agentrl.trainer import task_images
    from agentrl.trainer.checkpoint import CheckpointStore
    from agentrl.trainer.progress import ProgressTracker, reporter_for

    spec = config.job.spec
    tasks = TaskSplit.of(spec)
    checkpoints = CheckpointStore(config.env.checkpoint_dir / CHECKPOINT_SUBDIR)
    # a dry run reports what a start would resume from, without reading it
    state = peek_state(checkpoints) if dry_run else restore_state(checkpoints, backend)
    urls = config.runtime.engines.urls
    pool = connection_pool_size(spec)
    clients = [EngineClient(u, max_connections=pool) for u in urls]
    if hasattr(backend, "open_weight_sync"):  # rank 0 is an actor: the sync lives there
        weight_sync = await asyncio.to_thread(backend.open_weight_sync, state.step)
    else:
        weight_sync = build_weight_sync(config, backend, clients, state.step)
    parts = build_parts(
        spec,
        tasks=tasks,
        backend=backend,
        checkpoints=checkpoints,
        state=state,
        weight_sync=weight_sync,
    )
    built = Built(
        job=config.job.metadata.name,
        backend=spec.trainer.backend.value,
        weight_sync=type(weight_sync).__name__,
        engines=list(urls),
        world_size=config.env.world_size,
        rank=config.env.rank,
        checkpoint_dir=str(checkpoints.root),
        resume_step=state.step,
        train_tasks=len(tasks.train),
        megatron=backend.model_dump() if isinstance(backend, MegatronPlan) else None,
    )
    if dry_run:
        for client in clients:
            await client.close()
        return built
    sink = task_images.sink_for(config.env)
    if sink is not None:  # pre-pull is on: tell the operator which images the tasks need
        await task_images.publish(
            sink,
            task_images.images_in_draw_order(
                parts.stream.order,
                cursor=state.task_cursor,
                pending=state.pending_positions,
                held_out=tasks.held_out,
            ),
        )
    tracker = ProgressTracker(reporter_for(config.env), state=state)
    exported = WorkerMetrics()
    server = None
    if config.env.metrics_port is not None:
        server = serve(config.env.metrics_port, workers=exported)
        log.info("serving /metrics on port %d", server.port)
    episodes = None
    if rollout_workers:
        from agentrl.rollout.ray_workers import RemoteEpisodes

        episodes = RemoteEpisodes(rollout_workers, spec, on_metrics=exported.update)
    stop = stop or StopRequest()
    try:
        with on_stop_signals(stop):
            await _train(config, parts, clients, tracker, episodes=episodes, stop=stop)
        built.stopped = stop.reason
    finally:
        for client in clients:
            await client.close()
        if server is not None:
            server.close()
        for stats in episodes.final_stats if episodes is not None else []:
            log.info("rollout worker %s", stats.model_dump_json())
            built.rollout_workers.append(stats.model_dump())
    return built


async def _train(
    config: TrainerConfig,
    parts: RunParts,
    clients: list[Any],
    tracker: Any,
    *,
    episodes: Any = None,
    stop: StopRequest | None = None,
) -> None:
    """Wait for the engines, then run the session :mod:`agentrl.trainer.assembly` wires over
    the cluster's rollout tier, reporting progress and evaluations through ``tracker``."""
    from agentrl.trainer.evaluation import EVALUATIONS_LOG

    spec = config.job.spec
    for client in clients:
        # Engines load weights and capture graphs for minutes: wait as long as their probes do.
        await client.wait_healthy(deadline_seconds=float(spec.inference.startup_timeout_seconds))
    run_dir = config.env.checkpoint_dir / CHECKPOINT_SUBDIR
    options = SessionOptions(
        steps_log=run_dir / "steps.jsonl",
        # held-out pass@1 through the same episode runner, beside the loop (never awaited)
        evaluation=spec.trainer.evaluation,
        evaluations_log=run_dir / EVALUATIONS_LOG,
        on_evaluation=tracker.on_evaluation,
        on_step=tracker.on_step,
        stop=stop,
    )
    async with open_session(parts, cluster_rollout(config, episodes), options) as session:
        driver = session.driver
        if spec.trainer.warm_start is not None:
            warm = await _warm_start(config, parts, session.evaluation, tracker, stop=stop)
            if not warm.done:  # stopped in the middle: it checkpointed where it was
                tracker.on_stop(parts.state.step)
                await tracker.flush()
                return
        try:
            await driver.run()
        except CheckpointSaveError:  # the saves that ended the run reach the status first
            tracker.on_checkpoint(driver.last_checkpoint_step, driver.checkpoint_failure)
            await tracker.flush()
            raise
        # the status shows the step a resume continues from, and a failed save made good
        tracker.on_checkpoint(driver.last_checkpoint_step, driver.checkpoint_failure)
        await tracker.flush()


async def _warm_start(
    config: TrainerConfig,
    parts: RunParts,
    evaluation: Any,
    tracker: Any,
    *,
    stop: StopRequest | None,
) -> Any:
    """The warm start before RL (:func:`agentrl.trainer.assembly.warm_up`), with the three
    evaluations' first two, each waited for with the whole concurrency (nothing trains
    meanwhile): the model as given (before the stage begins; not again on a restart) and the
    warm-started weights (again on a restart before RL's first step)."""
    from agentrl.api.wire import CHAT_TEMPLATE_MOUNT_PATH, model_path
    from agentrl.rollout.conversations import job_turn_tokenizer
    from agentrl.rollout.tasks import offered_edits

    spec = config.job.spec
    state = parts.state
    if evaluation is not None and state.warm_start is None and state.step == 0:
        await evaluation.run_now(0)  # base: the engines serve the model as given
    turns = await asyncio.to_thread(
        job_turn_tokenizer,
        spec.model,
        model_dir=model_path(config.job),
        config_map_dir=CHAT_TEMPLATE_MOUNT_PATH,
        edits=offered_edits(spec.dataset),
    )
    warm = await warm_up(
        parts,
        turns,
        log_dir=config.env.checkpoint_dir / CHECKPOINT_SUBDIR,
        on_progress=tracker.on_warm_start,
        stop=stop,
    )
    assert warm is not None
    if warm.done:
        tracker.on_warm_start(warm)
        if evaluation is not None and state.step == 0:
            # the warm-started weights, waited for like the base: with the driver's evaluation
            # at the start beside training, step 1's push would reach the engines while it ran
            # and the figure would mix two weight versions
            evaluation.warm_start_done()
            await evaluation.run_now(0)
    return warm


def cluster_rollout(config: TrainerConfig, episodes: Any) -> Any:
    """The cluster's rollout tier (an :data:`agentrl.trainer.assembly.RolloutTier`): over the
    rollout worker actors of ``episodes`` (a :class:`~agentrl.rollout.ray_workers.
    RemoteEpisodes`) when given, else in this process with the spec's sandbox provider;
    following the in-effect concurrency of the mounted ``runtime.yaml``."""

    @contextlib.asynccontextmanager
    async def tier(stream: Any, admission: Any) -> AsyncIterator[Any]:
        from agentrl.rollout.concurrency_source import RuntimeFileSource

        spec = config.job.spec
        runtime = runtime_file(config.env)
        source = RuntimeFileSource(runtime) if runtime.is_file() else None
        if episodes is not None:
            from agentrl.rollout.ray_workers import open_remote_rollout

            async with open_remote_rollout(
                spec, episodes, tasks=stream, admission=admission, concurrency_source=source
            ) as scheduler:
                yield scheduler
            return
        from agentrl.rollout.runtime import open_rollout

        provider = sandbox_provider(
            spec.sandbox,
            pods=config.runtime.sandbox.pods,
            namespace=config.env.namespace,
            worker_id=config.env.pod_name or "trainer",
        )
        try:
            async with open_rollout(
                spec,
                provider=provider,
                engine_urls=config.runtime.engines.urls,
                tasks=stream,
                admission=admission,
                concurrency_source=source,
            ) as scheduler:
                yield scheduler
        finally:
            await provider.aclose()

    return tier


def spawn_local_ranks(env: TrainerEnv) -> int:
    """Start one process per GPU of this pod (this command again, with ``LOCAL_RANK`` set);
    the pod fails as soon as one rank fails. SIGTERM goes on to the driver (rank 0) only: the
    other ranks follow it to its checkpoint."""
    import signal

    procs: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, frame: Any) -> None:
        if env.node_rank == 0 and procs:
            procs[0].send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    for local in range(env.ranks_per_node):
        child_env = {**os.environ, "LOCAL_RANK": str(local)}
        child_env["RANK"] = str(env.node_rank * env.ranks_per_node + local)
        child_env["WORLD_SIZE"] = str(env.world_size)
        procs.append(subprocess.Popen([sys.argv[0], *sys.argv[1:]], env=child_env))
    status = 0
    for proc in procs:
        status = status or proc.wait()
    return status


def run_rank(config: TrainerConfig) -> int:
    """One rank: open torch.distributed, build the backend, drive (rank 0) or follow; returns
    the exit status (:attr:`Built.exit_code` on rank 0)."""
    import torch

    env = config.env
    if env.rank != 0:  # only the driver stops on SIGTERM; a follower dying would strand it
        ignore_stop()
    status = 0
    if torch.cuda.is_available():
        torch.cuda.set_device(env.local_rank or 0)
    torch.distributed.init_process_group(
        "nccl" if torch.cuda.is_available() else "gloo",
        init_method=f"tcp://{env.master_addr}:{env.master_port}",
        rank=env.rank,
        world_size=env.world_size,
    )
    try:
        backend = build_backend(config)
        if env.rank == 0:
            try:
                status = asyncio.run(drive(config, backend)).exit_code
            finally:
                if hasattr(backend, "stop_followers"):
                    backend.stop_followers()
        else:
            backend.follow()
    finally:
        torch.distributed.destroy_process_group()
    return status


# -- under Ray -------------------------------------------------------------------------------


class TrainerDriver:
    """The driver as a Ray actor in its own bundle: :func:`drive` over rank 0's actor. Started
    with two threads (:func:`agentrl.ray_cluster.placement.start_driver`) so that
    :meth:`request_stop` reaches it while :meth:`run` runs."""

    def __init__(self) -> None:
        self.stop = StopRequest()

    def request_stop(self, reason: str) -> None:
        """Pod 0 got SIGTERM: stop at the next step boundary, checkpointed."""
        self.stop.request_threadsafe(reason)

    def where(self) -> dict[str, Any]:
        """Where the driver runs (:func:`agentrl.ray_cluster.placement.current_placement`)."""
        from agentrl.ray_cluster.placement import current_placement

        return current_placement().model_dump()

    def run(
        self, config: dict[str, Any], rank0: Any, rollout_workers: list[Any] | None = None
    ) -> dict[str, Any]:
        from agentrl.trainer.ranks import RemoteBackend

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        parsed = TrainerConfig.model_validate(config)
        built = asyncio.run(
            drive(parsed, RemoteBackend(rank0), rollout_workers=rollout_workers, stop=self.stop)
        )
        return built.model_dump(mode="json")


def rollout_worker_config(config: TrainerConfig) -> Any:
    """What the job's rollout worker actors are started with (:mod:`agentrl.rollout.
    ray_workers`): the manifest, the engines, ``spec.rollout.workers``, the job's namespace and
    the sandbox pod template (``runtime.yaml``)."""
    from agentrl.rollout.ray_workers import RolloutWorkerConfig

    return RolloutWorkerConfig(
        job=config.job.to_manifest(),
        sandbox_pods=config.runtime.sandbox.pods,
        engine_urls=list(config.runtime.engines.urls),
        workers=config.job.spec.rollout.workers,
        namespace=config.env.namespace,
    )


def run_placed(config: TrainerConfig, placed: Any) -> Built:
    """Start the rank actors, the rollout workers (when ``placed`` has a rollout group) and the
    driver in ``placed``'s bundles and train to the end.

    Fails as soon as any rank or the driver fails (a rank that dies mid-collective would
    otherwise leave the others waiting). SIGTERM to this process (pod 0's main process) is
    handed to the driver actor, which stops cleanly; the ranks keep following it."""
    import signal

    import ray

    from agentrl.ray_cluster import placement
    from agentrl.rollout.ray_workers import start_workers_in
    from agentrl.trainer.ranks import TrainerRank

    payload = config.model_dump(mode="json", by_alias=True)
    ranks = placement.start_trainer_ranks(placed, TrainerRank)
    address, port = ray.get(ranks[0].rendezvous.remote())
    ray.get([r.setup.remote(payload, address, port) for r in ranks])
    follows = [r.follow.remote() for r in ranks[1:]]
    workers = None
    if placed.rollout is not None:
        workers = start_workers_in(placed, rollout_worker_config(config))
    driver = placement.start_driver(placed, TrainerDriver)
    run = driver.run.remote(payload, ranks[0], workers)
    pending = [run, *follows]
    signals: list[str] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: signals.append("SIGTERM"))
    forwarded = False
    try:
        while True:
            # a timeout: a signal handler only runs when the main thread is back in Python
            done, pending = ray.wait(pending, num_returns=1, timeout=1.0)
            if signals and not forwarded:
                driver.request_stop.remote(signals[0])
                forwarded = True
            if not done:
                continue
            if done[0] == run:
                built = Built.model_validate(ray.get(run))
                break
            ray.get(done[0])  # raises the rank's error
            rank = 1 + follows.index(done[0])
            raise RuntimeError(f"trainer rank {rank} stopped following before the driver finished")
    finally:
        signal.signal(signal.SIGTERM, previous)
    ray.get(ranks[0].stop_followers.remote())
    ray.get(follows)
    ray.get([r.close.remote() for r in ranks])
    return built


def join_ray(
    config: TrainerConfig,
    *,
    timeout_s: float,
    port: int = RAY_HEAD_PORT,
    temp_dir: str | None = None,
) -> int:
    """Pods other than 0: be a Ray node of the head on pod 0 (``MASTER_ADDR``), offering this
    pod's GPUs and CPU request, until the head goes away — the job is over: exit 0 (pod 0's exit
    status is the job's) — or this node's Ray fails while the head is still there."""
    from agentrl.ray_cluster.placement import trainer_node_resources

    ignore_stop()  # the driver's ranks on this node serve it until it checkpoints
    return join_head(
        config.env.master_addr,
        trainer_node_resources(config.job.spec).node_offer(),
        port=port,
        timeout_s=timeout_s,
        temp_dir=temp_dir,
    )


def run_with_ray(
    config: TrainerConfig,
    *,
    timeout_s: float,
    port: int = RAY_HEAD_PORT,
    temp_dir: str | None = None,
) -> int:
    """The trainer under Ray: pod 0 starts the head and places the job (the driver and every
    rank in their bundles), the other pods join (:func:`join_ray`). ``timeout_s`` bounds the
    head's start and the placement group's readiness (every trainer pod joined)."""
    from agentrl.ray_cluster import placement

    if config.env.node_rank > 0:
        return join_ray(config, timeout_s=timeout_s, port=port, temp_dir=temp_dir)
    agree_on_ray_auth()
    import ray

    head = start_ray_node(
        placement.trainer_node_resources(config.job.spec).node_offer(), port=port, temp_dir=temp_dir
    )
    try:
        if not wait_reachable("127.0.0.1", port, timeout_s=timeout_s):
            log.error("the Ray head did not come up within %gs", timeout_s)
            return 1
        ray.init(address=f"127.0.0.1:{port}", log_to_driver=True)
        # the rollout group too: its workers run the episodes (spec.rollout.workers ≥ 1)
        placed = placement.place(
            placement.plan_placement(config.job), timeout_s=timeout_s, rollout=True
        )
        try:
            built = run_placed(config, placed)
        finally:
            placed.remove()
        log.info("the driver of %s finished (stopped: %s)", built.job, built.stopped)
        return built.exit_code
    finally:
        ray.shutdown()
        stop_ray_node(head)


def dry_run(config: TrainerConfig) -> Built:
    """``--dry-run``: build everything of the run on this process (:func:`dry_run_backend`,
    engine clients, weight sync, checkpoint store, task order) without starting ranks,
    contacting engines or training."""
    return asyncio.run(drive(config, dry_run_backend(config), dry_run=True))


def run_trainer(config: TrainerConfig, *, use_ray: bool | None, placement_timeout: float) -> int:
    """This pod's part of the job, by topology: under Ray (``use_ray``; None: when ray is
    installed) :func:`run_with_ray`; else one rank process per GPU (:func:`spawn_local_ranks`),
    or, in such a process or on a one-rank pod, the rank itself (:func:`run_rank`). Returns the
    process's exit status."""
    env = config.env
    if use_ray is None:
        try:
            import ray  # noqa: F401

            use_ray = True
        except ImportError:
            use_ray = False
    if use_ray and env.local_rank is None:
        return run_with_ray(config, timeout_s=placement_timeout)
    if env.local_rank is None and env.ranks_per_node > 1:
        return spawn_local_ranks(env)
    return run_rank(config)
