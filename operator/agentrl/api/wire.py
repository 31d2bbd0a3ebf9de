"""The contract between the operator and its workloads, in one place: everything the operator
hands to the pods it creates and everything it reads back from them.

* **The ConfigMap** ``NAME-config`` (:func:`config_map_name`), mounted at
  :data:`SPEC_MOUNT_PATH` in every workload: ``job.yaml`` (the resolved manifest) and
  ``runtime.yaml`` (:class:`RuntimeConfig`: endpoints and the settings in effect, the sandbox
  concurrency among them, and the pod template of a sandbox, :class:`SandboxPods`), and the
  ``NAME-task-images`` ConfigMap the trainer writes (:data:`TASK_IMAGES_KEY`).
* **Annotations** the workloads write on their own pods and the operator lifts into the status:
  the engine watchdog's :class:`WatchdogReport` (:data:`ANNOTATION_WATCHDOG`) and the trainer
  driver's :class:`TrainerProgress` (:data:`ANNOTATION_PROGRESS`). One model each, used by the
  writer and the reader: the reader ignores unknown keys (a newer writer) and a malformed value.
* **Ports, paths, file names, environment variables and Ray resources** both sides must agree on.

**Versioned, with a skew policy** (:mod:`agentrl.api.wire_version`): ``runtime.yaml`` and each
annotation carry ``wireVersion`` (:data:`WIRE_VERSION`); a reader takes what a writer one minor
version older or newer wrote (unknown keys dropped and reported, missing ones defaulted) and
refuses a wider skew with :class:`WireSkewError`, naming both versions. Read them with
:func:`receive_runtime` and :func:`receive_annotation`, not with ``model_validate``. A change to
what :func:`contract_schema` returns needs a new :data:`WIRE_VERSION`.

The operator's builders (:mod:`agentrl.reconcile`) and the workloads (:mod:`agentrl.engine`,
:mod:`agentrl.rollout`, :mod:`agentrl.trainer`, ...) import these names from here; the workloads
never import :mod:`agentrl.reconcile` for them (import-linter contracts). The wire format is what
a running operator and running pods of another release exchange: rename a key here only with a
migration. Keys and label keys the operator alone uses stay in ``agentrl.reconcile.constants``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Final, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from agentrl.api import model
from agentrl.api.job import AgentRLJob
from agentrl.api.wire_version import UNVERSIONED as UNVERSIONED
from agentrl.api.wire_version import WIRE_HISTORY as WIRE_HISTORY
from agentrl.api.wire_version import WIRE_SKEW_PREFIX as WIRE_SKEW_PREFIX
from agentrl.api.wire_version import WIRE_VERSION as WIRE_VERSION
from agentrl.api.wire_version import WIRE_VERSION_KEY as WIRE_VERSION_KEY
from agentrl.api.wire_version import Received as Received
from agentrl.api.wire_version import Refusal as Refusal
from agentrl.api.wire_version import WireSkewError as WireSkewError
from agentrl.api.wire_version import receive, schema_of
from agentrl.api.wire_version import skew_line as skew_line

# ---- the engine pod: ports and paths shared by its builder, the launcher and the watchdog ----

#: Port SGLang listens on inside the engine pod (SGLang's own default).
ENGINE_PORT: Final = 30000
#: Port of the watchdog sidecar: ``/readyz`` (the engine pod's readiness probe), ``/healthz``,
#: ``/metrics`` and ``/state``.
WATCHDOG_PORT: Final = 9400
#: Readiness path of the watchdog; the engine container's readinessProbe points here.
WATCHDOG_READY_PATH: Final = "/readyz"
#: Liveness path of the watchdog process itself.
WATCHDOG_LIVE_PATH: Final = "/healthz"
#: Annotation the watchdog writes on its own pod: a JSON report whose ``state`` is
#: ``Starting``, ``Ready``, ``Recovering`` or ``Degraded``; the operator lifts ``Degraded`` into
#: the job's Degraded condition (reason ``WatchdogCrashLoop``).
ANNOTATION_WATCHDOG: Final = "agentrl.dev/watchdog"
#: Mount path of the emptyDir shared by the engine and the watchdog. It outlives container
#: restarts, so the lines an engine printed as it crashed are still there for the watchdog.
LOG_VOLUME_PATH: Final = "/var/log/agentrl"
#: The engine log inside :data:`LOG_VOLUME_PATH`, written by ``agentrl engine launch``.
ENGINE_LOG_FILE: Final = f"{LOG_VOLUME_PATH}/engine.log"
#: SGLang's ``--crash-dump-folder`` (the last minutes of requests before a crash), kept on the
#: log volume so it survives the restart.
CRASH_DUMP_PATH: Final = f"{LOG_VOLUME_PATH}/crash"
#: Where the operator mounts the job's ConfigMap; the launcher reads the resolved spec here.
SPEC_MOUNT_PATH: Final = "/etc/agentrl"
#: The resolved spec file in that ConfigMap.
SPEC_FILE: Final = f"{SPEC_MOUNT_PATH}/job.yaml"
#: Environment variable the operator sets to :data:`SPEC_FILE` in every workload.
SPEC_ENV: Final = "AGENTRL_CONFIG"
#: Where a ``spec.model.source.pvc`` is mounted (read-only); the model's CEL rule uses it too.
MODEL_MOUNT_PATH: Final = model.MODEL_MOUNT_PATH
#: Where the ConfigMap of ``spec.model.chatTemplate.configMapKeyRef`` is mounted (read-only,
#: only its key, as a file named by the key) in the pods that render episodes: the rollout
#: workers and the trainer (which runs episodes itself when there are no workers). The rollout
#: reads the template there (``config_map_dir`` of ``rollout.runtime.turn_tokenizer_for``). Not
#: under :data:`SPEC_MOUNT_PATH`: its mount point would have to be made inside that read-only
#: ConfigMap volume.
CHAT_TEMPLATE_MOUNT_PATH: Final = "/etc/agentrl-chat-template"
#: Where the checkpoint volume is mounted in engine pods (``/update_weights_from_disk`` reads
#: the trainer's exported weights from it).
CHECKPOINT_MOUNT_PATH: Final = "/checkpoints"
#: The trainer's record of the weights engines should serve (see
#: ``agentrl.engine.weight_pointer``); the watchdog re-pushes them after a restart.
CURRENT_WEIGHTS_FILE: Final = f"{CHECKPOINT_MOUNT_PATH}/current-weights.json"
#: ``PROMETHEUS_MULTIPROC_DIR``: SGLang's ``/metrics`` needs a writable directory.
PROMETHEUS_DIR: Final = "/tmp/prometheus"

#: The weight version engines start with; the trainer's first push is version 1.
INITIAL_WEIGHT_VERSION: Final = "0"

#: The module the engine container runs.
SGLANG_MODULE: Final = "sglang.launch_server"

#: The SGLang release this flag schema, the engine client and the tiny engine are checked
#: against (``tests/contracts/test_sglang_*.py`` run SGLang's own parser, routes, request
#: structures and metrics of this release). It is the release of the engine image's base,
#: ``SGLANG_BASE`` in ``images/sglang-engine/Dockerfile``; a test holds the two equal. To bump
#: it, see ``docs/engine.md`` ("Bumping the SGLang release").
SGLANG_VERSION: Final = "0.5.15.post1"

#: The container command of a ``server: tiny`` engine (a verb of the agentrl CLI in the engine
#: image); the watchdog finds that process by :data:`TINY_CMDLINE`.
TINY_COMMAND: Final = ("agentrl", "engine", "serve-tiny")
TINY_CMDLINE: Final = TINY_COMMAND[-1]


def model_path(job: AgentRLJob) -> str:
    """The model directory as the engine pod sees it (inside the PVC mount when one is set)."""
    source = job.spec.model.source
    if source.pvc is None:
        return source.path
    return f"{MODEL_MOUNT_PATH}/{source.path.lstrip('/')}".rstrip("/")


# ---- the trainer and the rollout tier ----------------------------------------------------

#: torch.distributed / Megatron rendezvous port on trainer rank 0 (``MASTER_PORT``).
TRAINER_MASTER_PORT: Final = 29500
#: Ray head port on trainer rank 0; rollout workers join it.
RAY_HEAD_PORT: Final = 6379
#: Ray custom resource only the rollout worker pods offer (one unit per CPU they offer); each
#: rollout worker's bundle takes one, so no worker lands on a trainer node, which has neither
#: the rollout ServiceAccount's sandbox rights nor CPU reserved for episodes.
ROLLOUT_NODE_RESOURCE: Final = "agentrl_rollout_node"
#: Port (named ``metrics``) of the trainer container where the driver (rank 0) serves
#: ``/metrics``: its own and its rollout workers' series (``agentrl.rollout.metrics_export``).
#: Handed to the container as ``AGENTRL_METRICS_PORT``; next to the engine watchdog's 9400.
TRAINER_METRICS_PORT: Final = 9401
#: The environment variable the ``e2b`` sandbox provider reads its API key from, filled from
#: ``spec.sandbox.e2b.apiKeySecretRef`` in the pods that run episodes (``pods.sandbox_env``).
E2B_API_KEY_ENV: Final = "E2B_API_KEY"

# ---- ConfigMap keys -----------------------------------------------------------------------


def config_map_name(job: str) -> str:
    """``NAME-config``: the ConfigMap holding ``job.yaml`` and ``runtime.yaml`` (a worker
    outside the cluster, or ``agentrl tasks validate``, reads it through the API)."""
    return f"{job}-config"


#: The resolved manifest (defaults filled in, uid included) the workloads read.
CONFIG_JOB_KEY: Final = "job.yaml"
#: Endpoints and in-effect settings (:class:`RuntimeConfig`).
CONFIG_RUNTIME_KEY: Final = "runtime.yaml"
#: The mounted ``runtime.yaml``: what the rollout tier follows (the kubelet refreshes it).
RUNTIME_FILE: Final = f"{SPEC_MOUNT_PATH}/{CONFIG_RUNTIME_KEY}"
#: Data key of the ``NAME-task-images`` ConfigMap: the dataset's task images, one per line, in
#: the order the trainer draws their tasks. The trainer's driver writes it after loading the
#: dataset (a volume the operator cannot read); the operator pre-pulls what it lists.
TASK_IMAGES_KEY: Final = "images"

# ---- annotations the workloads write -------------------------------------------------------

#: JSON the trainer's driver (rank 0) writes on its own pod (:class:`TrainerProgress`):
#: step, checkpoint step, weight version and rollout figures, lifted into ``status``.
ANNOTATION_PROGRESS: Final = "agentrl.dev/progress"


# ---- reading what the other side wrote ----------------------------------------------------

_DocumentT = TypeVar("_DocumentT", bound=BaseModel)


def receive_runtime(doc: Any, *, reader: str) -> Received[RuntimeConfig]:
    """``runtime.yaml`` (parsed YAML) under the skew policy; ``reader`` names this side in a
    refusal (``"this trainer"``).

    Raises:
        WireSkewError: an operator more than one minor version apart wrote it.
        pydantic.ValidationError: it is not a runtime config.
    """
    return receive(RuntimeConfig, doc, what=CONFIG_RUNTIME_KEY, reader=reader)


def receive_annotation(
    raw: str, model: type[_DocumentT], *, key: str, reader: str = "the operator"
) -> Received[_DocumentT]:
    """An annotation's JSON value as ``model`` under the skew policy (``key``: the annotation,
    named in a refusal).

    Raises:
        WireSkewError: a workload more than one minor version apart wrote it.
        ValueError: it is not JSON, or not a ``model``.
    """
    return receive(model, json.loads(raw), what=key, reader=reader)


def contract_schema() -> dict[str, Any]:
    """What a contract version pins (``tests/api/wire_schemas/VERSION.json``): the schema of
    every document that crosses, by the ConfigMap key or annotation it travels under."""
    return schema_of(
        {
            CONFIG_RUNTIME_KEY: RuntimeConfig,
            ANNOTATION_WATCHDOG: WatchdogReport,
            ANNOTATION_PROGRESS: TrainerProgress,
        }
    )


# ---- runtime.yaml ----------------------------------------------------------------------------


class _Config(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class EngineEndpoints(_Config):
    """Where the engines answer."""

    service: str
    """The headless Service governing the StatefulSet."""
    port: int
    """SGLang's port."""
    urls: list[str]
    """One base URL per engine pod (stable DNS names), in ordinal order."""


