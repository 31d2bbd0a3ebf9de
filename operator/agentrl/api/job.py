"""The AgentRLJob resource: ``spec`` ties the component specs together and carries the rules
that span them."""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import ConfigDict, Field

from agentrl.api.base import ManifestModel, ObjectName
from agentrl.api.engine import InferenceSpec
from agentrl.api.model import TINY_POLICY_PATH, DatasetSpec, ModelSpec
from agentrl.api.rollout import RolloutSpec
from agentrl.api.rules import Rule, immutable
from agentrl.api.sandbox import SandboxSpec
from agentrl.api.status import AgentRLJobStatus
from agentrl.api.trainer import TrainerSpec

GROUP = "agentrl.dev"
VERSION = "v1alpha1"
API_VERSION: Final = "agentrl.dev/v1alpha1"  # GROUP/VERSION, a literal for the model's field
KIND: Final = "AgentRLJob"
PLURAL = "agentrljobs"
SINGULAR = "agentrljob"
SHORT_NAMES = ("arj",)
CATEGORIES = ("agentrl",)

#: Longest job name. Every child name is NAME plus a suffix, and the longest derived value that
#: must stay a 63-character DNS label is the engine StatefulSet's controller-revision-hash label,
#: NAME + "-engine-" + 10 hash characters; 40 leaves room for that and for sandbox pod names
#: (NAME-sbx-<12 random>). ``agentrl.reconcile.names`` asserts this at import.
MAX_NAME_LENGTH = 40


