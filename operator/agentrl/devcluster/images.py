"""The project's container images built on this machine, for the local cluster and the tests.

Every image is built from its own ``images/<name>/Dockerfile``; only its base differs between
the two flavours. The **rocm** flavour is the Dockerfile's default (registry bases: ROCm PyTorch,
SGLang on ROCm, Python slim), built by ``make -C images`` with docker or buildah where a
registry is reachable. The **cpu** flavour replaces the base build ARG with a local base that
needs no registry:

* ``localhost/agentrl/debian:bookworm``: a Debian bookworm root file system made with
  ``debootstrap --variant=minbase`` plus Python 3.11, venv, pip and CA certificates, imported
  into buildah's storage (``buildah from scratch`` + the rootfs tarball + ``commit``);
* ``localhost/agentrl/torch-cpu:<TORCH_VERSION>``: that base plus ``/opt/venv`` holding torch
  from PyPI (``images/cpu/torch.Containerfile``): one shared layer under the trainer's and the
  engine's cpu flavours, built once.

:func:`build` builds whatever is missing with buildah (its own storage under
``~/.cache/agentrl/containers``, layer cache on, pip's cache mounted into the RUN steps, host
network only for pip and apt) and writes each finished image as an OCI archive into
``~/.cache/agentrl/images/``, with a stamp written last. :func:`archives` lists the finished,
up-to-date archives: another part of the dev cluster (the real kubelet node) imports them into
its containerd. A stamp records its cache key (the Dockerfile, the files it COPYs, the build
arguments and the base's own key), so an edit to any of those makes the image out of date.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from agentrl import __version__
from agentrl.devcluster.binaries import cache_root

if TYPE_CHECKING:
    from agentrl.devcluster.steps import Step

#: The tag every locally built image carries: the project's version.
VERSION = __version__

OPERATOR_IMAGE = f"localhost/agentrl/operator:{VERSION}"
TRAINER_IMAGE = f"localhost/agentrl/rocm-trainer:{VERSION}"
ENGINE_IMAGE = f"localhost/agentrl/sglang-engine:{VERSION}"
SANDBOX_IMAGE = f"localhost/agentrl/sandbox:{VERSION}"

#: The local bases of the cpu flavour.
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_PACKAGES = ("python3", "python3-venv", "python3-pip", "ca-certificates")
DEBIAN_IMAGE = f"localhost/agentrl/debian:{DEBIAN_SUITE}"
#: torch from PyPI for the cpu flavour (PyPI's Linux build is the CUDA one; it runs on CPUs).
TORCH_VERSION = "2.15.0"
TORCH_IMAGE = f"localhost/agentrl/torch-cpu:{TORCH_VERSION}"

#: Bumped when the way an image is built changes, so archives of the old recipe are rebuilt.
BUILD_REVISION = "r1"
#: The label carrying an image's cache key.
KEY_LABEL = "dev.agentrl.cache-key"

REPO = Path(__file__).resolve().parents[3]
IMAGES_DIR = REPO / "images"


class ImageError(RuntimeError):
    """An image could not be built; the message has the command's last words."""


@dataclass(frozen=True)
class Base:
    """One base image and the Python it runs (``major.minor`` of its ``python3``)."""

    ref: str
    python: str
    #: where the Python version comes from (the tag, upstream's Dockerfile, or our build)
    source: str


@dataclass(frozen=True)
class Image:
    """One image of ``images/<name>/Dockerfile`` and its two flavours of base."""

    name: str
    ref: str
    #: the Dockerfile's build ARG naming the base image
    base_arg: str
    rocm: Base
    cpu: Base
    #: further build ARGs of the cpu flavour
    cpu_args: dict[str, str] = field(default_factory=dict)
    #: the source tree it is built from (its Dockerfile and build context): this checkout, or
    #: a release's (:mod:`agentrl.devcluster.release`); None: this checkout (:data:`REPO`)
    root: Path | None = None
    #: the folder of its archive and stamp under :func:`images_dir` ("": the folder itself)
    subdir: str = ""
    #: the ``VERSION`` build ARG (the image's ``org.opencontainers.image.version``)
    version: str = VERSION
    #: its archive leaves out the layers of its base image: a release's image, imported into
    #: a node after this checkout's images, which carry those layers (the same local bases)
    thin: bool = False

    @property
    def tree(self) -> Path:
        """The root of its build context."""
        return REPO if self.root is None else self.root

    @property
    def dockerfile(self) -> Path:
        return (
            (IMAGES_DIR if self.root is None else self.root / "images") / self.name / "Dockerfile"
        )

    @property
    def archive(self) -> Path:
        return images_dir() / self.subdir / f"{self.name}.oci.tar"

    @property
    def stamp(self) -> Path:
        return images_dir() / self.subdir / f"{self.name}.json"


