"""``trainer.backend: megatron``: GRPO steps of a megatron-core GPTModel, behind the same surface
as :class:`agentrl.trainer.torch_backend.TorchBackend` (``train_step``, ``save_state``,
``load_state``, ``export_weights``; ``sft_step`` and ``finish_warm_start`` for the warm-start
stage) so :mod:`agentrl.trainer.loop` and :mod:`agentrl.trainer.warm_start` drive either.

What it is made of:

* **Parallelism** — :func:`initialize_parallel` starts megatron-core as it expects
  (:func:`agentrl.trainer.megatron_init.initialize_megatron`: device, model-parallel groups from
  ``spec.trainer.parallelism``, seeds and the model-parallel CUDA RNG states, the MoE router's
  fix without Transformer Engine) on the process group the trainer pod's processes opened
  (:func:`agentrl.trainer.pod.run_rank`, :class:`agentrl.trainer.ranks.TrainerRank`).
* **Model** — :func:`build_gpt_model`: a ``GPTModel`` whose ``TransformerConfig`` comes from the
  model's HF ``config.json`` (:mod:`agentrl.trainer.hf_config`: layers, hidden, heads, GQA
  groups, FFN, vocabulary, RoPE, q/k norms, MoE experts), checked field by field once built
  (:func:`check_built_model`). Transformer Engine's layer spec when TE and a GPU are there,
  megatron's local spec with :class:`~agentrl.trainer.megatron_attention.SDPACoreAttention`
  (torch's fused attention, packed sequences) otherwise. Initial weights come from the HF
  safetensors of ``spec.model.source`` (:mod:`agentrl.trainer.megatron_weights`).
* **Optimizer** — megatron's ``DistributedDataParallel`` and ``get_megatron_optimizer`` with
  ``use_distributed_optimizer`` (Adam state sharded over data-parallel ranks), configured from
  ``spec.trainer.optimizer``.
* **Loss** — :func:`agentrl.trainer.loss.grpo_loss` on token logprobs taken from the logits with
  megatron's vocab-parallel cross entropy (:func:`token_logprobs`), for the tokens the torch
  backend scores too (:func:`~agentrl.trainer.batching.token_sequences`, from position 1),
  through ``get_forward_backward_func`` (pipeline schedules included) in micro-batches that
  pack consecutive trajectories without padding (:func:`pack_microbatches`, :func:`packed_row`:
  the ``thd`` format, positions restarting per trajectory, attention not crossing them), with
  activation recompute for long micro-batches (:func:`set_recompute`). Each trajectory's loss
  is weighted so the sum over micro-batches and
  data-parallel ranks is the mini-batch's loss under ``algorithm.lossAggregation``
  (:func:`microbatch_weights`).
* **Mini-batches** — a step is ``algorithm.miniBatches`` optimizer updates per pass, for
  ``algorithm.epochs`` passes (:func:`~agentrl.trainer.batching.minibatch_bounds`: whole
  trajectories, in order), each mini-batch dealt round-robin over the data-parallel ranks
  (:func:`shard_minibatches`). The old logprobs are recomputed once, before the first update,
  so later updates are off-policy and the clip fraction means something.
* **Warm start** — :meth:`MegatronBackend.sft_step`: one update on a packed warm-start batch, each
  conversation a sequence of its own through the same packed forward
  (:mod:`agentrl.trainer.megatron_sft`), the mean negative logprob at temperature 1 of the
  loss-mask tokens, at ``warmStart.lr`` on the one optimizer; :meth:`MegatronBackend.
  finish_warm_start` zeroes the Adam moments (RL starts with fresh ones at ``optimizer.lr``, as
  on the torch backend) and makes the weights the KL reference. Warm-start updates do not count
  as steps (``iteration``).
* **Checkpoints** — ``torch_dist`` through ``megatron.core.dist_checkpointing`` (model, optimizer
  and the step counter in one directory; after a warm start, the KL reference too), saved and
  loaded with the same metadata (:func:`checkpoint_metadata`: the distributed optimizer's
  ``dp_reshardable`` sharding, which reloads at another data-parallel size but not at another
  TP/PP layout), recorded in the checkpoint as its content metadata. On torch's Adam (no Apex
  or Transformer Engine) megatron-core 0.16 cannot load into an optimizer that has not stepped
  (:func:`init_adam_state` gives it a first step's state) and restores the step counts as one
  shared tensor that every parameter's update then advances (:func:`restore_adam_steps`).
* **Weights out** — :mod:`agentrl.trainer.megatron_export`: every parameter has one owner
  rank; the owners write HF safetensors shards plus their index (:meth:`export_weights`), or
  stream their tensors to rank 0 for a distributed push (:meth:`named_tensors`), whatever the
  pipeline, expert and tensor parallel sizes.

Every rank runs the same calls: rank 0 (the driver) announces each call to the other ranks
(:meth:`MegatronBackend.follow` runs there) with ``broadcast_object_list``.

What a host without a GPU can do (the CPU tests): build the model, convert weights, compute token
logprobs and the loss from logits, save and load checkpoints, export and push weights at any
parallel layout (MoE layers then use megatron's all-gather token dispatcher: the all-to-all
one makes a CUDA stream when it is built). The forward itself runs on the CPU only where
``torch.cuda.current_device()`` is answered with the CPU (megatron-core 0.16's rotary embedding
asks it; the parity tests and the device script's ``--cpu`` mode do so, through
:meth:`MegatronBackend.score`). It does not step: megatron's optimizer makes its buffers on
``"cuda"`` by name and checks parameters by their CUDA type names, so
:meth:`MegatronBackend.train_step` and :meth:`~MegatronBackend.sft_step` need a GPU
(``bench/device/megatron_one_step.py`` runs them; the warm-start tests step on the CPU only by
answering those names with the CPU). Likewise its ``torch_dist`` writer stages
tensors with ``torch.cuda.synchronize()``; off-GPU, :class:`HostTorchDistSave` writes the same
format with torch's synchronous DCP writer (same key translation and planner as megatron's).

megatron-core is the ``megatron`` extra; it is imported inside the functions that need it.
Callers: :mod:`agentrl.trainer.factories`, ``bench/device/megatron_one_step.py``.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
import warnings
from collections.abc import Iterator, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

from agentrl.api.trainer import Algorithm, CorrectionMode, LossAggregation, TrainerSpec
from agentrl.trainer import megatron_export, megatron_init, megatron_sft, megatron_weights
from agentrl.trainer.batching import (
    TokenSequence,
    TrainSample,
    flatten,
    minibatch_bounds,
    token_sequences,
)
from agentrl.trainer.hf_config import (
    HFModelConfig,
    check_layout,
    compare_model_fields,
    optimizer_config_kwargs,
    transformer_config_kwargs,
)
from agentrl.trainer.loss import (
    combine_updates,
    grpo_loss,
    icepop_keep,
    mismatch_statistics,
    mismatch_weights,
)
from agentrl.trainer.sft_batches import SFTBatch
from agentrl.trainer.stats import LossStats, StepStats
from agentrl.trainer.torch_backend import SFTStats

#: Key of the step counter in a checkpoint's common (non-sharded) state.
ITERATION_KEY = "iteration"
#: Directory of the ``torch_dist`` checkpoint inside a :class:`CheckpointStore` step directory.
MODEL_DIR = "model"
#: Key of the KL reference's tensors in a checkpoint (saved once a warm start has made it), and
#: the content-metadata flag saying a checkpoint holds them.
REFERENCE_KEY = "reference"
REFERENCE_FLAG = "agentrl_warm_start_reference"
#: HF files besides the weights that engines need next to exported weights.
HF_SIDE_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    # megatron-core warns at import that Transformer Engine and Apex are absent (it falls back to
    # torch implementations), and its TransformerConfig warns about its own deprecated defaults;
    # neither is ours to act on.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def gpu_available() -> bool:
    """Whether this process can step the model (a CUDA/ROCm device is visible)."""
    return torch.cuda.is_available()


def initialize_parallel(
    trainer: TrainerSpec, *, seed: int = megatron_init.DEFAULT_SEED
) -> megatron_init.InitReport:
    """megatron-core started on this rank over the open process group, as megatron expects
    (:func:`agentrl.trainer.megatron_init.initialize_megatron`: device, model-parallel groups
    from ``spec.trainer.parallelism``, seeds and model-parallel RNG states, the MoE-without-TE
    fix); the groups are made once, a second call reseeds only."""
    return megatron_init.initialize_megatron(trainer, seed=seed)


def _have_transformer_engine() -> bool:
    return gpu_available() and megatron_init.have_transformer_engine()


def build_gpt_model(
    hf: HFModelConfig,
    trainer: TrainerSpec,
    *,
    params_dtype: torch.dtype = torch.bfloat16,
    recompute: str = "auto",
) -> Any:
    """This rank's part of the ``GPTModel`` (its pipeline stage, tensor shard and experts),
    parameters on the CPU (``use_cpu_initialization``); the caller moves it to the GPU.

    Without Transformer Engine, the local spec's attention core is
    :class:`~agentrl.trainer.megatron_attention.SDPACoreAttention` (fused kernels, packed
    sequences). ``recompute``: :func:`~agentrl.trainer.megatron_attention.recompute_kwargs`
    (``auto``: none at build time, then :func:`set_recompute` per micro-batch).
    The built model is checked against ``hf`` field by field (:func:`check_built_model`).

    Raises:
        ValueError: the built model differs from the HF config, or this megatron-core,
            Transformer Engine and model are a combination known to crash (named).
    """
    with _quiet():
        from megatron.core import parallel_state
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt import gpt_layer_specs as specs
        from megatron.core.transformer.transformer_config import TransformerConfig

        from agentrl.trainer import megatron_attention

    use_te = _have_transformer_engine()
    crashes = megatron_init.known_crashes(is_moe=hf.is_moe, use_te=use_te)
    if crashes:
        raise ValueError("refusing a combination known to crash: " + "; ".join(crashes))
    if trainer.parallelism.context > 1:
        # Context parallelism needs TE's attention and each rank fed its slices of every
        # sequence; the step here feeds whole sequences, which would be wrong, so refuse.
        raise NotImplementedError(
            "parallelism.context > 1 is not supported by the megatron backend yet "
            "(sequences are not split across context-parallel ranks)"
        )
    kwargs = transformer_config_kwargs(hf, trainer)
    if recompute != "auto":  # auto: chosen per micro-batch (set_recompute)
        kwargs.update(megatron_attention.recompute_kwargs(recompute, max_tokens=0))
    if hf.is_moe and not gpu_available():
        # megatron-core 0.16's all-to-all dispatcher makes a CUDA stream when it is built; the
        # all-gather one holds no state of its own (neither has parameters), so a host without
        # a GPU builds the same parameters with it — it cannot step anyway (see above).
        kwargs["moe_token_dispatcher_type"] = "allgather"
    check_layout(hf, trainer)
    with _quiet():
        config = TransformerConfig(
            **kwargs,
            activation_func=torch.nn.functional.silu,
            params_dtype=params_dtype,
            pipeline_dtype=params_dtype,
            bf16=params_dtype == torch.bfloat16,
        )
    moe = {"num_experts": hf.num_experts, "moe_grouped_gemm": False}
    if use_te:
        layer_spec = specs.get_gpt_layer_with_transformer_engine_spec(
            **moe, qk_layernorm=hf.qk_layernorm
        )
    else:
        layer_spec = megatron_attention.local_layer_spec(
            num_experts=hf.num_experts, qk_layernorm=hf.qk_layernorm
        )
    with _quiet():
        model = GPTModel(
            config=config,
            transformer_layer_spec=layer_spec,
            vocab_size=hf.vocab_size,
            max_sequence_length=hf.max_position_embeddings,
            pre_process=parallel_state.is_pipeline_first_stage(),
            post_process=parallel_state.is_pipeline_last_stage(),
            share_embeddings_and_output_weights=hf.tie_word_embeddings,
            position_embedding_type="rope",
            rotary_base=int(hf.rope_theta),
        )
    check_built_model(hf, model)
    return model


def built_model_fields(model: Any) -> dict[str, Any]:
    """The shape of a built ``GPTModel``, keyed as
    :func:`agentrl.trainer.hf_config.expected_model_fields`: the transformer config's sizes, the
    vocabulary and tying, and the RoPE base read back from the rotary frequencies (what the
    forward uses: ``inv_freq[i] = base^(-2i/dim)``)."""
    c = model.config
    rotary = getattr(model, "rotary_pos_emb", None)
    base: float | None = None
    if rotary is not None and rotary.inv_freq.numel() > 1:
        dim = 2 * rotary.inv_freq.numel()
        base = float(rotary.inv_freq.double()[1].log().mul(-dim / 2).exp())
    return {
        "num_layers": c.num_layers,
        "hidden_size": c.hidden_size,
        "num_attention_heads": c.num_attention_heads,
        "num_query_groups": c.num_query_groups,
        "kv_channels": c.kv_channels,
        "ffn_hidden_size": c.ffn_hidden_size,
        "layernorm_epsilon": c.layernorm_epsilon,
        "rotary_base": base,
        "tie_word_embeddings": bool(model.share_embeddings_and_output_weights),
        "vocab_size": model.vocab_size,
        "num_moe_experts": c.num_moe_experts,
        "moe_ffn_hidden_size": c.moe_ffn_hidden_size if c.num_moe_experts else None,
        "moe_router_topk": c.moe_router_topk if c.num_moe_experts else None,
    }


def check_built_model(hf: HFModelConfig, model: Any) -> None:
    """The start-up check: the built model has ``hf``'s shape, field by field.

    Raises:
        ValueError: naming every field that differs.
    """
    compare_model_fields(hf, built_model_fields(model))


def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, *, temperature: float
) -> torch.Tensor:
    """log π(target | prefix) per position from (tensor-parallel) logits ``[..., vocab/TP]``.

    The engine sampled at ``temperature``, so its logprobs are of ``softmax(logits / T)``; the
    trainer's must be of the same distribution. Vocab-parallel cross entropy gathers the
    normaliser over tensor-parallel ranks without materialising the whole vocabulary."""
    with _quiet():
        from megatron.core import tensor_parallel

    # vocab_parallel_cross_entropy works in place on its input (``-=``, ``exp(out=)``) after a
    # ``.float()`` that is a no-op on fp32: hand it a tensor of its own, never the caller's.
    scaled = logits.float().div(max(temperature, 1e-6)).clone(memory_format=torch.contiguous_format)
    return -tensor_parallel.vocab_parallel_cross_entropy(scaled, targets)


# -- one step's data ---------------------------------------------------------------------------


def microbatch_weights(
    seqs: Sequence[TokenSequence], logp_old: Sequence[torch.Tensor], algorithm: Algorithm
) -> list[float]:
    """Weight of each trajectory's own aggregated loss in the step's loss.

    ``grpo_loss`` on one trajectory aggregates over that trajectory alone; the step's loss is
    ``Σ weight_i × loss_i``. token-mean weighs by the trajectory's share of the step's
    loss-carrying tokens; the sequence means by 1 / (trajectories with loss tokens). ICEPOP
    removes tokens before aggregation, so the counts are taken after it — they depend only on
    the recomputed and the engine's logprobs, both known before the training pass.
    """
    correction = algorithm.off_policy_correction
    counts: list[float] = []
    for seq, old in zip(seqs, logp_old, strict=True):
        if not seq.carries_loss:
            counts.append(0.0)
            continue
        keep = torch.ones_like(old)
        if correction.mode == CorrectionMode.ICEPOP:
            engine = torch.tensor(seq.engine_logprobs, dtype=old.dtype)
            keep = icepop_keep(mismatch_weights(old, engine), correction)
        counts.append(float(keep.sum()))
    if algorithm.loss_aggregation == LossAggregation.TOKEN_MEAN:
        total = sum(counts)
        return [c / total if total else 0.0 for c in counts]
    present = sum(c > 0 for c in counts)
    return [1.0 / present if c > 0 else 0.0 for c in counts]


def step_statistics(
    seqs: Sequence[TokenSequence],
    logp_old: Sequence[torch.Tensor],
    parts: Sequence[LossStats],
    algorithm: Algorithm,
) -> LossStats:
    """The step's :class:`LossStats` from per-trajectory ones (of every update): the mismatch
    statistics are recomputed over the whole step (ESS is not additive), clip fraction and KL
    are averaged weighted by loss tokens."""
    flat = flatten(seqs)
    mask = torch.tensor(flat.mask, dtype=torch.float64)
    old = torch.cat([o.double() for o in logp_old])
    engine = torch.tensor(flat.engine_logprobs, dtype=torch.float64)
    mismatch = mismatch_statistics(
        logp_old=old, logp_engine=engine, mask=mask, correction=algorithm.off_policy_correction
    )
    return combine_updates(parts, mismatch)


def shard_minibatches(n: int, *, mini_batches: int, dp_rank: int, dp_size: int) -> list[list[int]]:
    """The step positions each mini-batch gives this data-parallel rank: mini-batch by
    mini-batch (:func:`~agentrl.trainer.batching.minibatch_bounds`), round-robin over ranks.

    Raises:
        ValueError: a mini-batch has fewer trajectories than there are data-parallel ranks (a
            rank without a micro-batch would not join the gradient reduction).
    """
    shards: list[list[int]] = []
    for a, b in minibatch_bounds(n, mini_batches):
        if b - a < dp_size:
            raise ValueError(
                f"a mini-batch of {b - a} trajectories cannot feed {dp_size} data-parallel ranks: "
                "lower algorithm.miniBatches or raise trainer.trajectoriesPerStep"
            )
        shards.append(list(range(a, b))[dp_rank::dp_size])
    return shards


#: Tokens packed into one micro-batch by default.
DEFAULT_MICROBATCH_TOKENS = 16_384


def pack_microbatches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Consecutive trajectories grouped into micro-batches of at most ``max_tokens`` tokens, in
    order (a trajectory longer than that is a micro-batch of its own); indices into
    ``lengths``."""
    groups: list[list[int]] = []
    used = 0
    for i, n in enumerate(lengths):
        if groups and used + n <= max_tokens:
            groups[-1].append(i)
            used += n
        else:
            groups.append([i])
            used = n
    return groups


