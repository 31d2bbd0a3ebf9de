"""Read Harbor task directories into :class:`~agentrl.rollout.tasks.model.Task`.

A Harbor task is a directory with ``instruction.md`` (what the agent is asked), ``task.toml``
(``[agent] timeout_sec``, ``[verifier] timeout_sec``, ``[environment] docker_image``, ...),
``tests/test.sh`` (runs the tests and writes ``/logs/verifier/reward.txt`` or ``reward.json``)
and optionally ``solution/solve.sh`` (the reference solution). The verifier copies ``tests/`` to
``/tests`` in the sandbox just before running it, so the agent never sees or edits it.

A task that only has ``environment/Dockerfile`` needs its image built and pushed first; such a
task is loaded with ``image=None`` (the spec's default image) and ``agentrl tasks validate`` will
say so when it fails.

Callers: :func:`agentrl.rollout.tasks.load_tasks` (``dataset.format: harbor``).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from agentrl.rollout.tasks.model import ReferenceSolution, RewardFileVerification, Task
from agentrl.rollout.tasks.swebench import DatasetError

#: Harbor images usually set WORKDIR /app; task.toml may name another in [environment].workdir.
DEFAULT_HARBOR_WORKDIR = "/app"


def _section(config: dict[str, Any], name: str) -> dict[str, Any]:
    value = config.get(name, {})
    return value if isinstance(value, dict) else {}


def load_harbor_task(directory: str | Path) -> Task:
    """One Harbor task directory."""
    root = Path(directory)
    instruction_path = root / "instruction.md"
    test_script = root / "tests" / "test.sh"
    if not instruction_path.is_file():
        raise DatasetError(f"{root}: no instruction.md")
    if not test_script.is_file():
        raise DatasetError(f"{root}: no tests/test.sh")
    config: dict[str, Any] = {}
    toml_path = root / "task.toml"
    if toml_path.is_file():
        try:
            config = tomllib.loads(toml_path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise DatasetError(f"{toml_path}: {exc}") from exc
    environment = _section(config, "environment")
    agent = _section(config, "agent")
    verifier = _section(config, "verifier")

    files = {
        f"/tests/{path.relative_to(root / 'tests').as_posix()}": path.read_text(encoding="utf-8")
        for path in sorted((root / "tests").rglob("*"))
        if path.is_file()
    }
    solution = root / "solution" / "solve.sh"
    image = environment.get("docker_image")
    return Task(
        id=root.name,
        source="harbor",
        instruction=instruction_path.read_text(encoding="utf-8"),
        image=str(image) if image else None,
        workdir=str(environment.get("workdir", DEFAULT_HARBOR_WORKDIR)),
        visible_test_command=None,
        verification=RewardFileVerification(
            files=files,
            command="mkdir -p /logs/verifier && bash /tests/test.sh",
            timeout_seconds=float(verifier["timeout_sec"]) if "timeout_sec" in verifier else None,
        ),
        reference=ReferenceSolution(
            script=solution.read_text(encoding="utf-8") if solution.is_file() else None
        ),
        timeout_seconds=float(agent["timeout_sec"]) if "timeout_sec" in agent else None,
    )


def load_harbor_directory(directory: str | Path) -> list[Task]:
    """A Harbor task directory, or a directory of them (sorted by name)."""
    root = Path(directory)
    if (root / "instruction.md").is_file():
        return [load_harbor_task(root)]
    tasks = [
        load_harbor_task(child)
        for child in sorted(root.iterdir())
        if child.is_dir() and (child / "instruction.md").is_file()
    ]
    if not tasks:
        raise DatasetError(f"{root}: no Harbor task directories (none has instruction.md)")
    return tasks
