"""``spec.inference``: the SGLang engines, their GPUs, caps and watchdog."""

from __future__ import annotations

import re
from enum import StrEnum

from pydantic import Field

from agentrl.api.base import (
    DNS_SUBDOMAIN_PATTERN,
    LABEL_KEY_PATTERN,
    LABEL_VALUE_PATTERN,
    LabelStr,
    ManifestModel,
    ShortStr,
)
from agentrl.api.quantities import Quantity
from agentrl.api.rules import Rule, let


def label_key_ok(key: str) -> bool:
    """A key Kubernetes accepts on a label (and so in a nodeSelector or a toleration)."""
    prefix = key.split("/", 1)[0] if "/" in key else ""
    return re.fullmatch(LABEL_KEY_PATTERN, key) is not None and len(prefix) <= 253


def label_value_ok(value: str) -> bool:
    """A label value Kubernetes accepts (at most 63 characters, alphanumeric at both ends)."""
    return re.fullmatch(LABEL_VALUE_PATTERN, value) is not None


#: The same two checks in CEL, on a string ``k`` / ``v``.
CEL_LABEL_KEY = (
    f"(k.matches(r'{LABEL_KEY_PATTERN}') && (!k.contains('/') || k.split('/')[0].size() <= 253))"
)
CEL_LABEL_VALUE = f"v.matches(r'{LABEL_VALUE_PATTERN}')"


_LABEL_RULES = (
    "(keys: [prefix/]name, the name at most 63 characters; values: at most 63; both "
    "alphanumeric at the ends, with - _ . inside)"
)


def node_selector_rule(camel: str, snake: str) -> Rule:
    """Every key and value of the map ``camel`` (``snake`` in Python) is one a node label can
    have: a selector no label can match leaves the pods Pending for good."""
    ok = f"({CEL_LABEL_KEY} && {let('v', f'self.{camel}[k]', CEL_LABEL_VALUE)})"
    return Rule(
        cel=f"self.{camel}.all(k, {ok})",
        message_expression=let(
            "k",
            f"self.{camel}.filter(k, !{ok})[0]",
            f"'{camel} entry %s: %s is not a valid label {_LABEL_RULES}'"
            f".format([k, self.{camel}[k]])",
        ),
        field_path=f".{camel}",
        check=lambda s: all(
            label_key_ok(k) and label_value_ok(v) for k, v in getattr(s, snake).items()
        ),
        message=lambda s: _label_message(camel, getattr(s, snake)),
    )


def _label_message(camel: str, mapping: dict[str, str]) -> str:
    key = next(k for k, v in mapping.items() if not (label_key_ok(k) and label_value_ok(v)))
    return f"{camel} entry {key}: {mapping[key]} is not a valid label {_LABEL_RULES}"


#: Flags ``extraArgs`` may never carry: HIP graphs stay on, and the flags the operator derives
#: from typed fields must be set through those fields.
FORBIDDEN_EXTRA_ARGS = ("--disable-cuda-graph", "--disable-cuda-graph-padding")
#: Shortest abbreviation of a graph-disabling flag that is refused (argparse expands a unique
#: prefix; shorter ones are ambiguous with SGLang's other ``--disable-c...`` flags, which
#: argparse itself rejects).
GRAPH_FLAG_MIN_PREFIX = "--disable-cu"

