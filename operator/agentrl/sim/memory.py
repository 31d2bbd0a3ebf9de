"""The trainer's GPU memory per GPU: can one trajectory of ``rollout.maxTrajectoryTokens`` be
trained at the job's parallel layout?

The estimate follows what the megatron backend (:mod:`agentrl.trainer.megatron_backend`) runs:

* **State** — bf16 weights (2 B per parameter), fp32 gradient buffers (4 B:
  ``grad_reduce_in_fp32``) and the distributed optimizer's fp32 master weights and two Adam
  moments (12 B), sharded over the data-parallel ranks (the expert parameters over the
  expert-data-parallel ranks, world / (tensor × expert × pipeline)); with ``algorithm.klCoef``
  above 0, a frozen bf16 copy of the start weights (the reference policy: 2 B more).
* **What a GPU holds** — tensor parallelism divides the attention and dense MLP matrices and the
  vocabulary (embedding, output layer, logits); pipeline parallelism divides the layers (the
  first stage also holds the input embedding, the last the output layer); expert parallelism
  divides the routed experts (each expert's matrices also split over tensor parallelism).
* **Activations** — fused attention (no tokens × tokens score matrix), packed sequences with
  one trajectory per micro-batch (at worst ``maxTrajectoryTokens`` tokens), full recompute per
  layer: a stage keeps each of its layers' input hidden state ([tokens, hidden], bf16) for every
  micro-batch in flight (the 1F1B schedule keeps up to ``pipeline`` on the first stage, one on
  the last), and one layer's working set at a time while it is recomputed and differentiated.
  The last stage also holds the logits [tokens, vocab / tensor] in fp32 for the logprob and
  the loss — at 32–64K tokens and a 150K vocabulary the largest activation of all. The logits
  exist before the backward pass starts and the layers are recomputed after they are freed, so
  the last stage's peak is the stored inputs plus the larger of the two.
* **Reserve** — a fixed amount for the HIP/CUDA context, RCCL/NCCL buffers and the caching
  allocator's fragmentation (:data:`RUNTIME_RESERVE_BYTES`).

Every activation term is proportional to the tokens, so the estimate is ``fixed + tokens ×
per_token`` per stage, and the largest ``maxTrajectoryTokens`` that fits follows directly.
Norms, biases, rotary tables and the per-trajectory logprob vectors are left out (< 0.1%).

The model's shapes come from the planner's catalogue (:mod:`agentrl.sim.architectures`:
``spec.model.architecture`` or the name of ``spec.model.source.path``), since the operator
cannot read ``config.json`` on a PVC; an unknown model is not estimated. The GPU is the one
``inference.nodeSelector`` names (trainer nodes are taken to be of the same product), else the
planner's default (:mod:`agentrl.sim.hardware`).

The checkpoint volume is sized here too (:func:`checkpoint_volume`): megatron checkpoints of
14 B per parameter (bf16 weights, fp32 master weights and two moments), of which the trainer
keeps :data:`CHECKPOINTS_KEPT`, and bf16 weight exports, of which both weight-sync modes keep
:data:`EXPORTS_KEPT`; each store writes the new one before deleting the oldest.

Called by :mod:`agentrl.sim.plan` (``agentrl plan`` reports it) and :mod:`agentrl.sim.cli`
(``agentrl validate`` refuses a job whose trainer cannot fit, naming the field to change).
"""

from __future__ import annotations

import math
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from agentrl.api import AgentRLJob
from agentrl.api.quantities import parse_quantity
from agentrl.api.trainer import TrainerBackend
from agentrl.api.validation import CheckResult, FieldError
from agentrl.sim.architectures import ModelArchitecture, UnsupportedArchitectureError
from agentrl.sim.hardware import GIB, GPUProduct, UnknownGPUError
from agentrl.sim.params import SimParams
from agentrl.sim.static_plan import PlanInputError, resolve_architecture, resolve_gpu

