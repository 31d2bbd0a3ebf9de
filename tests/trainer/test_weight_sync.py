"""Disk weight sync against a real tiny engine (in-process HTTP server)."""

from __future__ import annotations

from pathlib import Path

from aiohttp.test_utils import TestServer

from agentrl.engine.weight_pointer import read_current_weights
from agentrl.engine_client.client import EngineClient
from agentrl.tiny import policy as tiny
from agentrl.tiny.server import TinyEngine, build_app
from agentrl.trainer.weight_sync import POINTER_FILE, DiskWeightSync, prune_exports


async def test_a_push_makes_the_engine_serve_the_version_and_records_the_pointer(
    tmp_path: Path,
) -> None:
    engine = TinyEngine(tiny.new_policy(0, dim=8), model_path="start")
    server = TestServer(build_app(engine), host="127.0.0.1")
    await server.start_server()
    trained = tiny.new_policy(5, dim=8)
    async with EngineClient(str(server.make_url("")).rstrip("/"), max_connections=4) as client:
        sync = DiskWeightSync(
            [client], export=lambda d: tiny.save_policy(trained, d), weights_dir=tmp_path
        )
        report = await sync.push(3)
        assert report.failed == []
        assert report.served == {client.base_url: "3"}
        assert (await client.get_model_info()).weight_version == "3"
        pointer = read_current_weights(tmp_path / POINTER_FILE)
        assert pointer is not None and (pointer.model_path, pointer.weight_version) == (
            str(tmp_path / "v3"),
            "3",
        )
        # The engine "restarts" with its initial weights: reconcile finds and re-pushes it.
        engine.weight_version = "0"
        assert await sync.reconcile() == [client.base_url]
        assert (await client.get_model_info()).weight_version == "3"
        assert await sync.reconcile() == []  # nothing stale any more
    await server.close()


async def test_only_the_newest_exported_versions_are_kept_on_disk(tmp_path: Path) -> None:
    model = tiny.new_policy(0, dim=8)
    sync = DiskWeightSync([], export=lambda d: tiny.save_policy(model, d), weights_dir=tmp_path)
    for version in (1, 2, 3):
        await sync.push(version)
    assert sorted(p.name for p in tmp_path.glob("v*")) == ["v2", "v3"]


async def test_pushes_every_few_steps_keep_the_newest_exports_not_current_minus_one(
    tmp_path: Path,
) -> None:
    # weightSync.intervalSteps 2: versions are the steps 2, 4, 6. Keeping "v6 and v5" would
    # leave only v6; the newest two that exist are v4 and v6.
    model = tiny.new_policy(0, dim=8)
    sync = DiskWeightSync([], export=lambda d: tiny.save_policy(model, d), weights_dir=tmp_path)
    for version in (2, 4, 6):
        await sync.push(version)
    assert sorted(p.name for p in tmp_path.glob("v*")) == ["v4", "v6"]


def test_prune_keeps_current_and_newest_below_and_leaves_other_entries(tmp_path: Path) -> None:
    for name in ("v1", "v3", "v7", "v8", "v12", "vx", "step-10"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"w")
    (tmp_path / POINTER_FILE).write_text("{}")
    # Resumed at step 8 after a run that had got to 12: v12 is a leftover, v7 the newest below.
    deleted = prune_exports(tmp_path, current=8, keep=2)
    assert sorted(p.name for p in deleted) == ["v1", "v12", "v3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        POINTER_FILE, "step-10", "v7", "v8", "vx"]
    prune_exports(tmp_path, current=8, keep=1)
    assert sorted(p.name for p in tmp_path.glob("v*")) == ["v8", "vx"]
