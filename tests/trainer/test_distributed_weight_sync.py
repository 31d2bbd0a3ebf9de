"""Distributed weight sync over gloo on CPU: the trainer broadcasts into a real tiny engine that
joins the group through SGLang's ``/init_weights_update_group`` and receives through
``/update_weights_from_distributed``."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
from aiohttp.test_utils import TestServer

from agentrl.engine.weight_pointer import read_current_weights
from agentrl.engine_client.client import EngineClient
from agentrl.tiny import policy as tiny
from agentrl.tiny.server import TinyEngine, build_app
from agentrl.trainer.weight_sync import POINTER_FILE, DistributedWeightSync


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.slow
async def test_a_broadcast_push_makes_every_engine_serve_the_trainers_weights() -> None:
    engines = [TinyEngine(tiny.new_policy(0, dim=8), model_path="start") for _ in range(2)]
    servers = [TestServer(build_app(e), host="127.0.0.1") for e in engines]
    for server in servers:
        await server.start_server()
    trained = tiny.new_policy(5, dim=8)
    want = _params(trained)
    assert not torch.equal(next(iter(want.values())), _params(engines[0].model)[next(iter(want))])
    clients = [EngineClient(str(s.make_url("")).rstrip("/"), max_connections=4) for s in servers]
    sync = DistributedWeightSync(
        clients,
        tensors=lambda: list(trained.named_parameters()),
        master_address="127.0.0.1",
        master_port=_free_port(),
        backend="gloo",
        interface="lo",
        timeout_seconds=60.0,
    )
    try:
        report = await sync.push(3)

        assert report.failed == []
        assert report.served == {c.base_url: "3" for c in clients}
        for engine, client in zip(engines, clients, strict=True):
            got = _params(engine.model)
            assert got.keys() == want.keys()
            assert all(torch.equal(got[n], want[n]) for n in want)
            assert (await client.get_model_info()).weight_version == "3"
            assert not engine.paused  # generation continued after the push

        # Engine 1 "restarts" with its initial weights: reconcile forms a new group and re-pushes.
        engines[1].weight_version = "0"
        with torch.no_grad():
            for p in engines[1].model.parameters():
                p.zero_()
        assert await sync.reconcile() == [clients[1].base_url]
        assert sync.generation == 2
        assert all(torch.equal(p, want[n]) for n, p in _params(engines[1].model).items())
        assert (await clients[1].get_model_info()).weight_version == "3"
    finally:
        sync.close()
        for client in clients:
            await client.close()
        for server in servers:
            await server.close()


@pytest.mark.slow
async def test_exports_after_broadcast_pushes_are_pruned_like_disk_mode(tmp_path: Path) -> None:
    # Before, every push left its full HF export behind (~61 GB for Qwen3-30B-A3B): three
    # pushes with keep=2 must leave the last two, the pointer naming the newest.
    engine = TinyEngine(tiny.new_policy(0, dim=8), model_path="start")
    server = TestServer(build_app(engine), host="127.0.0.1")
    await server.start_server()
    trained = tiny.new_policy(5, dim=8)
    client = EngineClient(str(server.make_url("")).rstrip("/"), max_connections=4)
    sync = DistributedWeightSync(
        [client],
        tensors=lambda: list(trained.named_parameters()),
        master_address="127.0.0.1",
        master_port=_free_port(),
        backend="gloo",
        interface="lo",
        export=lambda d: tiny.save_policy(trained, d),
        weights_dir=tmp_path,
        keep=2,
        timeout_seconds=60.0,
    )
    try:
        for version in (1, 2, 3):
            report = await sync.push(version)
            assert report.failed == []
        assert sorted(p.name for p in tmp_path.glob("v*")) == ["v2", "v3"]
        pointer = read_current_weights(tmp_path / POINTER_FILE)
        assert pointer is not None and pointer.model_path == str(tmp_path / "v3")
    finally:
        sync.close()
        await client.close()
        await server.close()