_DEBIAN = Base(DEBIAN_IMAGE, "3.11", "Debian bookworm's python3 package (3.11.2)")
_TORCH = Base(TORCH_IMAGE, "3.11", "the Debian base's python3, in /opt/venv")
_SLIM = Base("python:3.11.11-slim-bookworm", "3.11", "the tag (the official Python image, 3.11.11)")
#: ROCm 7.2.4 PyTorch on Ubuntu 24.04 with Python 3.12: the base SGLang's own rocm724 images
#: are built on (sgl-project/sglang docker/rocm.Dockerfile, BASE_IMAGE_9x2_ROCM724), so the
#: trainer and the engine share their torch build. rocm/megatron-lm:v25.5_py310 was Python 3.10.
_ROCM_PYTORCH = Base(
    "rocm/pytorch:rocm7.2.4_ubuntu24.04_py3.12_pytorch_release_2.10.0",
    "3.12",
    "the tag (py3.12)",
)
_SGLANG_ROCM = Base(
    "lmsysorg/sglang:v0.5.15.post1-rocm724-${GPU_ARCH}",
    "3.12",
    "sglang's docker/rocm.Dockerfile: the rocm724 flavours build on rocm/pytorch "
    "rocm7.2.4_ubuntu24.04_py3.12 (the rocm720 ones on py3.10)",
)

IMAGES: dict[str, Image] = {
    image.name: image
    for image in (
        Image("operator", OPERATOR_IMAGE, "PYTHON_BASE", rocm=_SLIM, cpu=_DEBIAN),
        Image("rocm-trainer", TRAINER_IMAGE, "TRAINER_BASE", rocm=_ROCM_PYTORCH, cpu=_TORCH),
        Image("sglang-engine", ENGINE_IMAGE, "SGLANG_BASE", rocm=_SGLANG_ROCM, cpu=_TORCH),
        Image("sandbox", SANDBOX_IMAGE, "SANDBOX_BASE", rocm=_SLIM, cpu=_DEBIAN),
    )
}


def images_dir() -> Path:
    """``~/.cache/agentrl/images``: the finished OCI archives and their stamps."""
    return cache_root() / "images"


def work_dir() -> Path:
    """Scratch of the builds: the debootstrap root file system, its package cache, logs."""
    return cache_root() / "images-work"


def storage_dir() -> Path:
    """buildah's own storage (``--root``): the layer cache of every build here."""
    return cache_root() / "containers"


# ---------------------------------------------------------------------------------------------
# Dockerfiles: the few facts the builder needs (the tests read them with the same parser)


@dataclass
class Instruction:
    keyword: str
    args: str
    line: int


@dataclass
class Stage:
    base: str
    """The FROM image with build args substituted."""
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)


@dataclass
class Dockerfile:
    path: Path
    global_args: dict[str, str]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def last(self, keyword: str) -> str | None:
        """The arguments of the final stage's last ``keyword`` instruction, or None."""
        found = [i.args for i in self.final.instructions if i.keyword == keyword]
        return found[-1] if found else None

    def entrypoint(self) -> list[str]:
        value = self.last("ENTRYPOINT")
        if value is None:
            raise ValueError(f"{self.path}: no ENTRYPOINT")
        parsed = json.loads(value)  # exec form only: shell form is refused
        return [str(v) for v in parsed]

    def copy_sources(self) -> list[str]:
        """The build-context paths every COPY (not ``--from``) reads."""
        sources: list[str] = []
        for stage in self.stages:
            for instruction in stage.instructions:
                if instruction.keyword != "COPY":
                    continue
                words = instruction.args.split()
                if any(w.startswith("--from=") for w in words):
                    continue
                words = [w for w in words if not w.startswith("--")]
                sources += words[:-1]
        return sources


