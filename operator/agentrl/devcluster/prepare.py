"""``agentrl dev prepare``: build or install everything the test suite and the local cluster
need, before any test runs.

The README's test command runs this as its own step between lint and pytest, so no test ever
spends its timeout on a build, and a machine that cannot build (no Go toolchain, say) stops
there with a message naming what is missing instead of erroring tests one by one.

Each :class:`Step` says whether it is already done (a stamp or a finished cache entry written
last, so an interrupted step is never mistaken for a finished one), what it needs on the
machine, and how to do it. A step that was interrupted resumes: its own caches (Go's module
and build caches, pip's cache, the image layers) keep what it already had.

Steps are listed in :data:`STEPS` in the order they run; a module adds its own by appending a
factory there.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence

from agentrl.devcluster import binaries, sglang_env
from agentrl.devcluster.images import images_step
from agentrl.devcluster.node.artifacts import node_step
from agentrl.devcluster.release import release_images_step
from agentrl.devcluster.steps import PrepareError, Step, say

__all__ = ["STEPS", "PrepareError", "Step", "prepare", "say", "steps"]


def _binaries_done() -> bool:
    return not binaries.missing()


def _binaries_run() -> None:
    try:
        binaries.build(echo=True)
    except binaries.BinaryError as exc:
        raise PrepareError(str(exc)) from exc


def _needs_go() -> str | None:
    if _binaries_done() or shutil.which("go"):
        return None
    return (
        "Go >= 1.24 is needed to build " + ", ".join(binaries.missing()) + " and is not on "
        "PATH: install Go, or set AGENTRL_DEV_BIN_DIR / KUBEBUILDER_ASSETS to a directory "
        "that holds them"
    )


def binaries_step() -> Step:
    return Step(
        name="binaries",
        describe="Kubernetes control plane and node binaries, etcd, kwok, helm, CoreDNS "
        "(pinned Go modules, cached under ~/.cache/agentrl/bin)",
        is_done=_binaries_done,
        run=_binaries_run,
        checks=(_needs_go,),
    )


#: Factories of every step, in the order they run.
STEPS: list[Callable[[], Step]] = [binaries_step, sglang_env.sglang_step]


STEPS.append(images_step)  # the images as OCI archives: before the node, which imports them
STEPS.append(release_images_step)  # the previous release's, on the same bases (upgrade test)
STEPS.append(node_step)  # the real node's packages and images: after the binaries (CoreDNS)


def steps() -> list[Step]:
    return [factory() for factory in STEPS]


def prepare(only: Sequence[str] = (), *, check_only: bool = False) -> float:
    """Run every step that is not done yet (or only those named); returns seconds spent.

    All requirements are checked before anything runs, so a machine that lacks a tool learns it
    at once, not after a ten-minute build."""
    started = time.monotonic()
    chosen = steps()
    if only:
        unknown = sorted(set(only) - {s.name for s in chosen})
        if unknown:
            names = ", ".join(s.name for s in chosen)
            raise PrepareError(f"unknown step {', '.join(unknown)}: the steps are {names}")
        chosen = [s for s in chosen if s.name in only]
    pending = [s for s in chosen if not s.is_done()]
    problems = [p for s in pending for p in s.problems()]
    if problems:
        raise PrepareError("cannot prepare:\n  " + "\n  ".join(problems))
    for step in chosen:
        if step not in pending:
            say(f"prepare {step.name}: ready")
    if check_only:
        if pending:
            raise PrepareError("not prepared: " + ", ".join(s.name for s in pending))
        return time.monotonic() - started
    for step in pending:
        say(f"prepare {step.name}: {step.describe}")
        t0 = time.monotonic()
        step.run()
        if not step.is_done():
            raise PrepareError(
                f"{step.name}: finished, but what it built is already out of date: its inputs "
                "changed while it ran (files edited during the build?); run it again"
            )
        say(f"prepare {step.name}: done in {time.monotonic() - t0:.0f}s")
    return time.monotonic() - started