class PackedRow(BaseModel):
    """Several trajectories as one row of the ``thd`` (packed) format."""

    token_ids: list[int]
    position_ids: list[int]
    """Restarting at 0 for every trajectory (and for the padding)."""
    cu_seqlens: list[int]
    """Boundaries: ``[0, n0, n0 + n1, …]``; padding, if any, is a last sequence of its own."""
    offsets: list[int]
    """Where each trajectory starts in the row."""
    max_seqlen: int


def packed_row(sequences: Sequence[Sequence[int]], *, pad_to: int | None = None) -> PackedRow:
    """``sequences`` back to back without padding (``pad_to``: filled up to that length with a
    sequence of zeros, for pipeline stages that need one shape)."""
    ids: list[int] = []
    positions: list[int] = []
    cu = [0]
    offsets = []
    for seq in sequences:
        offsets.append(len(ids))
        ids.extend(seq)
        positions.extend(range(len(seq)))
        cu.append(len(ids))
    if pad_to is not None and pad_to > len(ids):
        filler = pad_to - len(ids)
        ids.extend([0] * filler)
        positions.extend(range(filler))
        cu.append(len(ids))
    lengths = [b - a for a, b in pairwise(cu)]
    return PackedRow(
        token_ids=ids,
        position_ids=positions,
        cu_seqlens=cu,
        offsets=offsets,
        max_seqlen=max(lengths, default=0),
    )


