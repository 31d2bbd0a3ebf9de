"""Write a single-layer OCI image archive (an OCI image layout in a tar) from local files.

No registry is reachable from the dev machine, so the images the real node needs (its pause
image, CoreDNS, a busybox for tests) are made here from binaries built or installed locally and
imported with ``ctr images import``. The archive is deterministic: the same files give the same
digests (mtime 0, uid/gid 0, sorted entries), so an import can be skipped when the node already
has that digest.

Layout written (https://github.com/opencontainers/image-spec, image-layout.md)::

    oci-layout                      {"imageLayoutVersion": "1.0.0"}
    index.json                      one manifest, named by io.containerd.image.name
    blobs/sha256/<layer>            an uncompressed tar of the files
    blobs/sha256/<config>           the image config (entrypoint, env, rootfs.diff_ids)
    blobs/sha256/<manifest>         the manifest naming config and layer
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"


@dataclass(frozen=True)
class Entry:
    """One file system entry of the layer: a file copied from ``source``, a directory
    (``source`` None, ``link`` None) or a symlink to ``link``."""

    path: str
    source: Path | None = None
    mode: int = 0o755
    link: str | None = None


@dataclass(frozen=True)
class ImageSpec:
    """What goes into an image: its full name, files, entrypoint and environment."""

    name: str
    entries: Sequence[Entry]
    entrypoint: Sequence[str] = ()
    cmd: Sequence[str] = ()
    env: Sequence[str] = ("PATH=/bin:/usr/bin:/sbin:/usr/sbin",)
    user: str = ""
    labels: dict[str, str] = field(default_factory=dict)


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _tar_info(
    name: str, *, kind: bytes, mode: int, size: int = 0, link: str = ""
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.linkname = link
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def layer_tar(entries: Iterable[Entry]) -> bytes:
    """The layer: parent directories first, then every entry, sorted by path."""
    buf = io.BytesIO()
    wanted = sorted(entries, key=lambda e: e.path)
    dirs: set[str] = set()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in wanted:
            rel = entry.path.strip("/")
            parts = rel.split("/")
            for depth in range(1, len(parts)):
                parent = "/".join(parts[:depth])
                if parent not in dirs:
                    dirs.add(parent)
                    tar.addfile(_tar_info(parent, kind=tarfile.DIRTYPE, mode=0o755))
            if entry.link is not None:
                tar.addfile(_tar_info(rel, kind=tarfile.SYMTYPE, mode=0o777, link=entry.link))
            elif entry.source is None:
                if rel not in dirs:
                    dirs.add(rel)
                    tar.addfile(_tar_info(rel, kind=tarfile.DIRTYPE, mode=entry.mode))
            else:
                data = entry.source.read_bytes()
                info = _tar_info(rel, kind=tarfile.REGTYPE, mode=entry.mode, size=len(data))
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _blob(data: bytes) -> tuple[str, bytes]:
    return _digest(data), data


def image_blobs(spec: ImageSpec) -> tuple[dict[str, bytes], dict[str, object]]:
    """Every blob by digest, and the index (the archive's ``index.json``)."""
    layer = layer_tar(spec.entries)
    layer_digest, _ = _blob(layer)
    config: dict[str, object] = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": list(spec.env),
            **({"Entrypoint": list(spec.entrypoint)} if spec.entrypoint else {}),
            **({"Cmd": list(spec.cmd)} if spec.cmd else {}),
            **({"User": spec.user} if spec.user else {}),
            **({"Labels": dict(spec.labels)} if spec.labels else {}),
        },
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created_by": "agentrl.devcluster.node.oci"}],
    }
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    config_digest = _digest(config_bytes)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": config_digest, "size": len(config_bytes)},
        "layers": [{"mediaType": MEDIA_LAYER, "digest": layer_digest, "size": len(layer)}],
    }
    manifest_bytes = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    manifest_digest = _digest(manifest_bytes)
    tag = spec.name.rsplit(":", 1)[1] if ":" in spec.name.rsplit("/", 1)[-1] else "latest"
    index = {
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [
            {
                "mediaType": MEDIA_MANIFEST,
                "digest": manifest_digest,
                "size": len(manifest_bytes),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": spec.name,
                    "org.opencontainers.image.ref.name": tag,
                },
            }
        ],
    }
    blobs = {layer_digest: layer, config_digest: config_bytes, manifest_digest: manifest_bytes}
    return blobs, index


def write_archive(spec: ImageSpec, path: Path) -> str:
    """Write the image as an OCI archive at ``path`` (atomically); returns the manifest
    digest, which is what containerd records as the image's target digest."""
    blobs, index = image_blobs(spec)
    members: list[tuple[str, bytes]] = [
        ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
        ("index.json", json.dumps(index, sort_keys=True).encode()),
    ]
    members += [(f"blobs/sha256/{d.split(':', 1)[1]}", data) for d, data in sorted(blobs.items())]
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with tarfile.open(partial, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("blobs", "blobs/sha256"):
            tar.addfile(_tar_info(directory, kind=tarfile.DIRTYPE, mode=0o755))
        for name, data in members:
            info = _tar_info(name, kind=tarfile.REGTYPE, mode=0o644, size=len(data))
            tar.addfile(info, io.BytesIO(data))
    os.replace(partial, path)
    manifests = index["manifests"]
    assert isinstance(manifests, list)
    return str(manifests[0]["digest"])


def archive_refs(path: Path) -> dict[str, str]:
    """Image name -> manifest digest of every named manifest in an OCI (or docker-save)
    archive's ``index.json``; empty when the archive names none."""
    with tarfile.open(path) as tar:
        try:
            member = tar.extractfile("index.json")
        except KeyError:
            return {}
        if member is None:
            return {}
        index = json.loads(member.read())
    out: dict[str, str] = {}
    for desc in index.get("manifests", []):
        annotations = desc.get("annotations") or {}
        name = annotations.get("io.containerd.image.name")
        ref = annotations.get("org.opencontainers.image.ref.name", "")
        # buildah's oci-archive names the full reference in ref.name; ctr keeps such a name
        if not name and "/" in ref:
            name = ref
        if name:
            out[name] = desc["digest"]
    return out


def archive_blobs(path: Path) -> dict[str, int]:
    """Digest (``sha256:…``) -> size in bytes of every blob an OCI archive carries, read from
    the tar headers alone (nothing is extracted)."""
    out: dict[str, int] = {}
    with tarfile.open(path) as tar:
        for member in tar:
            parts = member.name.split("/")
            if member.isfile() and len(parts) == 3 and parts[0] == "blobs":
                out[f"{parts[1]}:{parts[2]}"] = member.size
    return out