class AgentRLJobSpec(ManifestModel):
    """``spec``: one agentic RL job."""

    model: ModelSpec
    """What is trained and served."""
    dataset: DatasetSpec = Field(default_factory=DatasetSpec)
    """The tasks."""
    inference: InferenceSpec = Field(default_factory=InferenceSpec)
    """SGLang engines."""
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    """Episodes and their caps."""
    sandbox: SandboxSpec = Field(default_factory=SandboxSpec)
    """The sandbox pool; ``concurrency`` is the /scale field."""
    trainer: TrainerSpec = Field(default_factory=TrainerSpec)
    """The GRPO trainer."""
    image_pull_secrets: list[ObjectName] = Field(default_factory=list, max_length=16)
    """Secrets for pulling the engine, trainer and rollout images (task images use
    ``dataset.imagePullSecrets``)."""
    suspend: bool = False
    """Scale engines and sandboxes to zero and suspend the trainer; false resumes."""
    active_deadline_seconds: int | None = Field(default=None, ge=1, le=31_536_000)
    """Fail the job (DeadlineExceeded) when it has run this long, counted from its start."""
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0, le=31_536_000)
    """Delete the job this long after it is Complete or Failed."""

    cel_rules = (
        Rule(
            cel="self.trainer.evaluation.tasks == 0 || has(self.trainer.evaluation.dataset) || "
            "self.dataset.heldOutFraction > 0.0",
            message_expression="'trainer.evaluation.tasks (%d) needs held-out tasks: set "
            "dataset.heldOutFraction above 0, or trainer.evaluation.dataset to a task set of "
            "its own, or trainer.evaluation.tasks to 0 (no evaluation)'"
            ".format([self.trainer.evaluation.tasks])",
            field_path=".trainer.evaluation.tasks",
            check=lambda s: (
                s.trainer.evaluation.tasks == 0
                or s.trainer.evaluation.dataset is not None
                or s.dataset.held_out_fraction > 0.0
            ),
            message=lambda s: (
                f"trainer.evaluation.tasks ({s.trainer.evaluation.tasks}) needs held-out tasks: "
                "set dataset.heldOutFraction above 0, or trainer.evaluation.dataset to a task "
                "set of its own, or trainer.evaluation.tasks to 0 (no evaluation)"
            ),
        ),
        Rule(
            cel="!has(self.trainer.evaluation.dataset) || self.dataset.heldOutFraction == 0.0",
            message_expression="'dataset.heldOutFraction %s keeps tasks out of training that "
            "nothing evaluates: trainer.evaluation.dataset is the held-out set; set "
            "dataset.heldOutFraction to 0'.format([string(self.dataset.heldOutFraction)])",
            field_path=".dataset.heldOutFraction",
            check=lambda s: (
                s.trainer.evaluation.dataset is None or s.dataset.held_out_fraction == 0
            ),
            message=lambda s: (
                f"dataset.heldOutFraction {s.dataset.held_out_fraction} keeps tasks out of "
                "training that nothing evaluates: trainer.evaluation.dataset is the held-out "
                "set; set dataset.heldOutFraction to 0"
            ),
        ),
        Rule(
            cel="!has(self.trainer.evaluation.dataset) || "
            "self.trainer.evaluation.dataset.format == self.dataset.format",
            message_expression="'trainer.evaluation.dataset.format %s differs from "
            "dataset.format %s: one sandbox template (its security profile follows the format) "
            "serves both; evaluate on a set of the training format'"
            ".format([self.trainer.evaluation.dataset.format, self.dataset.format])",
            field_path=".trainer.evaluation.dataset.format",
            check=lambda s: (
                s.trainer.evaluation.dataset is None
                or s.trainer.evaluation.dataset.format == s.dataset.format
            ),
            message=lambda s: (
                f"trainer.evaluation.dataset.format "
                f"{s.trainer.evaluation.dataset.format.value} differs from dataset.format "
                f"{s.dataset.format.value}: one sandbox template (its security profile follows "
                "the format) serves both; evaluate on a set of the training format"
                if s.trainer.evaluation.dataset is not None
                else ""
            ),
        ),
        Rule(
            cel="self.trainer.trajectoriesPerStep % self.rollout.groupSize == 0",
            message_expression="'trainer.trajectoriesPerStep (%d) must be a multiple of "
            "rollout.groupSize (%d): a step trains on whole groups'"
            ".format([self.trainer.trajectoriesPerStep, self.rollout.groupSize])",
            field_path=".trainer.trajectoriesPerStep",
            check=lambda s: s.trainer.trajectories_per_step % s.rollout.group_size == 0,
            message=lambda s: (
                f"trainer.trajectoriesPerStep ({s.trainer.trajectories_per_step}) "
                f"must be a multiple of rollout.groupSize ({s.rollout.group_size}): a step trains "
                "on whole groups"
            ),
        ),
        Rule(
            cel="self.rollout.maxTrajectoryTokens <= self.inference.contextLength",
            message_expression="'rollout.maxTrajectoryTokens (%d) must not exceed "
            "inference.contextLength (%d): the engine cannot hold a longer trajectory'"
            ".format([self.rollout.maxTrajectoryTokens, self.inference.contextLength])",
            field_path=".rollout.maxTrajectoryTokens",
            check=lambda s: s.rollout.max_trajectory_tokens <= s.inference.context_length,
            message=lambda s: (
                "rollout.maxTrajectoryTokens "
                f"({s.rollout.max_trajectory_tokens}) must not exceed inference.contextLength "
                f"({s.inference.context_length}): the engine cannot hold a longer trajectory"
            ),
        ),
        Rule(
            cel="self.inference.server != 'tiny' || self.trainer.backend == 'torch'",
            message_expression="'inference.server tiny serves the built-in tiny policy, which "
            "only trainer.backend torch trains: set trainer.backend torch, or inference.server "
            "sglang'",
            field_path=".inference.server",
            check=lambda s: s.inference.server != "tiny" or s.trainer.backend == "torch",
            message=lambda s: (
                "inference.server tiny serves the built-in tiny policy, which only "
                "trainer.backend torch trains: set trainer.backend torch, or inference.server "
                "sglang"
            ),
        ),
        Rule(
            cel="self.trainer.backend != 'torch' || self.sandbox.provider == 'local' || "
            "self.inference.server == 'tiny'",
            message_expression="'trainer.backend torch trains the built-in tiny policy, which "
            "SGLang cannot serve: on a cluster set inference.server tiny (with gpusPerEngine "
            "0), or use trainer.backend megatron'",
            field_path=".inference.server",
            check=lambda s: (
                s.trainer.backend != "torch"
                or s.sandbox.provider == "local"
                or s.inference.server == "tiny"
            ),
            message=lambda s: (
                "trainer.backend torch trains the built-in tiny policy, which SGLang cannot "
                "serve: on a cluster set inference.server tiny (with gpusPerEngine 0), or use "
                "trainer.backend megatron"
            ),
        ),
        Rule(
            cel="self.trainer.backend != 'megatron' || self.sandbox.provider != 'local'",
            message_expression="'sandbox.provider local runs on one machine and needs "
            "trainer.backend torch; use provider kubernetes or e2b with megatron'",
            field_path=".sandbox.provider",
            check=lambda s: s.trainer.backend != "megatron" or s.sandbox.provider != "local",
            message=lambda s: (
                "sandbox.provider local runs on one machine and needs "
                "trainer.backend torch; use provider kubernetes or e2b with megatron"
            ),
        ),
        Rule(
            cel="!(self.dataset.format in ['swebench', 'swesmith']) || "
            "self.sandbox.provider != 'local'",
            message_expression="'dataset.format %s runs every instance in its own image (the "
            "repository in /testbed, its conda environment) and sandbox.provider local runs no "
            "images: use provider kubernetes (or e2b with templates built from the images)'"
            ".format([self.dataset.format])",
            field_path=".sandbox.provider",
            check=lambda s: (
                s.dataset.format not in ("swebench", "swesmith") or s.sandbox.provider != "local"
            ),
            message=lambda s: (
                f"dataset.format {s.dataset.format.value} runs every instance in its own image "
                "(the repository in /testbed, its conda environment) and sandbox.provider local "
                "runs no images: use provider kubernetes (or e2b with templates built from the "
                "images)"
            ),
        ),
        Rule(
            cel=f"!has(self.trainer.warmStart) || self.model.source.path != '{TINY_POLICY_PATH}'",
            message_expression=f"'trainer.warmStart renders conversations with the chat template "
            f"of the model, and model.source.path {TINY_POLICY_PATH} is the built-in tiny policy, "
            "which has none: set model.source.path to a Hugging Face model directory, or remove "
            "trainer.warmStart'",
            field_path=".trainer.warmStart",
            check=lambda s: s.trainer.warm_start is None or s.model.source.path != TINY_POLICY_PATH,
            message=lambda s: (
                "trainer.warmStart renders conversations with the chat template of the model, and "
                f"model.source.path {TINY_POLICY_PATH} is the built-in tiny policy, which has "
                "none: set model.source.path to a Hugging Face model directory, or remove "
                "trainer.warmStart"
            ),
        ),
        immutable("model", "spec.model"),
        Rule(
            cel="self.trainer.backend == oldSelf.trainer.backend && "
            "self.trainer.nodes == oldSelf.trainer.nodes && "
            "self.trainer.gpusPerNode == oldSelf.trainer.gpusPerNode && "
            "self.trainer.parallelism == oldSelf.trainer.parallelism",
            message_expression="'the trainer topology (backend, nodes, gpusPerNode, "
            "parallelism) is immutable once the job exists: checkpoints are laid out for it; "
            "delete and re-create the job to change it'",
            field_path=".trainer",
            transition=True,
        ),
    )


