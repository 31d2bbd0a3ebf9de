"""The static SGLang flag schema: ``AgentRLJob`` → ``python3 -m sglang.launch_server`` arguments
and the engine container's environment.

Called by the operator's engine StatefulSet builder (``agentrl.reconcile.engine``, to render the
pod) and by ``agentrl engine launch`` inside the engine container (to build the command it
execs). Both go through this one module, so ``agentrl render`` shows exactly the flags the engine
starts with.

Why a static schema: importing ``sglang.srt.server_args`` pulls in torch, triton and zmq and
probes the GPU, so neither the operator nor a CPU test may import it. The flags emitted here are
the canonical long names from SGLang's server-arguments reference (never argparse prefix
abbreviations such as ``--tp``).

Two promises hold for every job:

* HIP graphs stay on. ``--disable-cuda-graph`` is never emitted, and :func:`check_extra_args`
  refuses ``spec.inference.extraArgs`` that would disable graphs, including argparse
  abbreviations of those flags and ``--config`` files (which could carry them out of sight).
* A flag derived from a typed spec field cannot be overridden through ``extraArgs``: the error
  names the field to set instead, so there is one place for each setting.

This module imports only :mod:`agentrl.api` (an import-linter contract holds the reconcile layer
to that).
"""

from __future__ import annotations

from typing import Final

from agentrl.api import AgentRLJob
from agentrl.api.engine import FORBIDDEN_EXTRA_ARGS, MANAGED_FLAGS
from agentrl.api.wire import (
    CRASH_DUMP_PATH,
    ENGINE_LOG_FILE,
    ENGINE_PORT,
    INITIAL_WEIGHT_VERSION,
    PROMETHEUS_DIR,
    SGLANG_MODULE,
    model_path,
)

#: SGLang's ``--watchdog-timeout``: a forward batch slower than this crashes the engine, which
#: the watchdog then sees as a fault. SGLang's default, stated so ``agentrl render`` shows it.
SGLANG_WATCHDOG_TIMEOUT_SECONDS: Final = 300
#: ``SGLANG_HEALTH_CHECK_TIMEOUT``: how long ``/health_generate`` waits for one token before
#: answering 503 (SGLang's default).
SGLANG_HEALTH_CHECK_TIMEOUT_SECONDS: Final = 20

# ---- ROCm environment ------------------------------------------------------------------------

#: Environment of every engine on AMD GPUs: the set the SGLang ROCm image bakes in, stated again
#: because SGLang's code default for ``SGLANG_USE_AITER`` is off and a custom image must not
#: silently lose it (reference notes §2 and §6).
ROCM_ENV: Final[dict[str, str]] = {
    "SGLANG_USE_AITER": "1",
    "SGLANG_ROCM_FUSED_DECODE_MLA": "1",
    "SGLANG_MOE_PADDING": "1",
    "SGLANG_SET_CPU_AFFINITY": "1",
    "HIP_FORCE_DEV_KERNARG": "1",
    "HSA_NO_SCRATCH_RECLAIM": "1",
    "NCCL_MIN_NCHANNELS": "112",
    # ROCm 7.2.4 images: works around an IPC handle leak (ROCM-21485); harmless elsewhere.
    "HSA_ENABLE_IPC_MODE_LEGACY": "1",
}

#: Environment of every engine, whatever the GPU vendor.
COMMON_ENV: Final[dict[str, str]] = {
    # --context-length above the model's derived length only takes effect with this set.
    "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1",
    # /health answers without generating (a cheap readiness probe); /health_generate, which the
    # watchdog probes, still runs the model.
    "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "false",
    "SGLANG_HEALTH_CHECK_TIMEOUT": str(SGLANG_HEALTH_CHECK_TIMEOUT_SECONDS),
    "PROMETHEUS_MULTIPROC_DIR": PROMETHEUS_DIR,
}

# ---- the schema ------------------------------------------------------------------------------

#: Flags (canonical name first, then SGLang's aliases) that typed spec fields own, with the
#: field to set instead (the API's table: the same flags are refused at apply time). ``extraArgs``
#: naming any of them, or an argparse abbreviation of one, is refused.
OWNED_FLAGS: Final = MANAGED_FLAGS

