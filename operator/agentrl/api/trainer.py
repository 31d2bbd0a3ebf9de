"""``spec.trainer``: the GRPO algorithm, the asynchronous loop, topology, weight sync and
checkpoints."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from agentrl.api.base import DNS_SUBDOMAIN_PATTERN, ManifestModel, ObjectName
from agentrl.api.model import DatasetFormat, DatasetSpec
from agentrl.api.quantities import Quantity
from agentrl.api.rules import Rule


class TrainerBackend(StrEnum):
    """``megatron`` on GPUs; ``torch`` for tiny models on CPU (``agentrl run``)."""

    MEGATRON = "megatron"
    TORCH = "torch"


class ZeroVariancePolicy(StrEnum):
    """Groups whose rewards are all equal carry no signal."""

    KEEP = "keep"
    """Keep them (advantage 0: only the KL term acts)."""
    MASK = "mask"
    """Keep them in the batch but give them no loss."""
    DROP_AND_REFILL = "dropAndRefill"
    """Drop them and wait for other groups to fill the step."""


class LossAggregation(StrEnum):
    """How per-token losses become the step's loss."""

    TOKEN_MEAN = "token-mean"
    SEQ_MEAN_TOKEN_MEAN = "seq-mean-token-mean"
    SEQ_MEAN_TOKEN_SUM = "seq-mean-token-sum"


class CorrectionMode(StrEnum):
    """Train/inference mismatch correction using the engine's logprobs."""

    NONE = "none"
    TIS = "tis"
    """Truncated importance sampling: weights clipped to [low, high]."""
    ICEPOP = "icepop"
    """Tokens whose weight falls outside [low, high] get no gradient."""


class OffPolicyCorrection(ManifestModel):
    """Importance correction between the engine that sampled and the trainer."""

    mode: CorrectionMode = CorrectionMode.TIS
    """``none``, ``tis`` or ``icepop``."""
    low: float = Field(default=0.5, ge=0.0, le=1.0)
    """Lower bound of the importance weight."""
    high: float = Field(default=2.0, ge=1.0, le=100.0)
    """Upper bound of the importance weight."""


class Algorithm(ManifestModel):
    """GRPO settings."""

    std_normalize: bool = True
    """Divide advantages by the group's reward standard deviation (off: Dr. GRPO)."""
    zero_variance_groups: ZeroVariancePolicy = ZeroVariancePolicy.DROP_AND_REFILL
    """What happens to groups whose rewards are all equal."""
    loss_aggregation: LossAggregation = LossAggregation.TOKEN_MEAN
    """``token-mean``, ``seq-mean-token-mean`` or ``seq-mean-token-sum``."""
    clip_low: float = Field(default=0.2, ge=0.0, le=1.0)
    """PPO ratio clip below 1 (ε_low)."""
    clip_high: float = Field(default=0.28, ge=0.0, le=10.0)
    """PPO ratio clip above 1 (ε_high; 0.28 as in the report's recipes)."""
    kl_coef: float = Field(default=0.0, ge=0.0, le=10.0)
    """Coefficient of the low-variance KL penalty to the initial policy (0 disables it)."""
    off_policy_correction: OffPolicyCorrection = Field(default_factory=OffPolicyCorrection)
    """Train/inference mismatch correction."""
    mini_batches: int = Field(default=1, ge=1, le=1024)
    """Optimizer updates per pass over a step: its trajectories are split, in order and whole,
    into this many mini-batches, each one AdamW update. Logprobs of the "old" policy are taken
    once, before the first update, so every later update is off-policy with respect to them and
    the PPO clip (``clipLow``/``clipHigh``) bounds how far it moves; 1 is one update per step
    (the ratio is then exactly 1 and nothing is clipped). At most ``trajectoriesPerStep`` (for
    megatron: ``trajectoriesPerStep`` / data-parallel size)."""
    epochs: int = Field(default=1, ge=1, le=64)
    """Passes over a step's mini-batches (same split, same order); each pass after the first
    re-uses trajectories the policy has already been updated on."""

    cel_rules = (
        Rule(
            cel="self.offPolicyCorrection.low < self.offPolicyCorrection.high",
            message_expression="'offPolicyCorrection.low must be below offPolicyCorrection.high'",
            field_path=".offPolicyCorrection.low",
            check=lambda a: a.off_policy_correction.low < a.off_policy_correction.high,
            message=lambda a: "offPolicyCorrection.low must be below offPolicyCorrection.high",
        ),
    )