#: Engine flags (canonical name first, then SGLang's aliases) that the spec sets, with what
#: sets them. ``extraArgs`` may not carry any of them in any spelling argparse accepts: the
#: name itself, ``--name=value``, or an abbreviation (a prefix argparse would expand; one
#: shared by two flags makes argparse exit, so it is refused too).
MANAGED_FLAGS: dict[tuple[str, ...], str] = {
    ("--model-path", "--model"): "spec.model.source",
    ("--served-model-name",): "spec.model.servedName",
    ("--tool-call-parser",): "spec.model.toolCallParser",
    ("--reasoning-parser",): "spec.model.reasoningParser",
    ("--dtype",): "spec.model.dtype",
    ("--tp-size", "--tensor-parallel-size"): "spec.inference.gpusPerEngine",
    ("--dp-size", "--data-parallel-size"): "spec.inference.engines (one engine per pod)",
    ("--context-length",): "spec.inference.contextLength",
    ("--max-running-requests",): "spec.inference.maxRunningRequests",
    ("--mem-fraction-static",): "spec.inference.memFractionStatic",
    ("--chunked-prefill-size",): "spec.inference.chunkedPrefillSize",
    ("--kv-cache-dtype",): "spec.inference.kvCacheDtype",
    (
        "--cuda-graph-max-bs-decode",
        "--cuda-graph-max-bs",
        "--cuda-graph-bs-decode",
        "--cuda-graph-bs",
    ): "spec.inference.graphs.maxBatchSize",
    ("--host",): "the operator (engines listen on all addresses of their pod)",
    ("--port",): "the operator (the engine port its probes and Service use)",
    ("--enable-metrics",): "the operator (metrics are always on: the watchdog reads them)",
    ("--weight-version",): "the trainer (it pushes versioned weights)",
    ("--crash-dump-folder",): "the operator (crash dumps go to the engine's log volume)",
}
#: Every managed spelling → what sets it.
_MANAGED: dict[str, str] = {f: owner for flags, owner in MANAGED_FLAGS.items() for f in flags}


def flag_name(arg: str) -> str | None:
    """``--name`` of a command-line token (``--name=value`` included); None for values."""
    if not arg.startswith("--"):
        return None
    return arg.split("=", 1)[0]


def managed_flag(arg: str) -> str | None:
    """The managed flag ``arg`` sets (exactly, as ``--flag=value``, or abbreviated), if any."""
    name = flag_name(arg)
    if name is None:
        return None
    if name in _MANAGED:
        return name  # exact, even where it also starts a longer managed name
    for flag in _MANAGED:
        if flag == name or (len(name) > 2 and flag.startswith(name)):
            return flag
    return None


def disables_graphs(arg: str) -> bool:
    """A graph-disabling flag in any spelling: longer names (``-padding``), ``=value``, and
    abbreviations argparse would expand to one."""
    name = flag_name(arg)
    if name is None:
        return False
    return any(
        name.startswith(f) or (len(name) >= len(GRAPH_FLAG_MIN_PREFIX) and f.startswith(name))
        for f in FORBIDDEN_EXTRA_ARGS
    )


def _cel_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


# The same predicates in CEL (:func:`~agentrl.api.rules.let` names a value once: the map of
# managed flags ``m``, a token's flag name ``n`` = ``a.split('=')[0]``).
_CEL_MANAGED_MAP = (
    "{" + ", ".join(f"{_cel_string(f)}: {_cel_string(o)}" for f, o in _MANAGED.items()) + "}"
)
_CEL_MATCHES = "(f == n || (n.size() > 2 && f.startsWith(n)))"
_CEL_IS_MANAGED = let("n", "a.split('=')[0]", f"a.startsWith('--') && m.exists(f, {_CEL_MATCHES})")
_CEL_GRAPH = let(
    "n",
    "a.split('=')[0]",
    "a.startsWith('--') && ["
    + ", ".join(_cel_string(f) for f in FORBIDDEN_EXTRA_ARGS)
    + f"].exists(f, n.startsWith(f) || (n.size() >= {len(GRAPH_FLAG_MIN_PREFIX)} "
    "&& f.startsWith(n)))",
)
_CEL_MANAGED_RULE = let("m", _CEL_MANAGED_MAP, f"!self.extraArgs.exists(a, {_CEL_IS_MANAGED})")
_CEL_MANAGED_MESSAGE = let(
    "m",
    _CEL_MANAGED_MAP,
    let(
        "e",
        f"self.extraArgs.filter(a, {_CEL_IS_MANAGED})[0]",
        let(
            "n",
            "e.split('=')[0]",
            let(
                "k",
                f"n in m ? n : m.filter(f, {_CEL_MATCHES})[0]",
                "'extraArgs entry %s is (or abbreviates) %s, which %s sets: set it there, not in "
                "extraArgs'.format([e, k, m[k]])",
            ),
        ),
    ),
)
#: ``--config`` (a file of flags): abbreviations from this length up are refused.
CONFIG_FLAG_MIN_PREFIX = "--conf"


