"""``agentrl trainer``: the trainer pod's entry point (the ENTRYPOINT of ``images/rocm-trainer``).

What one pod of the Indexed Job ``NAME-trainer`` does:

1. Reads the resolved manifest (``$AGENTRL_CONFIG``, the ConfigMap mount) and ``runtime.yaml``
   beside it (engine URLs, rendezvous), and the environment the operator sets
   (:class:`TrainerEnv`: ``NODE_RANK``, ``NNODES``, ``GPUS_PER_NODE``, ``MASTER_ADDR/PORT``...).
2. With Ray (the default where it is installed): pod 0 starts the Ray head (the rollout worker
   pods join it too), the other pods join it as Ray nodes offering their GPUs and CPU request,
   and pod 0 places the job (:mod:`agentrl.trainer.placement`): one placement group with a
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
4. After every step, the driver writes :class:`~agentrl.reconcile.observed.TrainerProgress` on
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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import click
import yaml
from pydantic import BaseModel, ConfigDict, Field

from agentrl.api import AgentRLJob
from agentrl.api.trainer import TrainerBackend, WeightSyncMode
from agentrl.ray_node.node import (
    agree_on_ray_auth,
    join_head,
    start_ray_node,
    stop_ray_node,
    wait_reachable,
)
from agentrl.reconcile.configmap import RuntimeConfig
from agentrl.reconcile.constants import CONFIG_RUNTIME_KEY, RAY_HEAD_PORT
from agentrl.reconcile.engine_flags import CHECKPOINT_MOUNT_PATH, SPEC_FILE, model_path
from agentrl.trainer.stopping import STOPPED_EXIT_CODE, StopRequest, ignore_stop, on_stop_signals

log = logging.getLogger("agentrl.trainer")

#: The broadcast group of ``weightSync.mode: distributed`` listens on ``MASTER_PORT`` + this
#: (``MASTER_PORT`` itself is the trainer ranks' own rendezvous).
WEIGHT_GROUP_PORT_OFFSET = 1
#: Checkpoints go here under the checkpoint volume; exported weights and
#: ``current-weights.json`` sit at its root, where the watchdog looks.
CHECKPOINT_SUBDIR = "trainer"
#: Default of ``--placement-timeout``: the trainer pods pull the same large ROCm image and start
#: in the same window as the engines, whose ``startupTimeoutSeconds`` defaults to this too.
DEFAULT_PLACEMENT_TIMEOUT_S = 1800.0


class TrainerEnv(BaseModel):
    """The environment the operator gives the trainer container (``reconcile.trainer``)."""

    model_config = ConfigDict(frozen=True)

    config: Path = Path(SPEC_FILE)
    """``AGENTRL_CONFIG``: the resolved manifest."""
    pod_name: str | None = None
    namespace: str | None = None
    node_rank: int = Field(default=0, ge=0)
    nnodes: int = Field(default=1, ge=1)
    gpus_per_node: int = Field(default=0, ge=0)
    master_addr: str = "127.0.0.1"
    master_port: int = Field(default=29500, ge=1, le=65535)
    checkpoint_dir: Path = Path(CHECKPOINT_MOUNT_PATH)
    attempt: int = Field(default=0, ge=0)
    task_images_configmap: str | None = None
    """``AGENTRL_TASK_IMAGES_CONFIGMAP``: where the driver writes the dataset's task images for
    the operator's pre-pull (set only when pre-pull is on)."""
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    """``AGENTRL_METRICS_PORT``: where the driver serves ``/metrics`` (its own and the rollout
    workers' series); None serves none."""
    local_rank: int | None = None
    """Set by this command for the rank processes it starts."""

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> TrainerEnv:
        env = dict(os.environ if environ is None else environ)
        pairs = {
            "config": env.get("AGENTRL_CONFIG"),
            "pod_name": env.get("POD_NAME"),
            "namespace": env.get("POD_NAMESPACE"),
            "node_rank": env.get("NODE_RANK"),
            "nnodes": env.get("NNODES"),
            "gpus_per_node": env.get("GPUS_PER_NODE"),
            "master_addr": env.get("MASTER_ADDR"),
            "master_port": env.get("MASTER_PORT"),
            "checkpoint_dir": env.get("AGENTRL_CHECKPOINT_DIR"),
            "attempt": env.get("AGENTRL_TRAINER_ATTEMPT"),
            "metrics_port": env.get("AGENTRL_METRICS_PORT"),
            "task_images_configmap": env.get("AGENTRL_TASK_IMAGES_CONFIGMAP"),
            "local_rank": env.get("LOCAL_RANK"),
        }
        return cls.model_validate({k: v for k, v in pairs.items() if v not in (None, "")})

    @property
    def ranks_per_node(self) -> int:
        """One rank per GPU; one rank on a CPU-only pod (the torch backend)."""
        return max(self.gpus_per_node, 1)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.ranks_per_node

    @property
    def rank(self) -> int:
        return self.node_rank * self.ranks_per_node + (self.local_rank or 0)