class Optimizer(ManifestModel):
    """AdamW settings."""

    lr: float = Field(default=1e-6, gt=0.0, le=1.0)
    """Learning rate."""
    weight_decay: float = Field(default=0.1, ge=0.0, le=1.0)
    """Decoupled weight decay."""
    beta1: float = Field(default=0.9, ge=0.0, lt=1.0)
    """Adam β1."""
    beta2: float = Field(default=0.98, ge=0.0, lt=1.0)
    """Adam β2."""
    grad_clip: float = Field(default=1.0, gt=0.0, le=1000.0)
    """Global gradient-norm clip."""


class Parallelism(ManifestModel):
    """Megatron parallel sizes. Their product with data parallelism equals the GPUs. What the
    megatron backend runs: GPUs a multiple of tensor × pipeline × context and of tensor ×
    expert × pipeline (megatron-core's groups), context 1; the model's ``config.json`` is
    checked when the trainer starts (layers divisible by pipeline, heads by tensor, experts by
    expert, no expert parallelism on a dense model). All 1 for the torch backend."""

    tensor: int = Field(default=1, ge=1, le=64)
    """Tensor parallel size."""
    pipeline: int = Field(default=1, ge=1, le=64)
    """Pipeline parallel size."""
    context: int = Field(default=1, ge=1, le=64)
    """Context parallel size (1: the megatron backend does not split sequences yet)."""
    expert: int = Field(default=1, ge=1, le=256)
    """Expert parallel size (MoE)."""


class AsyncSpec(ManifestModel):
    """The asynchronous loop."""

    max_staleness: int = Field(default=2, ge=0, le=64)
    """Most policy versions an admitted episode may lag the trainer. Enforced by admission
    control (no new episode starts that would exceed it), never by discarding finished work."""


class WeightSyncMode(StrEnum):
    """How new weights reach the engines."""

    DISK = "disk"
    DISTRIBUTED = "distributed"


class WeightSync(ManifestModel):
    """Weight push to engines."""

    mode: WeightSyncMode = WeightSyncMode.DISK
    """``disk`` (save, then ``/update_weights_from_disk``) or ``distributed`` (an RCCL/NCCL
    broadcast group)."""
    interval_steps: int = Field(default=1, ge=1, le=10_000)
    """Push weights every this many steps."""
    push_attempts: int = Field(default=3, ge=1, le=20)
    """Tries of one push to one engine before it counts as a failed push (disk mode: that
    engine again; distributed mode: the whole broadcast, with a new group). An engine whose
    pushes keep failing is retried at the next interval; three failed pushes in a row set
    the job's ``Degraded`` condition."""
    retry_backoff_seconds: float = Field(default=2.0, ge=0.0, le=600.0)
    """Wait before the second try of a push (seconds); it doubles before each further try."""