def instructions(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped."""
    result: list[Instruction] = []
    pending = ""
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        full = pending + line
        pending = ""
        keyword, _, args = full.partition(" ")
        result.append(Instruction(keyword.upper(), args.strip(), start))
    return result


def _substitute(value: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m[1] or m[2], m[0]), value)


def _arg(text: str) -> tuple[str, str]:
    name, _, default = text.partition("=")
    return name.strip(), default.strip().strip('"')


def parse_dockerfile(path: Path, build_args: dict[str, str] | None = None) -> Dockerfile:
    """``path`` read into stages; ``build_args`` override the global ARG defaults."""
    overrides = build_args or {}
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for instruction in instructions(path.read_text()):
        if instruction.keyword == "ARG" and not stages:
            name, default = _arg(instruction.args)
            global_args[name] = overrides.get(name, _substitute(default, global_args))
        elif instruction.keyword == "FROM":
            words = [w for w in instruction.args.split() if not w.startswith("--platform")]
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=_substitute(words[0], global_args), name=name))
        else:
            if not stages:
                raise ValueError(f"{path}:{instruction.line}: {instruction.keyword} before FROM")
            stages[-1].instructions.append(instruction)
    return Dockerfile(path=path, global_args=global_args, stages=stages)


def dockerignore(root: Path | None = None) -> list[str]:
    """The build context's exclusions (``.dockerignore`` at the root of the tree; this
    checkout's by default)."""
    path = (root or REPO) / ".dockerignore"
    if not path.is_file():
        return []
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _ignored(relative: str, patterns: list[str]) -> bool:
    parts = relative.split("/")
    for pattern in patterns:
        bare = pattern.removeprefix("**/").rstrip("/")
        if pattern.startswith("**/"):
            if any(fnmatch.fnmatch(part, bare) for part in parts):
                return True
        elif any(fnmatch.fnmatch("/".join(parts[: i + 1]), bare) for i in range(len(parts))):
            return True
    return False


def context_files(sources: list[str], root: Path | None = None) -> list[Path]:
    """The files of the build context (the tree at ``root``, this checkout by default) the
    COPY sources name, as the build sees them."""
    root = root or REPO
    patterns = dockerignore(root)
    found: list[Path] = []
    for source in sources:
        top = root / source
        candidates = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for path in candidates:
            relative = path.relative_to(root).as_posix()
            if not _ignored(relative, patterns):
                found.append(path)
    return found


# ---------------------------------------------------------------------------------------------
# cache keys


def _digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:24]


def debian_key() -> str:
    return _digest(BUILD_REVISION, DEBIAN_SUITE, DEBIAN_MIRROR, DEBIAN_PACKAGES, "minbase")


def torch_containerfile() -> Path:
    return IMAGES_DIR / "cpu" / "torch.Containerfile"


def torch_key() -> str:
    return _digest(debian_key(), TORCH_VERSION, torch_containerfile().read_text())


def cpu_build_args(image: Image) -> dict[str, str]:
    return {image.base_arg: image.cpu.ref, "VERSION": image.version, **image.cpu_args}


def image_key(image: Image) -> str:
    """Everything the cpu-flavour build of ``image`` depends on, hashed."""
    base = torch_key() if image.cpu.ref == TORCH_IMAGE else debian_key()
    files = []
    parsed = parse_dockerfile(image.dockerfile)
    for path in context_files(parsed.copy_sources(), image.tree):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        files.append((path.relative_to(image.tree).as_posix(), digest))
    return _digest(
        BUILD_REVISION,
        base,
        image.dockerfile.read_text(),
        sorted(cpu_build_args(image).items()),
        dockerignore(image.tree),
        files,
        *(["thin"] if image.thin else []),
    )