class TrainerConfig(BaseModel):
    """Everything the trainer reads before it starts."""

    job: AgentRLJob
    runtime: RuntimeConfig
    env: TrainerEnv


def load_config(env: TrainerEnv) -> TrainerConfig:
    """The manifest at ``env.config`` and ``runtime.yaml`` beside it (the ConfigMap's two keys).

    Raises:
        FileNotFoundError: either file is missing.
        pydantic.ValidationError: either is invalid.
    """
    from agentrl.api.validation import load_job

    job = load_job(env.config.read_text(encoding="utf-8"))
    runtime_file = env.config.parent / CONFIG_RUNTIME_KEY
    runtime = RuntimeConfig.model_validate(yaml.safe_load(runtime_file.read_text(encoding="utf-8")))
    return TrainerConfig(job=job, runtime=runtime, env=env)


# -- building --------------------------------------------------------------------------------


def build_backend(config: TrainerConfig) -> Any:
    """The backend of ``spec.trainer.backend`` (torch.distributed already open for megatron)."""
    spec = config.job.spec
    if spec.trainer.backend == TrainerBackend.TORCH:
        from agentrl.engine import tiny
        from agentrl.trainer.torch_backend import TorchBackend

        source = spec.model.source.path
        model = (
            tiny.initial_policy(spec.dataset.seed)
            if source == tiny.BUILTIN_PATH
            else tiny.load_policy(model_path(config.job))
        )
        return TorchBackend(model, spec.trainer, temperature=spec.rollout.temperature)
    import torch

    from agentrl.trainer.hf_config import read_hf_config
    from agentrl.trainer.megatron_backend import MegatronBackend, initialize_parallel

    initialize_parallel(spec.trainer)
    model_dir = Path(model_path(config.job))
    dtype = {"float16": torch.float16, "float32": torch.float32}.get(
        spec.model.dtype, torch.bfloat16
    )
    return MegatronBackend(
        read_hf_config(model_dir),
        spec.trainer,
        temperature=spec.rollout.temperature,
        model_dir=model_dir,
        params_dtype=dtype,
    )


def build_weight_sync(config: TrainerConfig, backend: Any, clients: list[Any], step: int) -> Any:
    """Disk or distributed sync to the engines, recording ``current-weights.json`` at the root
    of the checkpoint volume (where engines' watchdogs read it)."""
    from agentrl.trainer.weight_sync import DiskWeightSync, DistributedWeightSync

    trainer = config.job.spec.trainer
    root = config.env.checkpoint_dir
    if trainer.weight_sync.mode == WeightSyncMode.DISK:
        return DiskWeightSync(
            clients, export=backend.export_weights, weights_dir=root, initial_version=step
        )
    import torch

    tensors = (
        backend.named_tensors
        if hasattr(backend, "named_tensors")
        else lambda: list(backend.model.named_parameters())
    )
    return DistributedWeightSync(
        clients,
        tensors=tensors,
        master_address=config.env.master_addr,
        master_port=config.env.master_port + WEIGHT_GROUP_PORT_OFFSET,
        backend="nccl" if torch.cuda.is_available() else "gloo",
        # a CPU engine (server tiny, 0 GPUs) receives in one rank, like a 1-GPU engine
        ranks_per_engine=max(config.job.spec.inference.gpus_per_engine, 1),
        interface=trainer.network.nccl_socket_ifname,
        export=backend.export_weights,
        weights_dir=root,
        initial_version=step,
    )


def dry_run_backend(config: TrainerConfig) -> Any:
    """What ``--dry-run`` builds of the backend without the ranks' process group: the whole
    torch backend; for megatron, the model's HF config and the megatron configuration derived
    from it (:class:`MegatronPlan`); building the model itself needs every rank."""
    spec = config.job.spec
    if spec.trainer.backend == TrainerBackend.TORCH:
        return build_backend(config)
    from agentrl.trainer.hf_config import (
        check_layout,
        optimizer_config_kwargs,
        read_hf_config,
        transformer_config_kwargs,
    )

    hf = read_hf_config(Path(model_path(config.job)))
    check_layout(hf, spec.trainer)
    return MegatronPlan(
        transformer=transformer_config_kwargs(hf, spec.trainer),
        optimizer=optimizer_config_kwargs(spec.trainer, bf16=spec.model.dtype == "bfloat16"),
    )


