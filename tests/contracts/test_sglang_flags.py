"""Every flag list ``agentrl engine launch`` can produce parses with the pinned SGLang's own
server-argument parser (``ServerArgs.add_cli_args`` on an argparse parser, in the pinned
environment) and sets the values the spec meant.

``ServerArgs.from_cli_args`` is not run: it builds a ``ServerArgs``, whose ``__post_init__``
needs an accelerator on this machine ("No accelerator ... is available"). It copies the
namespace's fields one to one, so the namespace is what the server would start with.

The expected values are written from the spec fields by hand (not by asking
``agentrl.api.engine_flags``), and SGLang's own destinations are read by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.factories import make_job

from agentrl.api import AgentRLJob, engine_flags
from agentrl.api.engine import EngineServer
from agentrl.devcluster import sglang_env

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

#: The manifest's kvCacheDtype → SGLang's spelling (its choices: auto, fp8_e5m2, fp8_e4m3,
#: bf16, bfloat16, fp4_e2m1).
KV_DTYPE = {"auto": "auto", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2", "bfloat16": "bf16"}


def _examples() -> dict[str, AgentRLJob]:
    jobs = {}
    for path in sorted(EXAMPLES.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "AgentRLJob":
                job = AgentRLJob.model_validate(doc)
                # server tiny launches agentrl engine serve-tiny, not SGLang: its arguments are
                # checked against that command (tests/reconcile/test_tiny_engine_pods.py)
                if job.spec.inference.server == EngineServer.SGLANG:
                    jobs[f"example {path.relative_to(EXAMPLES)}"] = job
    return jobs


def _variants() -> dict[str, AgentRLJob]:
    return {
        "defaults": make_job().obj(),
        "graphs max batch size 256": make_job()
        .with_spec("inference.graphs.maxBatchSize", 256)
        .obj(),
        "context length 131072, 512 running": make_job()
        .with_spec("inference.contextLength", 131072)
        .with_spec("inference.maxRunningRequests", 512)
        .obj(),
        "tool and reasoning parsers": make_job()
        .with_spec("model.toolCallParser", "qwen3_coder")
        .with_spec("model.reasoningParser", "qwen3")
        .obj(),
        "auto parsers": make_job()
        .with_spec("model.toolCallParser", "auto")
        .with_spec("model.reasoningParser", "auto")
        .obj(),
        "tp 4 on AMD": make_job()
        .with_engines(2, gpus_per_engine=4)
        .with_spec("inference.gpuResource", "amd.com/gpu")
        .obj(),
        "tp 8, fp8 KV cache, chunked prefill": make_job()
        .with_spec("inference.gpusPerEngine", 8)
        .with_spec("inference.kvCacheDtype", "fp8_e4m3")
        .with_spec("inference.chunkedPrefillSize", 8192)
        .obj(),
        "bfloat16 KV cache, float16 weights": make_job()
        .with_spec("inference.kvCacheDtype", "bfloat16")
        .with_spec("model.dtype", "float16")
        .obj(),
        "fp8_e5m2 KV cache, memFractionStatic 0.7": make_job()
        .with_spec("inference.kvCacheDtype", "fp8_e5m2")
        .with_spec("inference.memFractionStatic", 0.7)
        .obj(),
        "NVIDIA GPUs (no AITER)": make_job()
        .with_spec("inference.gpuResource", "nvidia.com/gpu")
        .obj(),
        "model on a PVC": make_job().with_model_pvc("models", "qwen3").obj(),
        "extraArgs: quantisation, prefill, memory saver": make_job()
        .with_spec(
            "inference.extraArgs",
            ["--quantization", "fp8", "--max-prefill-tokens", "32768", "--enable-memory-saver"],
        )
        .obj(),
        "extraArgs: attention backend, --flag=value": make_job()
        .with_spec("inference.extraArgs", ["--attention-backend=triton", "--page-size", "16"])
        .obj(),
    }


JOBS = {**_examples(), **_variants()}


_BASE = ["--model-path", "/m"]
#: Lists SGLang's parser must refuse: an unknown flag, a bad choice, an ambiguous prefix
#: (``--cuda-graph-max`` could be three options in 0.5.15).
REFUSED = [
    [*_BASE, "--enable-hip-magic"],
    [*_BASE, "--tool-call-parser", "qwen9"],
    [*_BASE, "--cuda-graph-max", "8"],
]

#: SGLang's destinations that turn decode graphs off, and the value that does it.
GRAPH_OFF = {
    "disable_cuda_graph": None,
    "disable_decode_cuda_graph": None,
    "cuda_graph_backend_decode": "disabled",
}


def _graph_off_cases(options_by_dest: dict[str, list[str]]) -> list[list[str]]:
    """Each option string for those destinations (from SGLang's parser), in full and as
    ``--flag=value``, and a graph configuration file."""
    cases = []
    for dest, value in GRAPH_OFF.items():
        for flag in options_by_dest[dest]:
            cases.append([flag] if value is None else [flag, value])
            if value is not None:
                cases.append([f"{flag}={value}"])
    cases.append(["--cuda-graph-config", '{"decode": {"backend": "disabled"}}'])
    return cases


@pytest.fixture(scope="module")
def answers(options_by_dest: dict[str, list[str]]) -> dict[str, Any]:
    """SGLang's parse of every list this module checks, in one probe run (each run imports
    sglang and torch anew)."""
    names = list(JOBS)
    graph = _graph_off_cases(options_by_dest)
    lists = [engine_flags.launch_args(JOBS[n]) for n in names]
    lists += REFUSED + [[*_BASE, *case] for case in graph]
    out = sglang_env.probe("parse", lists)
    jobs, rest = out[: len(names)], out[len(names) :]
    return {
        "jobs": dict(zip(names, jobs, strict=True)),
        "refused": rest[: len(REFUSED)],
        "graph": list(zip(graph, rest[len(REFUSED) :], strict=True)),
    }


@pytest.fixture(scope="module")
def parsed(answers: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """SGLang's parse of every job's flags."""
    return answers["jobs"]  # type: ignore[no-any-return]


def test_the_examples_are_among_the_checked_jobs() -> None:
    assert {"example quickstart.yaml", "example mi355x-report.yaml"} <= set(JOBS)


@pytest.mark.parametrize("name", list(JOBS))
def test_sglang_accepts_the_flags_and_reads_the_spec_from_them(
    name: str, parsed: dict[str, dict[str, Any]]
) -> None:
    job = JOBS[name]
    answer = parsed[name]
    assert answer["error"] is None, f"SGLang refuses the flags of {name}: {answer['error']}"
    values = answer["values"]
    inference, model = job.spec.inference, job.spec.model
    path = model.source.path
    if model.source.pvc is not None:
        path = "/models/" + path.lstrip("/")
    assert values["model_path"] == path
    assert values["served_model_name"] == model.served_name
    assert values["dtype"] == model.dtype
    assert values["context_length"] == inference.context_length
    assert values["tp_size"] == inference.gpus_per_engine
    assert values["dp_size"] == 1
    assert values["max_running_requests"] == inference.max_running_requests
    assert values["mem_fraction_static"] == pytest.approx(inference.mem_fraction_static)
    assert values["kv_cache_dtype"] == KV_DTYPE[inference.kv_cache_dtype]
    graphs = inference.graphs.max_batch_size or inference.max_running_requests
    assert values["cuda_graph_max_bs_decode"] == graphs
    assert values["chunked_prefill_size"] == inference.chunked_prefill_size
    assert values["tool_call_parser"] == model.tool_call_parser
    assert values["reasoning_parser"] == model.reasoning_parser
    assert values["host"] == "0.0.0.0"
    assert values["port"] == 30000
    assert values["enable_metrics"] is True
    assert values["weight_version"] == "0"
    assert values["watchdog_timeout"] == 300
    assert values["crash_dump_folder"] == "/var/log/agentrl/crash"
    assert values["trust_remote_code"] is True
    # HIP graphs on, every way SGLang 0.5.15 has of turning them off left alone
    assert values["disable_cuda_graph"] is False
    assert values["disable_decode_cuda_graph"] is False
    assert values["cuda_graph_backend_decode"] != "disabled"
    assert values["cuda_graph_config"] is None
    extra = list(inference.extra_args)
    if "--attention-backend=triton" in extra:
        assert values["attention_backend"] == "triton"  # extraArgs come last and win
    elif inference.gpu_resource.startswith("amd.com/"):
        assert values["attention_backend"] == "aiter"
    else:
        assert values["attention_backend"] is None


def test_extra_args_reach_sglang_with_their_values(parsed: dict[str, dict[str, Any]]) -> None:
    values = parsed["extraArgs: quantisation, prefill, memory saver"]["values"]
    assert (values["quantization"], values["max_prefill_tokens"]) == ("fp8", 32768)
    assert values["enable_memory_saver"] is True
    assert parsed["extraArgs: attention backend, --flag=value"]["values"]["page_size"] == 16


def test_sglang_refuses_what_the_launcher_must_catch(answers: dict[str, Any]) -> None:
    """The parser really is SGLang's: it refuses an unknown flag, a bad choice and an ambiguous
    prefix (``--cuda-graph-max`` could be three options in 0.5.15)."""
    unknown, choice, ambiguous = answers["refused"]
    assert "unrecognized arguments: --enable-hip-magic" in unknown["error"]
    assert "--tool-call-parser" in choice["error"] and "qwen9" in choice["error"]
    assert "ambiguous option: --cuda-graph-max" in ambiguous["error"]


#: What our flags set that no spec field may override through extraArgs, by SGLang's
#: destination (the names are SGLang's; the owning fields are written by hand).
OWNED_DESTS = {
    "model_path": "spec.model.source",
    "served_model_name": "spec.model.servedName",
    "tool_call_parser": "spec.model.toolCallParser",
    "reasoning_parser": "spec.model.reasoningParser",
    "dtype": "spec.model.dtype",
    "tp_size": "spec.inference.gpusPerEngine",
    "dp_size": "spec.inference.engines",
    "context_length": "spec.inference.contextLength",
    "max_running_requests": "spec.inference.maxRunningRequests",
    "mem_fraction_static": "spec.inference.memFractionStatic",
    "chunked_prefill_size": "spec.inference.chunkedPrefillSize",
    "kv_cache_dtype": "spec.inference.kvCacheDtype",
    "cuda_graph_max_bs_decode": "spec.inference.graphs.maxBatchSize",
    "cuda_graph_bs_decode": "spec.inference.graphs.maxBatchSize",
    "host": "the operator",
    "port": "the operator",
    "enable_metrics": "the operator",
    "weight_version": "the trainer",
    "crash_dump_folder": "the operator",
}


def test_every_sglang_spelling_of_an_owned_flag_is_refused_in_extra_args(
    options_by_dest: dict[str, list[str]],
) -> None:
    """Each option string SGLang maps to a destination our flags set (aliases and deprecated
    names included, e.g. ``--cuda-graph-max-bs`` next to ``--cuda-graph-max-bs-decode``) is
    refused in ``extraArgs``, naming the field that owns it."""
    accepted = []
    for dest, owner in OWNED_DESTS.items():
        assert dest in options_by_dest, f"SGLang has no option for {dest}"
        for flag in options_by_dest[dest]:
            try:
                engine_flags.check_extra_args([flag, "1"])
            except engine_flags.EngineFlagError as exc:
                assert owner in str(exc), f"{flag}: {exc}"
            else:
                accepted.append(flag)
    assert accepted == []


def test_every_way_sglang_has_to_disable_decode_graphs_is_refused(
    answers: dict[str, Any],
) -> None:
    """Each option string for the graph-disabling destinations (from SGLang's parser) is
    refused, in full, as ``--flag=value`` and abbreviated as far as argparse would still expand
    it; and SGLang's parser confirms each of these lists does turn decode graphs off."""
    assert len(answers["graph"]) >= 5
    for case, answer in answers["graph"]:
        values = answer["values"]
        assert answer["error"] is None, answer["error"]
        assert (
            values["disable_cuda_graph"]
            or values["disable_decode_cuda_graph"]
            or values["cuda_graph_backend_decode"] == "disabled"
            or values["cuda_graph_config"] is not None
        ), case
        with pytest.raises(engine_flags.EngineFlagError, match="HIP graphs"):
            engine_flags.check_extra_args(case)
    with pytest.raises(engine_flags.EngineFlagError, match="HIP graphs"):
        engine_flags.check_extra_args(["--disable-decode", "--model-path", "/m"])
    with pytest.raises(engine_flags.EngineFlagError, match="HIP graphs"):
        engine_flags.check_extra_args(["--cuda-graph-backend-d", "disabled"])


def test_prefill_graph_options_and_a_live_decode_backend_stay_allowed() -> None:
    engine_flags.check_extra_args(["--cuda-graph-backend-decode", "full"])
    engine_flags.check_extra_args(["--cuda-graph-backend-prefill", "disabled"])
    engine_flags.check_extra_args(["--disable-prefill-cuda-graph"])


def test_no_flag_we_emit_is_one_sglang_deprecates(sglang: dict[str, Any]) -> None:
    """A deprecated spelling (``--cuda-graph-max-bs`` in 0.5.15) warns at every start and is
    the first to go: the next releases make it an ambiguous prefix that argparse rejects."""
    deprecated = {
        s for o in sglang["options"] if o["action"].startswith("Deprecated") for s in o["strings"]
    }
    emitted = {
        token.split("=", 1)[0]
        for job in JOBS.values()
        for token in engine_flags.launch_args(job)
        if token.startswith("--")
    }
    assert sorted(emitted & deprecated) == []