#: bf16 weights.
WEIGHT_BYTES = 2
#: fp32 gradient buffers (``grad_reduce_in_fp32``).
GRAD_BYTES = 4
#: fp32 master weights + Adam's two fp32 moments, sharded over data-parallel ranks.
OPTIMIZER_BYTES = 12
#: bf16 activations (stored layer inputs, a layer's working set).
ACTIVATION_BYTES = 2
#: A layer's working set counted twice: its recomputed forward tensors and their gradients.
LAYER_GRADIENT_FACTOR = 2
#: Bytes per logit element: two fp32 [tokens, vocab / tensor] buffers at once (the logits and
#: the scaled copy the vocab-parallel cross entropy turns into the softmax it keeps for the
#: backward pass, where the gradient is written into it in place).
LOGIT_BYTES = 8
#: HIP/CUDA context, RCCL/NCCL communicator buffers and allocator fragmentation.
RUNTIME_RESERVE_BYTES = 10 * GIB
#: A megatron ``torch_dist`` checkpoint: bf16 weights + fp32 master weights + two fp32 moments.
CHECKPOINT_BYTES_PER_PARAM = 14
#: Checkpoints the trainer keeps (``agentrl.trainer.checkpoint.CheckpointStore``'s ``keep``).
CHECKPOINTS_KEPT = 3
#: Exported weight versions kept (``keep`` of both modes of ``agentrl.trainer.weight_sync``).
EXPORTS_KEPT = 2


class StageMemory(BaseModel):
    """One pipeline stage's bytes on one GPU at ``tokens`` tokens per micro-batch."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    stage: str
    """``only`` (pipeline 1), ``first`` or ``last``."""
    layers: int
    """Transformer layers of the stage."""
    micro_batches_in_flight: int
    """Micro-batches whose layer inputs the stage holds at once."""
    params: int
    """Parameters on one GPU of the stage (its shard of every matrix)."""
    weights_bytes: int
    """bf16 weights."""
    grads_bytes: int
    """fp32 gradients."""
    optimizer_bytes: int
    """Distributed optimizer's share (fp32 master + two moments)."""
    reference_bytes: int
    """The frozen bf16 reference copy (``algorithm.klCoef`` > 0), else 0."""
    reserve_bytes: int
    """Runtime reserve."""
    checkpoint_bytes_per_token: int
    """Stored layer inputs per token of a micro-batch."""
    layer_bytes_per_token: int
    """One layer's working set per token."""
    logits_bytes_per_token: int
    """Logits per token (last stage only)."""

    @property
    def fixed_bytes(self) -> int:
        """What does not depend on the trajectory length."""
        return (self.weights_bytes + self.grads_bytes + self.optimizer_bytes
                + self.reference_bytes + self.reserve_bytes)

    @property
    def bytes_per_token(self) -> int:
        """Peak activation bytes per token of a trajectory."""
        return self.checkpoint_bytes_per_token + max(self.layer_bytes_per_token,
                                                     self.logits_bytes_per_token)

    def total_bytes(self, tokens: int) -> int:
        """Peak bytes on one GPU of this stage for a trajectory of ``tokens``."""
        return self.fixed_bytes + tokens * self.bytes_per_token

    def max_tokens(self, capacity_bytes: float) -> int:
        """The longest trajectory that fits in ``capacity_bytes`` (0 when the state does not)."""
        room = capacity_bytes - self.fixed_bytes
        return max(0, math.floor(room / self.bytes_per_token)) if room > 0 else 0


class TrainerMemoryEstimate(BaseModel):
    """Peak memory of one trainer GPU (the fullest pipeline stage)."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    architecture: str
    """Model architecture (catalogue name)."""
    gpu: str
    """GPU product assumed for the trainer."""
    gpu_bytes: float
    """Its memory."""
    tokens: int
    """Tokens of the longest micro-batch (``rollout.maxTrajectoryTokens``)."""
    tensor: int
    """Tensor parallel size."""
    pipeline: int
    """Pipeline parallel size."""
    expert: int
    """Expert parallel size."""
    data_parallel: int
    """Data-parallel ranks."""
    stages: list[StageMemory]
    """The stages that can be fullest (one with pipeline 1; first and last otherwise)."""
    worst: StageMemory
    """The stage with the highest peak at ``tokens``."""
    total_bytes: int
    """That peak."""
    max_tokens: int
    """The longest ``maxTrajectoryTokens`` every stage fits (0: not even the state fits)."""

    @property
    def fits(self) -> bool:
        """Whether the peak fits the GPU's memory."""
        return self.total_bytes <= self.gpu_bytes


