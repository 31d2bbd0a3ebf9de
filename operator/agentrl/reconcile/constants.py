"""Keys, names and fixed numbers of the operator, in one place: label and annotation keys, the
server-side-apply field manager, ports the children talk on, and the condition reasons that
``agentrl.api.conditions`` does not (yet) hold.

Read by every builder in ``agentrl.reconcile`` and by the controller (which applies under
:data:`FIELD_MANAGER`). Ports and paths of the engine pod live in
``agentrl.reconcile.engine_flags`` (shared with ``agentrl engine launch``) and are re-used here,
not repeated.

There is no finalizer: every child, sandbox pods included, carries an ownerReference to the
job, so Kubernetes' garbage collector deletes them with the job whether or not the operator is
running, and a job can never hang in Terminating because the operator is down.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from agentrl.reconcile.engine_flags import WATCHDOG_ANNOTATION

#: Server-side apply field manager for everything the operator writes.
FIELD_MANAGER: Final = "agentrl-operator"

#: ``app.kubernetes.io/name`` and ``part-of`` of every child.
APP_NAME: Final = "agentrl"

# ---- label keys ------------------------------------------------------------------------------

LABEL_NAME: Final = "app.kubernetes.io/name"
LABEL_INSTANCE: Final = "app.kubernetes.io/instance"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_PART_OF: Final = "app.kubernetes.io/part-of"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
#: The job a child belongs to; with the component label it forms every selector.
LABEL_JOB: Final = "agentrl.dev/job"

# ---- annotation keys -------------------------------------------------------------------------

#: JSON the engine watchdog sidecar writes on its own pod (see ``observed.WatchdogReport``);
#: the operator lifts it into ``status.engines`` and the Degraded condition. Defined with the
#: engine's flag schema, which the watchdog shares.
ANNOTATION_WATCHDOG: Final = WATCHDOG_ANNOTATION
#: JSON the trainer's driver (rank 0) writes on its own pod (see ``observed.TrainerProgress``):
#: step, checkpoint step, weight version and rollout figures, lifted into ``status``.
ANNOTATION_PROGRESS: Final = "agentrl.dev/progress"
#: Data key of the ``NAME-task-images`` ConfigMap: the dataset's task images, one per line, in
#: the order the trainer draws their tasks. The trainer's driver writes it after loading the
#: dataset (a volume the operator cannot read); the operator pre-pulls what it lists.
TASK_IMAGES_KEY: Final = "images"
#: On the trainer Job: which attempt it is (0 first, then one more per restart). Lets a
#: restarted operator tell the current attempt from a failed one it has already counted.
ANNOTATION_TRAINER_ATTEMPT: Final = "agentrl.dev/trainer-attempt"
#: The Indexed Job's completion index of a trainer pod (set by Kubernetes).
ANNOTATION_JOB_COMPLETION_INDEX: Final = "batch.kubernetes.io/job-completion-index"


class Component(StrEnum):
    """``app.kubernetes.io/component`` values: one per part of the job."""

    CONFIG = "config"
    ENGINE = "engine"
    TRAINER = "trainer"
    ROLLOUT = "rollout"
    SANDBOX = "sandbox"
    CHECKPOINTS = "checkpoints"
    PREPULL = "prepull"


# ---- trainer rendezvous ----------------------------------------------------------------------

#: torch.distributed / Megatron rendezvous port on trainer rank 0 (``MASTER_PORT``).
TRAINER_MASTER_PORT: Final = 29500
#: Ray head port on trainer rank 0; rollout workers join it.
RAY_HEAD_PORT: Final = 6379
#: Ray custom resource only the rollout worker pods offer (one unit per CPU they offer); each
#: rollout worker's bundle takes one, so no worker lands on a trainer node, which has neither
#: the rollout ServiceAccount's sandbox rights nor CPU reserved for episodes.
ROLLOUT_NODE_RESOURCE: Final = "agentrl_rollout_node"
#: The environment variable the ``e2b`` sandbox provider reads its API key from, filled from
#: ``spec.sandbox.e2b.apiKeySecretRef`` in the pods that run episodes (``pods.sandbox_env``).
E2B_API_KEY_ENV: Final = "E2B_API_KEY"
#: Port (named ``metrics``) of the trainer container where the driver (rank 0) serves
#: ``/metrics``: its own and its rollout workers' series (``agentrl.rollout.metrics_export``).
#: Handed to the container as ``AGENTRL_METRICS_PORT``; next to the engine watchdog's 9400.
TRAINER_METRICS_PORT: Final = 9401

# ---- ConfigMap keys --------------------------------------------------------------------------

#: The resolved manifest (defaults filled in, uid included) the workloads read.
CONFIG_JOB_KEY: Final = "job.yaml"
#: Endpoints and in-effect settings (``configmap.RuntimeConfig``).
CONFIG_RUNTIME_KEY: Final = "runtime.yaml"


class ExtraReason(StrEnum):
    """Condition reasons the operator needs beyond ``agentrl.api.conditions.Reason``.

    They belong in that enum (one place for user-visible strings); they sit here because the API
    package is owned elsewhere. Same rules: CamelCase, stable.
    """

    AS_EXPECTED = "AsExpected"
    """Degraded=False: nothing is impaired."""
    WEIGHTS_CURRENT = "WeightsCurrent"
    """WeightsSynced=True: every ready engine serves the trainer's latest weights."""
    WEIGHTS_BEHIND = "WeightsBehind"
    """WeightsSynced=False: some ready engine serves older weights."""
    WEIGHT_VERSION_UNKNOWN = "WeightVersionUnknown"
    """WeightsSynced=Unknown: the trainer has published no weights yet or no engine reports."""
    JOB_FINISHED = "JobFinished"
    """A component condition after the job is Complete or Failed (its workloads scaled down)."""
    TRAINER_FAILED = "TrainerFailed"
    """Failed=True for a trainer failure other than the backoff limit or the deadline."""
    NOT_FINISHED = "NotFinished"
    """Complete=False and Failed=False while the job runs."""
    CONTAINER_ERROR = "ContainerError"
    """A container cannot be created or started (CreateContainerConfigError, a missing
    ConfigMap or Secret, RunContainerError); the kubelet's message is lifted."""