def _read_stamp(image: Image) -> dict[str, object] | None:
    try:
        data = json.loads(image.stamp.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_current(image: Image) -> bool:
    """The archive of ``image`` is finished (stamped) and built from what is here now."""
    stamp = _read_stamp(image)
    return bool(stamp and stamp.get("key") == image_key(image) and image.archive.is_file())


def missing() -> list[str]:
    """Names of the images whose archive is absent or out of date."""
    return [name for name, image in IMAGES.items() if not is_current(image)]


def archives() -> list[Path]:
    """The OCI archives of the images whose build finished and is up to date (stamped)."""
    return [image.archive for image in IMAGES.values() if is_current(image)]


def finished(image: Image) -> bool:
    """The archive of ``image`` was written completely (its stamp exists), current or not."""
    return _read_stamp(image) is not None and image.archive.is_file()


def stamp_of(name: str) -> dict[str, object]:
    """The stamp of a finished image (its reference, image id, key, archive size)."""
    image = IMAGES[name]
    stamp = _read_stamp(image)
    if not stamp or not finished(image):
        raise ImageError(f"the {name} image is not built: run 'agentrl dev prepare'")
    return stamp


# ---------------------------------------------------------------------------------------------
# buildah


def host_ca_bundle() -> Path | None:
    """The host's CA bundle: mounted over the image's during builds, so pip and apt trust
    whatever the host trusts (a TLS-inspecting proxy's root, say) without baking it in."""
    for candidate in (os.environ.get("SSL_CERT_FILE"), "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def storage_spec() -> str:
    """Our storage as a ``containers-storage:`` transport prefix, ``[driver@root+runroot]``."""
    root = storage_dir()
    return f"[overlay@{root / 'storage'}+{root / 'run'}]"


def buildah_argv(*args: str) -> list[str]:
    """A buildah command line on this project's own storage (overlay, as root)."""
    root = storage_dir()
    return [
        "buildah",
        "--root",
        str(root / "storage"),
        "--runroot",
        str(root / "run"),
        "--storage-driver",
        "overlay",
        *args,
    ]


class Runner:
    """Runs the build's commands, each logged to one log file; raises with the log's tail."""

    def __init__(self, log: Path, echo: bool = False) -> None:
        self.log = log
        self.echo = echo
        log.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, argv: list[str], *, capture: bool = False) -> str:
        with self.log.open("a") as out:
            out.write(f"$ {' '.join(argv)}\n")
            out.flush()
            if capture:
                proc = subprocess.run(
                    argv, stdout=subprocess.PIPE, stderr=out, text=True, check=False
                )
            else:
                proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False)
        if proc.returncode != 0:
            tail = "\n".join(self.log.read_text().splitlines()[-25:])
            raise ImageError(f"failed ({proc.returncode}): {' '.join(argv)}\n{tail}")
        return proc.stdout if capture else ""


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def inspect(ref: str) -> dict[str, object] | None:
    """buildah's description of the image ``ref`` in our storage, or None."""
    proc = subprocess.run(
        buildah_argv("inspect", "--type", "image", ref), capture_output=True, text=True
    )
    if proc.returncode != 0:
        return None
    data = json.loads(proc.stdout)
    return data if isinstance(data, dict) else None


def labels_of(info: dict[str, object]) -> dict[str, str]:
    oci = info.get("OCIv1")
    config = oci.get("config") if isinstance(oci, dict) else None
    labels = config.get("Labels") if isinstance(config, dict) else None
    return dict(labels) if isinstance(labels, dict) else {}


def _has(ref: str, key: str) -> bool:
    info = inspect(ref)
    return info is not None and labels_of(info).get(KEY_LABEL) == key


def _build_volumes() -> list[str]:
    ca = host_ca_bundle()
    return ["--volume", f"{ca}:/etc/ssl/certs/ca-certificates.crt:ro"] if ca else []


def build_debian(run: Runner) -> None:
    """The Debian base: debootstrap (its .deb files cached, so a rerun downloads nothing),
    then a tarball of the root file system added to an empty image."""
    key = debian_key()
    if _has(DEBIAN_IMAGE, key):
        return
    work = work_dir()
    rootfs, debs = work / "debian-rootfs", work / "debian-debs"
    debs.mkdir(parents=True, exist_ok=True)
    if rootfs.exists():  # an interrupted debootstrap: start over (the packages stay cached)
        _unmount_below(rootfs)
        shutil.rmtree(rootfs)
    say(f"images: debootstrap {DEBIAN_SUITE} (minbase + {', '.join(DEBIAN_PACKAGES)})")
    run(
        [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(DEBIAN_PACKAGES)}",
            f"--cache-dir={debs}",
            DEBIAN_SUITE,
            str(rootfs),
            DEBIAN_MIRROR,
        ]
    )
    _unmount_below(rootfs)
    for junk in ("var/lib/apt/lists", "var/cache/apt/archives", "var/log"):
        for child in (rootfs / junk).glob("*"):
            if child.is_file():
                child.unlink()
    tarball = work / "debian-rootfs.tar"
    excludes = ["--exclude=./proc/*", "--exclude=./sys/*", "--exclude=./dev/*"]
    run(
        [
            "tar",
            "--numeric-owner",
            "--xattrs",
            "-C",
            str(rootfs),
            "-cf",
            str(tarball),
            *excludes,
            ".",
        ]
    )
    container = run(buildah_argv("from", "scratch"), capture=True).strip()
    try:
        run(buildah_argv("add", container, str(tarball), "/"))
        run(
            buildah_argv(
                "config",
                "--env",
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--env",
                "LANG=C.UTF-8",
                "--cmd",
                "/bin/bash",
                "--label",
                f"{KEY_LABEL}={key}",
                "--label",
                f"org.opencontainers.image.title=agentrl-debian-{DEBIAN_SUITE}",
                container,
            )
        )
        run(buildah_argv("commit", "--rm", container, DEBIAN_IMAGE))
    except ImageError:
        subprocess.run(buildah_argv("rm", container), capture_output=True)
        raise
    tarball.unlink()
    shutil.rmtree(rootfs)


