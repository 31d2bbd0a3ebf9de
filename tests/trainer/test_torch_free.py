"""The driver loop and what it reads of a step (:mod:`agentrl.trainer.stats`, the batching, the
GRPO arithmetic, the step metrics) import without torch: a fresh interpreter with torch blocked
imports them. (Import-linter's contract in ``pyproject.toml`` covers the modules with no torch
import at all; the loop reaches torch only inside the weight sync's functions, which the
contract would count.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

MODULES = [
    "agentrl.trainer.stats",
    "agentrl.trainer.loop",
    "agentrl.trainer.step_metrics",
    "agentrl.trainer.batching",
    "agentrl.trainer.grpo",
]


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_with_torch_blocked(module: str) -> None:
    code = (
        "import importlib, sys\n"
        "sys.modules['torch'] = None  # any import of torch now raises ImportError\n"
        f"importlib.import_module({module!r})\n"
        "assert sys.modules['torch'] is None\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr


def test_blocking_torch_does_stop_a_module_that_needs_it() -> None:
    # The check above means something only if a torch import really fails under it.
    code = "import sys\nsys.modules['torch'] = None\nimport agentrl.trainer.loss\n"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode != 0
    assert "torch" in done.stderr
