"""Start megatron-core on a rank the way megatron-core expects, in one place.

:func:`initialize_megatron` is what every rank of a megatron trainer runs once its process group
is open (:func:`agentrl.trainer.pod.run_rank`, :class:`agentrl.trainer.ranks.TrainerRank`), before
any model is built. In megatron-LM's order (``megatron/training/initialize.py`` at core_v0.16.1):

1. **device** — the rank's GPU is made current (``LOCAL_RANK``, unless the launcher already
   chose it), when there is one;
2. **process group** — checked open (the launcher opens it), nccl when on a GPU, and its size
   divisible by tensor × pipeline × context parallel sizes (megatron-core would fail later with
   a less telling message);
3. **model-parallel groups** — ``parallel_state.initialize_model_parallel`` from
   ``spec.trainer.parallelism``;
4. **seeds** (:func:`set_random_seeds`) — ``random``, ``numpy`` and ``torch.manual_seed`` with
   ``seed + 100 × pipeline rank``, then, with a GPU, ``model_parallel_cuda_manual_seed`` (the
   data-parallel, tensor-parallel and expert RNG states megatron's attention forks; without them
   every forward fails with ``cuda rng state model-parallel-rng is not added``);
5. **MoE without Transformer Engine** (:func:`patch_moe_without_te`) — megatron-core
   0.13.0–0.16.1 import ``te_general_gemm`` only when TE imports and never define it otherwise,
   so the router's first forward raises ``NameError``; the name is set to ``None`` (what 0.17.0
   does), and :func:`known_crashes` refuses a combination that would still crash, naming it.

What the other pitfalls of a first run are handled where they arise: dropout 0 in
:func:`agentrl.trainer.hf_config.transformer_config_kwargs`, logprobs at the rollout temperature
on a copy of the logits in :func:`agentrl.trainer.megatron_backend.token_logprobs`.

Callers: :func:`agentrl.trainer.megatron_backend.initialize_parallel` (the trainer's ranks, the
tests), ``bench/device/megatron_one_step.py``.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from pydantic import BaseModel

from agentrl.api.trainer import TrainerSpec

#: The seed when the caller gives none (megatron-LM's ``--seed`` default).
DEFAULT_SEED = 1234


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


class InitReport(BaseModel):
    """What :func:`initialize_megatron` did on this rank."""

    device: str
    """``cuda:N`` or ``cpu``."""
    seed: int
    """The job's seed."""
    rank_seed: int
    """``seed + 100 × pipeline rank``: what ``random``, ``numpy`` and ``torch`` were seeded with."""
    cuda_rng_tracker: bool
    """Whether megatron's model-parallel CUDA RNG states were registered (needs a GPU)."""
    moe_te_gemm_patched: bool
    """Whether ``moe_utils.te_general_gemm`` had to be defined (``None``) for MoE without TE."""


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = re.match(r"\d*", piece)
        parts.append(int(digits.group() or 0) if digits else 0)
    return tuple(parts)


def megatron_version() -> tuple[int, ...]:
    """The installed megatron-core's version as a tuple (``(0, 16, 1)``)."""
    with _quiet():
        from megatron.core import package_info
    return _version(str(package_info.__version__))


def have_transformer_engine() -> bool:
    """Whether Transformer Engine imports (megatron's TE layer spec and fused kernels)."""
    try:
        with _quiet():
            import transformer_engine  # noqa: F401
    except ImportError:
        return False
    return True


def patch_moe_without_te() -> bool:
    """Define ``megatron.core.transformer.moe.moe_utils.te_general_gemm`` as ``None`` when it is
    undefined (Transformer Engine absent, megatron-core 0.13.0–0.16.1): the router then takes its
    ``torch.mm`` path. Returns whether the name had to be defined."""
    with _quiet():
        from megatron.core.transformer.moe import moe_utils
    if hasattr(moe_utils, "te_general_gemm"):
        return False
    moe_utils.te_general_gemm = None
    return True


