"""The ``node`` prepare step's images count only once stamped, and the step runs after the
binaries (CoreDNS's image is made from the coredns build)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from agentrl.devcluster import prepare
from agentrl.devcluster.node import artifacts, oci


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for var in ("AGENTRL_DEV_BIN_DIR", "KUBEBUILDER_ASSETS"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path / "agentrl"


def test_an_image_counts_only_once_its_stamp_names_it(cache: Path) -> None:
    assert artifacts.BUSYBOX.digest() is None
    assert set(artifacts.missing_images()) == {"pause", "coredns", "busybox"}
    artifacts.build_busybox()
    stamp = json.loads(artifacts.BUSYBOX.stamp.read_text())
    # the stamp names the digest the archive's own index gives its image
    assert oci.archive_refs(artifacts.BUSYBOX.archive) == {artifacts.BUSYBOX.name: stamp["digest"]}
    assert artifacts.BUSYBOX.digest() == stamp["digest"]
    assert "busybox" not in artifacts.missing_images()
    # an archive without its stamp (an interrupted build) is not finished
    artifacts.BUSYBOX.stamp.unlink()
    assert artifacts.BUSYBOX.digest() is None
    # nor one whose stamp names another image (the name changed with a revision)
    artifacts.BUSYBOX.stamp.write_text(json.dumps({"name": "other:1", "digest": "sha256:x"}))
    assert artifacts.BUSYBOX.digest() is None


def test_the_busybox_image_has_a_shell_its_applets_and_a_writable_tmp(cache: Path) -> None:
    artifacts.build_busybox()
    with tarfile.open(artifacts.BUSYBOX.archive) as tar:
        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
        manifest_digest = index["manifests"][0]["digest"].split(":")[1]
        manifest = json.loads(
            tar.extractfile(f"blobs/sha256/{manifest_digest}").read()  # type: ignore[union-attr]
        )
        layer_digest = manifest["layers"][0]["digest"].split(":")[1]
        layer = tar.extractfile(f"blobs/sha256/{layer_digest}")
        assert layer is not None
        with tarfile.open(fileobj=layer) as rootfs:
            entries = {m.name: m for m in rootfs.getmembers()}
    assert entries["bin/busybox"].isfile()
    for applet in ("sh", "sleep", "nslookup", "wget", "httpd", "nc", "timeout"):
        assert entries[f"bin/{applet}"].issym() and entries[f"bin/{applet}"].linkname == "busybox"
    assert entries["tmp"].mode == 0o1777
    assert "etc/passwd" in entries


def test_coredns_needs_the_pinned_build_and_says_so(cache: Path) -> None:
    with pytest.raises(artifacts.ArtifactError, match="agentrl dev prepare --only binaries"):
        artifacts.build_coredns()


def test_the_node_step_runs_after_the_binaries() -> None:
    names = [step.name for step in prepare.steps()]
    assert "node" in names and names.index("binaries") < names.index("node")
