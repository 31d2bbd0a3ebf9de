"""The current-weights record: which exported weights the engines should be serving.

Written by the trainer after every weight push (``write_current_weights``, atomically, on the
checkpoint volume the engine pods also mount at ``/checkpoints``); read by the watchdog sidecar
(``agentrl.engine.watchdog``) after it restarted an engine, to push those weights again with
``POST /update_weights_from_disk`` before the engine is marked ready.

Why a file and not a call back into the trainer: the engine pod can then recover on its own,
while the trainer is busy, restarting, or unreachable, and the file is on the volume that
``/update_weights_from_disk`` must read from anyway. With ``weightSync.mode: distributed`` the
trainer still records its latest exported checkpoint here; a restarted engine serves that until
the next broadcast.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class CurrentWeights(BaseModel):
    """What ``current-weights.json`` holds (camelCase JSON)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    model_path: str = Field(min_length=1)
    """HF-format directory of the weights, as the engine pod sees it."""
    weight_version: str = Field(min_length=1)
    """The version engines report in ``/get_model_info`` once they serve these weights."""
    load_format: str | None = None
    """``load_format`` for ``/update_weights_from_disk``; unset lets SGLang choose."""


def read_current_weights(path: Path) -> CurrentWeights | None:
    """The record at ``path``, or None when the trainer has not pushed weights yet.

    Raises:
        pydantic.ValidationError: when the file exists but is not a valid record.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return CurrentWeights.model_validate_json(text)


def write_current_weights(path: Path, weights: CurrentWeights) -> None:
    """Write the record atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(weights.model_dump_json(by_alias=True, exclude_none=True))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
