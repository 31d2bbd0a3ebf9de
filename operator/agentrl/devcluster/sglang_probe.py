"""Probe of the real SGLang package, run inside the pinned environment
(:data:`agentrl.devcluster.sglang_env.VENV`) as ``python -c <this file> COMMAND PAYLOAD``.

It imports only the standard library at the top (it runs where agentrl is not installed) and
prints one line of JSON. The contract tests compare that JSON with what our code produces; the
probe never sees our code, so what it reports is SGLang's own answer.

Commands:

``describe``
    SGLang's version; its server-argument parser (every option string, its destination,
    choices and arity, from ``ServerArgs.add_cli_args``); the reasoning and tool-call parser
    names it accepts; the HTTP route table of ``sglang.srt.entrypoints.http_server.app``
    (method, path, and the request structure FastAPI builds the body into); the fields of those
    structures (``sglang.srt.managers.io_struct``); the Prometheus names the scheduler's and
    the tokenizer's metrics collectors register; a metrics page those collectors render with
    known values; and the response pieces the handlers build (``finish_reason`` of every finish
    class, ``output_token_logprobs`` entries, the ``meta_info`` and ``/model_info`` keys, the
    weight-update and pause/continue answers).
``parsers``
    Only the version and the two parser-name lists (what ``agentrl.api.sglang_parsers``
    commits).
``mentions``
    PAYLOAD is a list of strings; for each, the installed source files quoting it.
``parse``
    PAYLOAD is a list of argument lists; each is parsed by SGLang's parser. The answer per list
    is ``{"error": message or null, "values": {dest: value}}``.
``convert``
    PAYLOAD is a list of ``{"struct": name, "body": {...}}``; each body is converted into that
    io_struct type as the server would. The
    answer names unknown keys, missing required fields and the conversion error, if any.
    The conversion is FastAPI's: pydantic validation of the JSON body against the type.

``ServerArgs.from_cli_args`` is not called: it builds a ``ServerArgs``, whose ``__post_init__``
needs an accelerator ("No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) or platform plugin is
available" on a CPU machine). ``parse`` stops at the argparse namespace, from which
``from_cli_args`` copies the dataclass fields one to one.
"""

import argparse
import ast
import dataclasses
import inspect
import json
import sys
import typing


