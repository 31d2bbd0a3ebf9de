"""Trainer ranks as Ray actors, and the driver's handles on rank 0.

Under Ray (``agentrl trainer``, :mod:`agentrl.ray_cluster.placement`) every rank is a
:class:`TrainerRank` actor in its bundle of the trainer placement group, and the driver is an
actor of its own. The ranks open ``torch.distributed`` among themselves (rank 0's node and a
free port there are the rendezvous), build the backend of ``spec.trainer.backend``, and then:

* ranks other than 0 follow rank 0 (:meth:`MegatronBackend.follow`) until it says stop;
* rank 0 serves the driver: steps (the warm start's too), checkpoints, weight export, and the
  weight sync to the engines, which lives here because it needs rank 0's weights (and, for
  ``weightSync.mode: distributed``, rank 0's GPU in the broadcast group).

The driver sees rank 0 through :class:`RemoteBackend` and :class:`RemoteWeightSync`, which have
the surfaces :class:`agentrl.trainer.loop.TrainingDriver` expects of a backend and a weight
sync (and :class:`agentrl.trainer.warm_start.WarmStart` of a backend: ``sft_step``,
``finish_warm_start``). Everything crossing the process boundary is a pydantic model (or a
dataclass) dumped to JSON-able data.

The backend and the weight sync are built by :mod:`agentrl.trainer.factories`, below this
module and :mod:`agentrl.trainer.pod` alike. ``ray`` is imported only inside the functions that
need it. Callers: :mod:`agentrl.trainer.pod`, tests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from agentrl.trainer.batching import TrainSample
from agentrl.trainer.sft_batches import SFTBatch
from agentrl.trainer.stats import StepStats
from agentrl.trainer.weight_sync import SyncReport

if TYPE_CHECKING:  # torch: imported where a warm-start update comes back, not by the driver
    from agentrl.trainer.torch_backend import SFTStats

T = TypeVar("T")


class TrainerRank:
    """The body of one trainer-rank actor (started by
    :func:`agentrl.ray_cluster.placement.start_trainer_ranks`)."""

    def __init__(self, rank: int, world_size: int, ranks_per_node: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.ranks_per_node = ranks_per_node
        self.backend: Any = None
        self.weight_sync: Any = None
        self._clients: list[Any] = []
        # One loop for the weight sync's engine clients, kept across calls (their HTTP
        # sessions belong to it); this actor runs one call at a time, on one thread.
        self._loop = asyncio.new_event_loop()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run_until_complete(coro)

    # -- placement and setup -----------------------------------------------------------------

    def where(self) -> dict[str, Any]:
        """Where this rank runs (:func:`agentrl.ray_cluster.placement.current_placement`)."""
        from agentrl.ray_cluster.placement import current_placement

        return {"rank": self.rank, **current_placement().model_dump()}

    def rendezvous(self) -> tuple[str, int]:
        """This node's address and a free port on it (rank 0: ``MASTER_ADDR``/``PORT``)."""
        import ray

        address = str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
        with socket.socket() as s:
            s.bind((address, 0))
            port = int(s.getsockname()[1])
        return address, port

    def setup(self, config: dict[str, Any], master_addr: str, master_port: int) -> None:
        """Open ``torch.distributed`` with the other ranks and build the backend.

        ``config``: the :class:`agentrl.trainer.config.TrainerConfig` the driver read, dumped;
        this rank's place in it (node rank, local rank, rendezvous) is filled in here."""
        import torch

        from agentrl.trainer.config import TrainerConfig
        from agentrl.trainer.factories import build_backend

        parsed = TrainerConfig.model_validate(config)
        env = parsed.env.model_copy(
            update={
                "node_rank": self.rank // self.ranks_per_node,
                "local_rank": self.rank % self.ranks_per_node,
                "nnodes": self.world_size // self.ranks_per_node,
                "master_addr": master_addr,
                "master_port": master_port,
            }
        )
        self.config = parsed.model_copy(update={"env": env})
        if torch.cuda.is_available():
            torch.cuda.set_device(self._device())
        torch.distributed.init_process_group(
            "nccl" if torch.cuda.is_available() else "gloo",
            init_method=f"tcp://{master_addr}:{master_port}",
            rank=self.rank,
            world_size=self.world_size,
        )
        self.backend = build_backend(self.config)

    @staticmethod
    def _device() -> int:
        """The GPU Ray gave this actor, as a torch device index: 0 when Ray narrowed the
        visible devices to it, its id when it did not (``RAY_EXPERIMENTAL_NOSET_*``)."""
        import ray
        import torch

        ids = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
        if torch.cuda.device_count() == 1 or not ids:
            return 0
        return int(ids[0])

    # -- ranks other than 0 ------------------------------------------------------------------

    def follow(self) -> None:
        """Run what rank 0 announces until it says stop (backends without followers, such as
        torch, have nothing to follow)."""
        if hasattr(self.backend, "follow"):
            self.backend.follow()

    # -- rank 0, for the driver --------------------------------------------------------------

    def train_step(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        stats = self.backend.train_step([TrainSample.model_validate(s) for s in samples])
        return dict(stats.model_dump(mode="json"))

    def sft_step(self, batch: dict[str, Any], lr: float) -> dict[str, Any]:
        stats = self.backend.sft_step(SFTBatch.model_validate(batch), lr=lr)
        return dataclasses.asdict(stats)

    def finish_warm_start(self) -> None:
        self.backend.finish_warm_start()

    def save_state(self, directory: str) -> None:
        self.backend.save_state(Path(directory))

    def load_state(self, directory: str) -> None:
        self.backend.load_state(Path(directory))

    def export_weights(self, directory: str) -> None:
        self.backend.export_weights(Path(directory))

    def open_weight_sync(self, step: int) -> None:
        """The weight sync of ``spec.trainer.weightSync.mode`` to the engines, here."""
        from agentrl.engine_client.client import EngineClient, connection_pool_size
        from agentrl.trainer.factories import build_weight_sync

        async def build() -> Any:
            pool = connection_pool_size(self.config.job.spec)
            self._clients = [
                EngineClient(u, max_connections=pool) for u in self.config.runtime.engines.urls
            ]
            return build_weight_sync(self.config, self.backend, self._clients, step)

        self.weight_sync = self._run(build())

    def push_weights(self, version: int) -> dict[str, Any]:
        report = self._run(self.weight_sync.push(version))
        return {
            "report": report.model_dump(mode="json"),
            "current_version": self.weight_sync.current_version,
        }

    def reconcile_weights(self) -> list[str]:
        return list(self._run(self.weight_sync.reconcile()))

    def stop_followers(self) -> None:
        """Release the other ranks from :meth:`follow`."""
        if hasattr(self.backend, "stop_followers"):
            self.backend.stop_followers()

    def close(self) -> None:
        """Close the weight sync, the engine clients and the process group."""
        import torch

        if self.weight_sync is not None and hasattr(self.weight_sync, "close"):
            self.weight_sync.close()
        for client in self._clients:
            self._run(client.close())
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


class RemoteWeightSync:
    """The driver's view of the weight sync that lives in rank 0."""

    def __init__(self, rank0: Any, *, current_version: int) -> None:
        self.rank0 = rank0
        self.current_version = current_version

    async def push(self, version: int) -> SyncReport:
        out = await self.rank0.push_weights.remote(version)
        self.current_version = int(out["current_version"])
        return SyncReport.model_validate(out["report"])

    async def reconcile(self) -> list[str]:
        return list(await self.rank0.reconcile_weights.remote())


class RemoteBackend:
    """The driver's view of rank 0's backend (:class:`agentrl.trainer.loop.Backend`)."""

    def __init__(self, rank0: Any) -> None:
        self.rank0 = rank0

    def _call(self, method: str, *args: Any) -> Any:
        import ray

        return ray.get(getattr(self.rank0, method).remote(*args))

    def train_step(self, samples: Sequence[TrainSample]) -> StepStats:
        payload = [s.model_dump(mode="json") for s in samples]
        return StepStats.model_validate(self._call("train_step", payload))

    def sft_step(self, batch: SFTBatch, *, lr: float) -> SFTStats:
        """One warm-start update on rank 0."""
        from agentrl.trainer.torch_backend import SFTStats

        return SFTStats(**self._call("sft_step", batch.model_dump(mode="json"), lr))

    def finish_warm_start(self) -> None:
        self._call("finish_warm_start")

    def save_state(self, directory: Path) -> None:
        self._call("save_state", str(directory))

    def load_state(self, directory: Path) -> None:
        self._call("load_state", str(directory))

    def export_weights(self, directory: Path) -> None:
        self._call("export_weights", str(directory))

    def open_weight_sync(self, step: int) -> RemoteWeightSync:
        """Build the weight sync in rank 0; the driver pushes through the handle returned."""
        self._call("open_weight_sync", step)
        return RemoteWeightSync(self.rank0, current_version=step)