#: ``--kv-cache-dtype`` spellings: the manifest says ``bfloat16`` like ``spec.model.dtype``;
#: SGLang's choice list spells it ``bf16``.
_KV_CACHE_DTYPE: Final[dict[str, str]] = {
    "auto": "auto",
    "fp8_e4m3": "fp8_e4m3",
    "fp8_e5m2": "fp8_e5m2",
    "bfloat16": "bf16",
}

#: Abbreviations of a graph-disabling flag from this length up are refused (argparse expands a
#: unique prefix); shorter ones are ambiguous with other ``--disable-c...`` flags of SGLang
#: (``--disable-custom-all-reduce``, ``--disable-chunked-prefix-cache``) and argparse rejects
#: them itself.
_GRAPH_FLAG_MIN_PREFIX: Final = "--disable-cu"

#: Further ways SGLang 0.5.15 offers to turn decode graphs off (found by the contract test
#: against its parser; ``--disable-cuda-graph`` there is a deprecated umbrella for them):
#: flags that disable them outright, and flags whose value ``disabled`` does. Prefill
#: (piecewise) graphs are a separate optimisation and may be switched off.
_GRAPH_DISABLING_FLAGS: Final = ("--disable-decode-cuda-graph",)
_GRAPH_BACKEND_FLAGS: Final = ("--cuda-graph-backend-decode",)
#: ``--cuda-graph-config`` (a JSON graph configuration) could carry a disabled decode backend
#: out of sight, like ``--config``.
_GRAPH_CONFIG_FLAG: Final = "--cuda-graph-config"


class EngineFlagError(ValueError):
    """The spec asks for engine flags the schema refuses. The message names the field and the
    way out; the operator reports it as ``InvalidSpec`` and the launcher exits non-zero."""


def _flag_name(arg: str) -> str | None:
    """``--name`` of a command-line token (``--name=value`` included); None for values."""
    if not arg.startswith("--") or arg == "--":
        return None
    return arg.split("=", 1)[0]


def _disables_graphs(name: str) -> bool:
    """True for a forbidden graph flag, a longer spelling of one, or an argparse abbreviation
    that could only expand to one."""
    for forbidden in FORBIDDEN_EXTRA_ARGS:
        if name.startswith(forbidden):
            return True
        if len(name) >= len(_GRAPH_FLAG_MIN_PREFIX) and forbidden.startswith(name):
            return True
    # SGLang has no other flag starting --disable-d(ecode), --cuda-graph-c(onfig) or
    # --cuda-graph-backend-d(ecode), so those prefixes expand to the graph flags only.
    if any(f.startswith(name) and len(name) >= len("--disable-d") for f in _GRAPH_DISABLING_FLAGS):
        return True
    return _GRAPH_CONFIG_FLAG.startswith(name) and len(name) >= len("--cuda-graph-c")


def _graph_backend_disabled(args: list[str], index: int) -> bool:
    """True when ``args[index]`` sets a decode graph backend (any abbreviation argparse would
    expand) to ``disabled``, as ``--flag=disabled`` or ``--flag disabled``."""
    arg = args[index]
    name = _flag_name(arg)
    if name is None or not any(
        f.startswith(name) and len(name) >= len("--cuda-graph-backend-d")
        for f in _GRAPH_BACKEND_FLAGS
    ):
        return False
    value = arg.split("=", 1)[1] if "=" in arg else (args[index + 1 : index + 2] or [""])[0]
    return value == "disabled"


def _owning_field(name: str) -> str | None:
    """The spec field owning ``name`` (exact, or an abbreviation of exactly one owned flag)."""
    for flags, owner in OWNED_FLAGS.items():
        if name in flags:
            return owner
    owners = {
        owner
        for flags, owner in OWNED_FLAGS.items()
        for flag in flags
        if flag.startswith(name) and len(name) > len("--")
    }
    # An abbreviation shared with flags we do not own is not ours to refuse: argparse itself
    # rejects it as ambiguous.
    return owners.pop() if len(owners) == 1 else None