def _jsonable(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(getattr(value, "value", value))


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print and exit 2
        raise _Refused(message)


def _parser():
    from sglang.srt.server_args import ServerArgs

    parser = _Parser(prog="sglang.launch_server", add_help=False)
    ServerArgs.add_cli_args(parser)
    return parser


def _options(parser):
    out = []
    for action in parser._actions:
        if not action.option_strings:
            continue
        out.append(
            {
                "strings": list(action.option_strings),
                "dest": action.dest,
                "choices": None if action.choices is None else [str(c) for c in action.choices],
                "nargs": _jsonable(action.nargs),
                "takes_value": action.nargs != 0,
                "action": type(action).__name__,
            }
        )
    return out


def _body_type(endpoint):
    try:
        hints = typing.get_type_hints(endpoint, include_extras=True)
    except Exception:  # a handler annotated with a name it cannot resolve: no typed body
        hints = {}
    for name in inspect.signature(endpoint).parameters:
        hint = hints.get(name)
        if hint is None:
            continue
        if typing.get_origin(hint) is typing.Annotated:
            hint = typing.get_args(hint)[0]
        if typing.get_origin(hint) is typing.Union:
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            hint = args[0] if len(args) == 1 else hint
        module = getattr(hint, "__module__", "")
        if module.startswith("sglang.srt.managers.io_struct"):
            return hint
    return None


def _struct_fields(cls):
    import msgspec

    if dataclasses.is_dataclass(cls):
        return {
            f.name: {
                "required": f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING
            }
            for f in dataclasses.fields(cls)
        }
    return {f.name: {"required": f.required} for f in msgspec.structs.fields(cls)}


def _routes():
    from sglang.srt.entrypoints.http_server import app

    routes, structs = [], {}
    pending = list(app.routes)
    while pending:
        route = pending.pop(0)
        if not hasattr(route, "path"):  # an included router: its own routes count
            router = getattr(route, "router", route)
            pending.extend(getattr(router, "routes", []))
            continue
        methods = sorted(getattr(route, "methods", None) or [])
        endpoint = getattr(route, "endpoint", None)
        body = _body_type(endpoint) if endpoint is not None else None
        if body is not None:
            structs[body.__name__] = _struct_fields(body)
        routes.append(
            {
                "path": route.path,
                "methods": methods,
                "body": None if body is None else body.__name__,
            }
        )
    return routes, structs


def _server_args_without_device(argv):
    """A ``ServerArgs`` holding what ``from_cli_args`` would pass it for ``argv``, without
    running ``__post_init__`` (which needs an accelerator). The collectors only read settings
    from it."""
    from sglang.srt.server_args import ServerArgs

    namespace = _parser().parse_args(argv)
    server_args = object.__new__(ServerArgs)
    for field in dataclasses.fields(ServerArgs):
        if hasattr(namespace, field.name):
            value = getattr(namespace, field.name)
        elif field.default is not dataclasses.MISSING:
            value = field.default
        elif field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
        else:
            continue
        object.__setattr__(server_args, field.name, value)
    return server_args


def _metrics():
    from prometheus_client import REGISTRY, generate_latest
    from sglang.srt.observability import metrics_collector as mc

    scheduler_labels = {
        "model_name": "policy",
        "engine_type": "unified",
        "tp_rank": 0,
        "pp_rank": 0,
        "moe_ep_rank": 0,
    }
    tokenizer_labels = {"model_name": "policy", "engine_type": "unified"}
    server_args = _server_args_without_device(["--model-path", "policy", "--enable-metrics"])
    scheduler = mc.SchedulerMetricsCollector(labels=scheduler_labels, server_args=server_args)
    tokenizer = mc.TokenizerMetricsCollector(labels=tokenizer_labels, server_args=server_args)
    names = sorted(REGISTRY._names_to_collectors)
    # Known values, set on the collectors' own metric objects, for our parsers to read back.
    scheduler.num_running_reqs.labels(**scheduler_labels).set(3)
    scheduler.num_queue_reqs.labels(**scheduler_labels).set(2)
    scheduler.token_usage.labels(**scheduler_labels).set(0.25)
    scheduler.gen_throughput.labels(**scheduler_labels).set(123.5)
    scheduler.num_used_tokens.labels(**scheduler_labels).set(4096)
    scheduler.max_total_num_tokens.labels(**scheduler_labels).set(16384)
    scheduler.cache_hit_rate.labels(**scheduler_labels).set(0.5)
    scheduler.num_retracted_reqs.labels(**scheduler_labels).set(1)
    tokenizer.generation_tokens_total.labels(**tokenizer_labels).inc(17)
    tokenizer.prompt_tokens_total.labels(**tokenizer_labels).inc(11)
    return {"names": names, "exposition": generate_latest(REGISTRY).decode()}


def _function(tree, name):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    raise LookupError(f"no function {name} in the installed source")


def _literal_keys(node):
    return [k.value for k in node.keys if isinstance(k, ast.Constant)]


def _keys_set(tree, function, variable):
    """String keys ``function`` puts into the dict ``variable``: by assigning a dict literal,
    by ``variable.update({...})`` and by ``variable["key"] = ...``, in source order."""
    keys = []
    for sub in ast.walk(_function(tree, function)):
        if (
            isinstance(sub, ast.Assign)
            and isinstance(sub.value, ast.Dict)
            and any(isinstance(t, ast.Name) and t.id == variable for t in sub.targets)
        ):
            keys += _literal_keys(sub.value)
        if isinstance(sub, ast.Assign):
            for target in sub.targets:
                if (
                    isinstance(target, ast.Subscript)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == variable
                    and isinstance(target.slice, ast.Constant)
                ):
                    keys.append(target.slice.value)
        if (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr == "update"
            and isinstance(sub.func.value, ast.Name)
            and sub.func.value.id == variable
            and sub.args
            and isinstance(sub.args[0], ast.Dict)
        ):
            keys += _literal_keys(sub.args[0])
    return list(dict.fromkeys(keys))


def _returned_content_keys(tree, function):
    """Keys of the dict literal a handler answers with (``content = {...}``,
    ``result = {...}`` or ``ORJSONResponse(content={...})``)."""
    keys = _keys_set(tree, function, "content") or _keys_set(tree, function, "result")
    if keys:
        return keys
    for sub in ast.walk(_function(tree, function)):
        if (
            isinstance(sub, ast.keyword)
            and sub.arg == "content"
            and isinstance(sub.value, ast.Dict)
        ):
            return _literal_keys(sub.value)
    return None


def _responses():
    """The pieces of SGLang's answers, from SGLang's own code: the finish classes' ``to_json``,
    the logprob entries ``detokenize_logprob_tokens`` builds, and (read with ``ast`` from the
    installed source, because the handlers need a running tokenizer manager) the keys of the
    dicts the handlers return."""
    import sglang.srt.entrypoints.http_server as http_server
    import sglang.srt.managers.tokenizer_manager as tm
    from sglang.srt.managers import schedule_batch as sb

    finish = [
        sb.FINISH_MATCHED_TOKEN(matched=151645).to_json(),
        sb.FINISH_MATCHED_STR(matched="</tool_call>").to_json(),
        sb.FINISH_LENGTH(length=7).to_json(),
        sb.FINISH_ABORT(message="aborted by pause_generation").to_json(),
        sb.FINISH_ABORT().to_json(),
    ]
    logprobs = tm.TokenizerManager.detokenize_logprob_tokens(
        None, [-0.5, -1.25, -0.125], [11, 12, 13], False
    )
    with open(tm.__file__, encoding="utf-8") as fh:
        tm_tree = ast.parse(fh.read())
    with open(http_server.__file__, encoding="utf-8") as fh:
        http_tree = ast.parse(fh.read())
    return {
        "finish_reasons": _jsonable(finish),
        "output_token_logprobs": _jsonable(logprobs),
        # every key _handle_batch_output may put in meta_info (some only for some requests)
        "meta_info_keys": _keys_set(tm_tree, "_handle_batch_output", "meta_info"),
        "logprob_meta_info_keys": _keys_set(tm_tree, "add_logprob_to_meta_info", "meta_info"),
        "out_dict_keys": _keys_set(tm_tree, "_handle_batch_output", "out_dict"),
        "model_info_keys": _returned_content_keys(http_tree, "model_info"),
        "update_weights_from_disk_keys": _returned_content_keys(
            http_tree, "update_weights_from_disk"
        ),
        "init_weights_update_group_keys": _returned_content_keys(
            http_tree, "init_weights_update_group"
        ),
        "update_weights_from_distributed_keys": _returned_content_keys(
            http_tree, "update_weights_from_distributed"
        ),
        "pause_generation_keys": _returned_content_keys(http_tree, "pause_generation"),
        "continue_generation_keys": _returned_content_keys(http_tree, "continue_generation"),
    }


def parsers(_payload):
    from importlib.metadata import version

    from sglang.srt.function_call.function_call_parser import FunctionCallParser
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    return {
        "sglang": version("sglang"),
        "reasoning_parsers": list(ReasoningParser.DetectorMap),
        "tool_call_parsers": list(FunctionCallParser.ToolCallParserEnum),
    }


def _flush_after_update():
    """What SGLang does about the cache after a weight update: the structs' ``flush_cache``
    default, and whether the scheduler asserts that the flush worked (read with ``ast`` from
    the installed ``weight_updater``) — a flush that only works on an idle scheduler."""
    import msgspec
    from sglang.srt.managers import io_struct
    from sglang.srt.managers import scheduler as scheduler_module
    from sglang.srt.managers.scheduler_components import weight_updater

    defaults = {
        name: next(
            f.default
            for f in msgspec.structs.fields(getattr(io_struct, name))
            if f.name == "flush_cache"
        )
        for name in ("UpdateWeightFromDiskReqInput", "UpdateWeightsFromDistributedReqInput")
    }
    with open(weight_updater.__file__, encoding="utf-8") as fh:
        function = _function(ast.parse(fh.read()), "flush_cache_after_weight_update")
    asserted = [
        ast.unparse(node.test) for node in ast.walk(function) if isinstance(node, ast.Assert)
    ]
    with open(scheduler_module.__file__, encoding="utf-8") as fh:
        flush = _function(ast.parse(fh.read()), "flush_cache")
    only_idle = any(
        isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "is_fully_idle"
        for n in ast.walk(flush)
    )
    return {"defaults": defaults, "asserted": asserted, "flush_only_when_idle": only_idle}


def describe(_payload):
    routes, structs = _routes()
    names = parsers(None)
    return {
        "version": names["sglang"],
        "options": _options(_parser()),
        "reasoning_parsers": names["reasoning_parsers"],
        "tool_call_parsers": names["tool_call_parsers"],
        "routes": routes,
        "structs": structs,
        "metrics": _metrics(),
        "responses": _responses(),
        "flush_after_update": _flush_after_update(),
    }


def parse(payload):
    parser = _parser()
    out = []
    for argv in payload:
        try:
            namespace = parser.parse_args(argv)
        except _Refused as exc:
            out.append({"error": str(exc), "values": None})
            continue
        out.append({"error": None, "values": _jsonable(vars(namespace))})
    return out


def convert(payload):
    from pydantic import TypeAdapter
    from sglang.srt.managers import io_struct

    out = []
    for item in payload:
        cls = getattr(io_struct, item["struct"])
        body = item["body"]
        fields = _struct_fields(cls)
        error = None
        try:
            # What FastAPI does with the body: pydantic validation against the type (io_struct
            # gives its msgspec structs a pydantic schema that ignores unknown keys, which is
            # why they are reported apart).
            TypeAdapter(cls).validate_json(json.dumps(body))
        except Exception as exc:  # the conversion error, whatever its type
            error = f"{type(exc).__name__}: {exc}"
        out.append(
            {
                "unknown": sorted(set(body) - set(fields)),
                "missing": sorted(k for k, f in fields.items() if f["required"] and k not in body),
                "error": error,
            }
        )
    return out


def mentions(payload):
    """For each string of ``payload``: where the installed sglang reads it as an environment
    variable: source files quoting it (``os.getenv("NAME")``), and ``sglang.srt.environ.Envs``
    when that declares it (``NAME = EnvBool(...)``, read by its attribute name)."""
    import pathlib

    import sglang
    from sglang.srt.environ import Envs

    root = pathlib.Path(sglang.__file__).parent
    sources = {p: p.read_text(encoding="utf-8", errors="replace") for p in root.rglob("*.py")}
    out = {}
    for name in payload:
        quoted = (f'"{name}"', f"'{name}'")
        out[name] = sorted(
            str(p.relative_to(root.parent))
            for p, text in sources.items()
            if any(q in text for q in quoted)
        )
        if name in vars(Envs):
            out[name].append("sglang.srt.environ.Envs")
    return out


COMMANDS = {
    "describe": describe,
    "parsers": parsers,
    "parse": parse,
    "convert": convert,
    "mentions": mentions,
}

if __name__ == "__main__":
    import contextlib
    import io
    import logging

    logging.disable(logging.CRITICAL)
    command, raw = sys.argv[1], sys.argv[2]
    with contextlib.redirect_stdout(io.StringIO()):  # SGLang prints deprecation notes
        result = COMMANDS[command](json.loads(raw))
    print(json.dumps(result))