class MegatronPlan(BaseModel):
    """The megatron configuration a dry run derives (the backend's stand-in there)."""

    transformer: dict[str, Any]
    optimizer: dict[str, Any]

    def export_weights(self, directory: Path) -> None:
        raise RuntimeError("a dry run builds no model to export")


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
    from agentrl.engine.client import EngineClient, connection_pool_size
    from agentrl.rollout.admission import StalenessAdmission
    from agentrl.rollout.metrics_export import WorkerMetrics, serve
    from agentrl.rollout.tasks import load_tasks, split_held_out
    from agentrl.trainer import task_images
    from agentrl.trainer.checkpoint import CheckpointStore, DriverState
    from agentrl.trainer.loop import TaskOrder, TaskStream
    from agentrl.trainer.progress import ProgressTracker, reporter_for

    spec = config.job.spec
    tasks = load_tasks(spec.dataset)
    train, held_out = split_held_out(tasks, spec.dataset.held_out_fraction, spec.dataset.seed)
    checkpoints = CheckpointStore(config.env.checkpoint_dir / CHECKPOINT_SUBDIR)
    if dry_run:  # report what a start would resume from, without reading it
        state = DriverState(step=(checkpoints.steps() or [0])[-1])
    else:
        state = checkpoints.load(backend) or DriverState()
        if state.step:
            log.info(
                "resuming from the checkpoint of step %d (restart %d): data position %d, "
                "pending positions %s",
                state.step,
                state.restarts,
                state.task_cursor,
                state.pending_positions,
            )
    urls = config.runtime.engines.urls
    pool = connection_pool_size(spec)
    clients = [EngineClient(u, max_connections=pool) for u in urls]
    if hasattr(backend, "open_weight_sync"):  # rank 0 is an actor: the sync lives there
        weight_sync = await asyncio.to_thread(backend.open_weight_sync, state.step)
    else:
        weight_sync = build_weight_sync(config, backend, clients, state.step)
    stream = TaskStream(
        TaskOrder(train, spec.dataset.seed),
        cursor=state.task_cursor,
        pending=state.pending_positions,
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
        train_tasks=len(train),
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
                stream.order,
                cursor=state.task_cursor,
                pending=state.pending_positions,
                held_out=held_out,
            ),
        )
    admission = StalenessAdmission(
        trajectories_per_step=spec.trainer.trajectories_per_step,
        max_staleness=spec.trainer.async_.max_staleness,
        policy_version=state.step,
        group_size=spec.rollout.group_size,
    )
    admission.admitted = state.step * spec.trainer.trajectories_per_step
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
            await _train(
                config, backend, clients, weight_sync, checkpoints, state, stream, admission,
                tracker, episodes=episodes, held_out=held_out, stop=stop,
            )  # fmt: skip
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
    backend: Any,
    clients: list[Any],
    weight_sync: Any,
    checkpoints: Any,
    state: Any,
    stream: Any,
    admission: Any,
    tracker: Any,
    *,
    episodes: Any = None,
    held_out: Any = (),
    stop: StopRequest | None = None,
) -> None:
    from agentrl.trainer.evaluation import EVALUATIONS_LOG, PeriodicEvaluation
    from agentrl.trainer.loop import TrainingDriver

    spec = config.job.spec
    for client in clients:
        # Engines load weights and capture graphs for minutes: wait as long as their probes do.
        await client.wait_healthy(deadline_seconds=float(spec.inference.startup_timeout_seconds))
    run_dir = config.env.checkpoint_dir / CHECKPOINT_SUBDIR
    async with _rollout_tier(config, stream, admission, episodes) as scheduler:
        # held-out pass@1 through the same episode runner, beside the loop (never awaited)
        evaluation = PeriodicEvaluation(
            spec.trainer.evaluation,
            held_out,
            seed=spec.dataset.seed,
            runner=scheduler.runner,
            concurrency=lambda: scheduler.concurrency,
            log_path=run_dir / EVALUATIONS_LOG,
            on_result=tracker.on_evaluation,
        )
        driver = TrainingDriver(
            spec=spec,
            backend=backend,
            source=scheduler,
            admission=admission,
            weight_sync=weight_sync,
            checkpoints=checkpoints,
            stream=stream,
            state=state,
            steps_log=run_dir / "steps.jsonl",
            on_step=lambda record: tracker.on_step(record, driver),
            evaluation=evaluation,
            stop=stop,
        )
        await driver.run()
        if driver.stopped:  # the status shows the step a resume continues from
            tracker.on_stop(driver.last_checkpoint_step)
        await tracker.flush()