def refuse_graph_disabling(args: list[str], *, source: str) -> None:
    """Refuse any token of ``args`` that would disable HIP graphs.

    ``source`` names where the arguments came from, e.g. ``spec.inference.extraArgs`` or
    ``the engine command line``.

    Raises:
        EngineFlagError: naming ``source[i]`` and the way out.
    """
    for index, arg in enumerate(args):
        name = _flag_name(arg)
        if name is not None and (_disables_graphs(name) or _graph_backend_disabled(args, index)):
            raise EngineFlagError(
                f"{source}[{index}] ({arg!r}) is refused: it disables HIP graphs, which halves "
                "decode throughput or worse. Graphs stay on; the watchdog restarts an engine "
                f"after a GPU fault instead. Remove it from {source}."
            )


def check_extra_args(extra_args: list[str]) -> None:
    """Refuse ``spec.inference.extraArgs`` that disable HIP graphs, hide flags in a config
    file, or set a flag a typed field owns.

    Raises:
        EngineFlagError: naming ``spec.inference.extraArgs[i]`` and what to do instead.
    """
    source = "spec.inference.extraArgs"
    refuse_graph_disabling(extra_args, source=source)
    for index, arg in enumerate(extra_args):
        where = f"{source}[{index}] ({arg!r})"
        name = _flag_name(arg)
        if name is None:
            continue
        if "--config".startswith(name) and len(name) >= len("--conf"):
            raise EngineFlagError(
                f"{where} is refused: a --config file could disable HIP graphs or override "
                f"typed fields out of sight. Put the flags in {source} instead."
            )
        owner = _owning_field(name)
        if owner is not None:
            raise EngineFlagError(
                f"{where} is refused: {name} is derived from {owner}; set it there instead "
                f"of in {source}."
            )


def is_amd(job: AgentRLJob) -> bool:
    """Whether the engines run on AMD GPUs (``amd.com/...`` resources): ROCm env and AITER."""
    return job.spec.inference.gpu_resource.startswith("amd.com/")


#: Where the flags :func:`launch_args` sets without a spec field come from (named when one of
#: them is refused by SGLang's parser at launch).
OPERATOR_SOURCE: Final = "the operator's fixed engine flags (agentrl.api.engine_flags)"


def launch_args_with_sources(job: AgentRLJob, port: int = ENGINE_PORT) -> list[tuple[str, str]]:
    """Each token of :func:`launch_args` with the spec field it comes from (``extraArgs``
    tokens as ``spec.inference.extraArgs[i]``), so an error about a token can name the field
    to change.

    Raises:
        EngineFlagError: when ``spec.inference.extraArgs`` is refused (see
            :func:`check_extra_args`).
    """
    inference = job.spec.inference
    model = job.spec.model
    check_extra_args(inference.extra_args)
    graph_max_bs = inference.graphs.max_batch_size or inference.max_running_requests
    fixed = OPERATOR_SOURCE
    graphs = (
        "spec.inference.graphs.maxBatchSize"
        if inference.graphs.max_batch_size is not None
        else "spec.inference.maxRunningRequests (graphs.maxBatchSize unset)"
    )
    # fmt: off
    flags: list[tuple[list[str], str]] = [
        (["--model-path", model_path(job)], "spec.model.source"),
        (["--served-model-name", model.served_name], "spec.model.servedName"),
        (["--dtype", model.dtype], "spec.model.dtype"),
        (["--host", "0.0.0.0"], fixed),
        (["--port", str(port)], fixed),
        (["--tp-size", str(inference.gpus_per_engine)], "spec.inference.gpusPerEngine"),
        (["--dp-size", "1"], fixed),
        (["--context-length", str(inference.context_length)], "spec.inference.contextLength"),
        (["--max-running-requests", str(inference.max_running_requests)],
         "spec.inference.maxRunningRequests"),
        (["--mem-fraction-static", str(inference.mem_fraction_static)],
         "spec.inference.memFractionStatic"),
        (["--kv-cache-dtype", _KV_CACHE_DTYPE[inference.kv_cache_dtype]],
         "spec.inference.kvCacheDtype"),
        # The canonical name in SGLang 0.5.15 (``--cuda-graph-max-bs`` is a deprecated alias
        # there, and an ambiguous prefix that argparse rejects in later releases).
        (["--cuda-graph-max-bs-decode", str(graph_max_bs)], graphs),
        (["--enable-metrics"], fixed),
        (["--watchdog-timeout", str(SGLANG_WATCHDOG_TIMEOUT_SECONDS)], fixed),
        (["--crash-dump-folder", CRASH_DUMP_PATH], fixed),
        (["--weight-version", INITIAL_WEIGHT_VERSION], fixed),
        (["--trust-remote-code"], fixed),
    ]
    # fmt: on
    if inference.chunked_prefill_size is not None:
        flags.append(
            (["--chunked-prefill-size", str(inference.chunked_prefill_size)],
             "spec.inference.chunkedPrefillSize")
        )  # fmt: skip
    if model.tool_call_parser is not None:
        flags.append((["--tool-call-parser", model.tool_call_parser], "spec.model.toolCallParser"))
    if model.reasoning_parser is not None:
        flags.append((["--reasoning-parser", model.reasoning_parser], "spec.model.reasoningParser"))
    if is_amd(job):
        flags.append((["--attention-backend", "aiter"], "spec.inference.gpuResource (AMD GPUs)"))
    out = [(token, source) for tokens, source in flags for token in tokens]
    out += [(arg, f"spec.inference.extraArgs[{i}]") for i, arg in enumerate(inference.extra_args)]
    return out