#: SGLang 0.5.15's other ways to turn decode graphs off (``--disable-cuda-graph`` is a deprecated
#: umbrella for them there; found by the contract test against its parser, see
#: ``agentrl.api.engine_flags``), each with the shortest abbreviation argparse expands to
#: it alone: flags that do it outright (or, ``--cuda-graph-config``, a JSON graph configuration
#: that could carry it out of sight), and the decode backend flag, whose value ``disabled`` does.
DECODE_GRAPH_OFF_FLAGS: dict[str, str] = {
    "--disable-decode-cuda-graph": "--disable-d",
    "--cuda-graph-config": "--cuda-graph-c",
}
DECODE_GRAPH_BACKEND_FLAG = ("--cuda-graph-backend-decode", "--cuda-graph-backend-d")


def _spells(name: str, flag: str, shortest: str) -> bool:
    return len(name) >= len(shortest) and flag.startswith(name)


def turns_decode_graphs_off(arg: str, args: list[str]) -> bool:
    """``arg`` (an entry of ``args``) turns decode graphs off: one of
    :data:`DECODE_GRAPH_OFF_FLAGS` in any spelling, or the decode backend set to ``disabled``
    (``=disabled``, or without ``=`` while some entry is ``disabled``: which value follows which
    flag is not checked, so that spelling is refused whenever ``disabled`` appears)."""
    name = flag_name(arg)
    if name is None:
        return False
    if any(_spells(name, f, short) for f, short in DECODE_GRAPH_OFF_FLAGS.items()):
        return True
    if not _spells(name, *DECODE_GRAPH_BACKEND_FLAG):
        return False
    return arg.endswith("=disabled") or ("=" not in arg and "disabled" in args)


def _decode_graph_message(s: InferenceSpec) -> str:
    first = next(a for a in s.extra_args if turns_decode_graphs_off(a, s.extra_args))
    return (
        f"extraArgs entry {first} turns decode graphs off: HIP graphs stay on (disabling them "
        "halves throughput); remove it from extraArgs"
    )


_CEL_DECODE_OFF = let(
    "n",
    "a.split('=')[0]",
    "a.startsWith('--') && ("
    + " || ".join(
        f"(n.size() >= {len(short)} && {_cel_string(f)}.startsWith(n))"
        for f, short in DECODE_GRAPH_OFF_FLAGS.items()
    )
    + f" || (n.size() >= {len(DECODE_GRAPH_BACKEND_FLAG[1])} && "
    + f"{_cel_string(DECODE_GRAPH_BACKEND_FLAG[0])}.startsWith(n) && (a.endsWith('=disabled') "
    + "|| (!a.contains('=') && 'disabled' in self.extraArgs))))",
)


def sets_config_file(arg: str) -> bool:
    """``--config FILE`` in any spelling: the file could disable graphs or set managed flags
    out of sight."""
    name = flag_name(arg)
    return (
        name is not None
        and len(name) >= len(CONFIG_FLAG_MIN_PREFIX)
        and ("--config".startswith(name))
    )


#: The ``agentrl engine serve-tiny`` flags ``extraArgs`` may carry with ``server: tiny``: its
#: fault injection (``agentrl.tiny.server``), a test and chaos tool — an engine that crashes,
#: hangs, stalls or stops taking weights on cue. The tiny engine's other flags are the spec's
#: (``engine_flags.tiny_args``). Each is one entry, ``--flag=value``, so that no value is read
#: as an entry of its own.
TINY_EXTRA_FLAGS = (
    "--fault-line",
    "--fault-after-requests",
    "--fault-mode",
    "--fault-weight-updates-after",
)


def tiny_extra_arg(arg: str) -> bool:
    """``arg`` is one of :data:`TINY_EXTRA_FLAGS`, written ``--flag=value``."""
    return "=" in arg and arg.split("=", 1)[0] in TINY_EXTRA_FLAGS


_CEL_TINY_FLAGS = "[" + ", ".join(_cel_string(f) for f in TINY_EXTRA_FLAGS) + "]"
_CEL_TINY_ARG = f"(a.contains('=') && a.split('=')[0] in {_CEL_TINY_FLAGS})"
#: What follows ``extraArgs entry ENTRY`` in the refusal, from the API server and from
#: ``agentrl validate`` alike.
_TINY_EXTRA_REFUSAL = (
    f"is not a fault-injection --flag=value of server tiny ({', '.join(TINY_EXTRA_FLAGS)}), "
    "the only extraArgs it takes; SGLang flags need server sglang"
)


