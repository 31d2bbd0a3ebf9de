"""Keys, names and fixed numbers only the operator uses: label keys, annotations it writes for
itself, the server-side-apply field manager, and the condition reasons that
``agentrl.api.conditions`` does not (yet) hold.

Read by every builder in ``agentrl.reconcile`` and by the controller (which applies under
:data:`FIELD_MANAGER`). What the operator hands to its workloads and reads back from them
(ConfigMap keys, annotation keys and payloads, ports, mount paths, Ray resources) is the wire
contract, :mod:`agentrl.api.wire`.

There is no finalizer: every child, sandbox pods included, carries an ownerReference to the
job, so Kubernetes' garbage collector deletes them with the job whether or not the operator is
running, and a job can never hang in Terminating because the operator is down.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

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