def _unmount_below(path: Path) -> None:
    """debootstrap mounts /proc and /sys in its target; an interrupted one leaves them."""
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    targets = [line.split()[1] for line in mounts if line.split()[1].startswith(str(path) + "/")]
    for target in sorted(targets, key=len, reverse=True):
        subprocess.run(["umount", "-l", target], capture_output=True)


def _build(
    run: Runner, containerfile: Path, context: Path, ref: str, key: str, args: dict[str, str]
) -> None:
    argv = buildah_argv(
        "build",
        "--layers",
        "--network",
        "host",
        *_build_volumes(),
        "--file",
        str(containerfile),
        "--tag",
        ref,
        "--label",
        f"{KEY_LABEL}={key}",
    )
    for name, value in sorted(args.items()):
        argv += ["--build-arg", f"{name}={value}"]
    run([*argv, str(context)])


def build_torch(run: Runner) -> None:
    key = torch_key()
    if _has(TORCH_IMAGE, key):
        return
    say(f"images: {TORCH_IMAGE} (torch {TORCH_VERSION} from PyPI, shared by trainer and engine)")
    _build(
        run,
        torch_containerfile(),
        torch_containerfile().parent,
        TORCH_IMAGE,
        key,
        {"BASE": DEBIAN_IMAGE, "TORCH_VERSION": TORCH_VERSION},
    )