def tiny_args(job: AgentRLJob, port: int = ENGINE_PORT) -> list[str]:
    """The ``agentrl engine serve-tiny`` arguments of a ``server: tiny`` engine: the same model
    path, served name, context, request cap and initial weight version an SGLang engine gets,
    the log where the watchdog reads it, and the dataset's seed, from which the trainer builds
    the same initial policy (weight version 0 is identical on both sides); then
    ``spec.inference.extraArgs``, which with ``server: tiny`` are the tiny engine's fault
    injection flags (``TINY_EXTRA_FLAGS``)."""
    inference = job.spec.inference
    # fmt: off
    return [
        "--model-path", model_path(job),
        "--served-model-name", job.spec.model.served_name,
        "--host", "0.0.0.0",
        "--port", str(port),
        "--weight-version", INITIAL_WEIGHT_VERSION,
        "--context-length", str(inference.context_length),
        "--max-running-requests", str(inference.max_running_requests),
        "--seed", str(job.spec.dataset.seed),
        "--log-file", ENGINE_LOG_FILE,
        *inference.extra_args,
    ]
    # fmt: on


def launch_args(job: AgentRLJob, port: int = ENGINE_PORT) -> list[str]:
    """The ``sglang.launch_server`` arguments for ``job`` (without the interpreter and module).

    The result is deterministic: the same spec always gives the same list, so an engine
    restarted by the kubelet or the watchdog comes back with exactly the same flags.

    Raises:
        EngineFlagError: when ``spec.inference.extraArgs`` is refused (see
            :func:`check_extra_args`).
    """
    return [token for token, _ in launch_args_with_sources(job, port)]


def launch_command(job: AgentRLJob, port: int = ENGINE_PORT) -> list[str]:
    """The full engine command: ``python3 -m sglang.launch_server`` plus :func:`launch_args`."""
    return ["python3", "-m", SGLANG_MODULE, *launch_args(job, port)]


def rocm_env(job: AgentRLJob) -> dict[str, str]:
    """The engine container's environment: the ROCm set on AMD GPUs, the SGLang settings every
    engine needs, and the collective-network pinning of ``spec.trainer.network`` (engines join
    the trainer's broadcast group for distributed weight sync)."""
    env = dict(COMMON_ENV)
    if is_amd(job):
        env.update(ROCM_ENV)
    network = job.spec.trainer.network
    if network.nccl_socket_ifname is not None:
        env["NCCL_SOCKET_IFNAME"] = network.nccl_socket_ifname
    if network.gloo_socket_ifname is not None:
        env["GLOO_SOCKET_IFNAME"] = network.gloo_socket_ifname
    if network.ib_hca is not None:
        env["NCCL_IB_HCA"] = network.ib_hca
    return env
