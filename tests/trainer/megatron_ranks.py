"""The ranks of the megatron parallel-export tests, started by ``torch.multiprocessing.spawn``
(so they live in an importable module of their own, not in the test module).

Each rank opens a gloo world on loopback, makes megatron-core's real model-parallel groups
(``parallel_state.initialize_model_parallel``), builds its part of the GPT from the HF model
directory the test wrote, and then rank 0 drives what a trainer does at a weight push while the
others follow: the disk export (every owner writes its shard) and a distributed push through
:class:`~agentrl.trainer.weight_sync.DistributedWeightSync` into a tiny engine over HTTP whose
model is a skeleton with the HF names (the engine loads by name and refuses unknown names or
wrong shapes). Rank 0 saves what the engine then holds for the test to compare.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import torch


def hf_skeleton(state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A module whose parameters are zeros named and shaped like ``state`` (HF names)."""
    root = torch.nn.Module()
    for name, tensor in state.items():
        *path, leaf = name.split(".")
        module = root
        for part in path:
            if part not in module._modules:
                module.add_module(part, torch.nn.Module())
            module = module._modules[part]  # type: ignore[assignment]
        module.register_parameter(
            leaf, torch.nn.Parameter(torch.zeros_like(tensor), requires_grad=False)
        )
    return root


async def _push(backend: Any, shapes: dict[str, torch.Tensor], push_port: int) -> Any:
    from aiohttp.test_utils import TestServer

    from agentrl.engine_client.client import EngineClient
    from agentrl.tiny.server import TinyEngine, build_app
    from agentrl.trainer.weight_sync import DistributedWeightSync

    engine = TinyEngine(hf_skeleton(shapes), model_path="start")  # type: ignore[arg-type]
    server = TestServer(build_app(engine), host="127.0.0.1")
    await server.start_server()
    client = EngineClient(str(server.make_url("")).rstrip("/"), max_connections=4)
    sync = DistributedWeightSync(
        [client],
        tensors=backend.named_tensors,
        master_address="127.0.0.1",
        master_port=push_port,
        backend="gloo",
        interface="lo",
        timeout_seconds=120.0,
    )
    try:
        report = await sync.push(1)
    finally:
        sync.close()
        await client.close()
        await server.close()
    pushed = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    return report, pushed, engine.weight_version


def run_rank(
    rank: int,
    world: int,
    port: int,
    push_port: int,
    parallelism: dict[str, int],
    model_dir: str,
    out_dir: str,
) -> None:
    """One rank of a ``world``-rank megatron job with ``parallelism``."""
    from safetensors.torch import load_file

    from agentrl.api.trainer import TrainerSpec
    from agentrl.trainer.hf_config import read_hf_config
    from agentrl.trainer.megatron_backend import MegatronBackend, initialize_parallel

    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        spec = TrainerSpec.model_validate(
            {"backend": "megatron", "gpusPerNode": world, "parallelism": parallelism}
        )
        initialize_parallel(spec)
        source = Path(model_dir)
        backend = MegatronBackend(
            read_hf_config(source),
            spec,
            temperature=1.0,
            model_dir=source,
            params_dtype=torch.float32,
        )
        out = Path(out_dir)
        if rank == 0:
            try:
                backend.export_weights(out / "export")
                shapes = load_file(str(source / "model.safetensors"))
                report, pushed, version = asyncio.run(_push(backend, shapes, push_port))
                torch.save(
                    {"failed": report.failed, "version": version, "tensors": pushed},
                    out / "pushed.pt",
                )
            finally:
                backend.stop_followers()
        else:
            backend.follow()
    finally:
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def open_world(parallelism: dict[str, int] | None = None) -> Any:
    """A one-rank gloo world with megatron started on it
    (:func:`agentrl.trainer.megatron_backend.initialize_parallel`); returns its
    :class:`~agentrl.trainer.megatron_init.InitReport`. Close with :func:`close_world`."""
    from agentrl.api.trainer import TrainerSpec
    from agentrl.trainer.megatron_backend import initialize_parallel

    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    spec = TrainerSpec.model_validate(
        {"backend": "megatron", "gpusPerNode": 1, "parallelism": parallelism or {}}
    )
    return initialize_parallel(spec)


def close_world() -> None:
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()