class Checkpoint(ManifestModel):
    """Checkpoints (the trainer resumes from the last one)."""

    interval_steps: int = Field(default=10, ge=1, le=100_000)
    """Save every this many steps."""
    volume: str | None = Field(default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    """Existing PVC to write to (a DNS-1123 subdomain: lower case, digits, ``-`` and ``.``);
    unset makes ``NAME-checkpoints``."""
    size: Quantity = "500Gi"
    """Size of the PVC the operator makes."""
    storage_class_name: str | None = Field(
        default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN
    )
    """StorageClass of that PVC (a DNS-1123 subdomain); unset uses the cluster default."""
    stop_grace_period_seconds: int = Field(default=1200, ge=30, le=86_400)
    """Seconds a trainer pod has, once told to stop (the job suspended, its node drained, the
    pod deleted), to finish its step, write a checkpoint and exit before Kubernetes kills it:
    the pods' ``terminationGracePeriodSeconds``. Size it for one step (with its weight push)
    plus one checkpoint write (its bytes over the volume's write rate), plus 10 % (at least
    60 s): measured with ``bench/stop_grace.py``, a stop costs nothing else. The default fits
    the report's Qwen3-30B-A3B: a 641 s step and 427 GB of weights and optimizer state
    written at 1 GB/s (1,068 s). While the job is suspending, engines stay up for at most
    this long."""
    save_attempts: int = Field(default=3, ge=1, le=20)
    """Tries of one checkpoint save before it counts as a failed save (a full volume, a
    permission refused, a storage I/O error). A failed save sets the job's ``Degraded``
    condition (``CheckpointSaveFailing``) and ``CheckpointSaved=False``; training goes on and
    the next interval saves again."""
    retry_backoff_seconds: float = Field(default=2.0, ge=0.0, le=600.0)
    """Wait before the second try of a save (seconds); it doubles before each further try."""
    max_failed_saves: int = Field(default=3, ge=1, le=1_000)
    """Failed saves in a row (each after ``saveAttempts`` tries) at which the trainer exits
    with an error, so the operator restarts it from the last checkpoint (a restart counted
    against ``trainer.backoffLimit``): training on without saving would spend GPU hours on steps
    that cannot be kept. A save at the end of training or at a stop, with no later interval to
    make up for it, fails the trainer at once."""


#: One Linux interface name: at most 15 characters (IFNAMSIZ 16 with the terminator), no
#: ``/``, whitespace or ``,``.
_IFNAME = r"[A-Za-z0-9_.:@-]{1,15}"
_NCCL_IFNAMES = rf"^(\^=?|=)?{_IFNAME}(,{_IFNAME})*$"
_GLOO_IFNAMES = rf"^{_IFNAME}(,{_IFNAME})*$"


class EvaluationDatasetSpec(ManifestModel):
    """``spec.trainer.evaluation.dataset``: a task set of its own to measure pass@1 on, as the
    report trained on SWE-smith and measured on SWE-bench Verified. Read like ``spec.dataset``
    (same path rules, the same sandbox profile, ``spec.dataset.imagePullSecrets`` for its
    images), in the same format, so one sandbox template serves both."""

    format: DatasetFormat
    """``swebench``, ``swesmith`` or ``harbor``, and the format of ``spec.dataset`` (the toy
    tasks are generated, not read: hold some out with ``spec.dataset.heldOutFraction``)."""
    path: str = Field(min_length=1, max_length=512)
    """JSONL file or task directory, as the trainer reads it (``agentrl run``: a local path)."""
    max_tasks: int | None = Field(default=None, ge=1, le=1_000_000)
    """Use at most this many of its tasks (after shuffling with ``spec.dataset.seed``)."""

    cel_rules = (
        Rule(
            cel="self.format != 'toy'",
            message_expression="'format toy: the toy tasks are generated, not read; hold some "
            "out with spec.dataset.heldOutFraction and remove trainer.evaluation.dataset'",
            field_path=".format",
            check=lambda d: d.format != DatasetFormat.TOY,
            message=lambda d: (
                "format toy: the toy tasks are generated, not read; hold some out with "
                "spec.dataset.heldOutFraction and remove trainer.evaluation.dataset"
            ),
        ),
    )

    def as_dataset(self, seed: int, image_pull_secrets: list[ObjectName]) -> DatasetSpec:
        """The :class:`DatasetSpec` its tasks are loaded with (nothing held out of it)."""
        return DatasetSpec(
            format=self.format,
            path=self.path,
            held_out_fraction=0.0,
            seed=seed,
            max_tasks=self.max_tasks,
            image_pull_secrets=image_pull_secrets,
        )


class EvaluationSpec(ManifestModel):
    """``spec.trainer.evaluation``: held-out pass@1 measured while the job trains.

    The driver evaluates at the start and every ``intervalSteps`` steps through the same rollout
    tier as training, beside it (never blocking a step): ``attemptsPerTask`` episodes on each of
    ``tasks`` held-out tasks, sampled per stratum (the toy tasks' bug kind, the SWE tasks'
    repository). The held-out tasks are those of ``dataset`` when it is set, else those
    ``spec.dataset.heldOutFraction`` keeps out of training. Its episodes never enter a training
    step."""

    interval_steps: int = Field(default=10, ge=0, le=100_000)
    """Evaluate at the start and after every this many steps; 0: only at the start."""
    tasks: int = Field(default=100, ge=0, le=100_000)
    """Held-out tasks per evaluation, sampled stratified with ``dataset.seed`` (all of them
    when the held-out split is smaller); 0 turns evaluation off."""
    attempts_per_task: int = Field(default=4, ge=1, le=64)
    """Episodes per task; pass@1 is the mean over tasks of successes / attempts that did not
    end in an infra error."""
    concurrency_share: float = Field(default=0.25, gt=0.0, le=1.0)
    """Share of ``sandbox.concurrency`` evaluation episodes may hold at once (at least one);
    they take their slots from the same in-effect concurrency as training's episodes, which
    run in the rest (live sandboxes never exceed the concurrency)."""
    dataset: EvaluationDatasetSpec | None = None
    """Tasks of their own to evaluate on (all of them eligible), instead of the share of
    ``spec.dataset`` that ``heldOutFraction`` keeps out of training; ``spec.dataset`` is then
    trained on whole (``heldOutFraction: 0``)."""


class NetworkSpec(ManifestModel):
    """Collective-communication network pinning."""

    nccl_socket_ifname: str | None = Field(default=None, max_length=64, pattern=_NCCL_IFNAMES)
    """``NCCL_SOCKET_IFNAME`` (RCCL reads the same): pin the NIC so weight sync never picks a
    duplicate container address. Interface names (at most 15 characters, Linux's limit) or
    prefixes, comma-separated, optionally after ``^`` (exclude) or ``=`` (exact), as NCCL
    reads them."""
    gloo_socket_ifname: str | None = Field(default=None, max_length=64, pattern=_GLOO_IFNAMES)
    """``GLOO_SOCKET_IFNAME``: exact interface names, comma-separated (gloo takes no prefixes
    or exclusions)."""
    ib_hca: str | None = Field(default=None, max_length=256)
    """``NCCL_IB_HCA``: RDMA devices to use."""


class WarmStartSpec(ManifestModel):
    """``spec.trainer.warmStart``: supervised fine-tuning on agent conversations before RL.

    The trainer first trains on every conversation of ``dataset`` for ``epochs`` passes, then
    starts RL from the result. Each conversation is rendered with the chat template and tool
    schemas the rollout uses (``spec.model.chatTemplate``; the SWE tools when
    ``spec.model.toolCallParser`` is set) and trained with loss on the tokens of every assistant
    turn, its end-of-turn token included, and on nothing else (mean over those tokens).
    Conversations are packed without padding into batches of at most ``tokensPerBatch``
    tokens. A line that does not parse, calls a tool the job does not offer, renders
    differently whole than turn by turn, or is longer than ``tokensPerBatch`` is refused with
    its line number (``agentrl tasks validate --manifest job.yaml`` checks the file before the
    job starts)."""

    dataset: str = Field(min_length=1, max_length=512)
    """JSONL file of conversations, as the trainer reads it (``agentrl run``: a local path; on a
    cluster, a path in the trainer pod). Each line is ``{"messages": [...], "tools": [...]}``:
    OpenAI chat messages (``system``, ``user``, ``assistant`` with optional ``tool_calls`` and
    ``reasoning_content``, ``tool`` results after the call) and, optionally, OpenAI tool
    definitions, which may only name tools the job offers (the job's definitions are rendered);
    ``agentrl tasks traces`` writes such a file."""
    epochs: int = Field(default=1, ge=1, le=100)
    """Passes over the conversations; each pass packs them in a new order (from ``seed``)."""
    lr: float = Field(default=1e-5, gt=0.0, le=1.0)
    """AdamW learning rate of the warm start (the RL phase uses ``optimizer.lr``); the other
    AdamW settings are ``optimizer``'s."""
    tokens_per_batch: int = Field(default=32768, ge=512, le=1_048_576)
    """Most tokens in one packed batch; a conversation longer than this is refused, not cut."""
    seed: int = Field(default=0, ge=0)
    """Seed of the conversations' order in each epoch."""


def _data_parallel(t: TrainerSpec) -> int:
    """Data-parallel ranks of the megatron backend (1 for torch): GPUs over tensor × pipeline ×
    context parallel sizes."""
    if t.backend != TrainerBackend.MEGATRON:
        return 1
    p = t.parallelism
    return (t.nodes * t.gpus_per_node) // (p.tensor * p.pipeline * p.context)


def _sizes(t: TrainerSpec) -> tuple[int, int, int, int]:
    p = t.parallelism
    return (p.tensor, p.pipeline, p.context, p.expert)


def _expert_size(t: TrainerSpec) -> int:
    """GPUs of one expert-parallel layout: megatron-core's ``initialize_model_parallel`` needs
    the world size to be a multiple of expert-tensor × expert × pipeline sizes (the expert
    tensor-parallel size is the tensor-parallel size here)."""
    p = t.parallelism
    return p.tensor * p.expert * p.pipeline


class TrainerSpec(ManifestModel):
    """``spec.trainer``: the GRPO trainer."""

    backend: TrainerBackend = TrainerBackend.MEGATRON
    """``megatron`` (GPUs) or ``torch`` (tiny models on CPU)."""
    nodes: int = Field(default=1, ge=1, le=1024)
    """Trainer pods (Indexed Job completions); rank 0 drives the job."""
    gpus_per_node: int = Field(default=8, ge=0, le=16)
    """GPUs each trainer pod requests (0 only for the torch backend)."""
    parallelism: Parallelism = Field(default_factory=Parallelism)
    """Megatron parallel sizes."""
    algorithm: Algorithm = Field(default_factory=Algorithm)
    """GRPO settings."""
    optimizer: Optimizer = Field(default_factory=Optimizer)
    """Optimizer settings."""
    trajectories_per_step: int = Field(default=64, ge=2, le=1_000_000)
    """Trajectories in one training step; a multiple of ``rollout.groupSize``."""
    max_steps: int = Field(default=100, ge=1, le=10_000_000)
    """Steps after which the job is Complete."""
    async_: AsyncSpec = Field(default_factory=AsyncSpec, alias="async")
    """The asynchronous loop."""
    weight_sync: WeightSync = Field(default_factory=WeightSync)
    """Weight push to engines."""
    checkpoint: Checkpoint = Field(default_factory=Checkpoint)
    """Checkpoints."""
    network: NetworkSpec = Field(default_factory=NetworkSpec)
    """NCCL/RCCL network pinning."""
    evaluation: EvaluationSpec = Field(default_factory=EvaluationSpec)
    """Held-out pass@1 during training (at the start and every ``intervalSteps``)."""
    warm_start: WarmStartSpec | None = None
    """Supervised fine-tuning on agent conversations before RL; unset starts RL from
    ``spec.model`` directly."""
    backoff_limit: int = Field(default=3, ge=0, le=100)
    """Trainer restarts (from the last checkpoint) before the job is Failed."""
    image: str = Field(default="ghcr.io/agentrl/rocm-trainer:0.1.0", min_length=1, max_length=512)
    """The trainer image (``images/rocm-trainer``)."""
    cpu: Quantity = "32"
    """CPU request per trainer pod."""
    memory: Quantity = "512Gi"
    """Memory request per trainer pod."""
    priority_class_name: str | None = Field(
        default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN
    )
    """PriorityClass of the trainer pods. Unset: the operator's ``--trainer-priority-class``
    (the Helm chart's ``priorityClasses``), else none. The class must exist: the API server
    refuses a pod naming a missing one."""

    cel_rules = (
        Rule(
            cel="self.algorithm.miniBatches * (self.backend == 'megatron' ? "
            "(self.nodes * self.gpusPerNode) / (self.parallelism.tensor * "
            "self.parallelism.pipeline * self.parallelism.context) : 1) <= "
            "self.trajectoriesPerStep",
            message_expression="'algorithm.miniBatches (%d) × data-parallel ranks (%d) must not "
            "exceed trajectoriesPerStep (%d): every mini-batch gives each data-parallel rank at "
            "least one trajectory'.format([self.algorithm.miniBatches, self.backend == "
            "'megatron' ? (self.nodes * self.gpusPerNode) / (self.parallelism.tensor * "
            "self.parallelism.pipeline * self.parallelism.context) : 1, "
            "self.trajectoriesPerStep])",
            field_path=".algorithm.miniBatches",
            check=lambda t: t.algorithm.mini_batches * _data_parallel(t) <= t.trajectories_per_step,
            message=lambda t: (
                f"algorithm.miniBatches ({t.algorithm.mini_batches}) × data-parallel ranks "
                f"({_data_parallel(t)}) must not exceed trajectoriesPerStep "
                f"({t.trajectories_per_step}): every mini-batch gives each data-parallel rank at "
                "least one trajectory"
            ),
        ),
        Rule(
            cel="self.backend != 'torch' || (self.parallelism.tensor == 1 && "
            "self.parallelism.pipeline == 1 && self.parallelism.context == 1 && "
            "self.parallelism.expert == 1)",
            message_expression="'parallelism is for the megatron backend: backend torch trains "
            "one unsharded model, so tensor, pipeline, context and expert must all be 1 (got %d, "
            "%d, %d, %d)'.format([self.parallelism.tensor, self.parallelism.pipeline, "
            "self.parallelism.context, self.parallelism.expert])",
            field_path=".parallelism",
            check=lambda t: t.backend != TrainerBackend.TORCH or _sizes(t) == (1, 1, 1, 1),
            message=lambda t: (
                "parallelism is for the megatron backend: backend torch trains one unsharded "
                "model, so tensor, pipeline, context and expert must all be 1 (got "
                + ", ".join(str(n) for n in _sizes(t))
                + ")"
            ),
        ),
        Rule(
            cel="self.backend != 'torch' || self.nodes == 1",
            message_expression="'nodes must be 1 for backend torch (got %d): it trains one "
            "model in one process, with no ranks to follow the driver; use backend megatron "
            "for more'.format([self.nodes])",
            field_path=".nodes",
            check=lambda t: t.backend != TrainerBackend.TORCH or t.nodes == 1,
            message=lambda t: (
                f"nodes must be 1 for backend torch (got {t.nodes}): it trains one model in one "
                "process, with no ranks to follow the driver; use backend megatron for more"
            ),
        ),
        Rule(
            cel="self.backend != 'torch' || self.gpusPerNode <= 1",
            message_expression="'gpusPerNode must be 0 or 1 for backend torch (got %d): every "
            "GPU is a trainer rank, and the torch backend has one (on the CPU); use backend "
            "megatron for more'.format([self.gpusPerNode])",
            field_path=".gpusPerNode",
            check=lambda t: t.backend != TrainerBackend.TORCH or t.gpus_per_node <= 1,
            message=lambda t: (
                f"gpusPerNode must be 0 or 1 for backend torch (got {t.gpus_per_node}): every "
                "GPU is a trainer rank, and the torch backend has one (on the CPU); use backend "
                "megatron for more"
            ),
        ),
        Rule(
            cel="self.backend != 'megatron' || self.parallelism.context == 1",
            message_expression="'parallelism.context must be 1 (got %d): the megatron backend "
            "feeds every context-parallel rank whole sequences instead of its slices; use "
            "tensor, pipeline or expert parallelism'.format([self.parallelism.context])",
            field_path=".parallelism.context",
            check=lambda t: t.backend != TrainerBackend.MEGATRON or t.parallelism.context == 1,
            message=lambda t: (
                f"parallelism.context must be 1 (got {t.parallelism.context}): the megatron "
                "backend feeds every context-parallel rank whole sequences instead of its "
                "slices; use tensor, pipeline or expert parallelism"
            ),
        ),
        Rule(
            cel="self.backend != 'megatron' || (self.nodes * self.gpusPerNode) % "
            "(self.parallelism.tensor * self.parallelism.expert * self.parallelism.pipeline) == 0",
            message_expression="'parallelism.expert (%d) does not fit: nodes × gpusPerNode (%d) "
            "must be a multiple of tensor × expert × pipeline (%d), the size megatron-core "
            "gives each expert-parallel layout (expert must divide the data-parallel × context "
            "ranks of a pipeline stage)'.format([self.parallelism.expert, self.nodes * "
            "self.gpusPerNode, self.parallelism.tensor * self.parallelism.expert * "
            "self.parallelism.pipeline])",
            field_path=".parallelism.expert",
            check=lambda t: (
                t.backend != TrainerBackend.MEGATRON
                or (t.nodes * t.gpus_per_node) % _expert_size(t) == 0
            ),
            message=lambda t: (
                f"parallelism.expert ({t.parallelism.expert}) does not fit: nodes × gpusPerNode "
                f"({t.nodes * t.gpus_per_node}) must be a multiple of tensor × expert × pipeline "
                f"({_expert_size(t)}), the size megatron-core gives each expert-parallel layout "
                "(expert must divide the data-parallel × context ranks of a pipeline stage)"
            ),
        ),
        Rule(
            cel="self.backend == 'torch' || self.gpusPerNode >= 1",
            message_expression="'gpusPerNode must be at least 1 for the megatron backend "
            "(0 GPUs is only for backend: torch)'",
            field_path=".gpusPerNode",
            check=lambda t: t.backend == TrainerBackend.TORCH or t.gpus_per_node >= 1,
            message=lambda t: (
                "gpusPerNode must be at least 1 for the megatron backend "
                "(0 GPUs is only for backend: torch)"
            ),
        ),
        Rule(
            cel="self.backend != 'megatron' || (self.nodes * self.gpusPerNode) % "
            "(self.parallelism.tensor * self.parallelism.pipeline * self.parallelism.context) "
            "== 0",
            message_expression="'nodes × gpusPerNode (%d) must be a multiple of tensor × "
            "pipeline × context parallel sizes (%d)'.format([self.nodes * self.gpusPerNode, "
            "self.parallelism.tensor * self.parallelism.pipeline * self.parallelism.context])",
            field_path=".parallelism",
            check=lambda t: (
                t.backend != TrainerBackend.MEGATRON
                or (t.nodes * t.gpus_per_node)
                % (t.parallelism.tensor * t.parallelism.pipeline * t.parallelism.context)
                == 0
            ),
            message=lambda t: (
                f"nodes × gpusPerNode ({t.nodes * t.gpus_per_node}) must be a "
                "multiple of tensor × pipeline × context parallel sizes "
                f"({t.parallelism.tensor * t.parallelism.pipeline * t.parallelism.context})"
            ),
        ),
    )