def known_crashes(*, is_moe: bool, use_te: bool, context_parallel: int = 1) -> list[str]:
    """Combinations of this megatron-core, Transformer Engine and the model that are known to
    crash at the first forward, each named (empty: none). Call after :func:`initialize_megatron`
    (which patches what can be patched)."""
    problems: list[str] = []
    version = megatron_version()
    if is_moe and not use_te:
        with _quiet():
            from megatron.core.transformer.moe import moe_utils
        if not hasattr(moe_utils, "te_general_gemm"):
            problems.append(
                f"MoE without Transformer Engine on megatron-core "
                f"{'.'.join(map(str, version))}: the router raises NameError te_general_gemm "
                "(megatron-core 0.13.0-0.16.1; fixed in 0.17.0)"
            )
    if context_parallel > 1 and not use_te:
        problems.append(
            "context parallelism without Transformer Engine: megatron's local attention "
            "asserts context_parallel_size == 1"
        )
    return problems


def set_random_seeds(seed: int, *, cuda: bool) -> int:
    """megatron-LM's ``_set_random_seed``: ``random``, ``numpy`` and ``torch`` seeded with
    ``seed + 100 × pipeline rank``, then (``cuda``) megatron's model-parallel CUDA RNG states
    from ``seed``. Needs the model-parallel groups; returns the rank's seed."""
    with _quiet():
        from megatron.core import parallel_state, tensor_parallel
    if not parallel_state.model_parallel_is_initialized():
        raise RuntimeError("seed after initialize_model_parallel: the seeds depend on the ranks")
    rank_seed = seed + 100 * parallel_state.get_pipeline_model_parallel_rank()
    random.seed(rank_seed)
    try:
        import numpy

        numpy.random.seed(rank_seed)
    except ImportError:  # numpy is optional for the trainer
        pass
    torch.manual_seed(rank_seed)
    if cuda:
        # Last: no torch.cuda.manual_seed may follow it (it registers the tracker's states).
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
    return rank_seed


def _local_rank() -> int | None:
    value = os.environ.get("LOCAL_RANK", "")
    return int(value) if value.isdigit() else None


def initialize_megatron(
    trainer: TrainerSpec, *, seed: int = DEFAULT_SEED, cuda: bool | None = None
) -> InitReport:
    """Everything megatron-core needs before a model is built, on this rank (see the module
    docstring for the order). Idempotent for the groups: a second call reseeds only.

    Args:
        trainer: ``spec.trainer`` (its ``parallelism``).
        seed: the job's seed.
        cuda: whether to use the GPU; default: whether one is visible.

    Raises:
        RuntimeError: the process group is not open, is not nccl on a GPU, or its size does
            not divide into the model-parallel sizes.
    """
    with _quiet():
        from megatron.core import parallel_state
    cuda = torch.cuda.is_available() if cuda is None else cuda
    if not torch.distributed.is_initialized():
        raise RuntimeError("torch.distributed is not initialised: open the process group first")
    backend = str(torch.distributed.get_backend())
    if cuda and "nccl" not in backend:
        raise RuntimeError(
            f"the process group's backend is {backend!r}: megatron's collectives on GPU tensors "
            "need nccl (RCCL on ROCm), e.g. init_process_group('nccl')"
        )
    device = "cpu"
    if cuda:
        local = _local_rank()
        # LOCAL_RANK, where set and visible, names the rank's device (the pod sets it and has
        # made it current already); without it the current device stays (a Ray actor's).
        visible = local is not None and local < torch.cuda.device_count()
        if visible and torch.cuda.current_device() != local:
            torch.cuda.set_device(local)
        device = f"cuda:{torch.cuda.current_device()}"
    p = trainer.parallelism
    world = torch.distributed.get_world_size()
    model_parallel = p.tensor * p.pipeline * p.context
    if world % model_parallel:
        raise RuntimeError(
            f"world size {world} is not divisible by parallelism tensor × pipeline × context "
            f"= {model_parallel}"
        )
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=p.tensor,
            pipeline_model_parallel_size=p.pipeline,
            context_parallel_size=p.context,
            expert_model_parallel_size=p.expert,
        )
    rank_seed = set_random_seeds(seed, cuda=cuda)
    patched = False if have_transformer_engine() else patch_moe_without_te()
    return InitReport(
        device=device,
        seed=seed,
        rank_seed=rank_seed,
        cuda_rng_tracker=cuda,
        moe_te_gemm_patched=patched,
    )


def rng_tracker_states() -> dict[str, Any]:
    """The CUDA RNG states megatron's tracker holds (names → states; empty before the seed)."""
    with _quiet():
        from megatron.core import tensor_parallel
    return dict(tensor_parallel.get_cuda_rng_tracker().get_states())
