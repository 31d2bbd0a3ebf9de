"""The process group of ``weightSync.mode: distributed``: the trainer (rank 0) and every engine
rank, joined over a TCP rendezvous on the trainer, broadcasting tensors from rank 0.

This mirrors what SGLang does on ``POST /init_weights_update_group``: a group apart from any
default ``torch.distributed`` world (the trainer's default world is its megatron ranks), so it
is built directly from a ``TCPStore`` and a ``ProcessGroupNCCL``/``ProcessGroupGloo`` instead of
``init_process_group``. The trainer listens (rank 0 hosts the store), engines connect with their
``rank_offset``.

The network is pinned: ``nccl`` reads ``NCCL_SOCKET_IFNAME`` (RCCL reads the same name; the
trainer sets it from ``spec.trainer.network`` before the group is made), ``gloo`` is given the
interface explicitly. Without pinning, a pod with several addresses may advertise one that the
other side cannot reach and the rendezvous hangs.

Callers: :class:`agentrl.trainer.weight_sync.DistributedWeightSync` (rank 0) and the tiny
engine's endpoints (:mod:`agentrl.tiny.weight_updates`). torch is imported inside.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from typing import Any

#: dtype names as SGLang's ``/update_weights_from_distributed`` carries them.
DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32")


def dtype_from_name(name: str) -> Any:
    """``"bfloat16"`` or ``"torch.bfloat16"`` → ``torch.bfloat16``."""
    import torch

    short = name.removeprefix("torch.")
    if short not in DTYPES:
        raise ValueError(f"dtype {name!r} is not one of {', '.join(DTYPES)}")
    return getattr(torch, short)


class BroadcastGroup:
    """One member of a weight-update group."""

    def __init__(
        self,
        *,
        master_address: str,
        master_port: int,
        rank: int,
        world_size: int,
        backend: str,
        interface: str | None = None,
        timeout_seconds: float = 600.0,
    ) -> None:
        """Join the group (blocks until every member has joined, or ``timeout_seconds``)."""
        import torch.distributed as dist

        timeout = dt.timedelta(seconds=timeout_seconds)
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.store = dist.TCPStore(
            master_address,
            master_port,
            world_size,
            is_master=rank == 0,
            timeout=timeout,
            wait_for_workers=False,
        )
        self.group: Any
        if backend == "gloo":
            options = dist.ProcessGroupGloo._Options()
            options._timeout = timeout
            interface = interface or os.environ.get("GLOO_SOCKET_IFNAME")
            device = (
                dist.ProcessGroupGloo.create_device(interface=interface)
                if interface
                else dist.ProcessGroupGloo.create_default_device()
            )
            options._devices = [device]
            self.group = dist.ProcessGroupGloo(self.store, rank, world_size, options)
        elif backend == "nccl":
            if interface:
                os.environ["NCCL_SOCKET_IFNAME"] = interface
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.group = dist.ProcessGroupNCCL(self.store, rank, world_size, options)
        else:
            raise ValueError(f"backend {backend!r}: use nccl (RCCL on ROCm) or gloo")

    def broadcast(self, tensor: Any, *, src: int = 0) -> None:
        """Broadcast ``tensor`` from ``src`` in place on every member."""
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = src
        self.group.broadcast([tensor], opts).wait()

    def close(self) -> None:
        """Leave the group (best effort: a peer that died is not waited for)."""
        shutdown = getattr(self.group, "shutdown", None)
        if shutdown is not None:
            with contextlib.suppress(RuntimeError):
                shutdown()
        self.group = None