def _tiny_extra_message(s: InferenceSpec) -> str:
    first = next(a for a in s.extra_args if not tiny_extra_arg(a))
    return f"extraArgs entry {first} {_TINY_EXTRA_REFUSAL}"


def _managed_message(s: InferenceSpec) -> str:
    first = next(a for a in s.extra_args if managed_flag(a))
    flag = managed_flag(first) or ""
    return (
        f"extraArgs entry {first} is (or abbreviates) {flag}, which {_MANAGED[flag]} sets: set it "
        "there, not in extraArgs"
    )


class Toleration(ManifestModel):
    """A pod toleration (the subset of core/v1 Toleration GPU nodes need)."""

    key: str | None = Field(default=None, max_length=253)
    """Taint key to tolerate; empty with operator Exists tolerates everything."""
    operator: str = Field(default="Equal", pattern=r"^(Equal|Exists)$")
    """``Equal`` or ``Exists``."""
    value: str | None = Field(default=None, max_length=253)
    """Taint value for ``Equal``."""
    effect: str | None = Field(default=None, pattern=r"^(NoSchedule|PreferNoSchedule|NoExecute)$")
    """Taint effect to tolerate; unset tolerates all effects."""

    cel_rules = (
        Rule(
            cel="!has(self.key) || " + let("k", "self.key", CEL_LABEL_KEY),
            message_expression=f"'key %s is not a taint key Kubernetes accepts {_LABEL_RULES}'"
            ".format([self.key])",
            field_path=".key",
            check=lambda t: t.key is None or label_key_ok(t.key),
            message=lambda t: f"key {t.key} is not a taint key Kubernetes accepts {_LABEL_RULES}",
        ),
        Rule(
            cel="!has(self.value) || " + let("v", "self.value", CEL_LABEL_VALUE),
            message_expression=f"'value %s is not a taint value Kubernetes accepts "
            f"{_LABEL_RULES}'.format([self.value])",
            field_path=".value",
            check=lambda t: t.value is None or label_value_ok(t.value),
            message=lambda t: (
                f"value {t.value} is not a taint value Kubernetes accepts {_LABEL_RULES}"
            ),
        ),
    )


class GraphSpec(ManifestModel):
    """HIP/CUDA graphs. They are always on: disabling them halves decode throughput."""

    max_batch_size: int | None = Field(default=None, ge=1, le=4096)
    """Largest batch captured in a graph (``--cuda-graph-max-bs``); unset captures up to
    ``maxRunningRequests``."""


class WatchdogSpec(ManifestModel):
    """The sidecar that restarts an engine on a GPU fault, with graphs still on."""

    enabled: bool = True
    """Run the watchdog sidecar next to each engine."""
    health_timeout_seconds: int = Field(default=60, ge=1, le=3600)
    """A ``/health_generate`` slower than this counts as a failed probe (seconds)."""
    health_interval_seconds: int = Field(default=15, ge=1, le=3600)
    """Seconds between ``/health_generate`` probes."""
    failed_probes_before_restart: int = Field(default=3, ge=1, le=100)
    """Consecutive failed probes before the engine is restarted."""
    stall_seconds: int = Field(default=120, ge=10, le=86400)
    """Running requests but no generated token for this long is a stall (seconds)."""
    max_restarts: int = Field(default=5, ge=1, le=100)
    """More restarts than this within ``restartWindowSeconds`` trips the crash-loop guard
    (Degraded condition and an Event; graphs stay on)."""
    restart_window_seconds: int = Field(default=3600, ge=60, le=604800)
    """The crash-loop guard's window (seconds)."""


class EngineServer(StrEnum):
    """What serves the policy in each engine pod."""

    SGLANG = "sglang"
    TINY = "tiny"


