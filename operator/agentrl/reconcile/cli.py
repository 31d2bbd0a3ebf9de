"""``agentrl render FILE``: print, as a multi-document YAML stream, exactly the objects the
operator applies for the AgentRLJob(s) in FILE — like ``helm template``.

The manifest is validated first with the API server's rules (``agentrl.api.validation``); an
invalid one exits 1 with ``FILE: spec.path.to.field: what is wrong``. The output is
deterministic: no clock, no cluster, and the uid placeholder unless ``--uid`` is given, so
``agentrl render job.yaml | kubectl apply -f -`` (after setting the uid) and a diff between two
renders are both meaningful.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
import yaml

from agentrl.api.engine_flags import EngineFlagError
from agentrl.api.validation import ManifestSyntaxError, validate_text
from agentrl.reconcile.children import desired_children
from agentrl.reconcile.context import RENDER_UID, BuildContext, Images


def render_objects(
    text: str,
    *,
    source: str = "manifest",
    namespace: str | None = None,
    uid: str | None = None,
    images: Images | None = None,
) -> list[dict[str, Any]]:
    """The children of every AgentRLJob in ``text``, in apply order.

    Raises:
        click.ClickException: naming the file and field when a manifest is invalid.
    """
    try:
        jobs, errors = validate_text(text)
    except ManifestSyntaxError as exc:
        raise click.ClickException(f"{source}: {exc}") from exc
    if errors:
        raise click.ClickException("\n".join(e.render(source) for e in errors))
    objects: list[dict[str, Any]] = []
    for job in jobs:
        ctx = BuildContext.for_job(job, images=images, namespace=namespace, uid=uid)
        try:
            objects += desired_children(job, ctx)
        except EngineFlagError as exc:
            raise click.ClickException(f"{source}: {exc}") from exc
    return objects


def dump_stream(objects: list[dict[str, Any]]) -> str:
    """A multi-document YAML stream, keys in the builders' order."""
    return yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False)


@click.command("render")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path))
@click.option("-n", "--namespace", help="Namespace when the manifest names none [default].")
@click.option("--uid", help=f"The job's uid in ownerReferences [{RENDER_UID}].")
@click.option("--rollout-image", help="Rollout workers' image [spec.trainer.image].")
@click.option("--watchdog-image", help="Engine watchdog sidecar's image [spec.inference.image].")
def render(
    file: Path,
    namespace: str | None,
    uid: str | None,
    rollout_image: str | None,
    watchdog_image: str | None,
) -> None:
    """Print the Kubernetes objects the operator would apply for FILE (- for stdin)."""
    if str(file) == "-":
        text, source = sys.stdin.read(), "<stdin>"
    else:
        try:
            text = file.read_text()
        except OSError as exc:
            raise click.ClickException(f"{file}: cannot read: {exc.strerror}") from exc
        source = str(file)
    images = Images(rollout=rollout_image, watchdog=watchdog_image)
    objects = render_objects(text, source=source, namespace=namespace, uid=uid, images=images)
    click.echo(dump_stream(objects), nl=False)