class MemoryVerdict(StrEnum):
    """What the check concluded."""

    FITS = "fits"
    TOO_LARGE = "too-large"
    NOT_ESTIMATED = "not-estimated"


class TrainerMemoryCheck(BaseModel):
    """The estimate of a job, or why there is none, and the field to change when it fails."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    verdict: MemoryVerdict
    """``fits``, ``too-large`` or ``not-estimated``."""
    estimate: TrainerMemoryEstimate | None = None
    """The figures (None when not estimated)."""
    field: str | None = None
    """Manifest path to change when too large."""
    message: str
    """One sentence: the figure and the way out, or why nothing was estimated."""


def stage_memory(arch: ModelArchitecture, *, stage: str, tensor: int, pipeline: int,
                 expert: int, data_parallel: int, micro_batches: int,
                 reference: bool) -> StageMemory:
    """Bytes of one GPU of ``stage`` (``only``, ``first`` or ``last``) at this layout."""
    layers = math.ceil(arch.num_layers / pipeline)
    matrix = arch.vocab_size * arch.hidden_size
    # Pipeline 1: embedding and output layer (one matrix when tied); else the first stage's
    # embedding or the last stage's output layer (a copy when tied).
    vocab_matrices = 2 if stage == "only" and not arch.tie_word_embeddings else 1
    dense = (layers * (arch.attention_params_per_layer + arch.dense_mlp_params_per_layer)
             + vocab_matrices * matrix) // tensor + layers * arch.router_params_per_layer
    experts = layers * arch.expert_params_per_layer // (tensor * expert)
    params = dense + experts
    expert_data_parallel = max(1, data_parallel // expert)
    optimizer = (OPTIMIZER_BYTES * dense // data_parallel
                 + OPTIMIZER_BYTES * experts // expert_data_parallel)
    in_flight = min(pipeline, micro_batches) if stage == "first" else 1
    h = arch.hidden_size
    kv_heads = math.ceil(arch.num_kv_heads / tensor)
    attention = 3 * h + (2 * arch.num_attention_heads // tensor + 2 * kv_heads) * arch.head_dim
    if arch.is_moe:
        # Balanced routing: each GPU of an expert-parallel group receives the top-k copies of
        # as many tokens as its micro-batch has; router logits and probabilities in fp32.
        mlp = (3 * h + 4 * arch.num_experts
               + arch.num_experts_per_tok * (3 * h + 3 * arch.moe_intermediate_size // tensor))
    else:
        mlp = 3 * h + 3 * arch.intermediate_size // tensor
    return StageMemory(
        stage=stage,
        layers=layers,
        micro_batches_in_flight=in_flight,
        params=params,
        weights_bytes=WEIGHT_BYTES * params,
        grads_bytes=GRAD_BYTES * params,
        optimizer_bytes=optimizer,
        reference_bytes=WEIGHT_BYTES * params if reference else 0,
        reserve_bytes=RUNTIME_RESERVE_BYTES,
        checkpoint_bytes_per_token=in_flight * layers * h * ACTIVATION_BYTES,
        layer_bytes_per_token=LAYER_GRADIENT_FACTOR * ACTIVATION_BYTES * (attention + mlp),
        logits_bytes_per_token=(LOGIT_BYTES * math.ceil(arch.vocab_size / tensor)
                                if stage in ("only", "last") else 0),
    )


def estimate_trainer_memory(job: AgentRLJob, arch: ModelArchitecture,
                            gpu: GPUProduct) -> TrainerMemoryEstimate:
    """Peak memory per trainer GPU of ``job`` (megatron backend) for ``arch`` on ``gpu``."""
    trainer = job.spec.trainer
    p = trainer.parallelism
    world = trainer.nodes * trainer.gpus_per_node
    dp = max(1, world // (p.tensor * p.pipeline * p.context))
    micro_batches = max(1, trainer.trajectories_per_step // (trainer.algorithm.mini_batches * dp))
    names = ["only"] if p.pipeline == 1 else ["first", "last"]
    stages = [
        stage_memory(arch, stage=name, tensor=p.tensor, pipeline=p.pipeline, expert=p.expert,
                     data_parallel=dp, micro_batches=micro_batches,
                     reference=trainer.algorithm.kl_coef > 0)
        for name in names
    ]
    tokens = job.spec.rollout.max_trajectory_tokens
    worst = max(stages, key=lambda s: s.total_bytes(tokens))
    return TrainerMemoryEstimate(
        architecture=arch.name,
        gpu=gpu.name,
        gpu_bytes=gpu.memory_bytes,
        tokens=tokens,
        tensor=p.tensor,
        pipeline=p.pipeline,
        expert=p.expert,
        data_parallel=dp,
        stages=stages,
        worst=worst,
        total_bytes=worst.total_bytes(tokens),
        max_tokens=min(s.max_tokens(gpu.memory_bytes) for s in stages),
    )


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def _verdict(job: AgentRLJob, est: TrainerMemoryEstimate) -> TrainerMemoryCheck:
    w = est.worst
    where = f" on the {w.stage} pipeline stage" if w.stage != "only" else ""
    capacity = f"the {_gib(est.gpu_bytes)} of one {est.gpu}"
    if est.fits:
        return TrainerMemoryCheck(
            verdict=MemoryVerdict.FITS, estimate=est,
            message=(f"trainer needs ~{_gib(est.total_bytes)} per GPU{where} at "
                     f"{est.tokens} tokens, within {capacity} (fits up to "
                     f"{est.max_tokens} tokens)"))
    state = w.fixed_bytes - w.reserve_bytes
    if est.max_tokens < job.spec.rollout.max_tokens_per_turn:
        return TrainerMemoryCheck(
            verdict=MemoryVerdict.TOO_LARGE, estimate=est, field="spec.trainer.parallelism",
            message=(f"the trainer's weights, gradients and optimizer state of {est.architecture} "
                     f"need {_gib(state)} per GPU{where} (plus {_gib(w.reserve_bytes)} "
                     f"reserved) at tensor {est.tensor}, pipeline {est.pipeline}, expert "
                     f"{est.expert}, leaving no room for a trajectory in {capacity}: raise "
                     "spec.trainer.parallelism.tensor, .pipeline or .expert, or "
                     "spec.trainer.nodes (more data-parallel ranks shard the optimizer)"))
    logits = est.tokens * w.logits_bytes_per_token
    return TrainerMemoryCheck(
        verdict=MemoryVerdict.TOO_LARGE, estimate=est, field="spec.rollout.maxTrajectoryTokens",
        message=(f"{est.tokens} tokens need ~{_gib(est.total_bytes)} per trainer GPU{where} "
                 f"({_gib(state)} weights, gradients and optimizer state, "
                 f"{_gib(est.tokens * w.checkpoint_bytes_per_token)} stored layer inputs"
                 + (f", {_gib(logits)} fp32 logits" if logits else "")
                 + f", {_gib(w.reserve_bytes)} runtime reserve), above {capacity}: lower "
                 f"spec.rollout.maxTrajectoryTokens to at most "
                 f"{est.max_tokens}, or raise spec.trainer.parallelism.tensor (it divides the "
                 "logits, the weights and the layers' working set)"))


def check_trainer_memory(job: AgentRLJob, params: SimParams | None = None,
                         arch: ModelArchitecture | None = None,
                         config_path: str | Path | None = None) -> TrainerMemoryCheck:
    """The trainer memory verdict of ``job``: ``not-estimated`` (with the reason) for the torch
    backend, an unknown model or an unknown GPU product; else the estimate and whether it fits.
    ``arch`` skips resolving the architecture (``agentrl plan`` has it already)."""
    if job.spec.trainer.backend != TrainerBackend.MEGATRON:
        return TrainerMemoryCheck(
            verdict=MemoryVerdict.NOT_ESTIMATED,
            message="trainer backend torch: no GPU memory estimate (the megatron backend's)")
    if arch is None:
        try:
            arch, _ = resolve_architecture(job, config_path)
        except (PlanInputError, UnsupportedArchitectureError, OSError) as exc:
            return TrainerMemoryCheck(
                verdict=MemoryVerdict.NOT_ESTIMATED,
                message=f"trainer memory not estimated: {exc}")
    try:
        gpu, _ = resolve_gpu(job, params or SimParams())
    except UnknownGPUError as exc:
        return TrainerMemoryCheck(
            verdict=MemoryVerdict.NOT_ESTIMATED,
            message=f"trainer memory not estimated: {exc}")
    return _verdict(job, estimate_trainer_memory(job, arch, gpu))



def validate_trainer_memory(job: AgentRLJob) -> CheckResult:
    """``agentrl validate``'s check (an ``agentrl.api.validation.JobCheck``): an error naming
    the field when the trainer cannot fit, a note when nothing could be estimated for a GPU
    trainer, nothing when it fits."""
    check = check_trainer_memory(job)
    if check.verdict == MemoryVerdict.TOO_LARGE:
        assert check.field is not None
        return CheckResult(errors=[FieldError(check.field, check.message)])
    if check.verdict == MemoryVerdict.NOT_ESTIMATED and \
            job.spec.trainer.backend == TrainerBackend.MEGATRON:
        return CheckResult(notes=[check.message])
    return CheckResult()


class CheckpointVolume(BaseModel):
    """What the trainer writes to its checkpoint volume, at steady state and at the peak."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    export_bytes: int
    """One exported weight version (bf16 HF safetensors)."""
    checkpoint_bytes: int
    """One checkpoint."""
    steady_bytes: int
    """:data:`EXPORTS_KEPT` exports + :data:`CHECKPOINTS_KEPT` checkpoints."""
    peak_bytes: int
    """One more of each, while a new one is written before the oldest is deleted."""
    size_bytes: float | None
    """``trainer.checkpoint.size`` of the PVC the operator makes; None for an existing
    ``checkpoint.volume`` (its size is not in the manifest)."""

    @property
    def fits(self) -> bool:
        """Whether the peak fits the PVC (True when its size is unknown)."""
        return self.size_bytes is None or self.peak_bytes <= self.size_bytes


