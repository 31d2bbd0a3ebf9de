"""The static SGLang flag schema: exact flags per spec, graphs always on, extraArgs refusals."""

from __future__ import annotations

from typing import Any

import pytest

from agentrl.api import AgentRLJob, engine_flags
from agentrl.api.engine_flags import EngineFlagError, launch_args, rocm_env
from tests.factories import make_job as _make_job

#: The engine tests' base job: a served model on a PVC path; each test sets ``spec.inference``.
SWE = _make_job("swe").with_served_model("/models/qwen3-30b-a3b", "policy")


def _engine_job(**inference: Any) -> AgentRLJob:
    return SWE.copy().with_inference(**inference).obj()


def test_default_job_gives_exactly_the_reference_flag_set() -> None:
    # Written out by hand from reference §6 and the API defaults: tp = gpusPerEngine = 1,
    # contextLength 65536, maxRunningRequests 64, memFractionStatic 0.85, graphs capture up to
    # maxRunningRequests (64), amd.com/gpu -> aiter attention.
    expected = [
        "--model-path", "/models/qwen3-30b-a3b",
        "--served-model-name", "policy",
        "--dtype", "bfloat16",
        "--host", "0.0.0.0",
        "--port", "30000",
        "--tp-size", "1",
        "--dp-size", "1",
        "--context-length", "65536",
        "--max-running-requests", "64",
        "--mem-fraction-static", "0.85",
        "--kv-cache-dtype", "auto",
        "--cuda-graph-max-bs-decode", "64",
        "--enable-metrics",
        "--watchdog-timeout", "300",
        "--crash-dump-folder", "/var/log/agentrl/crash",
        "--weight-version", "0",
        "--trust-remote-code",
        "--attention-backend", "aiter",
    ]  # fmt: skip
    assert launch_args(_engine_job()) == expected


def test_typed_fields_map_to_their_flags() -> None:
    job = _engine_job(
        gpusPerEngine=2,
        contextLength=32768,
        maxRunningRequests=256,
        memFractionStatic=0.7,
        chunkedPrefillSize=8192,
        kvCacheDtype="fp8_e4m3",
        graphs={"maxBatchSize": 160},
    )
    job.spec.model.tool_call_parser = "qwen25"
    job.spec.model.reasoning_parser = "qwen3"
    args = launch_args(job, port=31000)
    assert args[args.index("--tp-size") + 1] == "2"
    assert args[args.index("--context-length") + 1] == "32768"
    assert args[args.index("--max-running-requests") + 1] == "256"
    assert args[args.index("--mem-fraction-static") + 1] == "0.7"
    assert args[args.index("--chunked-prefill-size") + 1] == "8192"
    assert args[args.index("--kv-cache-dtype") + 1] == "fp8_e4m3"
    assert args[args.index("--cuda-graph-max-bs-decode") + 1] == "160"
    assert args[args.index("--tool-call-parser") + 1] == "qwen25"
    assert args[args.index("--reasoning-parser") + 1] == "qwen3"
    assert args[args.index("--port") + 1] == "31000"


def test_bfloat16_kv_cache_is_spelled_the_way_sglang_accepts_it() -> None:
    args = launch_args(_engine_job(kvCacheDtype="bfloat16"))
    assert args[args.index("--kv-cache-dtype") + 1] == "bf16"


def test_a_model_on_a_pvc_is_read_under_the_models_mount() -> None:
    job = _engine_job()
    job.spec.model.source.pvc = "weights"
    job.spec.model.source.path = "qwen3/instruct"
    args = launch_args(job)
    assert args[args.index("--model-path") + 1] == "/models/qwen3/instruct"


def test_extra_args_are_appended_verbatim_after_the_typed_flags() -> None:
    extra = ["--schedule-policy", "lpm", "--disable-custom-all-reduce", "--log-requests"]
    args = launch_args(_engine_job(extraArgs=extra))
    assert args[-4:] == extra


