"""The tiny engine's side of ``weightSync.mode: distributed``: SGLang's
``POST /init_weights_update_group`` and ``POST /update_weights_from_distributed``, with SGLang's
request and response shapes, over a gloo (CPU) or nccl group.

``/init_weights_update_group`` joins the trainer's broadcast group as rank ``rank_offset`` (the
tiny engine is one rank: tensor-parallel size 1). ``/update_weights_from_distributed`` receives,
in order, one broadcast per announced name with its dtype and shape, then loads them into the
served policy by parameter name and sets ``weight_version``. Both block in a worker thread so
the engine keeps answering while the group forms and tensors arrive.

Registered on the tiny server's application by :func:`add_routes` (called from
:func:`agentrl.tiny.server.build_app`); kept apart so the serving loop stays one module.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import torch
from aiohttp import web
from pydantic import BaseModel, Field, ValidationError

from agentrl.engine_client.weight_group import BroadcastGroup, dtype_from_name

log = logging.getLogger("agentrl.tiny.policy")


class InitGroupRequest(BaseModel):
    """Body of ``POST /init_weights_update_group`` (SGLang's fields)."""

    master_address: str
    master_port: int = Field(ge=1, le=65535)
    rank_offset: int = Field(ge=1)
    world_size: int = Field(ge=2)
    group_name: str = "weight_update_group"
    backend: str = "nccl"


class UpdateFromDistributedRequest(BaseModel):
    """Body of ``POST /update_weights_from_distributed`` (SGLang's fields)."""

    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    weight_version: str | None = None
    flush_cache: bool = True


class WeightGroups:
    """The groups this engine joined, by name."""

    def __init__(self) -> None:
        self.groups: dict[str, BroadcastGroup] = {}


def add_routes(app: web.Application, engine: Any) -> None:  # noqa: C901 - a handler per route
    """Serve both endpoints for ``engine`` (a ``tiny_server.TinyEngine``)."""
    state = WeightGroups()

    async def init_group(request: web.Request) -> web.Response:
        await engine.guard()  # a hung engine answers nothing, like on every other route
        if (refused := engine.weight_route_fault("/init_weights_update_group")) is not None:
            return refused  # --fault-weight-updates-after
        try:
            body = InitGroupRequest.model_validate(await request.json())
        except ValidationError as exc:
            raise web.HTTPBadRequest(text=f"invalid /init_weights_update_group: {exc}") from exc
        try:
            group = await asyncio.to_thread(
                BroadcastGroup,
                master_address=body.master_address,
                master_port=body.master_port,
                rank=body.rank_offset,
                world_size=body.world_size,
                backend=body.backend,
            )
        except (RuntimeError, ValueError) as exc:
            return web.json_response({"success": False, "message": str(exc)}, status=400)
        old = state.groups.pop(body.group_name, None)
        if old is not None:
            old.close()
        state.groups[body.group_name] = group
        return web.json_response(
            {"success": True, "message": "Succeeded to initialize custom process group."}
        )

    async def update(request: web.Request) -> web.Response:
        await engine.guard()
        if (refused := engine.weight_route_fault("/update_weights_from_distributed")) is not None:
            return refused
        try:
            body = UpdateFromDistributedRequest.model_validate(await request.json())
        except ValidationError as exc:
            raise web.HTTPBadRequest(
                text=f"invalid /update_weights_from_distributed: {exc}"
            ) from exc
        group = state.groups.get(body.group_name)
        if group is None:
            return web.json_response(
                {"success": False, "message": f"no weight update group {body.group_name!r}"},
                status=400,
            )
        if not len(body.names) == len(body.dtypes) == len(body.shapes):
            raise web.HTTPBadRequest(text="names, dtypes and shapes differ in length")
        try:
            received = await asyncio.to_thread(_receive, group, body)
            params = dict(engine.model.named_parameters())
            unknown = [n for n in received if n not in params]
            if unknown:
                raise ValueError(f"unknown parameters {unknown}")
            with torch.no_grad():
                for name, tensor in received.items():
                    params[name].copy_(tensor.to(params[name].dtype))
        except (RuntimeError, ValueError) as exc:
            return web.json_response({"success": False, "message": str(exc)}, status=400)
        engine.weight_version = body.weight_version or engine.weight_version
        engine.weight_update_taken()
        if body.flush_cache and not engine.idle:
            # as on /update_weights_from_disk: SGLang's scheduler asserts the flush worked
            message = "Cache flush failed after updating weights"
            engine.write_line(f"AssertionError: {message} ({engine.cache_flush_refused()})")
            raise web.HTTPInternalServerError(text=message)
        log.info("weights received by broadcast (version %s)", engine.weight_version)
        return web.json_response({"success": True, "message": "Succeeded to update parameter."})

    app.add_routes(
        [
            web.post("/init_weights_update_group", init_group),
            web.post("/update_weights_from_distributed", update),
        ]
    )


def _receive(group: BroadcastGroup, body: UpdateFromDistributedRequest) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, dtype, shape in zip(body.names, body.dtypes, body.shapes, strict=True):
        tensor = torch.empty(shape, dtype=dtype_from_name(dtype))
        group.broadcast(tensor, src=0)
        out[name] = tensor
    return out
