"""KV-cache arithmetic: bytes per token, the pool an engine gets, and what fits in it.

SGLang sizes an engine's KV pool from what ``--mem-fraction-static`` leaves after the weights
(``ModelRunner.profile_max_num_token``); ``sglang:max_total_num_tokens`` is the authoritative
value once an engine runs. These are the same formulas, pure, so they can be checked by hand.

Called by ``agentrl.sim.static_plan``, the engine model and the calibration.
"""

from __future__ import annotations

import math

from agentrl.sim.architectures import ModelArchitecture

#: Bytes of one element per KV dtype (``inference.kvCacheDtype``); ``auto`` follows the
#: weights, which are bf16 for every model the table holds.
KV_DTYPE_BYTES = {"auto": 2, "bfloat16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}
WEIGHT_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "auto": 2}


def kv_bytes_per_token(arch: ModelArchitecture, kv_dtype: str = "auto", tp: int = 1) -> float:
    """KV bytes one token occupies on one GPU of a ``tp``-way engine.

    ``2 (K and V) × layers × KV heads per rank × head_dim × bytes``. KV heads are split over
    tensor-parallel ranks but never below one per rank (SGLang replicates them then).
    """
    heads_per_rank = max(1.0, arch.num_kv_heads / tp)
    return 2 * arch.num_layers * heads_per_rank * arch.head_dim * KV_DTYPE_BYTES[kv_dtype]


def weight_bytes_per_gpu(arch: ModelArchitecture, dtype: str = "bfloat16", tp: int = 1) -> float:
    """Weight bytes each GPU of a ``tp``-way engine holds."""
    return arch.total_params * WEIGHT_DTYPE_BYTES[dtype] / tp


def kv_pool_tokens(hbm_bytes: float, mem_fraction_static: float, weight_bytes: float,
                   bytes_per_token: float) -> int:
    """Tokens of KV one engine holds: ``(HBM × memFractionStatic − weights) / bytes per token``.

    Zero (never negative) when the weights alone exceed the static share.
    """
    free = hbm_bytes * mem_fraction_static - weight_bytes
    return max(0, int(free // bytes_per_token))


def full_context_trajectories(pool_tokens: int, context_length: int) -> int:
    """Trajectories at the full context cap that fit in one pool at once (no prefix sharing)."""
    return pool_tokens // context_length


def runaways_to_fill(pool_tokens: int, runaway_min: int, runaway_max: int) -> float:
    """How many runaway generations of the given length range fill a pool (mean length)."""
    return pool_tokens / ((runaway_min + runaway_max) / 2)


def ceil_div(a: float, b: float) -> int:
    """``ceil(a / b)`` for positive numbers."""
    return math.ceil(a / b)
