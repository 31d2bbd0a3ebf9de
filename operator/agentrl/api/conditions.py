"""Condition types and reasons of an AgentRLJob: one place for every string a user can see in
``kubectl get arj`` or ``kubectl describe``."""

from __future__ import annotations

from enum import StrEnum


class ConditionType(StrEnum):
    """The condition types the operator writes."""

    READY = "Ready"
    ENGINES_READY = "EnginesReady"
    SANDBOX_POOL_READY = "SandboxPoolReady"
    TRAINER_READY = "TrainerReady"
    WEIGHTS_SYNCED = "WeightsSynced"
    SUSPENDED = "Suspended"
    COMPLETE = "Complete"
    FAILED = "Failed"
    DEGRADED = "Degraded"
    GPUS_AVAILABLE = "GPUsAvailable"
    """Whether the nodes matching the job's GPU placement have the allocatable GPUs its engines
    and trainer pods need (``reconcile.preflight``)."""
    CHECKPOINT_SAVED = "CheckpointSaved"
    """Whether the trainer's last checkpoint save succeeded (False while saves fail, with the
    step and the error; ``reconcile.status.checkpoint_verdict``)."""
    WIRE_COMPATIBLE = "WireCompatible"
    """Whether the job's workloads and the operator speak wire contract versions (of
    ``runtime.yaml`` and the workloads' annotations) at most one minor version apart
    (``reconcile.wire_skew``)."""


class Reason(StrEnum):
    """CamelCase reasons, stable: alerts and scripts match on them."""

    # generic
    RECONCILING = "Reconciling"
    ALL_READY = "AllComponentsReady"
    COMPONENTS_NOT_READY = "ComponentsNotReady"
    INVALID_SPEC = "InvalidSpec"
    # engines
    ENGINES_AVAILABLE = "EnginesAvailable"
    ENGINES_PROGRESSING = "EnginesProgressing"
    UNSCHEDULABLE = "Unschedulable"
    IMAGE_PULL_ERROR = "ImagePullError"
    CRASH_LOOP = "CrashLoopBackOff"
    NO_ENGINES = "NoEngines"
    WATCHDOG_CRASH_LOOP = "WatchdogCrashLoop"
    WEIGHT_PUSH_FAILING = "WeightPushFailing"
    """Degraded=True and WeightsSynced=False: the trainer's weight pushes to an engine failed
    several times in a row (``reconcile.status.WEIGHT_PUSH_FAILURES_DEGRADED``)."""
    # checkpoints
    CHECKPOINT_SAVE_FAILING = "CheckpointSaveFailing"
    """Degraded=True and CheckpointSaved=False: the trainer's checkpoint saves fail (each after
    ``checkpoint.saveAttempts`` tries; ``reconcile.status.CHECKPOINT_SAVE_FAILURES_DEGRADED``)."""
    CHECKPOINT_WRITTEN = "CheckpointWritten"
    """CheckpointSaved=True: the trainer's last save succeeded."""
    NO_CHECKPOINT_YET = "NoCheckpointYet"
    """CheckpointSaved=Unknown: no checkpoint written since the start, and none failed."""
    # trainer
    TRAINER_RUNNING = "TrainerRunning"
    TRAINER_PENDING = "TrainerPending"
    TRAINER_RESTARTING = "TrainerRestarting"
    TRAINER_SUCCEEDED = "TrainerSucceeded"
    EVALUATED = "Evaluated"
    """An event reason, not a condition's: a held-out evaluation finished."""
    BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    # sandbox pool
    POOL_READY = "SandboxPoolReady"
    ROLLOUT_PROGRESSING = "RolloutProgressing"
    QUOTA_LIMITED = "QuotaLimited"
    # suspend
    SUSPENDING = "Suspending"
    """The trainer is writing its checkpoint; engines and rollout workers wait for it."""
    SUSPENDED = "JobSuspended"
    RESUMED = "JobResumed"
    NOT_SUSPENDED = "NotSuspended"
    # GPU capacity (preflight) and placement
    GPU_CAPACITY_SUFFICIENT = "GPUCapacitySufficient"
    GPU_CAPACITY_INSUFFICIENT = "GPUCapacityInsufficient"
    NODES_UNREADABLE = "NodesUnreadable"
    CAPACITY_NOT_CHECKED = "CapacityNotChecked"
    NO_GPUS_REQUESTED = "NoGPUsRequested"
    WAITING_FOR_TRAINER = "WaitingForTrainerPlacement"
    # wire contract versions (WireCompatible; VersionSkew also ends the job: Failed)
    VERSIONS_COMPATIBLE = "VersionsCompatible"
    """WireCompatible=True: every workload that reported speaks a version the operator reads."""
    VERSION_SKEW = "VersionSkew"
    """WireCompatible=False: a workload and the operator are more than one minor version of the
    wire contract apart; the message names both. Failed=True with this reason when the trainer
    refused the operator's ``runtime.yaml`` (a restart of the same image can only refuse it
    again)."""
    VERSIONS_NOT_REPORTED = "VersionsNotReported"
    """WireCompatible=Unknown: no workload has written anything yet."""
