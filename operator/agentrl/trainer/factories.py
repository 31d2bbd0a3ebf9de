"""The parts of a cluster run built from a :class:`~agentrl.trainer.config.TrainerConfig`: the
backend of ``spec.trainer.backend`` and the weight sync of ``spec.trainer.weightSync.mode``.

They sit below both the pod's processes (:mod:`agentrl.trainer.pod`: rank processes, the dry
run) and the rank actors (:mod:`agentrl.trainer.ranks`), which build the backend and the
weight sync where rank 0 runs; torch and megatron are imported only inside the functions.

Callers: :mod:`agentrl.trainer.pod`, :mod:`agentrl.trainer.ranks`, tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from agentrl.api.job import AgentRLJobSpec
from agentrl.api.trainer import TrainerBackend, WeightSyncMode
from agentrl.api.wire import model_path
from agentrl.trainer.config import WEIGHT_GROUP_PORT_OFFSET, TrainerConfig


def torch_backend_for(
    spec: AgentRLJobSpec,
    model_dir: Path | None,
    *,
    seed: int,
    edit_names: tuple[str, ...] | None = None,
) -> Any:
    """The torch backend of ``spec`` over the model in ``model_dir``: an HF causal LM
    (:func:`agentrl.trainer.hf_model.load_causal_lm`, checked against its ``config.json``) when
    the directory has one, else the tiny policy's weight files; ``None``: the built-in tiny
    policy, seeded with ``seed`` (``edit_names``: the edits its prior spreads over)."""
    from agentrl.tiny import policy as tiny
    from agentrl.trainer.torch_backend import TorchBackend

    options: dict[str, Any] = {"temperature": spec.rollout.temperature}
    if model_dir is None:
        model = tiny.initial_policy(seed, edit_names=edit_names or tiny.DEFAULT_PRIOR_EDITS)
        return TorchBackend(model, spec.trainer, **options)
    from agentrl.trainer import hf_model

    if hf_model.is_hf_model_dir(model_dir):  # a config.json with a model_type
        model = hf_model.load_causal_lm(model_dir)
        return TorchBackend(model, spec.trainer, source=model_dir, **options)
    return TorchBackend(tiny.load_policy(model_dir), spec.trainer, **options)


def build_backend(config: TrainerConfig) -> Any:
    """The backend of ``spec.trainer.backend`` (torch.distributed already open for megatron)."""
    spec = config.job.spec
    if spec.trainer.backend == TrainerBackend.TORCH:
        from agentrl.tiny import policy as tiny

        builtin = spec.model.source.path == tiny.BUILTIN_PATH
        return torch_backend_for(
            spec, None if builtin else Path(model_path(config.job)), seed=spec.dataset.seed
        )
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
    from agentrl.trainer.weight_sync import DiskWeightSync, DistributedWeightSync, PushRetry

    trainer = config.job.spec.trainer
    root = config.env.checkpoint_dir
    retry = PushRetry.from_spec(trainer.weight_sync)
    if trainer.weight_sync.mode == WeightSyncMode.DISK:
        return DiskWeightSync(
            clients,
            export=backend.export_weights,
            weights_dir=root,
            initial_version=step,
            retry=retry,
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
        retry=retry,
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