def checkpoint_volume(job: AgentRLJob, arch: ModelArchitecture) -> CheckpointVolume:
    """The checkpoint volume's use by ``job``'s trainer for ``arch``."""
    params = arch.total_params
    export = WEIGHT_BYTES * params
    checkpoint = CHECKPOINT_BYTES_PER_PARAM * params
    ckpt = job.spec.trainer.checkpoint
    return CheckpointVolume(
        export_bytes=export,
        checkpoint_bytes=checkpoint,
        steady_bytes=EXPORTS_KEPT * export + CHECKPOINTS_KEPT * checkpoint,
        peak_bytes=(EXPORTS_KEPT + 1) * export + (CHECKPOINTS_KEPT + 1) * checkpoint,
        size_bytes=None if ckpt.volume is not None else parse_quantity(ckpt.size),
    )


def checkpoint_volume_warning(job: AgentRLJob, volume: CheckpointVolume) -> str | None:
    """A warning naming ``trainer.checkpoint.size`` when the PVC is smaller than the peak."""
    if volume.fits or volume.size_bytes is None:
        return None
    return (f"trainer.checkpoint.size ({job.spec.trainer.checkpoint.size} = "
            f"{volume.size_bytes / 1e9:,.1f} GB) is below the checkpoint volume's peak use, "
            f"{volume.peak_bytes / 1e9:,.1f} GB ({CHECKPOINTS_KEPT + 1} checkpoints of "
            f"{volume.checkpoint_bytes / 1e9:,.1f} GB while the oldest is replaced and "
            f"{EXPORTS_KEPT + 1} weight exports of {volume.export_bytes / 1e9:,.1f} GB): the "
            f"volume fills and checkpoints fail; raise it to at least "
            f"{math.ceil(volume.peak_bytes / GIB)}Gi")
