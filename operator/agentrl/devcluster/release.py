"""The previous release of this repository, built here: what the upgrade test installs first.

A release is a tag of this repository. :data:`PREVIOUS` names the one the current tree upgrades
from, by tag and by commit (a clone that did not fetch tags still has the commit). Its tree is
extracted with ``git archive`` into ``~/.cache/agentrl/releases/<tag>/src`` (the chart, the
examples and the image sources of that release, as they were), and its images are built from
their own Dockerfiles there, on the same local bases as this tree's (:mod:`.images`), and tagged
with the release's tag: ``localhost/agentrl/<name>:<tag>`` beside this tree's
``localhost/agentrl/<name>:<version>``. Their archives (``~/.cache/agentrl/images/releases/
<tag>/``) are thin: they leave out the base's layers (the torch layer alone is 5.6 GB), which a
node has from this tree's images, so they are imported after those.

Cutting a release: tag the commit (``git tag vX.Y.Z``) and name it in :data:`PREVIOUS` in the
commit after it; ``agentrl dev prepare`` builds its images once (cached by their inputs).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from agentrl.devcluster import images as images_mod
from agentrl.devcluster.binaries import cache_root
from agentrl.devcluster.images import IMAGES, REPO, Image, ImageError
from agentrl.devcluster.steps import PrepareError, Step


@dataclass(frozen=True)
class Release:
    """A tagged release of this repository."""

    tag: str
    commit: str
    #: its package version (``agentrl.__version__`` at the tag), the images' ``VERSION`` ARG
    version: str


#: The release the current tree upgrades from (the upgrade test, ``e2e/test_upgrade.py``).
PREVIOUS = Release(tag="v0.1.0", commit="f8be9adb577bec5a54586c597c78cd6c75e7aafb", version="0.1.0")


class ReleaseError(RuntimeError):
    """A release's tree could not be extracted; the message says why and what to do."""


def release_dir(release: Release = PREVIOUS) -> Path:
    return cache_root() / "releases" / release.tag


def tree(release: Release = PREVIOUS) -> Path:
    """Where the release's tree is extracted (see :func:`extract`)."""
    return release_dir(release) / "src"


def _stamp(release: Release) -> Path:
    return release_dir(release) / "src.commit"


def extracted(release: Release = PREVIOUS) -> bool:
    stamp = _stamp(release)
    return stamp.is_file() and stamp.read_text().strip() == release.commit


def extract(release: Release = PREVIOUS) -> Path:
    """The release's tree, extracted from this clone's git history once (a stamp naming the
    commit is written last, so an interrupted extraction is done again)."""
    root = tree(release)
    if extracted(release):
        return root
    found = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{release.commit}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    if found.returncode != 0:
        raise ReleaseError(
            f"release {release.tag} (commit {release.commit}) is not in the git history of "
            f"{REPO}: fetch it (`git fetch --tags`, or `git fetch --unshallow` in a shallow "
            "clone)"
        )
    _stamp(release).unlink(missing_ok=True)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    archive = subprocess.Popen(
        ["git", "-C", str(REPO), "archive", "--format=tar", release.commit],
        stdout=subprocess.PIPE,
    )
    assert archive.stdout is not None
    with tarfile.open(fileobj=archive.stdout, mode="r|") as tar:
        tar.extractall(root, filter="data")
    if archive.wait() != 0:
        raise ReleaseError(f"git archive {release.commit} failed ({archive.returncode})")
    _stamp(release).write_text(release.commit + "\n")
    return root


def release_images(release: Release = PREVIOUS) -> dict[str, Image]:
    """This tree's images as the release builds them: its Dockerfiles and build context, its
    version, tagged with its tag, thin archives in their own folder."""
    return {
        name: dataclasses.replace(
            image,
            ref=f"localhost/agentrl/{name}:{release.tag}",
            root=tree(release),
            subdir=f"releases/{release.tag}",
            version=release.version,
            thin=True,
        )
        for name, image in IMAGES.items()
    }


def ref(name: str, release: Release = PREVIOUS) -> str:
    """The reference of the release's image ``name`` (``operator``, ``rocm-trainer``, ...)."""
    return release_images(release)[name].ref


def missing(release: Release = PREVIOUS) -> list[str]:
    """Names of the release's images whose archive is absent or out of date."""
    if not extracted(release):
        return list(IMAGES)
    chosen = release_images(release).items()
    return [name for name, image in chosen if not images_mod.is_current(image)]


def archives(release: Release = PREVIOUS) -> list[Path]:
    """The release's finished, current (thin) archives: import them after this tree's."""
    if not extracted(release):
        return []
    return [i.archive for i in release_images(release).values() if images_mod.is_current(i)]


def build(release: Release = PREVIOUS, *, echo: bool = True) -> dict[str, float]:
    """Extract the release and build its images that are missing or out of date."""
    extract(release)
    return images_mod.build(echo=echo, among=release_images(release))


def _needs_git() -> str | None:
    if extracted() or shutil.which("git"):
        return None
    return f"git is needed to extract release {PREVIOUS.tag} from this clone and is not on PATH"


def _needs_root() -> str | None:
    if not missing() or os.geteuid() == 0:
        return None
    return "building the release's images needs root (buildah's overlay storage)"


def release_images_step() -> Step:
    """``release-images``: the previous release's images, for the upgrade test."""

    def run() -> None:
        try:
            spent = build()
        except (ImageError, ReleaseError) as exc:
            raise PrepareError(f"release-images: {exc}") from exc
        images_mod.say(
            "release-images: " + ", ".join(f"{name} {secs:.0f}s" for name, secs in spent.items())
        )

    return Step(
        name="release-images",
        describe=f"the images of release {PREVIOUS.tag} (the upgrade test's starting point), "
        f"built from its tag's tree into thin OCI archives under "
        f"~/.cache/agentrl/images/releases/{PREVIOUS.tag}",
        is_done=lambda: (
            not missing() and all(images_mod.in_storage(i) for i in release_images().values())
        ),
        run=run,
        checks=(_needs_git, _needs_root),
    )
