"""``agentrl validate``, ``agentrl crds`` and ``agentrl docs``: the API's command-line face."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from agentrl.api import crd as crd_mod
from agentrl.api import reference, validation


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-q", "--quiet", is_flag=True, help="Print only errors.")
def validate(files: tuple[Path, ...], quiet: bool) -> None:
    """Check AgentRLJob manifests offline with the API server's rules.

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
            jobs, errors = validation.validate_text(text)
        except validation.ManifestSyntaxError as exc:
            click.echo(f"{path}: {exc}", err=True)
            status = 2
            continue
        if not jobs and not errors:
            click.echo(f"{path}: no documents found", err=True)
            status = max(status, 1)
        for err in errors:
            click.echo(err.render(str(path)), err=True)
        if errors:
            status = max(status, 1)
        elif not quiet:
            names = ", ".join(j.metadata.name for j in jobs)
            click.echo(f"{path}: valid ({names})")
    sys.exit(status)


@click.command()
@click.option("--write", "directory", type=click.Path(file_okay=False, path_type=Path),
              default=None, help=f"Write {crd_mod.CRD_FILENAME} into this directory.")
@click.option("--check", "check_dir", type=click.Path(file_okay=False, path_type=Path),
              default=None, help="Exit 1 if the CRD in this directory differs from the models.")
def crds(directory: Path | None, check_dir: Path | None) -> None:
    """Print (or write, or check) the CRD generated from the models."""
    text = crd_mod.crd_yaml()
    if check_dir is not None:
        target = check_dir / crd_mod.CRD_FILENAME
        current = target.read_text() if target.exists() else ""
        if current != text:
            click.echo(f"{target} is out of date: run 'agentrl crds --write {check_dir}'", err=True)
            sys.exit(1)
        click.echo(f"{target} matches the models")
        return
    if directory is None:
        click.echo(text, nl=False)
        return
    directory.mkdir(parents=True, exist_ok=True)
    (directory / crd_mod.CRD_FILENAME).write_text(text)
    click.echo(f"wrote {directory / crd_mod.CRD_FILENAME}")


@click.command()
@click.option("--write", "path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Write the manifest reference to this file.")
def docs(path: Path | None) -> None:
    """Print (or write) docs/manifest.md, the field reference generated from the models."""
    text = reference.manifest_reference()
    if path is None:
        click.echo(text, nl=False)
        return
    path.write_text(text)
    click.echo(f"wrote {path}")
