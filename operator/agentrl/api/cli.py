"""``agentrl validate``, ``agentrl crds`` and ``agentrl docs``: the API's command-line face."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

import click

from agentrl.api import crd as crd_mod
from agentrl.api import reference, validation


def make_validate(checks: Sequence[validation.JobCheck]) -> click.Command:
    """``agentrl validate`` running the API server's rules and then ``checks`` on every valid
    job (``agentrl.sim.cli`` adds the trainer memory estimate; the registered verb is that
    one, see ``agentrl.cli.COMMANDS``)."""

    @click.command("validate")
    @click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
    @click.option("-q", "--quiet", is_flag=True, help="Print only errors.")
    def validate(files: tuple[Path, ...], quiet: bool) -> None:
        """Check AgentRLJob manifests offline with the API server's rules, and what the API
        server cannot check: a model path that repeats the PVC's mount point, and whether the
        trainer fits its GPUs at rollout.maxTrajectoryTokens (models the planner knows).

        Prints FILE: spec.path.to.field: what is wrong and what is allowed. Exit status: 0 all
        valid, 1 some manifest invalid, 2 some file unreadable (missing, or not YAML).
        """
        status = 0
        for path in files:
            try:
                text = path.read_text() if str(path) != "-" else sys.stdin.read()
            except OSError as exc:
                click.echo(f"{path}: cannot read: {exc.strerror or exc}", err=True)
                status = 2
                continue
            try:
                docs = validation.load_documents(text)
            except validation.ManifestSyntaxError as exc:
                click.echo(f"{path}: {exc}", err=True)
                status = 2
                continue
            if not docs:
                click.echo(f"{path}: no documents found", err=True)
                status = max(status, 1)
            errors: list[validation.FieldError] = []
            notes: list[str] = []
            names: list[str] = []
            for index, doc in enumerate(docs):
                job, found = validation.validate_document(doc, index)
                errors += found
                if job is None:
                    continue
                names.append(job.metadata.name)
                for check in checks:
                    result = check(job)
                    errors += [dataclasses.replace(e, document=index) for e in result.errors]
                    notes += result.notes
            for err in errors:
                click.echo(err.render(str(path)), err=True)
            if errors:
                status = max(status, 1)
            elif not quiet and docs:
                for note in notes:
                    click.echo(f"{path}: note: {note}")
                click.echo(f"{path}: valid ({', '.join(names)})")
        sys.exit(status)

    return validate


#: The API's own checks (``agentrl validate`` without the planner's).
validate = make_validate([])


@click.command()
@click.option(
    "--write",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help=f"Write {crd_mod.CRD_FILENAME} into this directory.",
)
@click.option(
    "--check",
    "check_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Exit 1 if the CRD in this directory differs from the models.",
)
@click.option(
    "--helm",
    is_flag=True,
    default=False,
    help="The Helm chart's template instead (charts/agentrl/templates/crds/).",
)
def crds(directory: Path | None, check_dir: Path | None, helm: bool) -> None:
    """Print (or write, or check) the CRD generated from the models."""
    text = _helm_template() if helm else crd_mod.crd_yaml()
    if check_dir is not None:
        target = check_dir / crd_mod.CRD_FILENAME
        current = target.read_text() if target.exists() else ""
        if current != text:
            flag = "--helm " if helm else ""
            click.echo(
                f"{target} is out of date: run 'agentrl crds {flag}--write {check_dir}'", err=True
            )
            sys.exit(1)
        click.echo(f"{target} matches the models")
        return
    if directory is None:
        click.echo(text, nl=False)
        return
    directory.mkdir(parents=True, exist_ok=True)
    (directory / crd_mod.CRD_FILENAME).write_text(text)
    click.echo(f"wrote {directory / crd_mod.CRD_FILENAME}")


#: Spec defaults a platform team sets once for every job (Helm value ``jobDefaults.KEY``):
#: (component, field) -> KEY; component "" is a field of ``spec`` itself. They become the
#: CRD's schema defaults, so the API server applies them and ``kubectl get arj -o yaml`` shows
#: the effective value.
HELM_JOB_DEFAULTS = {
    ("inference", "image"): "engineImage",
    ("inference", "gpuResource"): "gpuResource",
    ("inference", "nodeSelector"): "gpuNodeSelector",
    ("inference", "tolerations"): "gpuTolerations",
    ("trainer", "image"): "trainerImage",
    ("sandbox", "nodeSelector"): "sandboxNodeSelector",
    ("sandbox", "tolerations"): "sandboxTolerations",
    ("dataset", "imagePullSecrets"): "imagePullSecrets",
    ("", "imagePullSecrets"): "workloadImagePullSecrets",
}


def _placeholder(key: str) -> str:
    return f"HELMJOBDEFAULT0{key}0"


def _helm_template() -> str:
    """The CRD as the chart's template: the same object plus ``helm.sh/resource-policy: keep``
    (uninstall never deletes the jobs), rendered only when ``crds.install`` is true, with the
    defaults of :data:`HELM_JOB_DEFAULTS` taken from the chart's ``jobDefaults`` values."""
    import copy

    import yaml

    body = copy.deepcopy(crd_mod.crd())
    body["metadata"].setdefault("annotations", {})["helm.sh/resource-policy"] = "keep"
    spec = body["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for (component, field), key in HELM_JOB_DEFAULTS.items():
        schema = spec["properties"][component] if component else spec
        schema["properties"][field]["default"] = _placeholder(key)
        if component:  # the component's whole-object default carries the field too
            schema["default"][field] = _placeholder(key)
    text = yaml.safe_dump(body, sort_keys=False, width=100, allow_unicode=True)
    if "{{" in text:  # Helm would read it as a template action
        raise click.ClickException("the CRD contains '{{', which Helm cannot carry verbatim")
    for key in HELM_JOB_DEFAULTS.values():
        # toJson: a quoted string, or a flow-style map/list, both valid YAML
        text = text.replace(_placeholder(key), f"{{{{ toJson .Values.jobDefaults.{key} }}}}")
    return (
        "# GENERATED by `agentrl crds --helm --write charts/agentrl/templates/crds/` from\n"
        "# operator/agentrl/api/. Do not edit: change the models and regenerate.\n"
        "{{- if .Values.crds.install }}\n" + text + "{{- end }}\n"
    )


@click.command()
@click.option(
    "--write",
    "path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the manifest reference to this file.",
)
def docs(path: Path | None) -> None:
    """Print (or write) docs/manifest.md, the field reference generated from the models."""
    text = reference.manifest_reference()
    if path is None:
        click.echo(text, nl=False)
        return
    path.write_text(text)
    click.echo(f"wrote {path}")
