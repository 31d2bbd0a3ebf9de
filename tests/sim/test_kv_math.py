"""KV-cache arithmetic, checked against values worked out by hand."""

from __future__ import annotations

import pytest

from agentrl.sim import architectures, kvcache
from agentrl.sim.hardware import GIB, gpu_by_name


def test_qwen3_30b_a3b_kv_bytes_per_token_is_96_kib() -> None:
    arch = architectures.builtin("Qwen3-30B-A3B")
    # 2 (K and V) × 48 layers × 4 KV heads × 128 channels × 2 bytes (bf16) = 98,304 B.
    assert kvcache.kv_bytes_per_token(arch) == 98_304


def test_fp8_kv_halves_the_bytes_per_token() -> None:
    arch = architectures.builtin("Qwen3-30B-A3B")
    # 2 × 48 × 4 × 128 × 1 byte = 49,152 B.
    assert kvcache.kv_bytes_per_token(arch, "fp8_e4m3") == 49_152


def test_tensor_parallel_splits_kv_heads_but_never_below_one_per_rank() -> None:
    arch = architectures.builtin("Llama-3.1-70B")  # 80 layers, 8 KV heads, head_dim 128
    # TP 2: 4 heads per rank → 2 × 80 × 4 × 128 × 2 = 163,840 B.
    assert kvcache.kv_bytes_per_token(arch, "bfloat16", tp=2) == 163_840
    # TP 16: 8 heads cannot split 16 ways; each rank keeps one → 2 × 80 × 1 × 128 × 2 = 40,960 B.
    assert kvcache.kv_bytes_per_token(arch, "bfloat16", tp=16) == 40_960


def test_64k_trajectory_needs_6_3_gb_of_kv_as_the_report_says() -> None:
    arch = architectures.builtin("Qwen3-30B-A3B")
    # 64,000 tokens × 98,304 B = 6,291,456,000 B ≈ 6.29 GB (decimal).
    assert 64_000 * kvcache.kv_bytes_per_token(arch) == 6_291_456_000


def test_qwen3_30b_a3b_parameter_count_is_computed_from_its_shapes() -> None:
    arch = architectures.builtin("Qwen3-30B-A3B")
    # Embeddings (untied): 2 × 151,936 × 2,048 = 622,329,856.
    # Attention per layer: 2048×4096 (q) + 2×2048×512 (k, v) + 4096×2048 (o) = 18,874,368.
    # Experts per layer: 128 × 3 × 2048 × 768 = 603,979,776; router 2048 × 128 = 262,144.
    # 48 × (18,874,368 + 603,979,776 + 262,144) = 48 × 623,116,288 = 29,909,581,824;
    # + 622,329,856 = 30,531,911,680.
    assert arch.total_params == 30_531_911_680
    # Active: 8 experts: 8 × 3 × 2048 × 768 = 37,748,736 per layer.
    # 48 × (18,874,368 + 37,748,736) + 622,329,856 = 3,340,238,848.
    assert arch.active_params == 3_340_238_848


def test_mi355x_pool_at_mem_fraction_0_7_is_1_58_million_tokens() -> None:
    arch = architectures.builtin("Qwen3-30B-A3B")
    hbm = gpu_by_name("AMD_Instinct_MI355X").memory_bytes
    assert hbm == 288 * GIB
    weights = kvcache.weight_bytes_per_gpu(arch)  # 30,531,911,680 × 2 B = 61,063,823,360 B
    assert weights == 61_063_823_360
    # 288 × 2^30 = 309,237,645,312 B; × 0.7 = 216,466,351,718.4; − weights = 155,402,528,358.4
    # / 98,304 = 1,580,836.3 → 1,580,836 tokens. (The report: "1.5M-token KV cache".)
    pool = kvcache.kv_pool_tokens(hbm, 0.7, weights, 98_304)
    assert pool == 1_580_836


def test_pool_is_zero_when_the_weights_do_not_fit() -> None:
    # 80 GiB × 0.5 = 40 GiB static share, 50 GiB of weights: nothing left for KV.
    assert kvcache.kv_pool_tokens(80 * GIB, 0.5, 50 * GIB, 1024) == 0


def test_full_context_trajectories_and_runaways_that_fill_a_pool() -> None:
    # 1,500,000 // 65,536 = 22 trajectories at the full 64K cap.
    assert kvcache.full_context_trajectories(1_500_000, 65_536) == 22
    # Mean runaway (113,000 + 186,000) / 2 = 149,500 tokens; 1.5M / 149,500 = 10.03.
    assert kvcache.runaways_to_fill(1_500_000, 113_000, 186_000) == pytest.approx(10.03, abs=0.01)
