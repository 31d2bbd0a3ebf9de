"""``agentrl trainer``: the trainer pod's entry point (the ENTRYPOINT of ``images/rocm-trainer``).

What one pod of the Indexed Job ``NAME-trainer`` does:

1. Reads the resolved manifest (``$AGENTRL_CONFIG``, the ConfigMap mount) and ``runtime.yaml``
   beside it (engine URLs, rendezvous), and the environment the operator sets
   (:class:`TrainerEnv`: ``NODE_RANK``, ``NNODES``, ``GPUS_PER_NODE``, ``MASTER_ADDR/PORT``...).
2. Starts one rank per GPU (``GPUS_PER_NODE`` processes; rank = ``NODE_RANK × GPUS_PER_NODE +
   local rank``) and opens ``torch.distributed`` (nccl/RCCL on GPUs, gloo otherwise).
3. Builds the backend of ``spec.trainer.backend`` on every rank. Rank 0 runs the driver
   (:class:`agentrl.trainer.loop.TrainingDriver`) with the rollout tier over the engine URLs,
   the weight sync of ``spec.trainer.weightSync.mode`` and checkpoints on the checkpoint
   volume; the other ranks follow it (:meth:`MegatronBackend.follow`).
4. After every step, rank 0 writes :class:`~agentrl.reconcile.observed.TrainerProgress` on its
   own pod as the ``agentrl.dev/progress`` annotation (:mod:`agentrl.trainer.progress`), and
   every weight push records ``current-weights.json`` on the checkpoint volume for the engines'
   watchdogs (:mod:`agentrl.engine.weight_pointer`).

``--dry-run`` does 1 and builds everything of 3 on this process (backend, engine clients,
weight sync, checkpoint store, task order) without starting ranks, contacting engines or
training, then prints what it built as JSON.

Limits: the rollout tier runs inside rank 0's process (one asyncio loop); the rollout worker
pods' Ray actors do not stream trajectories to the driver yet (:mod:`agentrl.rollout.ray_workers`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import yaml
from pydantic import BaseModel, ConfigDict, Field

from agentrl.api import AgentRLJob
from agentrl.api.trainer import TrainerBackend, WeightSyncMode
from agentrl.reconcile.configmap import RuntimeConfig
from agentrl.reconcile.constants import CONFIG_RUNTIME_KEY
from agentrl.reconcile.engine_flags import CHECKPOINT_MOUNT_PATH, SPEC_FILE, model_path

log = logging.getLogger("agentrl.trainer")

#: The broadcast group of ``weightSync.mode: distributed`` listens on ``MASTER_PORT`` + this
#: (``MASTER_PORT`` itself is the trainer ranks' own rendezvous).
WEIGHT_GROUP_PORT_OFFSET = 1
#: Checkpoints go here under the checkpoint volume; exported weights and
#: ``current-weights.json`` sit at its root, where the watchdog looks.
CHECKPOINT_SUBDIR = "trainer"


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
        ranks_per_engine=config.job.spec.inference.gpus_per_engine,
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
        optimizer_config_kwargs,
        read_hf_config,
        transformer_config_kwargs,
    )

    hf = read_hf_config(Path(model_path(config.job)))
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


# -- running ---------------------------------------------------------------------------------


async def drive(config: TrainerConfig, backend: Any, *, dry_run: bool = False) -> Built:
    """Rank 0: the driver loop over the rollout tier (or, ``dry_run``, only build it)."""
    from agentrl.engine.client import EngineClient, connection_pool_size
    from agentrl.rollout.admission import StalenessAdmission
    from agentrl.rollout.tasks import load_tasks, split_held_out
    from agentrl.trainer.checkpoint import CheckpointStore, DriverState
    from agentrl.trainer.loop import TaskOrder, TaskStream
    from agentrl.trainer.progress import ProgressTracker, reporter_for

    spec = config.job.spec
    tasks = load_tasks(spec.dataset)
    train, _ = split_held_out(tasks, spec.dataset.held_out_fraction, spec.dataset.seed)
    checkpoints = CheckpointStore(config.env.checkpoint_dir / CHECKPOINT_SUBDIR)
    if dry_run:  # report what a start would resume from, without reading it
        state = DriverState(step=(checkpoints.steps() or [0])[-1])
    else:
        state = checkpoints.load(backend) or DriverState()
    urls = config.runtime.engines.urls
    pool = connection_pool_size(spec)
    clients = [EngineClient(u, max_connections=pool) for u in urls]
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
    admission = StalenessAdmission(
        trajectories_per_step=spec.trainer.trajectories_per_step,
        max_staleness=spec.trainer.async_.max_staleness,
        policy_version=state.step,
        group_size=spec.rollout.group_size,
    )
    admission.admitted = state.step * spec.trainer.trajectories_per_step
    tracker = ProgressTracker(reporter_for(config.env), state=state)
    try:
        await _train(
            config, backend, clients, weight_sync, checkpoints, state, stream, admission, tracker
        )
    finally:
        for client in clients:
            await client.close()
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
) -> None:
    from agentrl.rollout.runtime import open_rollout
    from agentrl.sandbox import open_provider
    from agentrl.trainer.loop import TrainingDriver

    spec = config.job.spec
    for client in clients:
        # Engines load weights and capture graphs for minutes: wait as long as their probes do.
        await client.wait_healthy(deadline_seconds=float(spec.inference.startup_timeout_seconds))
    provider = open_provider(
        spec.sandbox,
        job=config.job,
        namespace=config.env.namespace,
        worker_id=config.env.pod_name or "trainer",
    )
    async with open_rollout(
        spec,
        provider=provider,
        engine_urls=config.runtime.engines.urls,
        tasks=stream,
        admission=admission,
    ) as scheduler:
        driver = TrainingDriver(
            spec=spec,
            backend=backend,
            source=scheduler,
            admission=admission,
            weight_sync=weight_sync,
            checkpoints=checkpoints,
            stream=stream,
            state=state,
            steps_log=config.env.checkpoint_dir / CHECKPOINT_SUBDIR / "steps.jsonl",
            on_step=lambda record: tracker.on_step(record, driver),
        )
        await driver.run()
        await tracker.flush()


def _spawn_local_ranks(env: TrainerEnv) -> int:
    """Start one process per GPU of this pod (this command again, with ``LOCAL_RANK`` set);
    the pod fails as soon as one rank fails."""
    procs = []
    for local in range(env.ranks_per_node):
        child_env = {**os.environ, "LOCAL_RANK": str(local)}
        child_env["RANK"] = str(env.node_rank * env.ranks_per_node + local)
        child_env["WORLD_SIZE"] = str(env.world_size)
        procs.append(subprocess.Popen([sys.argv[0], *sys.argv[1:]], env=child_env))
    status = 0
    for proc in procs:
        status = status or proc.wait()
    return status


def run_rank(config: TrainerConfig) -> None:
    """One rank: open torch.distributed, build the backend, drive (rank 0) or follow."""
    import torch

    env = config.env
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
                asyncio.run(drive(config, backend))
            finally:
                if hasattr(backend, "stop_followers"):
                    backend.stop_followers()
        else:
            backend.follow()
    finally:
        torch.distributed.destroy_process_group()


@click.command("trainer")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Resolved manifest (default: $AGENTRL_CONFIG, else the ConfigMap mount).",
)
@click.option("--dry-run", is_flag=True, help="Build everything, print it as JSON, and exit.")
def trainer(config_path: Path | None, dry_run: bool) -> None:
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
    if env.local_rank is None and env.ranks_per_node > 1:
        sys.exit(_spawn_local_ranks(env))
    run_rank(config)
