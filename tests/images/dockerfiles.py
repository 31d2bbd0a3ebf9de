"""The Dockerfile reader for the image tests: the builder's own parser
(:mod:`agentrl.devcluster.images`), so the tests read the Dockerfiles as the build does."""

from __future__ import annotations

from pathlib import Path

from agentrl.devcluster.images import (
    IMAGES_DIR,
    REPO,
    Dockerfile,
    Instruction,
    Stage,
    instructions,
    parse_dockerfile,
)

IMAGES = IMAGES_DIR
parse = parse_dockerfile

__all__ = [
    "IMAGES",
    "REPO",
    "Dockerfile",
    "Instruction",
    "Stage",
    "all_dockerfiles",
    "instructions",
    "parse",
]


def all_dockerfiles() -> list[Path]:
    return sorted(IMAGES.glob("*/Dockerfile"))


def all_build_files() -> list[Path]:
    """Every Dockerfile plus the local bases' Containerfiles (images/cpu)."""
    return [*all_dockerfiles(), *sorted(IMAGES.glob("cpu/*.Containerfile"))]
