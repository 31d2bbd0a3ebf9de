"""What the trainer reads before it starts: the environment the operator sets and the mounted
configuration.

:class:`TrainerEnv` is the trainer container's environment (``NODE_RANK``, ``NNODES``,
``GPUS_PER_NODE``, ``MASTER_ADDR/PORT``...), :class:`TrainerConfig` the resolved manifest and
``runtime.yaml`` beside it (:func:`load_config`). Both cross process boundaries (Ray actors,
rank processes) as JSON; everything that builds a part of the run from them sits above this
module (:mod:`agentrl.trainer.factories`, :mod:`agentrl.trainer.assembly`,
:mod:`agentrl.trainer.pod`).

What the operator hands over (paths, ports, ``runtime.yaml``'s model) comes from
:mod:`agentrl.api.wire`, as on every other side of that contract.

Callers: :mod:`agentrl.trainer.cli`, :mod:`agentrl.trainer.factories`,
:mod:`agentrl.trainer.pod`, :mod:`agentrl.trainer.ranks` (inside the rank actor), tests.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

from agentrl.api import AgentRLJob
from agentrl.api.wire import (
    CHECKPOINT_MOUNT_PATH,
    CONFIG_RUNTIME_KEY,
    SPEC_FILE,
    RuntimeConfig,
    receive_runtime,
)

logger = logging.getLogger(__name__)

#: The broadcast group of ``weightSync.mode: distributed`` listens on ``MASTER_PORT`` + this
#: (``MASTER_PORT`` itself is the trainer ranks' own rendezvous).
WEIGHT_GROUP_PORT_OFFSET = 1
#: Checkpoints go here under the checkpoint volume; exported weights and
#: ``current-weights.json`` sit at its root, where the watchdog looks.
CHECKPOINT_SUBDIR = "trainer"
#: Default of ``--placement-timeout``: the trainer pods pull the same large ROCm image and start
#: in the same window as the engines, whose ``startupTimeoutSeconds`` defaults to this too.
DEFAULT_PLACEMENT_TIMEOUT_S = 1800.0


class TrainerEnv(BaseModel):
    """The environment the operator gives the trainer container (``reconcile.trainer``)."""

    model_config = ConfigDict(frozen=True)

    config: Path = Path(SPEC_FILE)
    """``AGENTRL_CONFIG``: the resolved manifest."""
    pod_name: str | None = None
    namespace: str | None = None
    node_rank: int = Field(default=0, ge=0)
    nnodes: int = Field(default=1, ge=1)
    gpus_per_node: int = Field(default=0, ge=0)
    master_addr: str = "127.0.0.1"
    master_port: int = Field(default=29500, ge=1, le=65535)
    checkpoint_dir: Path = Path(CHECKPOINT_MOUNT_PATH)
    attempt: int = Field(default=0, ge=0)
    task_images_configmap: str | None = None
    """``AGENTRL_TASK_IMAGES_CONFIGMAP``: where the driver writes the dataset's task images for
    the operator's pre-pull (set only when pre-pull is on)."""
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    """``AGENTRL_METRICS_PORT``: where the driver serves ``/metrics`` (its own and the rollout
    workers' series); None serves none."""
    local_rank: int | None = None
    """Set by this command for the rank processes it starts."""

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> TrainerEnv:
        env = dict(os.environ if environ is None else environ)
        pairs = {
            "config": env.get("AGENTRL_CONFIG"),
            "pod_name": env.get("POD_NAME"),
            "namespace": env.get("POD_NAMESPACE"),
            "node_rank": env.get("NODE_RANK"),
            "nnodes": env.get("NNODES"),
            "gpus_per_node": env.get("GPUS_PER_NODE"),
            "master_addr": env.get("MASTER_ADDR"),
            "master_port": env.get("MASTER_PORT"),
            "checkpoint_dir": env.get("AGENTRL_CHECKPOINT_DIR"),
            "attempt": env.get("AGENTRL_TRAINER_ATTEMPT"),
            "metrics_port": env.get("AGENTRL_METRICS_PORT"),
            "task_images_configmap": env.get("AGENTRL_TASK_IMAGES_CONFIGMAP"),
            "local_rank": env.get("LOCAL_RANK"),
        }
        return cls.model_validate({k: v for k, v in pairs.items() if v not in (None, "")})

    @property
    def ranks_per_node(self) -> int:
        """One rank per GPU; one rank on a CPU-only pod (the torch backend)."""
        return max(self.gpus_per_node, 1)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.ranks_per_node

    @property
    def rank(self) -> int:
        return self.node_rank * self.ranks_per_node + (self.local_rank or 0)


class TrainerConfig(BaseModel):
    """Everything the trainer reads before it starts."""

    job: AgentRLJob
    runtime: RuntimeConfig
    env: TrainerEnv


def load_config(env: TrainerEnv) -> TrainerConfig:
    """The manifest at ``env.config`` and ``runtime.yaml`` beside it (the ConfigMap's two keys),
    the latter under the wire contract's skew policy: keys this trainer does not know (an
    operator one minor version apart) are logged and ignored.

    Raises:
        FileNotFoundError: either file is missing.
        agentrl.api.wire.WireSkewError: an operator more than one minor version apart wrote
            ``runtime.yaml`` (the message names both versions).
        pydantic.ValidationError: either is invalid.
    """
    from agentrl.api.validation import load_job

    job = load_job(env.config.read_text(encoding="utf-8"))
    received = receive_runtime(
        yaml.safe_load(runtime_file(env).read_text(encoding="utf-8")), reader="this trainer"
    )
    if received.unknown:
        logger.warning(
            "runtime.yaml (wire contract %s) has keys this trainer does not know, ignored: %s",
            received.version,
            ", ".join(received.unknown),
        )
    return TrainerConfig(job=job, runtime=received.value, env=env)


def runtime_file(env: TrainerEnv) -> Path:
    """``runtime.yaml``, the ConfigMap's second key, beside the manifest."""
    return env.config.parent / CONFIG_RUNTIME_KEY