class TrainerEndpoints(_Config):
    """Trainer rendezvous."""

    master_addr: str
    """Rank 0's stable DNS name (``MASTER_ADDR``)."""
    master_port: int
    """torch.distributed rendezvous port (``MASTER_PORT``)."""
    ray_head_address: str
    """``host:port`` of the Ray head on rank 0; rollout workers join it."""
    nodes: int
    """Trainer pods."""


class SandboxPods(_Config):
    """The pod of one sandbox (provider ``kubernetes``), rendered by the operator from
    ``spec.sandbox`` (``reconcile.sandbox.sandbox_pods``: hardened, owned by the job, resources
    and placement from the spec). A rollout worker changes nothing in it but the name
    (:attr:`name_prefix` plus random characters), the task's image and its own labels
    (:meth:`pod`), so ``agentrl render`` shows the pods the workers will create, and an operator
    upgrade changes them without a new worker image."""

    name_prefix: str
    """Sandbox pods are named this plus random characters."""
    selector: dict[str, str]
    """Labels every sandbox pod of the job carries (the NetworkPolicy's selector); a worker
    reaps only pods that match it as well as its own worker label."""
    template: dict[str, Any]
    """The pod manifest without ``metadata.name``; one container, the sandbox."""

    @model_validator(mode="after")
    def _selector_in_template(self) -> SandboxPods:
        labels = self.template.get("metadata", {}).get("labels", {})
        missing = {k: v for k, v in self.selector.items() if labels.get(k) != v}
        if missing:
            raise ValueError(f"the pod template's labels lack the selector's {missing}")
        if len(self.template.get("spec", {}).get("containers", [])) != 1:
            raise ValueError("the pod template must have exactly one container")
        return self

    def pod(
        self, name: str, image: str | None = None, labels: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """A copy of the template named ``name``, with ``image`` in its container when given
        (else ``spec.sandbox.image``) and ``labels`` added."""
        manifest = copy.deepcopy(self.template)
        metadata = manifest.setdefault("metadata", {})
        metadata["name"] = name
        metadata.setdefault("labels", {}).update(labels or {})
        if image:
            manifest["spec"]["containers"][0]["image"] = image
        return manifest


class SandboxRuntime(_Config):
    """The sandbox pool as the rollout tier must run it."""

    provider: str
    """``kubernetes``, ``e2b`` or ``local``."""
    concurrency: int = Field(ge=0)
    """Sandboxes (episodes) in flight at once, in effect now."""
    desired: int
    """``spec.sandbox.concurrency``."""
    limited_by: str | None
    """What holds ``concurrency`` below ``desired``."""
    network_policy: str
    """The NetworkPolicy that confines sandbox pods."""
    pods: SandboxPods | None = None
    """How a sandbox pod is made; set exactly when ``provider`` is ``kubernetes``."""

    @model_validator(mode="after")
    def _pods_for_kubernetes(self) -> SandboxRuntime:
        if (self.provider == "kubernetes") != (self.pods is not None):
            raise ValueError("sandbox.pods is set exactly when sandbox.provider is kubernetes")
        return self


class RolloutRuntime(_Config):
    """The rollout workers."""

    workers: int = Field(ge=0)
    """Rollout worker pods in effect: each runs its share of ``sandbox.concurrency``
    (``rollout.concurrency_source.split_concurrency``)."""


class RuntimeConfig(_Config):
    """``runtime.yaml``: endpoints and in-effect settings. Workloads read it with
    :func:`receive_runtime`."""

    wire_version: str = WIRE_VERSION
    """The contract version of whoever wrote it (:data:`UNVERSIONED` when it says none)."""
    job: str
    namespace: str
    uid: str
    suspended: bool
    engines: EngineEndpoints
    trainer: TrainerEndpoints
    sandbox: SandboxRuntime
    rollout: RolloutRuntime
    checkpoint_dir: str
    """Where the checkpoint volume is mounted."""


# ---- annotation payloads ---------------------------------------------------------------------


class _Annotation(BaseModel):
    """JSON a workload writes on its pod: camelCase; the reader ignores unknown keys (a newer
    writer) and fills what an older writer left out with the defaults."""

    model_config = ConfigDict(
        frozen=True, extra="ignore", alias_generator=to_camel, populate_by_name=True
    )

    def to_annotation(self) -> str:
        """The annotation value."""
        return self.model_dump_json(by_alias=True, exclude_none=True)


class _Report(_Annotation):
    """A whole annotation (not a part of one): it says the contract version it was written in.
    The operator reads it with :func:`receive_annotation`."""

    wire_version: str = WIRE_VERSION
    """The writer's contract version (:data:`UNVERSIONED` when it says none)."""


class WatchdogState(StrEnum):
    """The watchdog's state; ``Degraded`` wins over the others while the guard is tripped."""

    STARTING = "Starting"
    """The engine is loading; readiness is down until it is healthy and has current weights."""
    READY = "Ready"
    """The engine is healthy and serves the current weights."""
    RECOVERING = "Recovering"
    """A fault was seen: the engine is being restarted; readiness is down."""
    DEGRADED = "Degraded"
    """More than ``maxRestarts`` restarts within the window: the crash-loop guard tripped.
    Recovery goes on, with graphs on; the operator sets the job's Degraded condition."""


class LastFault(_Annotation):
    """The latest fault a watchdog acted on."""

    signature: str = ""
    """Fault signature name (``GPU_MEMORY_ACCESS_FAULT``, ``HEALTH_PROBE_FAILED``, ...)."""
    line: str = ""
    """The log line that matched, or what the watchdog observed."""
    time: str | None = None
    """When it was seen (RFC 3339)."""


class WatchdogReport(_Report):
    """:data:`ANNOTATION_WATCHDOG` on an engine pod: written by the watchdog
    (:mod:`agentrl.engine.watchdog_report`), lifted by the operator into ``status.engines`` and
    the Degraded condition (:mod:`agentrl.reconcile.observed`)."""

    state: str = "Unknown"
    """A :class:`WatchdogState` (``Starting``, ``Ready``, ``Recovering``, ``Degraded``);
    ``Unknown`` when not said."""
    ready: bool = False
    """Whether the watchdog reports the engine ready."""
    restarts: int = Field(default=0, ge=0)
    """Engine restarts observed since the watchdog started."""
    restarts_in_window: int = Field(default=0, ge=0)
    """Restarts within the crash-loop window."""
    max_restarts: int | None = Field(default=None, ge=0)
    """The guard's limit (``spec.inference.watchdog.maxRestarts``)."""
    window_seconds: int | None = Field(default=None, ge=0)
    """The guard's window (``spec.inference.watchdog.restartWindowSeconds``)."""
    faults: int = Field(default=0, ge=0)
    """Faults acted on since the watchdog started."""
    last_fault: LastFault | None = None
    """The latest fault."""
    last_recovery_seconds: float | None = None
    """How long the latest recovery took, fault to ready (seconds)."""
    weight_version: str | None = None
    """Weight version the engine serves, read from its ``/model_info`` (whoever pushed it)."""
    updated_at: str | None = None
    """When this report was written (RFC 3339)."""

    @property
    def crash_loop(self) -> bool:
        """The crash-loop guard tripped."""
        return self.state == WatchdogState.DEGRADED


class TrainerStage(StrEnum):
    """What the trainer is doing (``status.trainer.stage``)."""

    WARMING_UP = "WarmingUp"
    """The warm start (``spec.trainer.warmStart``): supervised fine-tuning before RL."""
    TRAINING = "Training"
    """RL steps."""


#: Longest error text a :class:`WeightPushFailure` carries (the status message quotes it).
WEIGHT_PUSH_ERROR_CHARS: Final = 512


class WeightPushFailure(_Annotation):
    """An engine whose latest weight pushes failed, as the trainer reports it."""

    engine: str
    """The engine's URL, as the trainer reaches it (its pod's stable DNS name)."""
    failures: int = Field(ge=1)
    """Pushes in a row that failed (each after ``weightSync.pushAttempts`` tries); a push that
    succeeds removes the engine from the report."""
    error: str = ""
    """The last try's error, at most :data:`WEIGHT_PUSH_ERROR_CHARS` characters."""
    version: str | None = None
    """The weight version the last failed push carried."""


#: Longest error text a :class:`CheckpointSaveFailure` carries (the status message quotes it).
CHECKPOINT_SAVE_ERROR_CHARS: Final = 512


class CheckpointSaveFailure(_Annotation):
    """The trainer's checkpoint saves that failed in a row, as it reports them
    (:mod:`agentrl.trainer.checkpoint_saves`)."""

    failures: int = Field(ge=1)
    """Saves in a row that failed (each after ``checkpoint.saveAttempts`` tries); a save that
    succeeds removes the report."""
    step: int = Field(ge=0)
    """The step whose save failed last."""
    error: str = ""
    """The last try's error (exception type and message), at most
    :data:`CHECKPOINT_SAVE_ERROR_CHARS` characters."""


class EndReasonCounts(_Annotation):
    """Episodes per way they ended; one field per value of
    :class:`agentrl.rollout.trajectory.EndReason` (same names)."""

    submitted: int = Field(default=0, ge=0)
    """The agent called ``submit``."""
    turn_cap: int = Field(default=0, ge=0)
    """``rollout.maxTurns`` reached without a submit."""
    token_cap: int = Field(default=0, ge=0)
    """The trajectory token budget ran out."""
    wall_clock: int = Field(default=0, ge=0)
    """The episode's wall clock ran out."""
    infra_error: int = Field(default=0, ge=0)
    """The sandbox, engine or verifier failed: not the agent's doing, so left out of every
    rate of :class:`ToolHealth`."""


class ToolHealth(_Annotation):
    """How the agent used its tools, over the training episodes the driver received
    (:mod:`agentrl.rollout.tool_health`); a rate is None while its denominator is 0."""

    episodes: int = Field(default=0, ge=0)
    """Episodes counted: every one received but infra errors."""
    replies: int = Field(default=0, ge=0)
    """The model's replies (turns) in those episodes."""
    calls_per_episode: float | None = Field(default=None, ge=0.0)
    """Tool calls read from the replies (``submit`` included) / ``episodes``."""
    parse_failure_rate: float | None = Field(default=None, ge=0.0)
    """Replies whose calls could not be read / ``replies``."""
    no_tool_call_rate: float | None = Field(default=None, ge=0.0)
    """Replies that called no tool at all / ``replies``."""
    submit_rate: float | None = Field(default=None, ge=0.0)
    """Episodes that ended in ``submit`` / ``episodes``."""
    prefix_break_rate: float | None = Field(default=None, ge=0.0)
    """Episodes whose tokens stopped being the template's rendering of the
    conversation / episodes whose prefix was checked (native tool calls; text actions have
    no template to check against)."""
    end_reasons: EndReasonCounts = Field(default_factory=EndReasonCounts)
    """Episodes per end reason, infra errors included."""


class TrainerProgress(_Report):
    """``agentrl.dev/progress`` on the trainer's rank-0 pod, written by the driver."""

    step: int = Field(default=0, ge=0)
    """Last completed step."""
    last_checkpoint_step: int = Field(default=0, ge=0)
    """Step of the last checkpoint."""
    weight_version: str | None = None
    """Weight version last pushed to the engines."""
    trajectories_per_hour: float = 0.0
    """Completed trajectories per hour."""
    mean_reward: float | None = None
    """Mean reward of the last step."""
    pass_at_1: float | None = None
    """Held-out pass@1 at the last evaluation."""
    eval_step: int | None = Field(default=None, ge=0)
    """The step after which the last evaluation started (0: the start); None: none yet."""
    eval_episodes: int | None = Field(default=None, ge=0)
    """Attempts the last evaluation counted (infra errors left out)."""
    eval_infra_errors: int | None = Field(default=None, ge=0)
    """Attempts of the last evaluation that ended in an infra error (left out of pass@1)."""
    pass_at_1_base: float | None = None
    """Held-out pass@1 of the model as given, before the warm start (``trainer.warmStart``)."""
    pass_at_1_warm_start: float | None = None
    """Held-out pass@1 after the warm start, before the first RL step."""
    stage: TrainerStage | None = None
    """``WarmingUp`` while the warm start trains, ``Training`` once RL runs."""
    warm_start_progress: float | None = Field(default=None, ge=0.0, le=1.0)
    """Share of the warm start's updates done."""
    warm_start_loss: float | None = None
    """Loss of the warm start's last update (mean negative logprob of its assistant tokens)."""
    infra_error_rate: float = 0.0
    """Share of episodes ended by infra errors."""
    truncated_rate: float = 0.0
    """Share of episodes truncated by a cap."""
    tools: ToolHealth | None = None
    """Tool health over every episode counted so far (each once, when its group is trained on
    or dropped: the same window as the two rates above); None (left out) before the first, and
    by trainers older than the field."""
    weight_push_failures: list[WeightPushFailure] | None = None
    """Engines whose latest weight pushes failed, with the count in a row and the last error;
    None (left out) when every engine took the last push."""
    checkpoint_save_failure: CheckpointSaveFailure | None = None
    """The checkpoint saves failing now: the count in a row, the step and the last error; None
    (left out) when the last save succeeded, and by trainers older than the field (the reader
    then knows nothing of failed saves, as before)."""