def set_recompute(config: Any, tokens: int) -> None:
    """``recompute: auto``: full activation recompute (one layer at a time) for a micro-batch of
    more than :data:`~agentrl.trainer.megatron_attention.RECOMPUTE_ABOVE_TOKENS` tokens, none
    below (megatron's transformer block reads these config fields at every forward)."""
    from agentrl.trainer.megatron_attention import recompute_kwargs

    chosen = recompute_kwargs("auto", max_tokens=tokens)
    config.recompute_granularity = chosen.get("recompute_granularity")
    config.recompute_method = chosen.get("recompute_method")
    config.recompute_num_layers = chosen.get("recompute_num_layers")


# -- checkpoints -------------------------------------------------------------------------------


def checkpoint_metadata() -> dict[str, Any]:
    """The sharded-state-dict metadata of every save and load (the same dict at both: a MoE
    model's chained optimizer names its parts by it), as megatron-LM 0.16.1 passes it.

    The distributed optimizer's default sharding (``fully_sharded_model_space``) makes
    ``ShardedTensor``s with ``flattened_range``, which megatron-core 0.16's checkpoint validation
    rejects; ``dp_reshardable`` saves each data-parallel rank's optimizer shard as it is
    (reloadable at another data-parallel size, not at another tensor/pipeline layout)."""
    with _quiet():
        from megatron.core import parallel_state
    return {
        "distrib_optim_sharding_type": "dp_reshardable",
        "singleton_local_shards": False,
        "chained_optim_avoid_prefix": True,
        "dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True),
    }