class InferenceSpec(ManifestModel):
    """``spec.inference``: SGLang engines, one per pod."""

    server: EngineServer = EngineServer.SGLANG
    """``sglang`` (the engine image's SGLang, on GPUs) or ``tiny`` (the built-in tiny policy
    behind SGLang's HTTP API on CPU, ``agentrl engine serve-tiny``: the cluster path without
    GPUs, with ``gpusPerEngine: 0`` and ``trainer.backend: torch``). The same builders make both
    engines' pods; only the container's command and arguments differ."""
    engines: int = Field(default=1, ge=1, le=1024)
    """Number of engine replicas (pods)."""
    gpus_per_engine: int = Field(default=1, ge=0, le=8)
    """GPUs per engine = tensor-parallel size (``--tp-size``); 0 only with ``server: tiny``."""
    context_length: int = Field(default=65536, ge=512, le=1_048_576)
    """Engine-side context cap in tokens (``--context-length``). Mandatory: without it runaway
    generations fill the KV cache and stall every other request on the engine."""
    max_running_requests: int = Field(default=64, ge=1, le=4096)
    """Requests an engine decodes at once (``--max-running-requests``)."""
    mem_fraction_static: float = Field(default=0.85, gt=0.1, lt=1.0)
    """Share of GPU memory for weights plus KV cache (``--mem-fraction-static``)."""
    chunked_prefill_size: int | None = Field(default=None, ge=256, le=1_048_576)
    """``--chunked-prefill-size`` in tokens; unset keeps SGLang's default."""
    kv_cache_dtype: str = Field(default="auto", pattern=r"^(auto|fp8_e4m3|fp8_e5m2|bfloat16)$")
    """``--kv-cache-dtype``."""
    graphs: GraphSpec = Field(default_factory=GraphSpec)
    """HIP graph capture settings (always enabled)."""
    gpu_resource: str = Field(
        default="amd.com/gpu", pattern=r"^([a-z0-9.-]+/)?[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$"
    )
    """Extended resource name the engines request (``amd.com/gpu``; ``nvidia.com/gpu``)."""
    node_selector: dict[LabelStr, LabelStr] = Field(default_factory=dict, max_length=32)
    """Node labels the engines require, e.g. ``amd.com/gpu.product-name: AMD_Instinct_MI355X``."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    """Tolerations for tainted GPU nodes."""
    priority_class_name: str | None = Field(
        default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN
    )
    """PriorityClass of the engine pods. Unset: the operator's ``--engine-priority-class``
    (the Helm chart's ``priorityClasses``), else none. The class must exist: the API server
    refuses a pod naming a missing one."""
    image: str = Field(default="ghcr.io/agentrl/sglang-engine:0.1.0", min_length=1, max_length=512)
    """The engine image (``images/sglang-engine``)."""
    cpu: Quantity = "16"
    """CPU request per engine pod."""
    memory: Quantity = "256Gi"
    """Memory request per engine pod."""
    shm_size: Quantity = "64Gi"
    """Size of the memory-backed /dev/shm."""
    startup_timeout_seconds: int = Field(default=1800, ge=60, le=14400)
    """How long model load plus graph capture may take before the pod is restarted (s)."""
    watchdog: WatchdogSpec = Field(default_factory=WatchdogSpec)
    """The GPU fault watchdog sidecar."""
    extra_args: list[ShortStr] = Field(default_factory=list, max_length=64)
    """Extra ``sglang.launch_server`` flags, appended verbatim. Refused in any spelling argparse
    accepts (``--flag``, ``--flag=value``, an abbreviation): flags that disable graphs, a
    ``--config`` file, and the flags the spec sets itself (``--model-path``, ``--tp-size``,
    ``--context-length``, ``--mem-fraction-static``, ``--cuda-graph-max-bs``, ``--port``, ...;
    set the typed field instead). With ``server: tiny``: only the tiny engine's fault injection,
    ``--flag=value`` each (``--fault-mode``, ``--fault-after-requests``, ``--fault-line``,
    ``--fault-weight-updates-after``; a test and chaos tool, see ``docs/engine.md``)."""

    cel_rules = (
        node_selector_rule("nodeSelector", "node_selector"),
        Rule(
            cel="self.server != 'sglang' || self.gpusPerEngine >= 1",
            message_expression="'gpusPerEngine 0: SGLang needs at least one GPU per engine; set "
            "gpusPerEngine to 1 or more, or server tiny for a CPU engine'",
            field_path=".gpusPerEngine",
            check=lambda s: s.server != EngineServer.SGLANG or s.gpus_per_engine >= 1,
            message=lambda s: (
                "gpusPerEngine 0: SGLang needs at least one GPU per engine; set gpusPerEngine "
                "to 1 or more, or server tiny for a CPU engine"
            ),
        ),
        Rule(
            cel="self.server != 'tiny' || self.gpusPerEngine == 0",
            message_expression="'server tiny runs on CPU and would leave its %d GPUs idle: set "
            "gpusPerEngine to 0'.format([self.gpusPerEngine])",
            field_path=".gpusPerEngine",
            check=lambda s: s.server != EngineServer.TINY or s.gpus_per_engine == 0,
            message=lambda s: (
                f"server tiny runs on CPU and would leave its {s.gpus_per_engine} GPUs idle: "
                "set gpusPerEngine to 0"
            ),
        ),
        Rule(
            cel=f"self.server != 'tiny' || self.extraArgs.all(a, {_CEL_TINY_ARG})",
            message_expression=let(
                "e",
                f"self.extraArgs.filter(a, !{_CEL_TINY_ARG})[0]",
                f"'extraArgs entry %s {_TINY_EXTRA_REFUSAL}'.format([e])",
            ),
            field_path=".extraArgs",
            check=lambda s: (
                s.server != EngineServer.TINY or all(tiny_extra_arg(a) for a in s.extra_args)
            ),
            message=_tiny_extra_message,
            reason="FieldValueForbidden",
        ),
        Rule(
            # refuses any graph-disabling flag in extraArgs, in any spelling argparse accepts
            cel=f"!self.extraArgs.exists(a, {_CEL_GRAPH})",
            message_expression="'--disable-cuda-graph is refused: HIP graphs stay on "  # refused
            "(disabling them halves throughput); remove it from extraArgs'",
            field_path=".extraArgs",
            check=lambda s: not any(disables_graphs(a) for a in s.extra_args),
            message=lambda s: (
                "--disable-cuda-graph is refused: HIP graphs stay on "  # refused
                "(disabling them halves throughput); remove it from extraArgs"
            ),
            reason="FieldValueForbidden",
        ),
        Rule(
            cel=_CEL_MANAGED_RULE,
            message_expression=_CEL_MANAGED_MESSAGE,
            field_path=".extraArgs",
            check=lambda s: not any(managed_flag(a) for a in s.extra_args),
            message=_managed_message,
            reason="FieldValueForbidden",
        ),
        Rule(
            cel="!self.extraArgs.exists(a, "
            + let(
                "n",
                "a.split('=')[0]",
                f"n.size() >= {len(CONFIG_FLAG_MIN_PREFIX)} && '--config'.startsWith(n)",
            )
            + ")",
            message_expression="'extraArgs may not name a --config file: it could disable HIP "
            "graphs or set flags the spec owns out of sight; put its flags in extraArgs'",
            field_path=".extraArgs",
            check=lambda s: not any(sets_config_file(a) for a in s.extra_args),
            message=lambda s: (
                "extraArgs may not name a --config file: it could disable HIP graphs or set "
                "flags the spec owns out of sight; put its flags in extraArgs"
            ),
            reason="FieldValueForbidden",
        ),
        Rule(
            cel=f"!self.extraArgs.exists(a, {_CEL_DECODE_OFF})",
            message_expression=let(
                "e",
                f"self.extraArgs.filter(a, {_CEL_DECODE_OFF})[0]",
                "'extraArgs entry %s turns decode graphs off: HIP graphs stay on (disabling "
                "them halves throughput); remove it from extraArgs'.format([e])",
            ),
            field_path=".extraArgs",
            check=lambda s: not any(turns_decode_graphs_off(a, s.extra_args) for a in s.extra_args),
            message=_decode_graph_message,
            reason="FieldValueForbidden",
        ),
        Rule(
            cel="!has(self.graphs.maxBatchSize) || "
            "self.graphs.maxBatchSize <= self.maxRunningRequests",
            message_expression="'graphs.maxBatchSize (%d) must not exceed maxRunningRequests "
            "(%d): a graph larger than the largest batch is never used'"
            ".format([self.graphs.maxBatchSize, self.maxRunningRequests])",
            field_path=".graphs.maxBatchSize",
            check=lambda s: (
                s.graphs.max_batch_size is None or s.graphs.max_batch_size <= s.max_running_requests
            ),
            message=lambda s: (
                f"graphs.maxBatchSize ({s.graphs.max_batch_size}) must not exceed "
                f"maxRunningRequests ({s.max_running_requests}): a graph larger than the largest "
                "batch is never used"
            ),
        ),
    )
