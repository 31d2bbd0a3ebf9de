"""Separate, cached Python environments for contract tests against real upstream packages.

Some upstreams cannot share the project's environment: SGLang pins its own torch and a long
list of GPU packages. A contract test then runs a small probe in an environment that holds the
pinned release (installed without its GPU dependencies where the probe does not need them) and
compares what the probe prints with what our code produces.

Each :class:`Venv` lives in ``~/.cache/agentrl/venvs/<name>/`` and is created by
``agentrl dev prepare`` (never inside a test). It counts as ready only once its stamp is
written, after every install finished, and the stamp records the requirements: changing a pin
makes the environment out of date, so it is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from agentrl.devcluster.binaries import cache_root

STAMP = "agentrl-venv.json"


class VenvError(RuntimeError):
    """An environment could not be made; the message has pip's last words."""


@dataclass(frozen=True)
class Venv:
    """A pinned environment: ``requirements`` installed with their dependencies, then
    ``no_deps`` installed without theirs."""

    name: str
    requirements: tuple[str, ...] = ()
    no_deps: tuple[str, ...] = ()

    @property
    def path(self) -> Path:
        return cache_root() / "venvs" / self.name

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def _digest(self) -> str:
        text = json.dumps([sys.version_info[:2], self.requirements, self.no_deps])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def is_done(self) -> bool:
        stamp = self.path / STAMP
        if not stamp.is_file() or not self.python.exists():
            return False
        try:
            return json.loads(stamp.read_text()).get("digest") == self._digest()
        except (OSError, ValueError):
            return False

    def create(self, *, log: Path | None = None) -> Path:
        """Make the environment (resuming a half-made one: pip skips what is installed)."""
        log = log or cache_root() / f"venv-{self.name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        (self.path / STAMP).unlink(missing_ok=True)
        if not self.python.exists():
            if self.path.exists():
                shutil.rmtree(self.path)
            self._run([sys.executable, "-m", "venv", str(self.path)], log)
        pip = [str(self.python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        if self.requirements:
            self._run([*pip, *self.requirements], log)
        if self.no_deps:
            self._run([*pip, "--no-deps", *self.no_deps], log)
        stamp = {"name": self.name, "digest": self._digest(), "requirements": self.requirements}
        stamp["no_deps"] = self.no_deps
        (self.path / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
        return self.path

    @staticmethod
    def _run(cmd: list[str], log: Path) -> None:
        with log.open("a") as out:
            out.write(f"$ {' '.join(cmd)}\n")
            out.flush()
            proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False)
        if proc.returncode != 0:
            tail = "\n".join(log.read_text().splitlines()[-20:])
            raise VenvError(f"failed ({proc.returncode}): {' '.join(cmd)}\n{tail}")

    def run_probe(self, script: str, *args: str, timeout: float = 120) -> str:
        """Run ``python -c script args...`` in the environment; returns its stdout."""
        if not self.is_done():
            raise VenvError(
                f"the {self.name} environment is not prepared: run 'agentrl dev prepare'"
            )
        proc = subprocess.run(
            [str(self.python), "-c", script, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0:
            raise VenvError(f"probe failed in {self.name} ({proc.returncode}):\n{proc.stderr}")
        return proc.stdout