def test_nvidia_engines_get_neither_aiter_nor_the_rocm_environment() -> None:
    job = _engine_job(gpuResource="nvidia.com/gpu")
    assert "--attention-backend" not in launch_args(job)
    env = rocm_env(job)
    assert "SGLANG_USE_AITER" not in env
    assert "HSA_NO_SCRATCH_RECLAIM" not in env
    assert env["PROMETHEUS_MULTIPROC_DIR"] == "/tmp/prometheus"


@pytest.mark.parametrize(
    "inference",
    [
        {},
        {"graphs": {"maxBatchSize": 1}},
        {"gpusPerEngine": 8, "maxRunningRequests": 4096},
        {"extraArgs": ["--enable-torch-compile", "--disable-radix-cache"]},
        {"gpuResource": "nvidia.com/gpu"},
    ],
)
def test_no_spec_ever_produces_a_graph_disabling_flag(inference: dict[str, object]) -> None:
    args = launch_args(_engine_job(**inference))
    assert not [a for a in args if a.startswith("--disable-cuda-graph")]
    assert "--cuda-graph-max-bs-decode" in args


@pytest.mark.parametrize(
    ("extra", "index", "says"),
    [
        (["--disable-cuda-graph"], 0, "disables HIP graphs"),
        (["--log-requests", "--disable-cuda-graph-padding"], 1, "disables HIP graphs"),
        (["--disable-cuda-graph=true"], 0, "disables HIP graphs"),
        (["--disable-cuda-gr"], 0, "disables HIP graphs"),  # argparse would expand it
        (["--config", "/tmp/sglang.yaml"], 0, "--config file"),
        (["--context-length=131072"], 0, "spec.inference.contextLength"),
        (["--cuda-graph-max-bs", "0"], 0, "spec.inference.graphs.maxBatchSize"),
        (["--tensor-parallel-size", "4"], 0, "spec.inference.gpusPerEngine"),
        (["--model", "/elsewhere"], 0, "spec.model.source"),
        (["--max-running-req", "9"], 0, "spec.inference.maxRunningRequests"),
    ],
)
def test_refused_extra_args_name_the_field_and_the_way_out(
    extra: list[str], index: int, says: str
) -> None:
    job = _engine_job()
    # Set after validation: the launcher must refuse even a spec that got past the CEL rule.
    job.spec.inference.extra_args = extra
    with pytest.raises(EngineFlagError) as caught:
        launch_args(job)
    message = str(caught.value)
    assert f"spec.inference.extraArgs[{index}]" in message
    assert says in message


def test_engine_arguments_with_a_graph_flag_are_refused_wherever_they_come_from() -> None:
    with pytest.raises(EngineFlagError, match=r"the engine arguments\[2\]"):
        engine_flags.refuse_graph_disabling(
            ["--port", "30000", "--disable-cuda-graph"], source="the engine arguments"
        )


def test_rocm_environment_carries_the_reference_settings_and_network_pinning() -> None:
    job = _engine_job()
    job.spec.trainer.network.nccl_socket_ifname = "eth1"
    job.spec.trainer.network.ib_hca = "ionic_0,ionic_1"
    env = rocm_env(job)
    # Reference §6 "Env", value by value.
    assert env["SGLANG_USE_AITER"] == "1"
    assert env["HSA_NO_SCRATCH_RECLAIM"] == "1"
    assert env["HIP_FORCE_DEV_KERNARG"] == "1"
    assert env["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] == "1"
    assert env["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] == "false"
    assert env["SGLANG_HEALTH_CHECK_TIMEOUT"] == "20"
    assert env["NCCL_MIN_NCHANNELS"] == "112"
    assert env["NCCL_SOCKET_IFNAME"] == "eth1"
    assert env["NCCL_IB_HCA"] == "ionic_0,ionic_1"
    assert "GLOO_SOCKET_IFNAME" not in env


def test_launch_command_runs_the_sglang_module_with_the_same_arguments() -> None:
    job = _engine_job()
    assert engine_flags.launch_command(job) == [
        "python3",
        "-m",
        "sglang.launch_server",
        *launch_args(job),
    ]
