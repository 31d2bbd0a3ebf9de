"""The previous release, as the upgrade test (e2e/test_upgrade.py) starts from it: a commit of
this repository's history before the current tree, extracted as it was, and its images keyed by
that tree alone."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from agentrl.devcluster import images as builder
from agentrl.devcluster import release

REPO = Path(__file__).resolve().parents[2]


def git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True
    ).stdout


def test_the_previous_release_is_a_commit_before_this_tree() -> None:
    commit = release.PREVIOUS.commit
    assert git("rev-parse", f"{commit}^{{commit}}").strip() == commit
    ancestor = subprocess.run(
        ["git", "-C", str(REPO), "merge-base", "--is-ancestor", commit, "HEAD"], check=False
    )
    assert ancestor.returncode == 0, f"{commit} is not an ancestor of HEAD"
    # its version is the one its own tree says
    init = git("show", f"{commit}:operator/agentrl/__init__.py")
    assert f'__version__ = "{release.PREVIOUS.version}"' in init


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


def test_the_release_tree_is_extracted_as_committed_once(cache: Path) -> None:
    tree = release.extract()
    assert tree == cache / "agentrl" / "releases" / release.PREVIOUS.tag / "src"
    for path in ("charts/agentrl/Chart.yaml", "images/rocm-trainer/Dockerfile", "README.md"):
        committed = git("show", f"{release.PREVIOUS.commit}:{path}")
        assert (tree / path).read_text() == committed, path
    # the stamp is written last: a tree without it is extracted again, one with it is kept
    (tree / "README.md").write_text("edited")
    assert release.extract() == tree and (tree / "README.md").read_text() == "edited"
    (tree.parent / "src.commit").unlink()
    release.extract()
    assert (tree / "README.md").read_text() == git("show", f"{release.PREVIOUS.commit}:README.md")


def test_a_release_not_in_the_history_is_refused_naming_the_fix(cache: Path) -> None:
    gone = dataclasses.replace(release.PREVIOUS, tag="v9.9.9", commit="0" * 40)
    with pytest.raises(release.ReleaseError, match=r"v9\.9\.9.*git fetch --tags"):
        release.extract(gone)
    assert release.missing(gone) == list(builder.IMAGES)
    assert release.archives(gone) == []


def test_the_release_images_are_built_from_its_tree_under_its_tag(cache: Path) -> None:
    tree = release.extract()
    found = release.release_images()
    assert set(found) == set(builder.IMAGES)
    for name, image in found.items():
        assert image.ref == f"localhost/agentrl/{name}:{release.PREVIOUS.tag}"
        assert image.dockerfile == tree / "images" / name / "Dockerfile"
        assert image.archive.parent == builder.images_dir() / "releases" / release.PREVIOUS.tag
        assert builder.cpu_build_args(image)["VERSION"] == release.PREVIOUS.version
        assert image.thin
        # its key follows its own tree, not this one's
        key = builder.image_key(image)
        assert key != builder.image_key(builder.IMAGES[name])
        source = tree / "operator" / "agentrl" / "__init__.py"
        if name != "sandbox":
            source.write_text(source.read_text() + "\n# edited\n")
            assert builder.image_key(image) != key
            committed = f"{release.PREVIOUS.commit}:operator/agentrl/__init__.py"
            source.write_text(git("show", committed))
        assert builder.image_key(image) == key
