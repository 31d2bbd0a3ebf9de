"""Refused at apply time, not when the runtime trips on it: parallel layouts megatron-core or
the backend cannot run, engine flags the spec already sets (in any spelling argparse accepts),
and names and labels Kubernetes would refuse. Each rule's exact words through ``agentrl
validate``; the API server's own refusal of the same manifests is the corpus in
``tests/api/cases.py`` (``tests/apiserver/test_agentrljob_api.py``)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from agentrl.api import validation
from agentrl.api.engine import MANAGED_FLAGS, disables_graphs, managed_flag
from tests.api.cases import BASE, merge

LABELS = (
    "(keys: [prefix/]name, the name at most 63 characters; values: at most 63; both "
    "alphanumeric at the ends, with - _ . inside)"
)


def _errors(patch: dict[str, Any]) -> list[tuple[str, str]]:
    _, errors = validation.validate_text(yaml.safe_dump(merge(BASE, {"spec": patch})))
    return [(e.path, e.message) for e in errors]


#: The CPU engine a torch-backend job runs on a cluster.
TINY_ENGINE: dict[str, Any] = {"server": "tiny", "gpusPerEngine": 0}

#: (spec patch, field, exact message): one per rule, shared with the API-server test that
#: holds the server's own words (CEL ``messageExpression``) to the same text.
RULE_CASES: list[tuple[dict[str, Any], str, str]] = [
    (
        {"trainer": {"parallelism": {"context": 2}}},
        "spec.trainer.parallelism.context",
        "parallelism.context must be 1 (got 2): the megatron backend feeds every "
        "context-parallel rank whole sequences instead of its slices; use tensor, pipeline "
        "or expert parallelism",
    ),
    (
        {
            "inference": TINY_ENGINE,
            "trainer": {
                "backend": "torch",
                "gpusPerNode": 0,
                "parallelism": {"tensor": 2, "expert": 4},
            },
        },
        "spec.trainer.parallelism",
        "parallelism is for the megatron backend: backend torch trains one unsharded model, "
        "so tensor, pipeline, context and expert must all be 1 (got 2, 1, 1, 4)",
    ),
    (
        {"inference": TINY_ENGINE, "trainer": {"backend": "torch", "gpusPerNode": 0, "nodes": 2}},
        "spec.trainer.nodes",
        "nodes must be 1 for backend torch (got 2): it trains one model in one process, with "
        "no ranks to follow the driver; use backend megatron for more",
    ),
    (
        {"inference": TINY_ENGINE, "trainer": {"backend": "torch", "gpusPerNode": 8}},
        "spec.trainer.gpusPerNode",
        "gpusPerNode must be 0 or 1 for backend torch (got 8): every GPU is a trainer rank, "
        "and the torch backend has one (on the CPU); use backend megatron for more",
    ),
    (
        # 8 % (tensor 1 × expert 3 × pipeline 2 = 6) = 2
        {"trainer": {"parallelism": {"pipeline": 2, "expert": 3}}},
        "spec.trainer.parallelism.expert",
        "parallelism.expert (3) does not fit: nodes × gpusPerNode (8) must be a multiple of "
        "tensor × expert × pipeline (6), the size megatron-core gives each expert-parallel "
        "layout (expert must divide the data-parallel × context ranks of a pipeline stage)",
    ),
    (
        # tensor 2 × expert 8 = 16 GPUs for one layout; there are 8
        {"trainer": {"parallelism": {"tensor": 2, "expert": 8}}},
        "spec.trainer.parallelism.expert",
        "parallelism.expert (8) does not fit: nodes × gpusPerNode (8) must be a multiple of "
        "tensor × expert × pipeline (16), the size megatron-core gives each expert-parallel "
        "layout (expert must divide the data-parallel × context ranks of a pipeline stage)",
    ),
    (
        {"inference": {"gpusPerEngine": 0}},
        "spec.inference.gpusPerEngine",
        "gpusPerEngine 0: SGLang needs at least one GPU per engine; set gpusPerEngine to 1 or "
        "more, or server tiny for a CPU engine",
    ),
    (
        {
            "inference": {"server": "tiny", "gpusPerEngine": 1},
            "trainer": {"backend": "torch", "gpusPerNode": 0},
        },
        "spec.inference.gpusPerEngine",
        "server tiny runs on CPU and would leave its 1 GPUs idle: set gpusPerEngine to 0",
    ),
    (
        {
            "inference": {
                **TINY_ENGINE,
                "extraArgs": ["--fault-weight-updates-after=2", "--log-requests"],
            },
            "trainer": {"backend": "torch", "gpusPerNode": 0},
        },
        "spec.inference.extraArgs",
        "extraArgs entry --log-requests is not a fault-injection --flag=value of server tiny "
        "(--fault-line, --fault-after-requests, --fault-mode, --fault-weight-updates-after), "
        "the only extraArgs it takes; SGLang flags need server sglang",
    ),
    (
        {"inference": TINY_ENGINE},
        "spec.inference.server",
        "inference.server tiny serves the built-in tiny policy, which only trainer.backend "
        "torch trains: set trainer.backend torch, or inference.server sglang",
    ),
    (
        {"trainer": {"backend": "torch", "gpusPerNode": 0}},
        "spec.inference.server",
        "trainer.backend torch trains the built-in tiny policy, which SGLang cannot serve: on a "
        "cluster set inference.server tiny (with gpusPerEngine 0), or use trainer.backend "
        "megatron",
    ),
    (
        {"inference": {"extraArgs": ["--log-requests", "--context-length=131072"]}},
        "spec.inference.extraArgs",
        "extraArgs entry --context-length=131072 is (or abbreviates) --context-length, "
        "which spec.inference.contextLength sets: set it there, not in extraArgs",
    ),
    (
        {"inference": {"extraArgs": ["--mem-frac", "0.9"]}},
        "spec.inference.extraArgs",
        "extraArgs entry --mem-frac is (or abbreviates) --mem-fraction-static, which "
        "spec.inference.memFractionStatic sets: set it there, not in extraArgs",
    ),
    (
        {"inference": {"extraArgs": ["--tp", "2"]}},
        "spec.inference.extraArgs",
        "extraArgs entry --tp is (or abbreviates) --tp-size, which "
        "spec.inference.gpusPerEngine sets: set it there, not in extraArgs",
    ),
    (
        {"inference": {"extraArgs": ["--cuda-graph-max-bs=8"]}},
        "spec.inference.extraArgs",
        "extraArgs entry --cuda-graph-max-bs=8 is (or abbreviates) --cuda-graph-max-bs, "
        "which spec.inference.graphs.maxBatchSize sets: set it there, not in extraArgs",
    ),
    (
        {"inference": {"extraArgs": ["--port", "30001"]}},
        "spec.inference.extraArgs",
        "extraArgs entry --port is (or abbreviates) --port, which the operator (the engine "
        "port its probes and Service use) sets: set it there, not in extraArgs",
    ),
    (
        {"inference": {"extraArgs": ["--model=/elsewhere"]}},
        "spec.inference.extraArgs",
        "extraArgs entry --model=/elsewhere is (or abbreviates) --model, which "
        "spec.model.source sets: set it there, not in extraArgs",
    ),
    (
        {"inference": {"extraArgs": ["--disable-cuda-gr"]}},
        "spec.inference.extraArgs",
        "--disable-cuda-graph is refused: HIP graphs stay on (disabling them halves "  # refused
        "throughput); remove it from extraArgs",
    ),
    (
        {"inference": {"extraArgs": ["--disable-decode-cuda"]}},
        "spec.inference.extraArgs",
        "extraArgs entry --disable-decode-cuda turns decode graphs off: HIP graphs stay on "
        "(disabling them halves throughput); remove it from extraArgs",
    ),
    (
        {"inference": {"extraArgs": ["--log-requests", "--cuda-graph-backend-decode=disabled"]}},
        "spec.inference.extraArgs",
        "extraArgs entry --cuda-graph-backend-decode=disabled turns decode graphs off: HIP graphs "
        "stay on (disabling them halves throughput); remove it from extraArgs",
    ),
    (
        {"inference": {"extraArgs": ["--cuda-graph-backend-d", "disabled"]}},
        "spec.inference.extraArgs",
        "extraArgs entry --cuda-graph-backend-d turns decode graphs off: HIP graphs stay on "
        "(disabling them halves throughput); remove it from extraArgs",
    ),
    (
        {"inference": {"extraArgs": ["--cuda-graph-config", "{}"]}},
        "spec.inference.extraArgs",
        "extraArgs entry --cuda-graph-config turns decode graphs off: HIP graphs stay on "
        "(disabling them halves throughput); remove it from extraArgs",
    ),
    (
        {"inference": {"extraArgs": ["--conf", "/etc/sglang.yaml"]}},
        "spec.inference.extraArgs",
        "extraArgs may not name a --config file: it could disable HIP graphs or set flags "
        "the spec owns out of sight; put its flags in extraArgs",
    ),
    (
        {"inference": {"nodeSelector": {"amd.com/gpu.product-name": "MI355X "}}},
        "spec.inference.nodeSelector",
        f"nodeSelector entry amd.com/gpu.product-name: MI355X  is not a valid label {LABELS}",
    ),
    (
        {"inference": {"nodeSelector": {"Example.com/gpu": "yes"}}},
        "spec.inference.nodeSelector",
        f"nodeSelector entry Example.com/gpu: yes is not a valid label {LABELS}",
    ),
    (
        {"inference": {"tolerations": [{"key": "gpu node", "operator": "Exists"}]}},
        "spec.inference.tolerations[0].key",
        f"key gpu node is not a taint key Kubernetes accepts {LABELS}",
    ),
    (
        {"inference": {"tolerations": [{"key": "gpu", "value": "x" * 64}]}},
        "spec.inference.tolerations[0].value",
        f"value {'x' * 64} is not a taint value Kubernetes accepts {LABELS}",
    ),
    (
        {
            "model": {"source": {"path": "tiny"}},
            "inference": TINY_ENGINE,
            "trainer": {"backend": "torch", "gpusPerNode": 0, "warmStart": {"dataset": "w.jsonl"}},
        },
        "spec.trainer.warmStart",
        "trainer.warmStart renders conversations with the chat template of the model, and "
        "model.source.path tiny is the built-in tiny policy, which has none: set "
        "model.source.path to a Hugging Face model directory, or remove trainer.warmStart",
    ),
]


@pytest.mark.parametrize(("patch", "path", "message"), RULE_CASES)
def test_each_rule_refuses_with_its_exact_words(
    patch: dict[str, Any], path: str, message: str
) -> None:
    assert _errors(patch) == [(path, message)]


def test_the_checkpoint_volume_must_be_a_pvc_name() -> None:
    errors = _errors({"trainer": {"checkpoint": {"volume": "Checkpoints_01"}}})
    assert [p for p, _ in errors] == ["spec.trainer.checkpoint.volume"]
    assert "does not match the pattern" in errors[0][1]


@pytest.mark.parametrize(
    "patch",
    [
        # 8 GPUs: pipeline 2 × expert 4 is megatron-core's expert layout of size 8
        {"trainer": {"parallelism": {"pipeline": 2, "expert": 4}}},
        {"trainer": {"parallelism": {"tensor": 2, "expert": 4}}},
        {"trainer": {"parallelism": {"expert": 8}}},
        # flags the spec does not set, including longer names that start like a managed one
        # and values that look like nothing
        {"inference": {"extraArgs": ["--enable-metrics-for-all-schedulers", "--log-requests"]}},
        {"inference": {"extraArgs": ["--max-prefill-tokens=16384", "--schedule-policy", "lpm"]}},
        {"inference": {"extraArgs": ["--disable-radix-cache", "--portal", "-v", "30000"]}},
        # a decode backend other than disabled; prefill graphs may be switched off
        {"inference": {"extraArgs": ["--cuda-graph-backend-decode=full"]}},
        {"inference": {"extraArgs": ["--disable-piecewise-cuda-graph"]}},
        {"inference": {"nodeSelector": {"amd.com/gpu.product-name": "AMD_Instinct_MI355X"}}},
        {"inference": {"tolerations": [{"key": "amd.com/gpu", "operator": "Exists"}]}},
        {"trainer": {"checkpoint": {"volume": "ckpt.v1", "storageClassName": "fast-ssd"}}},
        {"trainer": {"network": {"ncclSocketIfname": "^docker,lo", "glooSocketIfname": "eth0"}}},
        {"trainer": {"network": {"ncclSocketIfname": "=ens1f0", "glooSocketIfname": "a,b"}}},
        # a warm start on a Hugging Face model, all of its fields set
        {
            "inference": TINY_ENGINE,
            "trainer": {
                "backend": "torch",
                "gpusPerNode": 0,
                "warmStart": {
                    "dataset": "/models/traces.jsonl",
                    "epochs": 3,
                    "lr": 2e-5,
                    "tokensPerBatch": 65536,
                    "seed": 1,
                },
            },
        },
        # a warm start on the megatron backend (its sft_step trains the stage on the GPUs)
        {"trainer": {"backend": "megatron", "warmStart": {"dataset": "/models/traces.jsonl"}}},
        # the report's layout: trained on SWE-smith, measured on SWE-bench Verified
        {
            "dataset": {"format": "swebench", "path": "/data/smith.jsonl", "heldOutFraction": 0},
            "trainer": {
                "evaluation": {
                    "tasks": 100,
                    "attemptsPerTask": 4,
                    "dataset": {"format": "swebench", "path": "/data/swe-bench-verified.jsonl"},
                }
            },
        },
    ],
    ids=lambda p: yaml.safe_dump(p, default_flow_style=True).strip(),
)
def test_what_the_runtime_runs_is_accepted(patch: dict[str, Any]) -> None:
    assert _errors(patch) == []


def test_every_managed_flag_is_refused_in_every_spelling() -> None:
    for flags in MANAGED_FLAGS:
        for flag in flags:
            assert managed_flag(flag) is not None, flag
            assert managed_flag(f"{flag}=1") is not None, flag
            assert managed_flag(flag[:-1]) is not None, flag  # an abbreviation
    assert managed_flag("--log-requests") is None
    assert managed_flag("--") is None
    assert managed_flag("30000") is None
    assert disables_graphs("--disable-cuda-graph-padding=1")  # refused
    assert not disables_graphs("--disable-c")  # ambiguous: argparse refuses it itself