def content_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint records of :func:`checkpoint_metadata` (``save(content_metadata=…)``):
    the plain values, without the process group."""
    return {k: v for k, v in metadata.items() if k != "dp_cp_group"}


def host_save_strategy() -> Any:
    """A ``torch_dist`` save strategy that stages tensors synchronously (no CUDA calls).

    megatron-core 0.16's ``TorchDistSaveShardedStrategy`` writes through an asynchronous writer
    that calls ``torch.cuda.synchronize()`` and allocates its failure flag on the current CUDA
    device, so it cannot save from a host without a GPU. This one keeps megatron's translation
    of sharded tensors and its save planner and hands them to torch's ``FileSystemWriter``:
    the files are the same ``torch_dist`` format, loaded by the stock strategy."""
    with _quiet():
        import torch.distributed.checkpoint as dcp
        from megatron.core.dist_checkpointing.strategies import torch as mcore_torch

    class HostTorchDistSave(mcore_torch.TorchDistSaveShardedStrategy):  # type: ignore[misc]
        def save(self, sharded_state_dict: Any, checkpoint_dir: Path) -> None:
            translated, _, _ = mcore_torch._replace_state_dict_keys_with_sharded_keys(
                sharded_state_dict, self.keep_only_main_replica
            )
            pyt_state_dict = mcore_torch.mcore_to_pyt_state_dict(translated, False)
            dcp.save(
                pyt_state_dict,
                storage_writer=dcp.FileSystemWriter(checkpoint_dir, thread_count=1),
                planner=mcore_torch.MCoreSavePlanner(
                    dedup_replicated_tensors=not self.keep_only_main_replica,
                    flatten_state_dict=False,
                ),
            )

    return HostTorchDistSave("torch_dist", 1)


def init_adam_state(optimizer: Any) -> None:
    """Give every parameter of torch's Adam inside ``optimizer`` the state its first step would
    make (zero moments, step 0) where it has none yet, before a checkpoint is loaded into it.

    megatron-core 0.16's distributed optimizer builds the state dict it loads into from its own
    current state and, on torch's Adam (no Apex or Transformer Engine), reads every parameter's
    ``step`` while doing so: a fresh optimizer (a restarted trainer) has none and fails an
    assertion. The values are replaced by the checkpoint's."""
    for inner in megatron_sft.inner_optimizers(optimizer):
        if not isinstance(inner, torch.optim.Adam | torch.optim.AdamW):
            continue  # Transformer Engine's FusedAdam keeps its step per group
        for group in inner.param_groups:
            for param in group["params"]:
                state = inner.state[param]
                if state:
                    continue
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                if group.get("amsgrad"):
                    state["max_exp_avg_sq"] = torch.zeros_like(
                        param, memory_format=torch.preserve_format
                    )


def restore_adam_steps(optimizer: Any) -> None:
    """Each parameter's Adam step count as a tensor of its own, from its group's count.

    megatron-core 0.16's distributed optimizer, loading into torch's Adam (no Apex or Transformer
    Engine), sets every parameter's ``step`` to one shared tensor and then copies the current
    one over it; torch's Adam advances each parameter's ``step`` in place, so the shared tensor
    would count every parameter's update and the bias correction after a resume would differ
    from the uninterrupted run's. The group's ``step`` (what megatron saves it from) is right."""
    for inner in megatron_sft.inner_optimizers(optimizer):
        for group in inner.param_groups:
            if "step" not in group:
                continue
            for param in group["params"]:
                state = inner.state.get(param)
                if state and isinstance(state.get("step"), torch.Tensor):
                    state["step"] = torch.tensor(float(group["step"]), dtype=state["step"].dtype)


class _Command(BaseModel):
    """What rank 0 asks every other rank to do with it."""

    op: str
    """``step``, ``sft``, ``finish_warm_start``, ``save``, ``load``, ``export``,
    ``named_tensors`` or ``stop``."""
    samples: list[TrainSample] = []
    batch: SFTBatch | None = None
    """``sft``: the warm-start batch."""
    lr: float | None = None
    """``sft``: the warm start's learning rate."""
    path: str | None = None


# -- the backend -------------------------------------------------------------------------------


