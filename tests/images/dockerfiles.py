"""A small Dockerfile reader for the image tests: instructions, ARG defaults, stages."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "images"


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

    def entrypoint(self) -> list[str]:
        entries = [i for i in self.final.instructions if i.keyword == "ENTRYPOINT"]
        assert entries, f"{self.path}: no ENTRYPOINT"
        value = json.loads(entries[-1].args)  # exec form only: shell form is refused
        assert isinstance(value, list)
        return [str(v) for v in value]


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


def parse(path: Path) -> Dockerfile:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for instruction in instructions(path.read_text()):
        if instruction.keyword == "ARG" and not stages:
            name, default = _arg(instruction.args)
            global_args[name] = _substitute(default, global_args)
        elif instruction.keyword == "FROM":
            words = instruction.args.split()
            words = [w for w in words if not w.startswith("--platform")]
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=_substitute(words[0], global_args), name=name))
        else:
            assert stages, f"{path}:{instruction.line}: {instruction.keyword} before FROM"
            stages[-1].instructions.append(instruction)
    return Dockerfile(path=path, global_args=global_args, stages=stages)


def all_dockerfiles() -> list[Path]:
    return sorted(IMAGES.glob("*/Dockerfile"))
