"""The whole HF-named state dict out of a megatron-core model spread over pipeline stages,
tensor-parallel shards and expert-parallel ranks: on disk, and streamed to trainer rank 0 for a
distributed weight push.

Who holds what (megatron-core's ``parallel_state``, default order ``tp-cp-ep-dp-pp``):

* a pipeline stage holds its layers (numbered from 0 on each stage; the global number adds
  ``get_transformer_layer_offset``), the first stage the embedding, the last the final norm and
  the output layer;
* a dense parameter is sharded over the tensor-parallel group and replicated over the
  data-parallel and context-parallel groups, so after the tensor-parallel gather the rank with
  tensor-, data- and context-parallel rank 0 of each stage **owns** it;
* an expert parameter lives on one expert-parallel rank (local expert ``i`` of rank ``r`` is
  global expert ``r × experts / ep + i``), sharded over the expert tensor-parallel group and
  replicated over the expert data-parallel group, so the rank with expert tensor- and expert
  data-parallel rank 0 owns it.

Every parameter therefore has exactly one owner in the world. :func:`owned_tensors` yields a
rank's owned HF tensors (a collective over its tensor-parallel groups: every rank iterates);
:func:`write_shards` writes them as one safetensors file per owner plus the index SGLang reads;
:func:`stream_to_rank0` sends the owners' tensors to rank 0 one at a time, after a manifest of
names, dtypes and shapes (:class:`TensorSpec`), so rank 0 announces the whole push to engines
before a byte moves and holds at most one remote tensor at a time.

A model with tied embeddings (``tie_word_embeddings``) keeps a copy of the embedding as the last
stage's ``output_layer`` when pipelined; HF has no ``lm_head`` then, so that copy is not
exported. Callers: :class:`agentrl.trainer.megatron_backend.MegatronBackend`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentrl.trainer import megatron_weights

#: Name of the safetensors index (``weight_map``: tensor name → file) SGLang and HF read.
INDEX_FILE = "model.safetensors.index.json"


@dataclass(frozen=True)
class TensorSpec:
    """What a receiver allocates for one tensor before it arrives."""

    name: str
    """HF name (global layer and expert indices)."""
    dtype: str
    """``bfloat16``, ``float32``, ... (torch's name without ``torch.``)."""
    shape: tuple[int, ...]


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` → ``"bfloat16"`` (the spelling SGLang's requests carry)."""
    return str(dtype).removeprefix("torch.")


def is_expert(param: torch.Tensor) -> bool:
    """megatron marks expert parameters ``allreduce = False`` (they are reduced over the expert
    data-parallel group, not the data-parallel one)."""
    return not getattr(param, "allreduce", True)


def owns(ps: Any, param: torch.Tensor) -> bool:
    """Whether this rank is the one owner of ``param`` (after its tensor-parallel gather)."""
    if is_expert(param):
        return ps.get_expert_tensor_parallel_rank() == 0 and ps.get_expert_data_parallel_rank() == 0
    return (
        ps.get_tensor_model_parallel_rank() == 0
        and ps.get_data_parallel_rank() == 0
        and ps.get_context_parallel_rank() == 0
    )


def owned_tensors(backend: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """This rank's owned parameters as whole HF tensors (global names).

    Every rank must iterate to the end: each tensor-parallel shard is gathered over its group,
    owner or not."""
    tied = backend.hf.tie_word_embeddings
    for name, param in backend.model.named_parameters():
        whole = backend.gathered(name, param)
        if not owns(backend.ps, param):
            continue
        for hf_name, tensor in megatron_weights.to_hf(backend.global_name(name), whole, backend.hf):
            if tied and hf_name == "lm_head.weight":
                continue  # the last stage's copy of the embedding
            yield hf_name, tensor


def _specs(backend: Any) -> list[TensorSpec]:
    """The :class:`TensorSpec` of every tensor this rank owns, without gathering any data
    (the whole shapes come from the shard's shape and its tensor-parallel size)."""
    tied = backend.hf.tie_word_embeddings
    out: list[TensorSpec] = []
    for name, param in backend.model.named_parameters():
        if not owns(backend.ps, param):
            continue
        dim, _, _, size = backend._tp(param)
        shape = list(param.shape)
        if dim is not None:
            shape[dim] *= size
        meta = torch.empty(shape, dtype=param.dtype, device="meta")
        for hf_name, t in megatron_weights.to_hf(backend.global_name(name), meta, backend.hf):
            if not (tied and hf_name == "lm_head.weight"):
                out.append(TensorSpec(hf_name, dtype_name(param.dtype), tuple(t.shape)))
    return out


def write_shards(backend: Any, directory: Path) -> list[str]:
    """Write this rank's owned tensors to ``directory`` (one file per owner rank, named by
    its global rank) and, on rank 0, the index of every owner's tensors. A collective over
    the whole world (the index gathers every rank's names). Returns the names written here."""
    from safetensors.torch import save_file

    rank = torch.distributed.get_rank()
    filename = f"model-rank{rank:05d}.safetensors"
    tensors = {n: t.to("cpu").contiguous() for n, t in owned_tensors(backend)}
    if tensors:
        save_file(tensors, str(directory / filename), metadata={"format": "pt"})
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    entries: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(entries, (filename, sorted(tensors), size))
    if rank == 0:
        weight_map: dict[str, str] = {}
        for file, names, _ in entries:
            for n in names:
                if n in weight_map:
                    raise RuntimeError(f"{n} is owned by two ranks ({weight_map[n]}, {file})")
                weight_map[n] = file
        index = {
            "metadata": {"total_size": sum(e[2] for e in entries)},
            "weight_map": dict(sorted(weight_map.items())),
        }
        (directory / INDEX_FILE).write_text(json.dumps(index, indent=2), encoding="utf-8")
    return sorted(tensors)


@dataclass
class Stream:
    """The whole model as rank 0 receives it: every owner's :class:`TensorSpec` up front
    (in the order the tensors come), then the tensors one by one."""

    specs: list[TensorSpec]
    tensors: Iterator[tuple[str, torch.Tensor]]


def stream_to_rank0(backend: Any) -> Stream | None:
    """Every owned tensor of every rank, to rank 0 in a fixed order: rank 0's own first, then
    each other owner's in global-rank order, each tensor sent point-to-point when rank 0 asks
    for it (it does, by posting the receive). A collective over the whole world: every rank
    calls it; on ranks other than 0 it sends everything, returns None and is done.

    Rank 0 receives on the backend's device (the GPU under nccl, the CPU under gloo)."""
    rank = torch.distributed.get_rank()
    mine = _specs(backend)
    manifests: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(manifests, mine)
    if rank != 0:
        for _, tensor in owned_tensors(backend):
            torch.distributed.send(tensor.contiguous(), dst=0)
        return None

    specs = [s for part in manifests for s in part]
    seen: set[str] = set()
    for s in specs:
        if s.name in seen:
            raise RuntimeError(f"{s.name} is owned by two ranks")
        seen.add(s.name)

    device = backend.device or torch.device("cpu")

    def receive() -> Iterator[tuple[str, torch.Tensor]]:
        yield from owned_tensors(backend)
        for src in range(1, len(manifests)):
            for s in manifests[src]:
                buffer = torch.empty(s.shape, dtype=getattr(torch, s.dtype), device=device)
                torch.distributed.recv(buffer, src=src)
                yield s.name, buffer

    return Stream(specs=specs, tensors=receive())