class ObjectMeta(ManifestModel):
    """The part of metadata a manifest sets."""

    model_config = ConfigDict(**{**ManifestModel.model_config, "extra": "allow"})

    name: str = Field(min_length=1, max_length=253, pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    """Job name: a DNS label of at most 40 characters (children append suffixes)."""
    namespace: str | None = None
    """Namespace; unset uses the current one."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Labels, copied to every child."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations."""


class AgentRLJob(ManifestModel):
    """An agentic RL job: engines, trainer, rollout tier and sandbox pool."""

    api_version: Literal["agentrl.dev/v1alpha1"] = API_VERSION
    """``agentrl.dev/v1alpha1``."""
    kind: Literal["AgentRLJob"] = KIND
    """``AgentRLJob``."""
    metadata: ObjectMeta
    """Name, namespace, labels."""
    spec: AgentRLJobSpec
    """The job."""
    status: AgentRLJobStatus | None = None
    """Written by the operator."""

    cel_rules = (
        Rule(
            cel=f"self.metadata.name.size() <= {MAX_NAME_LENGTH}",
            message_expression=f"'metadata.name must be at most {MAX_NAME_LENGTH} characters "
            "(it is %d): every child name (NAME-engine-<hash>, NAME-checkpoints, ...) must "
            "stay a 63-character DNS label'.format([self.metadata.name.size()])",
            field_path=".metadata.name",
            check=lambda j: len(j.metadata.name) <= MAX_NAME_LENGTH,
            message=lambda j: (
                f"metadata.name must be at most {MAX_NAME_LENGTH} characters "
                f"(it is {len(j.metadata.name)}): every child name (NAME-engine-<hash>, "
                "NAME-checkpoints, ...) must stay a 63-character DNS label"
            ),
        ),
    )

    @classmethod
    def from_manifest(cls, obj: dict[str, Any]) -> AgentRLJob:
        """Parse a manifest (a dict from YAML or the API server)."""
        return cls.model_validate(obj)
