"""``status`` of an AgentRLJob. Everything the operator writes is declared here: the API
server silently drops status fields the schema does not declare."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agentrl.api.base import ManifestModel


class Condition(ManifestModel):
    """A condition as in metav1.Condition."""

    type: str = Field(min_length=1, max_length=316)
    """Condition type (Ready, EnginesReady, ...)."""
    status: Literal["True", "False", "Unknown"]
    """True, False or Unknown."""
    reason: str = Field(
        min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
    )
    """CamelCase reason."""
    message: str = Field(default="", max_length=32768)
    """Human-readable detail; child failures are lifted in here."""
    observed_generation: int | None = Field(default=None, ge=0)
    """The .metadata.generation this condition was computed from."""
    last_transition_time: str
    """RFC 3339 time the status last changed."""


class EngineStatus(ManifestModel):
    """Engine StatefulSet summary."""

    replicas: int = 0
    """Engine pods desired."""
    ready: int = 0
    """Engine pods ready."""
    restarts: int = 0
    """Engine container restarts, summed over pods."""
    faults: int = 0
    """GPU faults the watchdogs reported."""
    weight_version: int | None = None
    """Lowest weight version the engines serve."""


class SandboxStatus(ManifestModel):
    """Sandbox pool summary; ``concurrency`` and ``selector`` back the /scale subresource."""

    concurrency: int = 0
    """Concurrency in effect (after quotas and provider limits)."""
    desired: int = 0
    """``spec.sandbox.concurrency`` as last observed."""
    limited_by: str | None = None
    """What caps the effective concurrency below the desired one, if anything."""
    ready: int = 0
    """Sandbox pods ready."""
    in_use: int = 0
    """Sandboxes running episodes."""
    selector: str = ""
    """Label selector of the job's sandbox pods, as a string (HPA needs it)."""
    last_scale_time: str | None = None
    """When the autoscaler last moved concurrency."""
    last_scale_reason: str | None = None
    """Why the autoscaler last moved concurrency."""
    pre_pull: str | None = None
    """Progress of the image pre-pull DaemonSets (``spec.sandbox.prePull``)."""


class TrainerStatus(ManifestModel):
    """Trainer Job summary."""

    step: int = 0
    """Last completed training step."""
    last_checkpoint_step: int = 0
    """Step of the last checkpoint."""
    restarts: int = 0
    """Trainer restarts (each resumes from the last checkpoint)."""
    active: int = 0
    """Trainer pods running."""
    stage: str | None = None
    """``WarmingUp`` while the warm start (``spec.trainer.warmStart``) trains, ``Training``
    once RL runs; None before the driver reports."""
    warm_start_progress: float | None = None
    """Share of the warm start's updates done (1.0 once it is over)."""
    warm_start_loss: float | None = None
    """Loss of the warm start's last update (mean negative logprob of its assistant tokens)."""


class EndReasonStatus(ManifestModel):
    """Episodes per way they ended."""

    submitted: int = 0
    """The agent called ``submit``."""
    turn_cap: int = 0
    """``rollout.maxTurns`` reached without a submit."""
    token_cap: int = 0
    """The trajectory token budget (``rollout.maxTrajectoryTokens``) ran out."""
    wall_clock: int = 0
    """The episode's wall clock ran out."""
    infra_error: int = 0
    """The sandbox, engine or verifier failed; left out of every tool-health rate."""


class ToolHealthStatus(ManifestModel):
    """How the agent uses its tools, over every training episode so far (infra errors left
    out); a rate is unset until it has a denominator."""

    episodes: int = 0
    """Episodes counted (infra errors left out)."""
    replies: int = 0
    """The model's replies (turns) in those episodes."""
    calls_per_episode: float | None = None
    """Tool calls read from the replies (``submit`` included) per episode."""
    parse_failure_rate: float | None = None
    """Share of replies whose tool calls could not be read (malformed, unknown tool, bad
    arguments): ``spec.model.toolCallParser`` does not read what the model writes."""
    no_tool_call_rate: float | None = None
    """Share of replies that called no tool at all; near 1: the agent answers in prose and
    never acts."""
    submit_rate: float | None = None
    """Share of episodes that ended with the agent calling ``submit``."""
    prefix_break_rate: float | None = None
    """Share of the episodes checked against the chat template (native tool calls) whose
    tokens stopped being its rendering of the conversation (nothing after the break is
    trained on)."""
    end_reasons: EndReasonStatus = Field(default_factory=EndReasonStatus)
    """Episodes per end reason, infra errors included."""


class RolloutStatus(ManifestModel):
    """Rollout figures reported by the driver."""

    trajectories_per_hour: float = 0.0
    """Completed trajectories per hour."""
    mean_reward: float | None = None
    """Mean reward of the last step."""
    pass_at_1: float | None = None
    """Held-out pass@1 at the last evaluation (``spec.trainer.evaluation``): the mean over
    tasks of successes / attempts that did not end in an infra error."""
    eval_step: int | None = None
    """The step after which the last evaluation started (0: the start of training)."""
    eval_episodes: int | None = None
    """Attempts the last evaluation counted."""
    eval_infra_errors: int | None = None
    """Attempts of the last evaluation that ended in an infra error (left out of pass@1)."""
    pass_at_1_base: float | None = None
    """Held-out pass@1 of the model as given, measured before the warm start
    (``spec.trainer.warmStart``): with ``passAt1WarmStart`` and ``passAt1``, the report's
    base → after SFT → after RL."""
    pass_at_1_warm_start: float | None = None
    """Held-out pass@1 after the warm start, before the first RL step."""
    infra_error_rate: float = 0.0
    """Share of episodes that ended in infra_error (retried, never trained on)."""
    truncated_rate: float = 0.0
    """Share of episodes truncated by a cap."""
    tools: ToolHealthStatus | None = None
    """Tool health: calls per episode, parse failures, replies without a call, submits,
    prefix breaks and episodes per end reason; unset until the trainer reports it."""


class AgentRLJobStatus(ManifestModel):
    """``status``: conditions plus a summary per component."""

    observed_generation: int | None = None
    """The .metadata.generation the operator last acted on."""
    conditions: list[Condition] = Field(default_factory=list)
    """Ready, EnginesReady, SandboxPoolReady, TrainerReady, WeightsSynced, Suspended, Complete,
    Failed, Degraded, GPUsAvailable, CheckpointSaved, WireCompatible."""
    ready_reason: str | None = None
    """The Ready condition's reason, as a printer column."""
    degraded_reason: str | None = None
    """The Degraded condition's reason while it is True (``CheckpointSaveFailing``,
    ``WatchdogCrashLoop``, ``WeightPushFailing``), as a printer column; unset otherwise."""
    start_time: str | None = None
    """When the job first started running (RFC 3339)."""
    completion_time: str | None = None
    """When the job became Complete or Failed (RFC 3339)."""
    engines: EngineStatus = Field(default_factory=EngineStatus)
    """Engine summary."""
    sandbox: SandboxStatus = Field(default_factory=SandboxStatus)
    """Sandbox pool summary."""
    trainer: TrainerStatus = Field(default_factory=TrainerStatus)
    """Trainer summary."""
    rollout: RolloutStatus = Field(default_factory=RolloutStatus)
    """Rollout figures."""
