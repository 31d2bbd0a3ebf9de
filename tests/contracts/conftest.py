"""Fixtures of the SGLang contract tests: the pinned release's own answers, read once per
session from the environment ``agentrl dev prepare`` makes (step ``sglang``).

A missing environment fails the tests with the message of
:func:`agentrl.devcluster.sglang_env.probe` (it names ``agentrl dev prepare``); nothing is
built here.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentrl.devcluster import sglang_env


@pytest.fixture(scope="session")
def sglang() -> dict[str, Any]:
    """The probe's ``describe`` answer: parser options, parser names, routes, request
    structures, metric names and response pieces of the pinned SGLang."""
    return sglang_env.probe("describe")  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def options_by_dest(sglang: dict[str, Any]) -> dict[str, list[str]]:
    """Every option string of SGLang's parser, grouped by the destination it sets."""
    out: dict[str, list[str]] = {}
    for option in sglang["options"]:
        out.setdefault(option["dest"], []).extend(option["strings"])
    return out
