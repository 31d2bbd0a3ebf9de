"""megatron-core started on a rank as it expects (:mod:`agentrl.trainer.megatron_init`), on a
one-rank gloo world: the groups exist, the seeds are ``seed + 100 × pipeline rank`` in ``random``,
``numpy`` and ``torch``, the model-parallel CUDA seed is called after the groups and after the
host seeds (recorded: its RNG states need a GPU), the MoE router's ``te_general_gemm`` is defined
without Transformer Engine, and the combination that would crash is refused by name."""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy
import pytest
import torch

pytest.importorskip("megatron.core", reason="the megatron extra (pip install 'agentrl[megatron]')")

from agentrl.trainer import megatron_init
from tests.trainer.megatron_ranks import close_world, free_port, open_world

pytestmark = pytest.mark.slow  # megatron-core takes seconds to import


@pytest.fixture
def moe_utils(monkeypatch: pytest.MonkeyPatch) -> object:
    """megatron's moe_utils as it is without Transformer Engine (no ``te_general_gemm``)."""
    from megatron.core.transformer.moe import moe_utils as module

    if megatron_init.have_transformer_engine():
        pytest.skip("Transformer Engine is installed: the name is defined by its import")
    monkeypatch.delattr(module, "te_general_gemm", raising=False)
    return module


@pytest.fixture
def world(moe_utils: object) -> Iterator[megatron_init.InitReport]:
    report = open_world()
    yield report
    close_world()


def test_the_groups_exist_and_the_host_seeds_are_the_jobs(
    world: megatron_init.InitReport,
) -> None:
    from megatron.core import parallel_state

    assert parallel_state.model_parallel_is_initialized()
    assert world.device == "cpu" and not world.cuda_rng_tracker
    # Pipeline rank 0: seed + 100 × 0. The generators are where a fresh seed puts them.
    assert world.rank_seed == world.seed == megatron_init.DEFAULT_SEED
    draw = (random.random(), float(numpy.random.rand()), float(torch.rand(())))
    random.seed(1234)
    numpy.random.seed(1234)
    torch.manual_seed(1234)
    assert draw == (random.random(), float(numpy.random.rand()), float(torch.rand(())))


def test_the_moe_router_gemm_name_is_defined_as_none_without_te(
    world: megatron_init.InitReport, moe_utils: object
) -> None:
    assert world.moe_te_gemm_patched
    assert moe_utils.te_general_gemm is None  # type: ignore[attr-defined]
    assert megatron_init.known_crashes(is_moe=True, use_te=False) == []


def test_the_cuda_seed_comes_after_the_groups_and_the_host_seeds(
    world: megatron_init.InitReport, monkeypatch: pytest.MonkeyPatch
) -> None:
    from megatron.core import parallel_state, tensor_parallel

    calls: list[tuple[int, bool, int]] = []

    def record(seed: int, *args: object, **kwargs: object) -> None:
        calls.append((seed, parallel_state.model_parallel_is_initialized(), torch.initial_seed()))

    monkeypatch.setattr(tensor_parallel, "model_parallel_cuda_manual_seed", record)
    assert megatron_init.set_random_seeds(77, cuda=True) == 77
    # Called once, with the job's seed, the groups made and torch already seeded.
    assert calls == [(77, True, 77)]
    calls.clear()
    megatron_init.set_random_seeds(77, cuda=False)
    assert calls == []


def test_seeding_before_the_groups_is_refused(moe_utils: object) -> None:
    from megatron.core import parallel_state

    assert not parallel_state.model_parallel_is_initialized()
    with pytest.raises(RuntimeError, match="after initialize_model_parallel"):
        megatron_init.set_random_seeds(1, cuda=False)


def test_initialising_without_a_process_group_is_refused(moe_utils: object) -> None:
    from agentrl.api.trainer import TrainerSpec

    spec = TrainerSpec.model_validate({"backend": "megatron", "gpusPerNode": 1})
    with pytest.raises(RuntimeError, match="process group"):
        megatron_init.initialize_megatron(spec, cuda=False)


def test_moe_without_te_and_without_the_fix_is_named_as_a_known_crash(moe_utils: object) -> None:
    problems = megatron_init.known_crashes(is_moe=True, use_te=False)
    assert len(problems) == 1
    assert "te_general_gemm" in problems[0] and "0.17.0" in problems[0]
    assert megatron_init.known_crashes(is_moe=False, use_te=False) == []


def test_the_version_is_read_as_numbers() -> None:
    assert megatron_init._version("0.16.1") == (0, 16, 1)
    assert megatron_init._version("0.17.0rc2") == (0, 17, 0)
    assert len(megatron_init.megatron_version()) == 3


def test_a_gloo_group_is_refused_for_a_gpu_rank(world: megatron_init.InitReport) -> None:
    from agentrl.api.trainer import TrainerSpec

    spec = TrainerSpec.model_validate({"backend": "megatron", "gpusPerNode": 1})
    with pytest.raises(RuntimeError, match=r"'gloo'.*need nccl"):
        megatron_init.initialize_megatron(spec, cuda=True)


def test_a_world_that_does_not_divide_into_the_model_parallel_sizes_is_refused(
    moe_utils: object,
) -> None:
    from agentrl.api.trainer import TrainerSpec

    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        spec = TrainerSpec.model_validate(
            {"backend": "megatron", "gpusPerNode": 2, "parallelism": {"tensor": 2}}
        )
        with pytest.raises(RuntimeError, match="world size 1 is not divisible"):
            megatron_init.initialize_megatron(spec, cuda=False)
    finally:
        torch.distributed.destroy_process_group()