@contextlib.asynccontextmanager
async def _rollout_tier(
    config: TrainerConfig, stream: Any, admission: Any, episodes: Any
) -> AsyncIterator[Any]:
    """The running scheduler: over the rollout worker actors of ``episodes`` (a
    :class:`~agentrl.rollout.ray_workers.RemoteEpisodes`) when given, else in this process;
    following the in-effect concurrency of the mounted ``runtime.yaml``."""
    from agentrl.rollout.concurrency_source import RuntimeFileSource

    spec = config.job.spec
    runtime_file = config.env.config.parent / CONFIG_RUNTIME_KEY
    source = RuntimeFileSource(runtime_file) if runtime_file.is_file() else None
    if episodes is not None:
        from agentrl.rollout.ray_workers import open_remote_rollout

        async with open_remote_rollout(
            spec, episodes, tasks=stream, admission=admission, concurrency_source=source
        ) as scheduler:
            yield scheduler
        return
    from agentrl.rollout.runtime import open_rollout
    from agentrl.sandbox import open_provider

    provider = open_provider(
        spec.sandbox,
        job=config.job,
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


def _spawn_local_ranks(env: TrainerEnv) -> int:
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
    with two threads (:func:`agentrl.trainer.placement.start_driver`) so that
    :meth:`request_stop` reaches it while :meth:`run` runs."""

    def __init__(self) -> None:
        self.stop = StopRequest()

    def request_stop(self, reason: str) -> None:
        """Pod 0 got SIGTERM: stop at the next step boundary, checkpointed."""
        self.stop.request_threadsafe(reason)

    def where(self) -> dict[str, Any]:
        """Where the driver runs (:func:`agentrl.rollout.ray_workers.current_placement`)."""
        from agentrl.rollout.ray_workers import current_placement

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
    ray_workers`): the manifest, the engines, ``spec.rollout.workers``, the job's namespace."""
    from agentrl.rollout.ray_workers import RolloutWorkerConfig

    return RolloutWorkerConfig(
        job=config.job.to_manifest(),
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

    from agentrl.trainer import placement
    from agentrl.trainer.ranks import TrainerRank

    payload = config.model_dump(mode="json", by_alias=True)
    ranks = placement.start_trainer_ranks(placed, TrainerRank)
    address, port = ray.get(ranks[0].rendezvous.remote())
    ray.get([r.setup.remote(payload, address, port) for r in ranks])
    follows = [r.follow.remote() for r in ranks[1:]]
    workers = None
    if placed.rollout is not None:
        workers = placement.start_rollout_workers(placed, rollout_worker_config(config))
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
    from agentrl.trainer.placement import trainer_node_resources

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
    from agentrl.trainer import placement

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


@click.command("trainer")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Resolved manifest (default: $AGENTRL_CONFIG, else the ConfigMap mount).",
)
@click.option("--dry-run", is_flag=True, help="Build everything, print it as JSON, and exit.")
@click.option(
    "--ray/--no-ray",
    "use_ray",
    default=None,
    help="Place the driver and the ranks with Ray (default: when ray is installed); --no-ray "
    "starts one rank process per GPU of this pod.",
)
@click.option(
    "--placement-timeout",
    type=click.FloatRange(min=1.0),
    default=DEFAULT_PLACEMENT_TIMEOUT_S,
    show_default=True,
    help="Seconds for the trainer pods to join Ray and the placement group to be ready.",
)
def trainer(
    config_path: Path | None, dry_run: bool, use_ray: bool | None, placement_timeout: float
) -> None:
    """Run the GRPO trainer of the job (the trainer pod's entry point)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    env = TrainerEnv.from_environ()
    if config_path is not None:
        env = env.model_copy(update={"config": config_path})
    config = load_config(env)
    if dry_run:
        built = asyncio.run(drive(config, dry_run_backend(config), dry_run=True))
        click.echo(json.dumps(built.model_dump(), indent=2))
        return
    if use_ray is None:
        try:
            import ray  # noqa: F401

            use_ray = True
        except ImportError:
            use_ray = False
    if use_ray and env.local_rank is None:
        sys.exit(run_with_ray(config, timeout_s=placement_timeout))
    if env.local_rank is None and env.ranks_per_node > 1:
        sys.exit(_spawn_local_ranks(env))
    sys.exit(run_rank(config))
