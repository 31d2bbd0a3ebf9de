"""``agentrl dev``: developer tools, starting with the local control plane.

``agentrl dev cluster up | down | status | env | build``.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

import click

from agentrl.devcluster import binaries, versions
from agentrl.devcluster.cluster import (
    DEFAULT_NAME,
    DEFAULT_REAL_NODES,
    MAX_REAL_NODES,
    ClusterError,
    LocalCluster,
)
from agentrl.devcluster.processes import PortInUseError
from agentrl.devcluster.profile import ClusterProfile


@click.group()
def dev() -> None:
    """Local development tools."""


@dev.command("prepare")
@click.option(
    "--only",
    multiple=True,
    help="Run only this step (repeatable); `agentrl dev prepare --list` names them.",
)
@click.option("--list", "list_steps", is_flag=True, help="List the steps and whether each is done.")
@click.option(
    "--check", is_flag=True, help="Build nothing: exit 1 unless every step is already done."
)
def prepare_cmd(only: tuple[str, ...], list_steps: bool, check: bool) -> None:
    """Build or install everything the tests and the local cluster need (before any test).

    The README's test command runs this between lint and pytest. Each step is skipped when
    its result is already cached; an interrupted step resumes where its caches left it.
    """
    from agentrl.devcluster import prepare

    if list_steps:
        for step in prepare.steps():
            state = "done" if step.is_done() else "to do"
            click.echo(f"{step.name:<12} {state:<6} {step.describe}")
        return
    try:
        spent = prepare.prepare(only, check_only=check)
    except prepare.PrepareError as exc:
        _fail(str(exc))
        return
    click.echo(f"prepared in {spent:.0f}s", err=True)


@dev.command("images")
@click.option(
    "--only",
    multiple=True,
    type=click.Choice(["operator", "rocm-trainer", "sglang-engine", "sandbox"]),
    help="Build only this image (repeatable).",
)
@click.option("--force", is_flag=True, help="Rebuild even up-to-date images (layers stay cached).")
@click.option("--list", "list_images", is_flag=True, help="List the images and their archives.")
def images_cmd(only: tuple[str, ...], force: bool, list_images: bool) -> None:
    """Build the images (cpu flavour: a debootstrap Debian base, torch from PyPI) with buildah
    into OCI archives under ~/.cache/agentrl/images; only what is missing or out of date."""
    from agentrl.devcluster import images

    if not list_images:
        try:
            spent = images.build(list(only) or None, force=force)
        except images.ImageError as exc:
            _fail(str(exc))
            return
        for step, seconds in spent.items():
            click.echo(f"built {step:<14} {seconds:7.0f}s", err=True)
    for name, image in images.IMAGES.items():
        if images.is_current(image):
            size = image.archive.stat().st_size / 2**30
            click.echo(f"{image.ref:<42} {size:6.2f} GiB  {image.archive}")
        else:
            state = "out of date" if images.finished(image) else "not built"
            click.echo(f"{image.ref:<42} {state:>11}  (agentrl dev images --only {name})")
    usage = images.disk_usage()
    click.echo(
        f"disk: archives {usage['archives'] / 2**30:.2f} GiB, "
        f"buildah storage {usage['storage'] / 2**30:.2f} GiB",
        err=True,
    )


@dev.group()
def cluster() -> None:
    """A real Kubernetes control plane on loopback with simulated AMD GPU nodes (kwok) and
    real worker nodes (kubelet, containerd, kube-proxy) that run containers.

    kube-apiserver, etcd, kube-controller-manager, kube-scheduler, kwok, the kubelet and
    kube-proxy, built from pinned upstream Go modules into ~/.cache/agentrl (or taken from
    KUBEBUILDER_ASSETS); containerd, runc and the CNI plugins from Debian packages.
    """


_name = click.option(
    "--name", default=DEFAULT_NAME, show_default=True, help="Cluster name (its state directory)."
)
_port = click.option(
    "--port",
    type=click.IntRange(1024, 65529),
    default=None,
    help="Base port: kube-apiserver listens here, the other components on the next 5 ports "
    "[default: 16443, or the port the cluster was created with].",
)


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


@cluster.command()
@_name
@_port
@click.option(
    "--gpu-nodes",
    type=click.IntRange(0, 1000),
    default=None,
    help="Simulated MI355X GPU nodes (8 × amd.com/gpu each) [default: 4].",
)
@click.option(
    "--cpu-nodes",
    type=click.IntRange(0, 1000),
    default=None,
    help="Simulated CPU nodes for sandboxes [default: 2].",
)
@click.option(
    "--real-nodes",
    type=click.IntRange(0, MAX_REAL_NODES),
    default=None,
    help="Real worker nodes (kubelet + containerd + kube-proxy in a network namespace each; "
    "pods there run containers) [default: "
    f"{DEFAULT_REAL_NODES}, or as the cluster was created]. 0: simulated nodes only.",
)
@click.option(
    "--project-images/--no-project-images",
    default=True,
    show_default=True,
    help="Import the project's image archives (`agentrl dev images`, ~13 GB on the node once "
    "unpacked) into the real nodes; without them a node holds only its own images (pause, "
    "coredns, busybox) and `agentrl dev cluster load` imports the rest later.",
)
@click.option(
    "--profile",
    "profile_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="YAML cluster profile (node shapes).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(5, 3600),
    default=180.0,
    show_default=True,
    help="Seconds to wait for each component.",
)
def up(
    name: str,
    port: int | None,
    gpu_nodes: int | None,
    cpu_nodes: int | None,
    real_nodes: int | None,
    project_images: bool,
    profile_path: Path | None,
    timeout: float,
) -> None:
    """Start the cluster (idempotent: on a running cluster only the nodes are re-applied)."""
    try:
        profile = ClusterProfile.load(profile_path) if profile_path else ClusterProfile()
    except (ValueError, OSError) as exc:
        _fail(f"--profile {profile_path}: {exc}")
        return
    profile = profile.with_counts(gpu_nodes=gpu_nodes, cpu_nodes=cpu_nodes)
    try:
        local = LocalCluster(name, port=port)
        bins = binaries.ensure(echo=True)
        local.up(
            profile,
            bins=bins,
            echo=lambda m: click.echo(m, err=True),
            timeout=timeout,
            real_nodes=real_nodes,
            project_images=project_images,
        )
    except PortInUseError as exc:
        _fail(str(exc))
        return
    except (ClusterError, binaries.BinaryError) as exc:
        _fail(str(exc))
        return
    reals = [n.name for n in local.real_nodes() if n.running()]
    click.echo(
        f"\nKubernetes v{versions.KUBERNETES} with {profile.gpu.count} GPU node(s) "
        f"({profile.gpu.gpus} × {profile.gpu.gpu_resource} each), {profile.cpu.count} CPU "
        f"node(s) and {len(reals)} real node(s) {' '.join(reals)} is running at "
        f"{local.server}.\n"
        f'Use it:\n  eval "$(agentrl dev cluster env{_name_flag(name)})"\n'
        f"  kubectl get nodes -L amd.com/gpu.product-name\n"
        f"Stop it:\n  agentrl dev cluster down{_name_flag(name)}"
    )


def _name_flag(name: str) -> str:
    return "" if name == DEFAULT_NAME else f" --name {shlex.quote(name)}"


@cluster.command()
@_name
@click.option("--purge", is_flag=True, help="Also delete the state (etcd data, certificates).")
def down(name: str, purge: bool) -> None:
    """Stop every component of the cluster; leaves no process or port behind."""
    try:
        local = LocalCluster(name)
    except ClusterError as exc:
        _fail(str(exc))
        return
    stopped = local.down()
    if purge:
        local.delete()
    click.echo(f"stopped {', '.join(stopped)}" if stopped else f"cluster '{name}' was not running")


@cluster.command()
@_name
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(name: str, as_json: bool) -> None:
    """Show whether the cluster runs; exit 0 when the API server is ready, 3 otherwise."""
    try:
        report = LocalCluster(name).status()
    except ClusterError as exc:
        _fail(str(exc))
        return
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(
            f"cluster {report['name']}: "
            + ("ready" if report["apiserver_ready"] else "not ready")
            + f" ({report['server']})"
        )
        for comp, pid in report["components"].items():
            click.echo(f"  {comp:<24} {'running (pid ' + str(pid) + ')' if pid else 'stopped'}")
        for node in report["real_nodes"]:
            click.echo(
                f"  real node {node['name']}: {'Ready' if node['ready'] else 'not Ready'}, "
                f"node IP {node['node_ip']}, pod CIDR {node['pod_cidr']}, "
                f"netns {node['netns']}"
            )
            for comp, pid in node["processes"].items():
                state = "running (pid " + str(pid) + ")" if pid else "stopped"
                click.echo(f"    {comp:<22} {state}")
        click.echo(f"  kubeconfig: {report['kubeconfig']}")
    sys.exit(0 if report["apiserver_ready"] else 3)


@cluster.command()
@_name
def env(name: str) -> None:
    """Print shell exports for the cluster (eval "$(agentrl dev cluster env)")."""
    try:
        local = LocalCluster(name)
        bins = binaries.ensure(
            build_missing=False, echo=False, names=binaries.CONTROL_PLANE_BINARIES
        )
    except (ClusterError, binaries.BinaryError) as exc:
        _fail(str(exc))
        return
    click.echo(f"export KUBECONFIG={shlex.quote(str(local.kubeconfig))}")
    path = ":".join(bins.bin_dirs())
    click.echo(f'export PATH={shlex.quote(path)}:"$PATH"')
    running = [n for n in local.real_nodes() if n.running()]
    for node in running:
        p = node.plan
        click.echo(
            f"# real node {p.name}: netns {p.netns}, node IP {p.node_ip}, pod CIDR "
            f"{p.pod_subnet}, containerd {p.containerd_socket}"
        )
    if running:
        # ctr (and nerdctl) read these: `ctr images ls` lists the first real node's images
        sock = str(running[0].plan.containerd_socket)
        click.echo(f"export CONTAINERD_ADDRESS={shlex.quote(sock)}")
        click.echo("export CONTAINERD_NAMESPACE=k8s.io")


@cluster.command()
@_name
@click.argument("archives", nargs=-1, type=click.Path(exists=True, dir_okay=False, path_type=Path))
def load(name: str, archives: tuple[Path, ...]) -> None:
    """Import OCI image archives into the running real node(s) (default: every finished
    archive of `agentrl dev images`); images already there at the same digest are skipped."""
    from agentrl.devcluster.cluster import echo_stale_images, project_archives

    try:
        local = LocalCluster(name)
        if not archives:
            echo_stale_images(lambda m: click.echo(m, err=True))
        chosen = list(archives) or project_archives()
        if not chosen:
            click.echo("no image archives to load (build them with `agentrl dev images`)")
            return
        imported = local.load(chosen, echo=lambda m: click.echo(m, err=True))
    except ClusterError as exc:
        _fail(str(exc))
        return
    skipped = len(chosen) - len(set(imported))
    click.echo(f"imported {len(set(imported))} archive(s), {skipped} already present")


@cluster.command()
def build() -> None:
    """Build (or find) the pinned binaries and print where they are (part of `dev prepare`)."""
    started = time.monotonic()
    try:
        bins = binaries.ensure(echo=True)
    except binaries.BinaryError as exc:
        _fail(str(exc))
        return
    for field, path in vars(bins).items():
        click.echo(f"{field.replace('_', '-'):<24} {path}")
    click.echo(f"ready in {time.monotonic() - started:.1f}s")
