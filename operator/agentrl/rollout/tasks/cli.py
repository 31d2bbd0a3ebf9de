"""``agentrl tasks``: generate the bundled toy dataset, validate any dataset in sandboxes, write
expert traces of the toy tasks for a warm start (``traces``), list a
dataset's images for pre-pulling.

Callers: the CLI root (``agentrl.cli`` names ``agentrl.rollout.tasks.cli:tasks``).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from agentrl.api import AgentRLJob
from agentrl.api.sandbox import SandboxSpec
from agentrl.api.wire import (
    CONFIG_RUNTIME_KEY,
    SandboxPods,
    WireSkewError,
    config_map_name,
    receive_runtime,
)
from agentrl.rollout.tasks import generate_toy_tasks, load_dataset, task_images
from agentrl.rollout.tasks.model import MissingTemplateError, Task, with_e2b_templates

if TYPE_CHECKING:
    from agentrl.api.model import ModelSpec
    from agentrl.rollout.validate import TaskReport


@click.group()
def tasks() -> None:
    """Dataset tools: generate the bundled toy tasks, validate a dataset."""


@tasks.command()
@click.option(
    "--out",
    "out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the tasks as JSONL here (default: stdout).",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed of the candidate edits' selection and order.",
)
@click.option(
    "--repos",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Also write each task's repository (buggy) into DIR/<task id>/ to look at.",
)
def generate(out: Path | None, seed: int, repos: Path | None) -> None:
    """Generate the bundled toy dataset (small Python repositories with real bugs and tests)."""
    toy = generate_toy_tasks(seed)
    lines = "".join(task.model_dump_json() + "\n" for task in toy)
    if out is None:
        sys.stdout.write(lines)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(lines, encoding="utf-8")
        click.echo(f"wrote {len(toy)} tasks to {out}", err=True)
    if repos is not None:
        for task in toy:
            for rel, content in task.files.items():
                target = repos / task.id / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(content, encoding="utf-8")
        click.echo(f"wrote {len(toy)} repositories under {repos}", err=True)


@tasks.command()
@click.argument("dataset", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--manifest",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Print this AgentRLJob manifest with the images added to spec.sandbox.prePull.images "
    "(and pre-pulling enabled) instead of the list.",
)
def images(dataset: Path, manifest: Path | None) -> None:
    """The images DATASET's tasks run in, each once, in task order: one per line, or merged
    into a manifest's ``spec.sandbox.prePull.images``. The operator pre-pulls what that field
    lists (it cannot read the dataset, which lives where the rollout pods see it):
    ``agentrl tasks images d.jsonl --manifest job.yaml | kubectl apply -f -``."""
    import yaml

    found = task_images(load_dataset(dataset))
    if manifest is None:
        for image in found:
            click.echo(image)
        click.echo(f"{len(found)} images", err=True)
        return
    doc = yaml.safe_load(manifest.read_text(encoding="utf-8"))
    pre_pull = doc.setdefault("spec", {}).setdefault("sandbox", {}).setdefault("prePull", {})
    listed = list(pre_pull.get("images") or [])
    pre_pull["images"] = list(dict.fromkeys([*listed, *found]))
    pre_pull["enabled"] = True
    added = len(pre_pull["images"]) - len(listed)
    click.echo(yaml.safe_dump(doc, sort_keys=False), nl=False)
    click.echo(f"{added} images added to spec.sandbox.prePull.images", err=True)


def applied_sandbox_pods(
    job: str, namespace: str | None = None, *, kubeconfig: str | None = None
) -> SandboxPods:
    """The sandbox pod template the operator wrote into the applied job's ``runtime.yaml``: what
    its rollout workers create (owned by the job, under its NetworkPolicy). ``namespace``:
    default the kubeconfig's.

    Raises:
        agentrl.api.wire.WireSkewError: an operator more than one minor version apart wrote it.
        LookupError: the job's ConfigMap is not there (the job is not applied), or the job runs
            another provider.
    """
    import yaml
    from lightkube import ApiError, Client, KubeConfig
    from lightkube.resources.core_v1 import ConfigMap

    config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
    client = Client(config=config, namespace=namespace)
    name = config_map_name(job)
    where = namespace or client.namespace
    try:
        found = client.get(ConfigMap, name, namespace=where)
    except ApiError as exc:
        if exc.status.code != 404:
            raise
        raise LookupError(
            f"job {job} is not applied in namespace {where} (no ConfigMap {name})"
        ) from exc
    runtime = receive_runtime(
        yaml.safe_load((found.data or {}).get(CONFIG_RUNTIME_KEY) or "{}"),
        reader="agentrl tasks validate",
    ).value
    if runtime.sandbox.pods is None:
        raise LookupError(
            f"job {job} runs spec.sandbox.provider {runtime.sandbox.provider}: its ConfigMap "
            "has no sandbox pod template"
        )
    return runtime.sandbox.pods


def with_provider_templates(items: list[Task], sandbox: SandboxSpec) -> list[Task]:
    """The tasks as ``sandbox``'s provider runs them: on E2B, each with the template of its
    image (``spec.sandbox.e2b.templates``), a task whose image has none refused before anything
    runs (naming the task, its image and the field); elsewhere unchanged."""
    if sandbox.provider != "e2b":
        return items
    templates = sandbox.e2b.templates if sandbox.e2b is not None else {}
    try:
        return with_e2b_templates(items, templates)
    except MissingTemplateError as exc:
        raise click.ClickException(str(exc)) from exc


@tasks.command()
@click.argument("dataset", required=False)
@click.option(
    "--provider",
    type=click.Choice(["local", "kubernetes", "e2b"]),
    default="local",
    show_default=True,
    help="Where the sandboxes run.",
)
@click.option(
    "--manifest",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="AgentRLJob manifest whose spec.sandbox configures the provider. For kubernetes the "
    "job must be applied (spec.suspend: true is enough): its sandbox pods are made from the pod "
    "template the operator writes into the job's ConfigMap.",
)
@click.option(
    "--namespace",
    default=None,
    help="kubernetes: the applied job's namespace (default: the manifest's, else the "
    "kubeconfig's).",
)
@click.option(
    "--kubeconfig",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="kubernetes: kubeconfig file (default: $KUBECONFIG, ~/.kube/config or in-cluster).",
)
@click.option(
    "--concurrency", type=int, default=4, show_default=True, help="Tasks validated at once."
)
@click.option(
    "--timeout",
    type=float,
    default=600.0,
    show_default=True,
    help="Seconds for each setup, solution and test run.",
)
@click.option(
    "--check-candidates/--no-check-candidates",
    default=False,
    show_default=True,
    help="Toy tasks: also check that every decoy candidate edit scores 0.",
)
@click.option("--max-tasks", type=int, default=None, help="Validate only the first N tasks.")
@click.option(
    "--warm-start",
    "warm_start",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Check this warm-start JSONL file (default: the manifest's "
    "spec.trainer.warmStart.dataset, when it is on this machine).",
)
@click.option(
    "--model",
    "model_dir",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="Warm start: the model directory whose tokenizer and chat template render the "
    "conversations (default: the manifest's spec.model.source.path).",
)
@click.option(
    "--tool-call-parser",
    default=None,
    help="Warm start: the job's spec.model.toolCallParser (default: the manifest's); without "
    "one the job offers no tools.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON report per task.")
def validate(
    dataset: str | None,
    provider: str,
    manifest: Path | None,
    namespace: str | None,
    kubeconfig: str | None,
    concurrency: int,
    timeout: float,
    check_candidates: bool,
    max_tasks: int | None,
    warm_start: Path | None,
    model_dir: str | None,
    tool_call_parser: str | None,
    as_json: bool,
) -> None:
    """Check DATASET: each task's reference solution must score 1 and the untouched repository
    0, in sandboxes. DATASET is a task JSONL file, a SWE-bench/SWE-smith JSONL file, a Harbor
    task directory, or "toy" for the bundled set. Exits 1 when any task fails.

    With a warm-start file (``--warm-start``, or the manifest's ``spec.trainer.warmStart``),
    first check its conversations as the trainer will read them, rendered with the job's chat
    template and tools: each refused line is printed as FILE:LINE: reason, then a summary;
    exits 1 when any line is refused. DATASET may then be left out."""
    from agentrl.rollout.validate import validate_dataset
    from agentrl.sandbox import open_provider

    job = _read_manifest(manifest)
    warm_ok = check_warm_start(
        job,
        warm_start=warm_start,
        model_dir=model_dir,
        tool_call_parser=tool_call_parser,
        as_json=as_json,
        dataset_given=dataset is not None,
    )
    if dataset is None:
        _warm_start_only(warm_ok)
        return
    if provider != "local" and manifest is None:
        raise click.UsageError(
            f"--provider {provider} needs --manifest: the job's spec.sandbox (and, for "
            "kubernetes, its hardened pod template) configures the sandboxes"
        )
    items = generate_toy_tasks() if dataset == "toy" else load_dataset(dataset)
    in_images = [t.id for t in items if t.source in ("swebench", "swesmith")]
    if provider == "local" and in_images:
        raise click.UsageError(
            f"{dataset} holds SWE-bench/SWE-smith instances ({in_images[0]}, ...), which run in "
            "their own images: local sandboxes have none; use --provider kubernetes --manifest "
            "job.yaml"
        )
    if max_tasks is not None:
        items = items[:max_tasks]
    pods = None
    if job is not None:
        sandbox_spec = job.spec.sandbox.model_copy(update={"provider": provider})
        if provider == "kubernetes":
            namespace = namespace or job.metadata.namespace
            try:
                pods = applied_sandbox_pods(job.metadata.name, namespace, kubeconfig=kubeconfig)
            except LookupError as exc:
                raise click.ClickException(
                    f"{exc}. --provider kubernetes makes sandbox pods from the template the "
                    f"operator writes into the job's ConfigMap: kubectl apply -f {manifest} "
                    "first (spec.suspend: true keeps it from starting engines and the trainer), "
                    "with spec.sandbox.provider: kubernetes; or pass --namespace"
                ) from exc
            except WireSkewError as exc:
                raise click.ClickException(str(exc)) from exc
            namespace = namespace or pods.template["metadata"].get("namespace")
    else:
        sandbox_spec = SandboxSpec(provider=provider)  # type: ignore[arg-type]
    items = with_provider_templates(items, sandbox_spec)

    async def run() -> list:  # type: ignore[type-arg]
        sandboxes = open_provider(
            sandbox_spec, pods=pods, namespace=namespace, kubeconfig=kubeconfig
        )
        try:
            return await validate_dataset(
                sandboxes,
                items,
                concurrency=concurrency,
                timeout=timeout,
                check_candidates=check_candidates,
            )
        finally:
            await sandboxes.aclose()

    reports = asyncio.run(run())
    bad = [r for r in reports if not r.ok]
    _print_reports(reports, as_json=as_json)
    click.echo(f"{len(reports) - len(bad)}/{len(reports)} tasks valid", err=True)
    if bad or warm_ok is False:
        raise SystemExit(1)


def _print_reports(reports: list[TaskReport], *, as_json: bool) -> None:
    """One JSON object per task, or a FAIL line per failed check."""
    for report in reports:
        if as_json:
            click.echo(
                json.dumps(
                    {
                        "task": report.task_id,
                        "ok": report.ok,
                        "checks": [c.model_dump() for c in report.checks],
                    }
                )
            )
        elif not report.ok:
            for check in report.checks:
                if check.problem is not None:
                    click.echo(f"FAIL {report.task_id} [{check.variant}]: {check.problem}")


def _read_manifest(manifest: Path | None) -> AgentRLJob | None:
    import yaml

    if manifest is None:
        return None
    return AgentRLJob.model_validate(yaml.safe_load(manifest.read_text(encoding="utf-8")))


def _warm_start_only(warm_ok: bool | None) -> None:
    """Exit as the warm-start check says: 1 when a line was refused, a usage error when there
    was nothing to check at all."""
    if warm_ok is None:
        raise click.UsageError(
            "give DATASET, or a warm-start file to check (--warm-start, or a --manifest with "
            "spec.trainer.warmStart)"
        )
    if not warm_ok:
        raise SystemExit(1)


@tasks.command()
@click.argument("manifest", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Write the conversations here (JSONL: one {messages, tools} object per line).",
)
@click.option("--concurrency", type=int, default=4, show_default=True, help="Tasks solved at once.")
@click.option(
    "--solver",
    type=click.Choice(["apply_edit", "editor"]),
    default="apply_edit",
    show_default=True,
    help="Fix with the toy tasks' apply_edit tool (what the job's rollout offers on them), or "
    "view and str_replace with str_replace_editor (the tools every dataset has).",
)
def traces(manifest: Path, out: Path, concurrency: int, solver: str) -> None:
    """Write expert conversations for the training split of MANIFEST's toy tasks: a scripted
    solver acting through spec.model.toolCallParser's syntax, the SWE tools running its calls
    in local sandboxes, kept when the task's verifier scores 1 (a warm-start dataset).
    Held-out tasks (spec.dataset.heldOutFraction) are never solved. Exits 1 when a task could
    not be turned into a resolved conversation."""
    from agentrl.api.model import DatasetFormat
    from agentrl.api.validation import load_job
    from agentrl.rollout.caps import EpisodeCaps
    from agentrl.rollout.tasks import load_tasks, offered_edits, split_held_out
    from agentrl.rollout.tasks.traces import write_traces
    from agentrl.rollout.toolcalls import UnknownToolCallParser, get_parser
    from agentrl.sandbox import open_provider

    job = load_job(manifest.read_text(encoding="utf-8"))
    spec = job.spec
    if spec.dataset.format != DatasetFormat.TOY:
        raise click.UsageError(
            f"spec.dataset.format is {spec.dataset.format.value}: the scripted solver knows the "
            "bundled toy tasks only (format: toy)"
        )
    if spec.model.tool_call_parser is None:
        raise click.UsageError(
            "spec.model.toolCallParser is not set: traces are written in the syntax of the "
            "job's tool-call parser (e.g. qwen25 or qwen3_coder)"
        )
    try:
        parser = get_parser(spec.model.tool_call_parser)
    except UnknownToolCallParser as exc:
        raise click.UsageError(str(exc)) from exc
    train, held_out = split_held_out(
        load_tasks(spec.dataset), spec.dataset.held_out_fraction, spec.dataset.seed
    )
    sandbox_spec = spec.sandbox.model_copy(update={"provider": "local"})

    async def run() -> Any:
        provider = open_provider(sandbox_spec)
        try:
            return await write_traces(
                train,
                provider,
                parser,
                EpisodeCaps.from_spec(spec),
                out,
                concurrency=concurrency,
                edits=offered_edits(spec.dataset) if solver == "apply_edit" else (),
            )
        finally:
            await provider.aclose()

    report = asyncio.run(run())
    for task_id, reason in report.failed.items():
        click.echo(f"{task_id}: {reason}", err=True)
    click.echo(
        f"wrote {report.written} conversations to {out} ({len(train)} training tasks; "
        f"{len(held_out)} held out, not solved)",
        err=True,
    )
    if report.failed:
        sys.exit(1)


def check_warm_start(
    job: AgentRLJob | None,
    *,
    warm_start: Path | None,
    model_dir: str | None,
    tool_call_parser: str | None,
    as_json: bool,
    dataset_given: bool,
) -> bool | None:
    """Check the warm-start file of ``validate``: ``warm_start``, else the manifest's
    ``spec.trainer.warmStart.dataset`` when it is on this machine, rendered with the manifest's
    model (or ``model_dir``, ``tool_call_parser``). Prints every refused line
    (``FILE:LINE: reason``, or one JSON object each) and a summary; True when every line is
    good, False when one is not, None when there is no file to check."""
    from agentrl.api.trainer import WarmStartSpec
    from agentrl.rollout.conversations import job_turn_tokenizer, read_warm_start
    from agentrl.rollout.hf_tokenizer import TokenizerConfigError
    from agentrl.rollout.tasks import offered_edits

    path = _warm_start_file(job, warm_start, dataset_given=dataset_given)
    if path is None:
        return None
    spec = job.spec.trainer.warm_start if job is not None else None
    settings = spec or WarmStartSpec(dataset=str(path))
    try:
        turns = job_turn_tokenizer(
            _warm_start_model(job, model_dir, tool_call_parser),
            model_dir=model_dir,
            # the tools the job's rollout offers: apply_edit too on the toy tasks
            edits=offered_edits(job.spec.dataset) if job is not None else (),
        )
    except TokenizerConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    report = read_warm_start(path, turns, tokens_per_batch=settings.tokens_per_batch)
    for error in report.errors:
        if as_json:
            click.echo(json.dumps({"warmStart": str(path), **error.model_dump()}))
        else:
            click.echo(error.render(path))
    count = len(report.conversations)
    click.echo(
        f"warm start {path}: {count}/{count + len(report.errors)} conversations valid, "
        f"{report.tokens} tokens, {report.trained_tokens} of them assistant tokens (trained on)",
        err=True,
    )
    return not report.errors


def _warm_start_file(
    job: AgentRLJob | None, warm_start: Path | None, *, dataset_given: bool
) -> Path | None:
    """The warm-start file to check: ``--warm-start``, else the manifest's when it is on this
    machine (a note says it is not checked otherwise; with no DATASET either, a usage error)."""
    from agentrl.rollout.conversations import WARM_START_FIELD

    spec = job.spec.trainer.warm_start if job is not None else None
    if warm_start is not None or spec is None:
        return warm_start
    if Path(spec.dataset).is_file():
        return Path(spec.dataset)
    message = (
        f"{WARM_START_FIELD}.dataset {spec.dataset} is not on this machine, so it is not "
        "checked: pass --warm-start with a copy of it (and --model with the model directory)"
    )
    if not dataset_given:
        raise click.UsageError(message)
    click.echo(f"note: {message}", err=True)
    return None


def _warm_start_model(
    job: AgentRLJob | None, model_dir: str | None, tool_call_parser: str | None
) -> ModelSpec:
    """``spec.model`` as the warm-start check renders with it: the manifest's, or a model at
    ``model_dir``; ``tool_call_parser`` replaces its parser."""
    from agentrl.api.model import ModelSource, ModelSpec

    if job is not None:
        model = job.spec.model
    elif model_dir is not None:
        model = ModelSpec(source=ModelSource(path=model_dir))
    else:
        raise click.UsageError(
            "--warm-start needs the model: --model DIR (the model directory whose tokenizer "
            "and chat template the rollout renders with) or --manifest job.yaml"
        )
    if model_dir is None and model.source.pvc is not None:
        raise click.UsageError(
            f"spec.model.source.path {model.source.path} is inside PVC {model.source.pvc}: pass "
            "--model with the model directory on this machine"
        )
    if tool_call_parser is not None:
        # Not validated here: the tokenizer's parser lookup names the parsers there are.
        model = model.model_copy(update={"tool_call_parser": tool_call_parser})
    return model


@tasks.command("convert-traces")
@click.option(
    "--from",
    "source",
    type=click.Choice(["openhands", "swe-smith", "swe-agent-text"]),
    required=True,
    help="The trajectory format: OpenHands native function calling (nebius "
    "SWE-rebench-openhands, SWE-Gym OpenHands-Sampled), <function=...> text blocks (SWE-smith "
    "xml split, R2E-Gym SFT), or SWE-agent text actions (nebius SWE-agent-trajectories).",
)
@click.argument(
    "source_file", metavar="IN", type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Write the conversations here (JSONL: one {messages, tools} object per line).",
)
@click.option(
    "--include-unresolved",
    is_flag=True,
    help="Also convert the rows the source marks unresolved (resolved/target false).",
)
@click.option(
    "--keep-system-prompt",
    is_flag=True,
    help="Keep the source's system prompt (default: the rollout's, which the job trains with).",
)
def convert_traces(
    source: str, source_file: Path, out: Path, include_unresolved: bool, keep_system_prompt: bool
) -> None:
    """Convert a public SWE trajectory set IN (JSONL rows, or a JSON array of rows) into
    warm-start conversations that call the job's tools (bash, str_replace_editor, submit).
    Each row that cannot be converted faithfully is printed as IN:ROW: reason; then a summary.
    Exits 1 when nothing was converted. Check the result with the job's template and parser:
    agentrl tasks validate --manifest job.yaml --warm-start OUT."""
    from agentrl.rollout.trace_converters import ConvertOptions, convert

    options = ConvertOptions(
        include_unresolved=include_unresolved, keep_system_prompt=keep_system_prompt
    )
    with source_file.open(encoding="utf-8") as lines:
        report = convert(source, lines, options)
    for skipped in report.skipped:
        click.echo(skipped.render(source_file), err=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(c.jsonl() + "\n" for c in report.conversations), encoding="utf-8")
    click.echo(
        f"wrote {len(report.conversations)}/{report.rows} rows of {source_file} to {out}: "
        f"{len(report.skipped)} skipped (above), {report.unresolved} unresolved left out"
        + ("" if include_unresolved else " (--include-unresolved keeps them)"),
        err=True,
    )
    if not report.conversations:
        sys.exit(1)