class MegatronBackend:
    """GRPO on a megatron-core GPTModel. Construct on every rank after
    :func:`initialize_parallel`; rank 0 calls the methods, the others call :meth:`follow`.

    Args:
        hf: the model's HF config.
        spec: ``spec.trainer``.
        temperature: the rollout temperature (logprobs are of ``softmax(logits / T)``).
        model_dir: the HF model directory (initial weights, and the config/tokenizer files
            copied next to exported weights); None starts from megatron's random init.
        params_dtype: parameter dtype (``spec.model.dtype``; float32 in the CPU tests).
        microbatch_tokens: the packing budget of a micro-batch (a longer trajectory is a
            micro-batch of its own).
        recompute: activation recompute, ``full``/``selective``/``none``, or ``auto``: full
            for micro-batches above
            :data:`~agentrl.trainer.megatron_attention.RECOMPUTE_ABOVE_TOKENS` tokens.
    """

    def __init__(
        self,
        hf: HFModelConfig,
        spec: TrainerSpec,
        *,
        temperature: float,
        model_dir: Path | None = None,
        params_dtype: torch.dtype = torch.bfloat16,
        microbatch_tokens: int = DEFAULT_MICROBATCH_TOKENS,
        recompute: str = "auto",
    ) -> None:
        with _quiet():
            from megatron.core import parallel_state
        self.microbatch_tokens = microbatch_tokens
        self.recompute = recompute
        self.hf = hf
        self.spec = spec
        self.temperature = temperature
        self.model_dir = model_dir
        self.params_dtype = params_dtype
        self.iteration = 0
        self.ps = parallel_state
        self.model = build_gpt_model(hf, spec, params_dtype=params_dtype, recompute=recompute)
        if model_dir is not None and any(model_dir.glob("*.safetensors")):
            self.load_hf_weights(model_dir)
        self.device = torch.device("cuda", torch.cuda.current_device()) if gpu_available() else None
        self.reference: Any = None
        self.reference_from_warm_start = False
        """The KL reference holds the warm start's weights (so checkpoints carry it)."""
        self.ddp: Any = None
        self.optimizer: Any = None
        if self.device is not None:
            self._setup_training()

    # -- construction ----------------------------------------------------------------------

    def _setup_training(self) -> None:
        with _quiet():
            from megatron.core.distributed import (
                DistributedDataParallel,
                DistributedDataParallelConfig,
                finalize_model_grads,
            )
            from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        if self.spec.algorithm.kl_coef > 0:
            # The KL term compares with the initial policy: a frozen copy of the start weights.
            self.reference = build_gpt_model(
                self.hf, self.spec, params_dtype=self.params_dtype, recompute="none"
            )
            self.reference.load_state_dict(self.model.state_dict(), strict=False)
            self.reference.to(self.device).eval().requires_grad_(False)
        self.model.to(self.device)
        config = self.model.config
        self.ddp = DistributedDataParallel(
            config=config,
            ddp_config=DistributedDataParallelConfig(
                grad_reduce_in_fp32=True, use_distributed_optimizer=True
            ),
            module=self.model,
        )
        config.no_sync_func = self.ddp.no_sync
        config.finalize_model_grads_func = finalize_model_grads
        bf16 = self.params_dtype == torch.bfloat16
        self.optimizer = get_megatron_optimizer(
            OptimizerConfig(**optimizer_config_kwargs(self.spec, bf16=bf16)), [self.ddp]
        )

    # -- names -----------------------------------------------------------------------------

    def _layer_offset(self) -> int:
        with _quiet():
            from megatron.core.transformer.transformer_layer import get_transformer_layer_offset
        return int(get_transformer_layer_offset(self.model.config))

    def global_name(self, name: str) -> str:
        """A parameter's name with the pipeline stage's layer offset and the expert-parallel
        rank's expert offset added (the names a single-GPU model would have)."""
        parts = name.split(".")
        if name.startswith("decoder.layers."):
            parts[2] = str(int(parts[2]) + self._layer_offset())
        if ".local_experts." in name and self.hf.num_experts:
            i = parts.index("local_experts") + 1
            per_rank = self.hf.num_experts // self.ps.get_expert_model_parallel_world_size()
            parts[i] = str(int(parts[i]) + self.ps.get_expert_model_parallel_rank() * per_rank)
        return ".".join(parts)

    def _tp(self, param: torch.Tensor) -> tuple[int | None, Any, int, int]:
        """(partition dim, group, rank, size) of a parameter's tensor-parallel sharding;
        experts shard over the expert tensor-parallel group."""
        if not getattr(param, "tensor_model_parallel", False):
            return None, None, 0, 1
        if not getattr(param, "allreduce", True):  # expert parameters
            group = self.ps.get_expert_tensor_parallel_group()
            rank = self.ps.get_expert_tensor_parallel_rank()
            size = self.ps.get_expert_tensor_parallel_world_size()
        else:
            group = self.ps.get_tensor_model_parallel_group()
            rank = self.ps.get_tensor_model_parallel_rank()
            size = self.ps.get_tensor_model_parallel_world_size()
        return int(param.partition_dim), group, rank, size

    # -- HF weights ------------------------------------------------------------------------

    def load_hf_weights(self, model_dir: Path) -> None:
        """Fill this rank's parameters from the HF safetensors in ``model_dir``, reading only
        the tensors this rank's stage and experts need (every rank of a node reads at once:
        whole files on each would hold the model once per rank in host memory)."""
        from safetensors import safe_open

        globals_ = [self.global_name(n) for n, _ in self.model.named_parameters()]
        wanted = {k for g in globals_ for k in megatron_weights.hf_names(g)}
        if "lm_head.weight" in wanted:
            wanted.add("model.embed_tokens.weight")  # a tied model's output layer reads this
        state: dict[str, torch.Tensor] = {}
        for f in sorted(model_dir.glob("*.safetensors")):
            with safe_open(str(f), framework="pt") as opened:
                for key in opened.keys():  # noqa: SIM118 - safe_open is not a mapping
                    if key in wanted:
                        state[key] = opened.get_tensor(key)
        params = dict(self.model.named_parameters())
        whole = megatron_weights.from_hf(state, [self.global_name(n) for n in params], self.hf)
        with torch.no_grad():
            for name, param in params.items():
                dim, _, rank, size = self._tp(param)
                piece = megatron_weights.shard(
                    name, whole[self.global_name(name)], partition_dim=dim, rank=rank, size=size
                )
                param.copy_(piece.to(param.dtype))

    def gathered(self, name: str, param: torch.Tensor) -> torch.Tensor:
        """``param`` whole: its tensor-parallel pieces gathered (a collective over its
        tensor-parallel group, so every rank of the group must call it for the same name)."""
        dim, group, _, size = self._tp(param)
        tensor = param.detach()
        if size == 1:
            return tensor
        pieces = [torch.empty_like(tensor) for _ in range(size)]
        torch.distributed.all_gather(pieces, tensor.contiguous(), group=group)
        return megatron_weights.unshard(name, pieces, partition_dim=dim)

    def hf_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The HF tensors this rank owns (:func:`agentrl.trainer.megatron_export.owns`: one
        owner per parameter in the world), whole; every rank must iterate to the end."""
        yield from megatron_export.owned_tensors(self)

    def _export(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        megatron_export.write_shards(self, directory)
        if torch.distributed.get_rank() == 0 and self.model_dir is not None:
            for side in HF_SIDE_FILES:
                if (self.model_dir / side).is_file():
                    shutil.copy2(self.model_dir / side, directory / side)

    # -- collective calls ------------------------------------------------------------------

    def _announce(self, command: _Command) -> None:
        if torch.distributed.get_world_size() > 1:
            torch.distributed.broadcast_object_list([command], src=0)

    def follow(self) -> None:
        """Ranks other than 0: run what rank 0 runs, until it says ``stop``."""
        while True:
            box: list[Any] = [None]
            torch.distributed.broadcast_object_list(box, src=0)
            command: _Command = box[0]
            if command.op == "stop":
                return
            if command.op == "step":
                self._step(command.samples)
            elif command.op == "save":
                self._save(Path(command.path or ""))
            elif command.op == "load":
                self._load(Path(command.path or ""))
            elif command.op == "export":
                self._export(Path(command.path or ""))
            elif command.op == "sft":
                assert command.batch is not None and command.lr is not None
                self._sft(command.batch, lr=command.lr)
            elif command.op == "finish_warm_start":
                self._finish_warm_start()
            elif command.op == "named_tensors":
                megatron_export.stream_to_rank0(self)

    def stop_followers(self) -> None:
        """Rank 0: release the other ranks from :meth:`follow`."""
        self._announce(_Command(op="stop"))

    # -- the Backend surface ---------------------------------------------------------------

    def train_step(self, samples: Sequence[TrainSample]) -> StepStats:
        """One GRPO update on ``samples`` (rank 0; the others follow)."""
        self._announce(_Command(op="step", samples=list(samples)))
        return self._step(samples)

    def sft_step(self, batch: SFTBatch, *, lr: float) -> SFTStats:
        """One update of the warm-start stage on a packed batch (rank 0; the others follow):
        the mean negative logprob at temperature 1 of its loss-mask tokens, each predicted from
        the tokens before it in its own conversation (:func:`~agentrl.trainer.megatron_sft.
        sft_sequences` through the packed forward of :meth:`train_step`: no attention across
        the packing), conversations shared out over data-parallel ranks, at learning rate
        ``lr``. The loss is of the weights before the update; not counted as a step
        (``iteration``)."""
        self._announce(_Command(op="sft", batch=batch, lr=lr))
        return self._sft(batch, lr=lr)

    def finish_warm_start(self) -> None:
        """RL starts from the warm-started weights (rank 0; the others follow): the Adam
        moments are zeroed and the learning rate set back to ``optimizer.lr`` (RL's first
        update is a fresh Adam's, as on the torch backend), and the weights become the KL
        reference, which checkpoints carry from now on."""
        self._announce(_Command(op="finish_warm_start"))
        self._finish_warm_start()

    def score(self, samples: Sequence[TrainSample]) -> list[torch.Tensor]:
        """The current weights' logprobs of each sample's loss-mask tokens (from position 1),
        without megatron's schedule: packed micro-batches through :meth:`_forward_step` on this
        rank alone. For one-rank layouts (the device script's parity check, tests); on a host
        without a GPU it computes on the CPU where megatron's forward allows it."""
        seqs = token_sequences(samples, first_position=1)
        device = self.device or torch.device("cpu")
        out: list[torch.Tensor] = []

        def keep(_: TokenSequence, lp: torch.Tensor) -> torch.Tensor:
            out.append(lp.detach().float().cpu())
            return lp.sum() * 0.0

        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for group in pack_microbatches(
                    [len(s.token_ids) for s in seqs], self.microbatch_tokens
                ):
                    logits, loss_func = self._forward_step(
                        [seqs[i] for i in group],
                        self.model,
                        pad_to=None,
                        microbatches=1,
                        loss_fn=keep,
                        device=device,
                    )
                    loss_func(logits)
        finally:
            self.model.train(was_training)
        return out

    def save_state(self, directory: Path) -> None:
        """Model, optimizer and step counter as a ``torch_dist`` checkpoint in
        ``directory/model`` (a collective: every rank writes its shards)."""
        self._announce(_Command(op="save", path=str(directory)))
        self._save(directory)

    def load_state(self, directory: Path) -> None:
        """Inverse of :meth:`save_state`."""
        self._announce(_Command(op="load", path=str(directory)))
        self._load(directory)

    def export_weights(self, directory: Path) -> None:
        """HF safetensors (plus config and tokenizer files) that SGLang loads."""
        self._announce(_Command(op="export", path=str(directory)))
        self._export(directory)

    def named_tensors(self) -> megatron_export.Stream:
        """The whole HF-named state dict for a distributed weight push, on rank 0: every
        tensor's name, dtype and shape first, then the tensors one at a time as the owning
        ranks send them (pipeline stages, expert-parallel ranks; see
        :mod:`agentrl.trainer.megatron_export`)."""
        self._announce(_Command(op="named_tensors"))
        stream = megatron_export.stream_to_rank0(self)
        assert stream is not None  # rank 0
        return stream

    # -- implementations -------------------------------------------------------------------

    def _sharded_state(
        self, *, is_loading: bool, metadata: dict[str, Any], reference: bool
    ) -> dict[str, Any]:
        # The layout megatron's own training uses: the model's sharded state under "model",
        # the distributed optimizer's (which refers to the model's tensors) under "optimizer",
        # both built with the same metadata at save and at load; the warm start's KL reference
        # under its own prefix.
        state: dict[str, Any] = {"model": self.model.sharded_state_dict(metadata=metadata)}
        if self.optimizer is not None:
            state["optimizer"] = self.optimizer.sharded_state_dict(
                state["model"], is_loading=is_loading, metadata=metadata
            )
        if reference:
            state[REFERENCE_KEY] = self.reference.sharded_state_dict(
                prefix=f"{REFERENCE_KEY}.", metadata=metadata
            )
        return state

    def _save(self, directory: Path) -> None:
        with _quiet():
            from megatron.core import dist_checkpointing
        target = directory / MODEL_DIR
        target.mkdir(parents=True, exist_ok=True)
        metadata = checkpoint_metadata()
        reference = self.reference is not None and self.reference_from_warm_start
        state = self._sharded_state(is_loading=False, metadata=metadata, reference=reference)
        state[ITERATION_KEY] = self.iteration
        strategy = None if gpu_available() else host_save_strategy()
        content = content_metadata(metadata)
        if reference:
            content[REFERENCE_FLAG] = True
        with _quiet():  # torch's DCP deprecations, reached through megatron's calls
            dist_checkpointing.save(
                state,
                str(target),
                sharded_strategy=strategy,
                validate_access_integrity=True,
                content_metadata=content,
            )
        if torch.distributed.get_rank() == 0:
            (directory / "hf_config.json").write_text(
                json.dumps(self.hf.model_dump(), indent=2), encoding="utf-8"
            )

    def _load(self, directory: Path) -> None:
        with _quiet():
            from megatron.core import dist_checkpointing
        source = str(directory / MODEL_DIR)
        # What the checkpoint was saved with (a checkpoint from before it was recorded: ours).
        saved = dict(dist_checkpointing.load_content_metadata(source) or {})
        reference = bool(saved.pop(REFERENCE_FLAG, False)) and self.reference is not None
        metadata = {**checkpoint_metadata(), **saved}
        if self.optimizer is not None:
            init_adam_state(self.optimizer)
        with _quiet():
            loaded = dist_checkpointing.load(
                self._sharded_state(is_loading=True, metadata=metadata, reference=reference),
                source,
            )
        # strict=False: Transformer Engine's per-module "_extra_state" entries are optional.
        self.model.load_state_dict(loaded["model"], strict=False)
        if self.optimizer is not None and "optimizer" in loaded:
            # no_grad: fp32 parameters are their own main weights, copied into in place.
            with torch.no_grad():
                self.optimizer.load_state_dict(loaded["optimizer"])
            restore_adam_steps(self.optimizer)
        if reference:
            prefix = f"{REFERENCE_KEY}."
            self.reference.load_state_dict(
                {k.removeprefix(prefix): v for k, v in loaded[REFERENCE_KEY].items()},
                strict=False,
            )
        self.reference_from_warm_start = reference
        self.iteration = int(loaded[ITERATION_KEY])

    def _require_device(self) -> torch.device:
        if self.device is None or self.optimizer is None:
            raise RuntimeError(
                "the megatron backend steps on a GPU only: megatron-core's forward pass and "
                "gradient buffers call torch.cuda.current_device(); use backend: torch on a CPU"
            )
        return self.device

    def _run(
        self,
        model: Any,
        seqs: Sequence[TokenSequence],
        *,
        forward_only: bool,
        loss_fn: Any,
        temperature: float | None = None,
    ) -> None:
        """``seqs`` through ``model``, packed into micro-batches of at most
        ``microbatch_tokens`` tokens without padding (:func:`pack_microbatches`), each through
        :meth:`_forward_step` (logprobs at ``temperature``, by default the rollout's)."""
        with _quiet():
            from megatron.core.pipeline_parallel import get_forward_backward_func
        self._require_device()
        groups = pack_microbatches([len(s.token_ids) for s in seqs], self.microbatch_tokens)
        batches = [[seqs[i] for i in group] for group in groups]
        # Pipeline stages exchange activations of one fixed shape: pad every row to the longest
        # (the padding is a sequence of its own, so it attends only to itself).
        pipelined = self.ps.get_pipeline_model_parallel_world_size() > 1
        width = max(sum(len(s.token_ids) for s in b) for b in batches)

        def forward_step(data: Iterator[list[TokenSequence]], module: Any) -> tuple[Any, Any]:
            return self._forward_step(
                next(data),
                module,
                pad_to=width if pipelined else None,
                microbatches=len(batches),
                loss_fn=loss_fn,
                temperature=temperature,
            )

        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(batches),
            model=[model],
            num_microbatches=len(batches),
            seq_length=width,
            micro_batch_size=1,
            forward_only=forward_only,
        )

    def _forward_step(
        self,
        batch: Sequence[TokenSequence],
        module: Any,
        *,
        pad_to: int | None,
        microbatches: int,
        loss_fn: Any,
        device: torch.device | None = None,
        temperature: float | None = None,
    ) -> tuple[Any, Any]:
        """One micro-batch: ``batch`` packed into one row (:func:`packed_row`, the ``thd``
        format: positions restart per trajectory, attention stays within it) through
        ``module``; the loss function calls ``loss_fn(seq, logp)`` with each trajectory's loss
        tokens' logprobs (at ``temperature``, by default the rollout's) and returns the sum,
        times ``microbatches`` (megatron divides every micro-batch's loss by their number)."""
        scale = self.temperature if temperature is None else temperature
        with _quiet():
            from megatron.core.packed_seq_params import PackedSeqParams
        device = device or self._require_device()
        row = packed_row([s.token_ids for s in batch], pad_to=pad_to)
        ids = torch.tensor([row.token_ids], dtype=torch.long, device=device)
        positions = torch.tensor([row.position_ids], dtype=torch.long, device=device)
        cu = torch.tensor(row.cu_seqlens, dtype=torch.int32, device=device)
        params = PackedSeqParams(
            qkv_format="thd",
            cu_seqlens_q=cu,
            cu_seqlens_kv=cu,
            max_seqlen_q=row.max_seqlen,
            max_seqlen_kv=row.max_seqlen,
        )
        if self.recompute == "auto":
            set_recompute(self.model.config, len(row.token_ids))
        logits = module(ids, positions, None, packed_seq_params=params)

        def loss_func(output: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
            total = output.new_zeros((), dtype=torch.float32)
            for seq, offset in zip(batch, row.offsets, strict=True):
                index = torch.tensor(seq.positions, device=device) + offset
                lp = token_logprobs(
                    output[0, index - 1].unsqueeze(0), ids[:, index], temperature=scale
                )[0]
                total = total + loss_fn(seq, lp)
            return total * microbatches, {}

        return logits, loss_func

    def _logprobs(self, model: Any, seqs: Sequence[TokenSequence]) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []

        def keep(_: TokenSequence, lp: torch.Tensor) -> torch.Tensor:
            out.append(lp.detach().float())
            return lp.sum() * 0.0

        with torch.no_grad():
            self._run(model, seqs, forward_only=True, loss_fn=keep)
        return out

    def _step(self, samples: Sequence[TrainSample]) -> StepStats:
        self._require_device()
        algorithm = self.spec.algorithm
        # RL's rate, whatever the optimizer last ran at (a warm start's, a checkpoint's).
        megatron_sft.set_learning_rate(self.optimizer, self.spec.optimizer.lr)
        last_stage = self.ps.is_pipeline_last_stage()
        dp = self.ps.get_data_parallel_world_size()
        # Token j is predicted from the logits at j − 1: token 0 is never scored.
        all_seqs = token_sequences(samples, first_position=1)
        shards = [
            [all_seqs[i] for i in shard]
            for shard in shard_minibatches(
                len(all_seqs),
                mini_batches=algorithm.mini_batches,
                dp_rank=self.ps.get_data_parallel_rank(),
                dp_size=dp,
            )
        ]
        seqs = [s for shard in shards for s in shard]

        # The old (and reference) logprobs of every trajectory of this rank, once, with the
        # weights at the start of the step: every update is measured against them.
        t0 = time.monotonic()
        self.ddp.eval()
        logp_old = self._logprobs(self.ddp, seqs)
        logp_ref = self._logprobs(self.reference, seqs) if self.reference is not None else None
        t1 = time.monotonic()
        old_by_index = {s.index: o for s, o in zip(seqs, logp_old, strict=True)}
        ref_by_index = {s.index: r for s, r in zip(seqs, logp_ref, strict=True)} if logp_ref else {}

        # Weights need each mini-batch's totals over data-parallel ranks: gather every rank's
        # old logprobs on the last stage (small: one float per generated token).
        olds: list[torch.Tensor] = []
        weights: dict[int, float] = {}
        if last_stage:
            gathered: list[Any] = [None] * dp
            torch.distributed.all_gather_object(
                gathered,
                [(s.index, lp.cpu()) for s, lp in zip(seqs, logp_old, strict=True)],
                group=self.ps.get_data_parallel_group(),
            )
            olds = [lp for _, lp in sorted((x for part in gathered for x in part), key=_first)]
            for a, b in minibatch_bounds(len(all_seqs), algorithm.mini_batches):
                w = microbatch_weights(all_seqs[a:b], olds[a:b], algorithm)
                weights.update({a + i: wi for i, wi in enumerate(w)})

        parts: list[LossStats] = []
        losses: list[float] = []  # this rank's share of each update's loss
        norms: list[float] = []
        for _ in range(algorithm.epochs):
            for shard in shards:
                loss, norm = self._update(shard, old_by_index, ref_by_index, weights, parts)
                losses.append(loss)
                norms.append(norm)
        self.iteration += 1
        t2 = time.monotonic()

        payload: Any = None
        if last_stage:
            totals: list[Any] = [None] * dp
            torch.distributed.all_gather_object(
                totals, (losses, parts), group=self.ps.get_data_parallel_group()
            )
            per_update = [sum(t[0][u] for t in totals) for u in range(len(losses))]
            stats = step_statistics(all_seqs, olds, [p for t in totals for p in t[1]], algorithm)
            payload = (sum(per_update) / len(per_update), stats)
        if self.ps.get_pipeline_model_parallel_world_size() > 1:
            box = [payload]
            torch.distributed.broadcast_object_list(
                box,
                src=self.ps.get_pipeline_model_parallel_last_rank(),
                group=self.ps.get_pipeline_model_parallel_group(),
            )
            payload = box[0]
        loss_value, stats = payload
        return StepStats(
            loss=float(loss_value),
            grad_norm=sum(norms) / len(norms),
            loss_stats=stats,
            recompute_seconds=t1 - t0,
            update_seconds=t2 - t1,
        )

    def _sft(self, batch: SFTBatch, *, lr: float) -> SFTStats:
        self._require_device()
        dp = int(self.ps.get_data_parallel_world_size())
        seqs = megatron_sft.sft_sequences(batch)
        tokens = megatron_sft.trained_tokens(seqs)
        mine = megatron_sft.data_parallel_share(
            seqs, dp_rank=self.ps.get_data_parallel_rank(), dp_size=dp
        )
        losses: list[float] = []

        def nll(seq: TokenSequence, lp: torch.Tensor) -> torch.Tensor:
            if not seq.carries_loss:  # a rank's stand-in: joins the reduction, adds nothing
                return lp.sum() * 0.0
            loss = -lp.sum() / tokens
            losses.append(float(loss.detach()))
            return loss * dp  # DDP averages the gradients over data-parallel ranks

        megatron_sft.set_learning_rate(self.optimizer, lr)
        self.ddp.train()
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()
        self._run(self.ddp, mine, forward_only=False, loss_fn=nll, temperature=1.0)
        _, grad_norm, _ = self.optimizer.step()
        return SFTStats(
            loss=self._batch_total(sum(losses)), grad_norm=float(grad_norm or 0.0), tokens=tokens
        )

    def _batch_total(self, value: float) -> float:
        """The sum of every data-parallel rank's ``value`` (computed on the last pipeline
        stage), on every rank."""
        total = value
        if self.ps.is_pipeline_last_stage():
            totals: list[Any] = [None] * self.ps.get_data_parallel_world_size()
            torch.distributed.all_gather_object(
                totals, float(value), group=self.ps.get_data_parallel_group()
            )
            total = float(sum(totals))
        if self.ps.get_pipeline_model_parallel_world_size() > 1:
            box = [total]
            torch.distributed.broadcast_object_list(
                box,
                src=self.ps.get_pipeline_model_parallel_last_rank(),
                group=self.ps.get_pipeline_model_parallel_group(),
            )
            total = float(box[0])
        return total

    def _finish_warm_start(self) -> None:
        if self.optimizer is not None:
            megatron_sft.reset_adam_moments(self.optimizer)
            megatron_sft.set_learning_rate(self.optimizer, self.spec.optimizer.lr)
        if self.reference is not None:
            # strict=False: Transformer Engine's per-module "_extra_state" entries are optional.
            self.reference.load_state_dict(self.model.state_dict(), strict=False)
            self.reference_from_warm_start = True

    def _update(
        self,
        shard: Sequence[TokenSequence],
        old_by_index: dict[int, torch.Tensor],
        ref_by_index: dict[int, torch.Tensor],
        weights: dict[int, float],
        parts: list[LossStats],
    ) -> tuple[float, float]:
        """One optimizer update on this rank's share of one mini-batch: (this rank's part of
        the mini-batch's loss, gradient norm)."""
        device = self._require_device()
        algorithm = self.spec.algorithm
        dp = self.ps.get_data_parallel_world_size()
        losses: list[float] = []

        def grpo(seq: TokenSequence, lp: torch.Tensor) -> torch.Tensor:
            flat = flatten([seq])
            loss, stats = grpo_loss(
                logp=lp,
                logp_old=old_by_index[seq.index].to(device),
                logp_engine=torch.tensor(flat.engine_logprobs, device=device),
                advantages=torch.tensor(flat.advantages, device=device),
                mask=torch.tensor(flat.mask, device=device),
                seq_index=torch.tensor(flat.seq_index, dtype=torch.long, device=device),
                num_seqs=1,
                algorithm=algorithm,
                logp_ref=ref_by_index[seq.index].to(device) if ref_by_index else None,
            )
            parts.append(stats)
            losses.append(float(loss.detach()) * weights[seq.index])
            # DDP averages the gradients over data-parallel ranks (and _run undoes megatron's
            # mean over micro-batches): undo it so the sum is the mini-batch's loss.
            return loss * weights[seq.index] * dp

        self.ddp.train()
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()
        self._run(self.ddp, shard, forward_only=False, loss_fn=grpo)
        _, grad_norm, _ = self.optimizer.step()
        return sum(losses), float(grad_norm or 0.0)


def _first(item: tuple[int, Any]) -> int:
    return item[0]
