"""What a step of ``agentrl dev prepare`` is: :class:`Step`, :class:`PrepareError` and
:func:`say`.

The modules that contribute steps (:mod:`agentrl.devcluster.images`,
:mod:`agentrl.devcluster.node.artifacts`, :mod:`agentrl.devcluster.sglang_env`) build them from
here, and :mod:`agentrl.devcluster.prepare` lists and runs them; this module imports neither,
so the step modules and the runner do not import each other in a circle.

Callers: :mod:`agentrl.devcluster.prepare` (which re-exports all three),
:mod:`agentrl.devcluster.images`, :mod:`agentrl.devcluster.node.artifacts`,
:mod:`agentrl.devcluster.sglang_env`.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field


class PrepareError(RuntimeError):
    """A step cannot run or failed; the message names what is missing and the fix."""


def say(message: str) -> None:
    """Progress output of a step (stderr, flushed: CI shows it as it happens)."""
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Step:
    """One thing to build or install before the tests."""

    name: str
    describe: str
    is_done: Callable[[], bool]
    run: Callable[[], None]
    #: commands that must be on PATH for ``run``; checked first, named when missing
    tools: tuple[str, ...] = ()
    #: how to get the tools when they are missing
    hint: str = ""
    #: further requirements checked before ``run``: each returns a problem or None
    checks: tuple[Callable[[], str | None], ...] = field(default_factory=tuple)

    def problems(self) -> list[str]:
        found = [t for t in self.tools if shutil.which(t) is None]
        out = []
        if found:
            out.append(
                f"{self.name}: {', '.join(found)} not found on PATH"
                + (f" ({self.hint})" if self.hint else "")
            )
        for check in self.checks:
            problem = check()
            if problem:
                out.append(f"{self.name}: {problem}")
        return out
