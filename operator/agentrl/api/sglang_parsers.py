"""The reasoning and tool-call parser names of the SGLang release the engine image pins: what
``spec.model.reasoningParser`` and ``spec.model.toolCallParser`` may say.

SGLang's argument parser accepts only these names (``ServerArgs.add_cli_args`` builds the
choices from ``ReasoningParser.DetectorMap`` and ``FunctionCallParser.ToolCallParserEnum``,
plus ``auto``); any other makes the engine exit at start. So the manifest is checked against
them at apply time (an ``enum`` in the CRD, and ``agentrl validate``).

The lists are data, ``sglang_parsers.json`` beside this module, written from the real package
by ``agentrl dev sglang-parsers --write`` (it runs a probe in the environment
``agentrl dev prepare`` makes). ``tests/contracts/test_sglang_parsers.py`` fails, with the
difference, when they are not what the pinned release has, e.g. after a version bump.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any, Literal

DATA_FILE = "sglang_parsers.json"

_DATA: dict[str, Any] = json.loads(
    resources.files(__package__).joinpath(DATA_FILE).read_text(encoding="utf-8")
)

#: The SGLang release the lists were read from.
SGLANG_RELEASE: str = _DATA["sglang"]
#: ``--reasoning-parser`` choices: SGLang's detectors, then ``auto`` (detect from the chat
#: template).
REASONING_PARSERS: tuple[str, ...] = (*_DATA["reasoning_parsers"], "auto")
#: ``--tool-call-parser`` choices: SGLang's parsers, then ``auto``.
TOOL_CALL_PARSERS: tuple[str, ...] = (*_DATA["tool_call_parsers"], "auto")

ReasoningParserName = Literal[REASONING_PARSERS]  # type: ignore[valid-type]
ToolCallParserName = Literal[TOOL_CALL_PARSERS]  # type: ignore[valid-type]
