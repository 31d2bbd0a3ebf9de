"""A real tiny engine (``agentrl engine serve-tiny``) in a subprocess, for the trainer tests
that run the trainer's entry points against one."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def tiny_engine(policy: Path, *, hf_model: bool = False) -> Iterator[str]:
    """A real CPU engine serving a new tiny policy saved at ``policy`` (``hf_model``: the
    HF-format Qwen3 model ``agentrl model create`` makes, seed 0); yields its URL."""
    if hf_model:
        from agentrl.trainer import hf_model as hf

        hf.create_model(policy, seed=0)
    else:
        from agentrl.tiny import policy as tiny  # torch: only the tests that start one

        tiny.save_policy(tiny.new_policy(0, dim=16), policy)
    context = "4096" if hf_model else "2048"
    engine = subprocess.Popen(
        [sys.executable, "-m", "agentrl.cli", "engine", "serve-tiny", "--port", "0",
         "--model-path", str(policy), "--context-length", context],
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert engine.stderr is not None
        url = None
        while url is None:
            line = engine.stderr.readline()
            assert line, "the tiny engine exited before serving"
            found = re.search(r"serving on (http://\S+)", line)
            url = found.group(1) if found else None
        # keep reading its log: a full pipe would block the engine's event loop mid-request
        threading.Thread(target=engine.stderr.read, daemon=True).start()
        yield url
    finally:
        engine.terminate()
        engine.wait(timeout=60)
