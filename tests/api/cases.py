"""The corpus of invalid manifests: one broken rule each, with the field that must be named.

Shared by the offline tests (``agentrl validate``) and the API-server tests, so both sides are
held to the same list. Each case is a patch deep-merged into :data:`BASE` (a valid job).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

BASE: dict[str, Any] = {
    "apiVersion": "agentrl.dev/v1alpha1",
    "kind": "AgentRLJob",
    "metadata": {"name": "corpus"},
    "spec": {
        "model": {"source": {"path": "/models/Qwen3-8B"}},
        "inference": {"engines": 2, "contextLength": 32768, "maxRunningRequests": 64},
        "rollout": {"groupSize": 4, "maxTrajectoryTokens": 32768, "maxTokensPerTurn": 4096},
        "sandbox": {"concurrency": 32},
        "trainer": {"nodes": 1, "gpusPerNode": 8, "trajectoriesPerStep": 32},
    },
}


def merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``patch`` deep-merged in (a patch value of None deletes the key)."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


@dataclass(frozen=True)
class Case:
    """One invalid manifest."""

    name: str
    patch: dict[str, Any]
    field: str
    """The manifest path both the API server and ``agentrl validate`` must name."""

    def manifest(self) -> dict[str, Any]:
        return merge(BASE, self.patch)


def spec(patch: dict[str, Any]) -> dict[str, Any]:
    return {"spec": patch}


INVALID: list[Case] = [
    # --- schema: bounds, enums, patterns, required, unknown fields
    Case("group size below 2", spec({"rollout": {"groupSize": 1}}), "spec.rollout.groupSize"),
    Case("zero max turns", spec({"rollout": {"maxTurns": 0}}), "spec.rollout.maxTurns"),
    Case(
        "temperature above 2", spec({"rollout": {"temperature": 2.5}}), "spec.rollout.temperature"
    ),
    Case(
        "negative concurrency", spec({"sandbox": {"concurrency": -1}}), "spec.sandbox.concurrency"
    ),
    Case(
        "unknown sandbox provider",
        spec({"sandbox": {"provider": "docker"}}),
        "spec.sandbox.provider",
    ),
    Case("unknown trainer backend", spec({"trainer": {"backend": "fsdp"}}), "spec.trainer.backend"),
    Case(
        "mem fraction of 1",
        spec({"inference": {"memFractionStatic": 1.0}}),
        "spec.inference.memFractionStatic",
    ),
    Case(
        "context length below 512",
        spec({"inference": {"contextLength": 100, "maxRunningRequests": 64}}),
        "spec.inference.contextLength",
    ),
    Case(
        "more than 8 GPUs per engine",
        spec({"inference": {"gpusPerEngine": 16}}),
        "spec.inference.gpusPerEngine",
    ),
    Case("zero engines", spec({"inference": {"engines": 0}}), "spec.inference.engines"),
    Case(
        "model without a source",
        spec({"model": {"source": None, "servedName": "x"}}),
        "spec.model.source",
    ),
    Case("empty model path", spec({"model": {"source": {"path": ""}}}), "spec.model.source.path"),
    Case(
        "unknown loss aggregation",
        spec({"trainer": {"algorithm": {"lossAggregation": "sum"}}}),
        "spec.trainer.algorithm.lossAggregation",
    ),
    Case(
        "unknown zero-variance policy",
        spec({"trainer": {"algorithm": {"zeroVarianceGroups": "ignore"}}}),
        "spec.trainer.algorithm.zeroVarianceGroups",
    ),
    Case(
        "unknown correction mode",
        spec({"trainer": {"algorithm": {"offPolicyCorrection": {"mode": "mis"}}}}),
        "spec.trainer.algorithm.offPolicyCorrection.mode",
    ),
    Case(
        "negative clip",
        spec({"trainer": {"algorithm": {"clipLow": -0.1}}}),
        "spec.trainer.algorithm.clipLow",
    ),
    Case(
        "zero learning rate",
        spec({"trainer": {"optimizer": {"lr": 0}}}),
        "spec.trainer.optimizer.lr",
    ),
    Case("bad cpu quantity", spec({"sandbox": {"cpu": "two"}}), "spec.sandbox.cpu"),
    Case(
        "bad weight sync mode",
        spec({"trainer": {"weightSync": {"mode": "nfs"}}}),
        "spec.trainer.weightSync.mode",
    ),
    Case(
        "negative staleness",
        spec({"trainer": {"async": {"maxStaleness": -1}}}),
        "spec.trainer.async.maxStaleness",
    ),
    Case("unknown dataset format", spec({"dataset": {"format": "csv"}}), "spec.dataset.format"),
    Case(
        "held-out fraction of 1",
        spec({"dataset": {"heldOutFraction": 1.0}}),
        "spec.dataset.heldOutFraction",
    ),
    Case("misspelled field", spec({"rollout": {"groupsize": 8}}), "spec.rollout.groupsize"),
    Case("zero active deadline", spec({"activeDeadlineSeconds": 0}), "spec.activeDeadlineSeconds"),
    Case("upper-case name", {"metadata": {"name": "Corpus"}}, "metadata.name"),
    # --- cross-field rules (CEL)
    Case(
        "evaluation without held-out tasks",
        spec({"dataset": {"heldOutFraction": 0.0}, "trainer": {"evaluation": {"tasks": 10}}}),
        "spec.trainer.evaluation.tasks",
    ),
    Case(
        "an evaluation set of its own while the dataset still holds tasks out of training",
        spec(
            {
                "dataset": {"format": "swebench", "path": "/data/train.jsonl"},
                "trainer": {"evaluation": {"dataset": {"format": "swebench", "path": "/d/e"}}},
            }
        ),
        "spec.dataset.heldOutFraction",
    ),
    Case(
        "an evaluation set in another format than the training set",
        spec(
            {
                "dataset": {"format": "swebench", "path": "/data/t.jsonl", "heldOutFraction": 0},
                "trainer": {"evaluation": {"dataset": {"format": "harbor", "path": "/data/h"}}},
            }
        ),
        "spec.trainer.evaluation.dataset.format",
    ),
    Case(
        "the toy tasks as an evaluation set (they are generated, not read)",
        spec(
            {
                "dataset": {"heldOutFraction": 0},
                "trainer": {"evaluation": {"dataset": {"format": "toy", "path": "/data/t"}}},
            }
        ),
        "spec.trainer.evaluation.dataset.format",
    ),
    Case(
        "evaluation with no attempts",
        spec({"trainer": {"evaluation": {"attemptsPerTask": 0}}}),
        "spec.trainer.evaluation.attemptsPerTask",
    ),
    Case(
        "trajectories per step not a multiple of the group size",
        spec({"rollout": {"groupSize": 6}, "trainer": {"trajectoriesPerStep": 32}}),
        "spec.trainer.trajectoriesPerStep",
    ),
    Case(
        "trajectory longer than the engine context",
        spec({"rollout": {"maxTrajectoryTokens": 65536}}),
        "spec.rollout.maxTrajectoryTokens",
    ),
    Case(
        "turn longer than the trajectory",
        spec({"rollout": {"maxTokensPerTurn": 40000}}),
        "spec.rollout.maxTokensPerTurn",
    ),
    Case(
        "llm timeout above the episode timeout",
        spec({"rollout": {"llmTimeoutSeconds": 900, "episodeTimeoutSeconds": 600}}),
        "spec.rollout.llmTimeoutSeconds",
    ),
    Case(
        "autoscale min above max",
        spec({"sandbox": {"autoscale": {"enabled": True, "min": 64, "max": 16}}}),
        "spec.sandbox.autoscale.min",
    ),
    Case(
        "concurrency outside the autoscale bounds",
        spec(
            {"sandbox": {"concurrency": 500, "autoscale": {"enabled": True, "min": 16, "max": 128}}}
        ),
        "spec.sandbox.concurrency",
    ),
    Case(
        "e2b provider without e2b settings",
        spec({"sandbox": {"provider": "e2b"}}),
        "spec.sandbox.e2b",
    ),
    Case(
        "graph-disabling extra arg",
        spec({"inference": {"extraArgs": ["--disable-cuda-graph"]}}),
        "spec.inference.extraArgs",
    ),
    Case(
        "graph batch above max running requests",
        spec({"inference": {"graphs": {"maxBatchSize": 128}}}),
        "spec.inference.graphs.maxBatchSize",
    ),
    Case(
        "megatron with zero GPUs", spec({"trainer": {"gpusPerNode": 0}}), "spec.trainer.gpusPerNode"
    ),
    Case(
        "parallel sizes that do not divide the GPUs",
        spec({"trainer": {"gpusPerNode": 8, "parallelism": {"tensor": 3}}}),
        "spec.trainer.parallelism",
    ),
    Case(
        "zero mini-batches",
        spec({"trainer": {"algorithm": {"miniBatches": 0}}}),
        "spec.trainer.algorithm.miniBatches",
    ),
    Case(
        "zero epochs",
        spec({"trainer": {"algorithm": {"epochs": 0}}}),
        "spec.trainer.algorithm.epochs",
    ),
    Case(
        # 5 mini-batches × 8 data-parallel ranks (8 GPUs, no model parallelism) > 32 trajectories
        "more mini-batches than the step can give every data-parallel rank",
        spec({"trainer": {"algorithm": {"miniBatches": 5}}}),
        "spec.trainer.algorithm.miniBatches",
    ),
    Case(
        "importance bounds inverted",
        spec({"trainer": {"algorithm": {"offPolicyCorrection": {"low": 1.0, "high": 1.0}}}}),
        "spec.trainer.algorithm.offPolicyCorrection.low",
    ),
    Case(
        "dataset path missing for swebench",
        spec({"dataset": {"format": "swebench"}}),
        "spec.dataset.path",
    ),
    Case(
        "local sandboxes with the megatron trainer",
        spec({"sandbox": {"provider": "local"}}),
        "spec.sandbox.provider",
    ),
    Case("name too long for child names", {"metadata": {"name": "a" * 41}}, "metadata.name"),
    # --- layouts and flags the runtime would refuse or crash on (refused at apply time)
    Case(
        "context parallelism with the megatron backend",
        spec({"trainer": {"parallelism": {"context": 2}}}),
        "spec.trainer.parallelism.context",
    ),
    Case(
        "parallelism with the torch backend",
        spec({"trainer": {"backend": "torch", "gpusPerNode": 0, "parallelism": {"tensor": 2}}}),
        "spec.trainer.parallelism",
    ),
    Case(
        "the torch backend on two trainer pods",
        spec({"trainer": {"backend": "torch", "gpusPerNode": 0, "nodes": 2}}),
        "spec.trainer.nodes",
    ),
    Case(
        "the torch backend with eight ranks",
        spec({"trainer": {"backend": "torch", "gpusPerNode": 8}}),
        "spec.trainer.gpusPerNode",
    ),
    Case(
        # 8 GPUs over pipeline 2 leave 4 ranks per stage: expert 3 does not divide them
        "expert parallelism that does not divide the ranks of a pipeline stage",
        spec({"trainer": {"parallelism": {"pipeline": 2, "expert": 3}}}),
        "spec.trainer.parallelism.expert",
    ),
    Case(
        "a managed engine flag as --flag=value",
        spec({"inference": {"extraArgs": ["--context-length=131072"]}}),
        "spec.inference.extraArgs",
    ),
    Case(
        "an abbreviation of a managed engine flag",
        spec({"inference": {"extraArgs": ["--mem-frac", "0.9"]}}),
        "spec.inference.extraArgs",
    ),
    Case(
        "the engine port in extra args",
        spec({"inference": {"extraArgs": ["--log-requests", "--port", "30001"]}}),
        "spec.inference.extraArgs",
    ),
    Case(
        "an abbreviated graph-disabling flag",
        spec({"inference": {"extraArgs": ["--disable-cuda-gr"]}}),
        "spec.inference.extraArgs",
    ),
    Case(
        "a graph-disabling flag with a value",
        spec({"inference": {"extraArgs": ["--disable-cuda-graph=true"]}}),
        "spec.inference.extraArgs",
    ),
    Case(
        "the decode graph backend set to disabled",
        spec({"inference": {"extraArgs": ["--cuda-graph-backend-decode", "disabled"]}}),
        "spec.inference.extraArgs",
    ),
    Case(
        "an engine --config file",
        spec({"inference": {"extraArgs": ["--config", "/etc/sglang.yaml"]}}),
        "spec.inference.extraArgs",
    ),
    Case(
        "a node selector value no label can have",
        spec({"inference": {"nodeSelector": {"amd.com/gpu.product-name": "AMD Instinct MI355X"}}}),
        "spec.inference.nodeSelector",
    ),
    Case(
        "a node selector key name longer than 63 characters",
        spec({"inference": {"nodeSelector": {"example.com/" + "k" * 64: "x"}}}),
        "spec.inference.nodeSelector",
    ),
    Case(
        "a toleration key no taint can have",
        spec({"inference": {"tolerations": [{"key": "gpu node", "operator": "Exists"}]}}),
        "spec.inference.tolerations[0].key",
    ),
    Case(
        "a checkpoint volume that is not a PVC name",
        spec({"trainer": {"checkpoint": {"volume": "Checkpoints_01"}}}),
        "spec.trainer.checkpoint.volume",
    ),
    Case(
        "an NCCL interface name longer than Linux allows",
        spec({"trainer": {"network": {"ncclSocketIfname": "enp1s0f0np0-bond0"}}}),
        "spec.trainer.network.ncclSocketIfname",
    ),
    Case(
        "a gloo interface given as an exclusion",
        spec({"trainer": {"network": {"glooSocketIfname": "^docker"}}}),
        "spec.trainer.network.glooSocketIfname",
    ),
    Case(
        "a storage class that is not an object name",
        spec({"trainer": {"checkpoint": {"storageClassName": "fast ssd"}}}),
        "spec.trainer.checkpoint.storageClassName",
    ),
    Case(
        "a model path on a PVC that names the mount point again (/models/models/...)",
        spec({"model": {"source": {"path": "/models/Qwen3-8B", "pvc": "models"}}}),
        "spec.model.source.path",
    ),
    Case(
        "a chat template given two ways",
        spec({"model": {"chatTemplate": {"bundled": "qwen3-instruct", "path": "t.jinja"}}}),
        "spec.model.chatTemplate",
    ),
    Case(
        "an XML tool-call parser with a JSON-call bundled template",
        spec(
            {
                "model": {
                    "toolCallParser": "qwen3_coder",
                    "chatTemplate": {"bundled": "qwen3-instruct"},
                }
            }
        ),
        "spec.model.toolCallParser",
    ),
    Case(
        "auto as the tool-call parser of a model the training rollout parses itself",
        spec({"model": {"toolCallParser": "auto"}}),
        "spec.model.toolCallParser",
    ),
    Case(
        "a warm start below the batch budget's floor",
        spec({"trainer": {"warmStart": {"dataset": "w.jsonl", "tokensPerBatch": 100}}}),
        "spec.trainer.warmStart.tokensPerBatch",
    ),
    Case(
        "a warm start without its dataset",
        spec({"trainer": {"warmStart": {"epochs": 2}}}),
        "spec.trainer.warmStart.dataset",
    ),
    Case(
        "a warm start on the built-in tiny policy, which has no chat template",
        spec(
            {
                "model": {"source": {"path": "tiny"}},
                "trainer": {"backend": "torch", "warmStart": {"dataset": "w"}},
            }
        ),
        "spec.trainer.warmStart",
    ),
    Case(
        "an SGLang tool-call parser the training rollout has no parser for",
        spec({"model": {"toolCallParser": "llama3", "chatTemplate": {"path": "t.jinja"}}}),
        "spec.model.toolCallParser",
    ),
]
