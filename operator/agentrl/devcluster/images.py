"""The project's container images built on this machine, for the local cluster and the tests.

Each image is built with buildah from its own ``images/<name>/Dockerfile`` with the CPU
flavour of its base (a Debian bookworm root file system made with debootstrap, and a shared
torch layer for the trainer and the engine), and written as an OCI archive into
``~/.cache/agentrl/images/``. An archive counts only once its stamp is written, after it.
"""

from __future__ import annotations

from pathlib import Path

from agentrl import __version__

#: The tag every locally built image carries: the project's version.
VERSION = __version__

OPERATOR_IMAGE = f"localhost/agentrl/operator:{VERSION}"
TRAINER_IMAGE = f"localhost/agentrl/rocm-trainer:{VERSION}"
ENGINE_IMAGE = f"localhost/agentrl/sglang-engine:{VERSION}"
SANDBOX_IMAGE = f"localhost/agentrl/sandbox:{VERSION}"

#: image name (its images/<name>/ directory) -> reference
IMAGES: dict[str, str] = {
    "operator": OPERATOR_IMAGE,
    "rocm-trainer": TRAINER_IMAGE,
    "sglang-engine": ENGINE_IMAGE,
    "sandbox": SANDBOX_IMAGE,
}


def archives() -> list[Path]:
    """The OCI archives of the images whose build finished (stamped); none yet."""
    return []