def build_image(run: Runner, image: Image) -> None:
    """Build ``image`` (its cpu flavour) and write its OCI archive, then its stamp."""
    key = image_key(image)
    source = image.dockerfile.relative_to(image.tree)
    say(f"images: {image.ref} from {source}" + (f" of {image.root}" if image.root else ""))
    _build(run, image.dockerfile, image.tree, image.ref, key, cpu_build_args(image))
    info = inspect(image.ref)
    if info is None:
        raise ImageError(f"{image.ref} was built but is not in the storage")
    image.stamp.unlink(missing_ok=True)
    leave_out = base_layers(image) if image.thin else frozenset[str]()
    _export(run, image.ref, image.archive, leave_out=leave_out)
    stamp = {
        "name": image.name,
        "ref": image.ref,
        "image_id": info.get("FromImageID"),
        "key": key,
        "base": image.cpu.ref,
        "archive": str(image.archive),
        "archive_bytes": image.archive.stat().st_size,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    image.stamp.write_text(json.dumps(stamp, indent=2) + "\n")


def base_layers(image: Image) -> frozenset[str]:
    """The digests of the layers of ``image``'s cpu base (uncompressed, as the archives hold
    them: a layer's digest is its diff id)."""
    info = inspect(image.cpu.ref)
    oci = info.get("OCIv1") if info else None
    rootfs = oci.get("rootfs") if isinstance(oci, dict) else None
    diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    if not isinstance(diff_ids, list):
        raise ImageError(f"{image.cpu.ref} (the base of {image.ref}) is not in the storage")
    return frozenset(str(d) for d in diff_ids)


def _export(
    run: Runner, ref: str, archive: Path, *, leave_out: frozenset[str] = frozenset()
) -> None:
    """Write the image ``ref`` of buildah's storage as the OCI archive ``archive``, without
    the blobs ``leave_out`` names."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    # Copied into an OCI layout first, with uncompressed layers, by skopeo (`buildah push`
    # gzips even with --disable-compression: minutes per torch layer on 2 cores; containerd
    # imports either form); the archive is then a plain copy of the image's blobs out of it.
    # The layout is deleted once the archive is written: kept, it would hold a third copy of
    # every layer (~8 GB) beside buildah's storage and the archives.
    layout = layout_dir()
    shutil.rmtree(layout, ignore_errors=True)
    try:
        run(
            [
                "skopeo",
                "copy",
                "--quiet",
                "--dest-oci-accept-uncompressed-layers",
                f"containers-storage:{storage_spec()}{ref}",
                f"oci:{layout}:{ref}",
            ]
        )
        partial = archive.parent / f".{archive.name}.partial"
        write_archive(layout, ref, partial, leave_out=leave_out)
        partial.replace(archive)
    finally:
        shutil.rmtree(layout, ignore_errors=True)


def layout_dir() -> Path:
    """The OCI image layout an image is copied into while its archive is written."""
    return work_dir() / "oci-layout"


def _blob(layout: Path, digest: str) -> Path:
    algorithm, _, hexdigest = digest.partition(":")
    return layout / "blobs" / algorithm / hexdigest


def _manifests(layout: Path) -> list[dict[str, object]]:
    index = json.loads((layout / "index.json").read_text())
    manifests = index.get("manifests") if isinstance(index, dict) else None
    return [m for m in manifests if isinstance(m, dict)] if isinstance(manifests, list) else []


def _ref_name(descriptor: dict[str, object]) -> str | None:
    annotations = descriptor.get("annotations")
    if isinstance(annotations, dict):
        value = annotations.get("org.opencontainers.image.ref.name")
        return str(value) if value is not None else None
    return None


def _image_blobs(layout: Path, descriptor: dict[str, object]) -> list[str]:
    """The digests of an image's manifest, its config and its layers."""
    digest = str(descriptor["digest"])
    manifest = json.loads(_blob(layout, digest).read_text())
    layers = [str(layer["digest"]) for layer in manifest["layers"]]
    return [digest, str(manifest["config"]["digest"]), *layers]


def write_archive(
    layout: Path, ref: str, target: Path, *, leave_out: frozenset[str] = frozenset()
) -> None:
    """An OCI archive (the tar form of a layout, as ``oci-archive:`` writes it) holding only
    the image ``ref`` of ``layout``, less the blobs ``leave_out`` names (a thin archive: its
    index and manifest still name them, so whoever imports it must hold them already;
    containerd reads the layers it unpacks from its content store)."""
    found = [m for m in _manifests(layout) if _ref_name(m) == ref]
    if len(found) != 1:
        raise ImageError(f"{layout} holds {len(found)} images named {ref}, not one")
    index = json.dumps({"schemaVersion": 2, "manifests": found}).encode()
    with tarfile.open(target, "w") as archive:
        archive.add(layout / "oci-layout", arcname="oci-layout")
        info = tarfile.TarInfo("index.json")
        info.size = len(index)
        archive.addfile(info, io.BytesIO(index))
        for digest in dict.fromkeys(_image_blobs(layout, found[0])):
            if digest in leave_out:
                continue
            algorithm, _, hexdigest = digest.partition(":")
            archive.add(_blob(layout, digest), arcname=f"blobs/{algorithm}/{hexdigest}")


#: Debian packages holding the tools of the build.
TOOL_PACKAGES = {
    "buildah": "buildah",
    "skopeo": "skopeo",
    "debootstrap": "debootstrap",
    "runc": "runc",
}


def missing_tools() -> list[str]:
    return [tool for tool in TOOL_PACKAGES if shutil.which(tool) is None]


def install_tools(run: Runner) -> None:
    """apt-get install what the build needs and this machine lacks (Debian/Ubuntu hosts)."""
    missing_now = missing_tools()
    if not missing_now:
        return
    if shutil.which("apt-get") is None:
        raise ImageError(
            f"{', '.join(missing_now)} not found and there is no apt-get: install "
            + ", ".join(TOOL_PACKAGES[t] for t in missing_now)
        )
    packages = sorted({TOOL_PACKAGES[t] for t in missing_now})
    say(f"images: apt-get install {' '.join(packages)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages],
    ):
        with run.log.open("a") as out:
            out.write(f"$ {' '.join(argv)}\n")
            out.flush()
            proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        if proc.returncode != 0:
            tail = "\n".join(run.log.read_text().splitlines()[-15:])
            raise ImageError(f"failed ({proc.returncode}): {' '.join(argv)}\n{tail}")


def build(
    names: list[str] | None = None,
    *,
    echo: bool = True,
    force: bool = False,
    among: Mapping[str, Image] = IMAGES,
) -> dict[str, float]:
    """Build the named images of ``among`` (this tree's by default; a release's, see
    :mod:`.release`), all by default, that are missing or out of date; returns seconds spent
    per step. ``force`` rebuilds even current ones (the layer cache still applies)."""
    with build_lock():
        return _build_all([among[n] for n in (names or list(among))], echo=echo, force=force)


@contextlib.contextmanager
def build_lock() -> Iterator[None]:
    """One build at a time on this machine: two would race on the storage,
    the shared layout and the archives. A second one waits, then finds the first one's work done."""
    work_dir().mkdir(parents=True, exist_ok=True)
    with (work_dir() / "build.lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say("images: another build is running here; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build_all(chosen: list[Image], *, echo: bool, force: bool) -> dict[str, float]:
    # a thin archive cannot be loaded back into the storage (its base layers are not in it):
    # an image of one that left the storage is built again (from the layer cache, if any)
    todo = [
        image
        for image in chosen
        if force or not is_current(image) or (image.thin and not in_storage(image))
    ]
    spent: dict[str, float] = {}
    run = Runner(work_dir() / "build.log", echo=echo)
    for image in chosen:
        if image not in todo and not in_storage(image):
            # a finished archive whose image left the storage (pruned): load it back
            with _timed(spent, f"load {image.name}"):
                say(f"images: loading {image.archive} back into buildah's storage")
                run(buildah_argv("pull", "--quiet", f"oci-archive:{image.archive}"))
    if not todo:
        return spent
    with _timed(spent, "tools"):
        install_tools(run)
    with _timed(spent, "debian"):
        build_debian(run)
    if any(image.cpu.ref == TORCH_IMAGE for image in todo):
        with _timed(spent, "torch-cpu"):
            build_torch(run)
    for image in todo:
        with _timed(spent, image.name):
            build_image(run, image)
    # Untagged images no other image builds on: the layer cache of earlier builds, superseded
    # (a few GB after some rebuilds of the trainer and the engine). The current chains stay.
    run(buildah_argv("rmi", "--prune"))
    return spent


@contextlib.contextmanager
def _timed(spent: dict[str, float], name: str) -> Iterator[None]:
    start = time.monotonic()
    yield
    spent[name] = time.monotonic() - start


def disk_usage() -> dict[str, int]:
    """Bytes used by the archives and by buildah's storage (the layer cache)."""

    def size(path: Path) -> int:
        if not path.exists():
            return 0
        out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True)
        return int(out.stdout.split()[0]) if out.returncode == 0 and out.stdout else 0

    return {"archives": size(images_dir()), "storage": size(storage_dir())}


# ---------------------------------------------------------------------------------------------
# images a test defines (not the project's): the same builder, on the Debian base


def fixture_archives_dir() -> Path:
    """``~/.cache/agentrl/images/tests``: archives of the images tests define."""
    return images_dir() / "tests"


def build_test_image(containerfile: Path, context: Path, ref: str, *, echo: bool = False) -> Path:
    """Build the image ``ref`` a test defines (``containerfile`` with the build context
    ``context``; its base is the build ARG ``BASE``, given the cpu flavour's Debian base) with
    this module's buildah, storage and layer cache, and write it as an OCI archive for the real
    node (:meth:`~agentrl.devcluster.cluster.LocalCluster.load`); returns the archive. Done only
    when the archive is missing or was built from another containerfile, context or base (its
    stamp's key). The Debian base comes from ``agentrl dev prepare`` (step ``images``)."""
    files = sorted(p for p in context.rglob("*") if p.is_file())
    digests = [
        (path.relative_to(context).as_posix(), hashlib.sha256(path.read_bytes()).hexdigest())
        for path in files
    ]
    key = _digest(BUILD_REVISION, debian_key(), ref, containerfile.read_text(), digests)
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", ref)
    archive = fixture_archives_dir() / f"{slug}.oci.tar"
    stamp = fixture_archives_dir() / f"{slug}.json"
    with build_lock():
        try:
            done = json.loads(stamp.read_text()).get("key") == key and archive.is_file()
        except (OSError, ValueError):
            done = False
        if done:
            return archive
        if not _has(DEBIAN_IMAGE, debian_key()):
            raise ImageError(f"{DEBIAN_IMAGE} is not built: run 'agentrl dev prepare'")
        stamp.unlink(missing_ok=True)
        run = Runner(work_dir() / "build.log", echo=echo)
        say(f"images: {ref} from {containerfile}")
        _build(run, containerfile, context, ref, key, {"BASE": DEBIAN_IMAGE})
        _export(run, ref, archive)
        stamp.write_text(json.dumps({"ref": ref, "key": key, "archive": str(archive)}) + "\n")
    return archive


# ---------------------------------------------------------------------------------------------
# running a built image (the tests use this; nothing here builds)


@dataclass
class Container:
    """A working container from a finished archive, for commands run with ``buildah run``."""

    name: str
    image: Image

    def run(
        self,
        argv: list[str],
        *,
        user: str | None = None,
        workdir: str | None = None,
        timeout: float = 300,
    ) -> subprocess.CompletedProcess[str]:
        extra: list[str] = ["--network", "none"]
        if user is not None:
            extra += ["--user", user]
        if workdir is not None:
            extra += ["--workingdir", workdir]
        return subprocess.run(
            buildah_argv("run", *extra, self.name, "--", *argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def config(self) -> dict[str, object]:
        """The OCI image config of the container's image (entrypoint, user, labels, env)."""
        proc = subprocess.run(
            buildah_argv("inspect", "--type", "container", self.name),
            capture_output=True,
            text=True,
            check=True,
        )
        data = json.loads(proc.stdout)
        config = data["OCIv1"]["config"]
        return dict(config) if isinstance(config, dict) else {}


def in_storage(image: Image) -> bool:
    """buildah's storage holds the very image the archive of ``image`` was written from."""
    stamp = _read_stamp(image)
    info = inspect(image.ref)
    return bool(stamp and info and info.get("FromImageID") == stamp.get("image_id"))


@contextlib.contextmanager
def container(name: str) -> Iterator[Container]:
    """A working container of the finished image ``name`` (the one its archive holds);
    removed afterwards."""
    image = IMAGES[name]
    stamp_of(name)
    if not in_storage(image):
        raise ImageError(
            f"{image.ref} is not in buildah's storage ({storage_dir()}): run 'agentrl dev prepare'"
        )
    proc = subprocess.run(
        buildah_argv("from", "--quiet", "--pull=never", image.ref),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise ImageError(f"cannot start a container of {image.ref}: {proc.stderr}")
    ctr = Container(proc.stdout.strip().splitlines()[-1], image)
    try:
        yield ctr
    finally:
        subprocess.run(buildah_argv("rm", ctr.name), capture_output=True, check=False)


# ---------------------------------------------------------------------------------------------
# the `agentrl dev prepare` step


def _needs_root() -> str | None:
    if not missing() or os.geteuid() == 0:
        return None
    return "building the images needs root (debootstrap, and buildah's overlay storage)"


def _needs_tools() -> str | None:
    lacking = missing_tools()
    if not missing() or not lacking or shutil.which("apt-get"):
        return None
    return (
        f"{', '.join(lacking)} not found and there is no apt-get to install them: install "
        + ", ".join(TOOL_PACKAGES[t] for t in lacking)
    )


def images_step() -> Step:
    """``images``: the operator, trainer, engine and sandbox images (cpu flavour) as OCI
    archives in ``~/.cache/agentrl/images``."""
    from agentrl.devcluster.steps import PrepareError
    from agentrl.devcluster.steps import Step as PrepareStep

    def run() -> None:
        try:
            spent = build()
        except ImageError as exc:
            raise PrepareError(f"images: {exc}") from exc
        say("images: " + ", ".join(f"{name} {secs:.0f}s" for name, secs in spent.items()))

    return PrepareStep(
        name="images",
        describe="container images (operator, trainer, engine, sandbox; cpu flavour on a "
        "debootstrap Debian base) built with buildah into OCI archives under "
        "~/.cache/agentrl/images",
        is_done=lambda: not missing() and all(in_storage(i) for i in IMAGES.values()),
        run=run,
        checks=(_needs_root, _needs_tools),
    )
