"""The environment holding the real SGLang release the engine image pins, for the contract tests
(``tests/contracts/test_sglang_*.py``) and for regenerating the parser lists the API validates
against (``agentrl.api.sglang_parsers``).

Why torch is in it: the modules the contract needs cannot be imported without it.
``sglang.srt.server_args`` (the argument parser) imports ``sglang.srt.utils.common``, which runs
``import torch``, ``import triton`` and ``from torchvision.io import decode_jpeg`` at import time,
and ``import sglang`` itself patches transformers' modelling classes. A GPU is not needed to
import them; PyPI's torch wheel needs its CUDA runtime libraries to import even on a CPU, so
torch is installed with its dependencies (about 5 GB, once, by ``agentrl dev prepare``).
SGLang itself is installed with ``--no-deps``: its GPU kernels (sglang-kernel, flashinfer,
deep-gemm, ...) are never imported by the parser, the route table, the request structures or
the metrics collectors. The other packages are the ones those imports reach, pinned to the
versions SGLang pins where it pins one (torch, transformers, openai) and to versions known to
work otherwise, so the environment is the same on every machine.

The probes that run in this environment live in :mod:`agentrl.devcluster.sglang_probe`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.api.wire import SGLANG_VERSION
from agentrl.devcluster.venvs import Venv, VenvError

if TYPE_CHECKING:
    from agentrl.devcluster.steps import Step

#: What the probes import reaches, besides sglang (see the module docstring).
REQUIREMENTS: tuple[str, ...] = (
    "torch==2.11.0",
    "torchvision==0.26.0",
    "transformers==5.12.1",
    "openai==2.6.1",
    "aiohttp==3.14.5",
    "click==8.5.1",
    "compressed-tensors==0.20.1",
    "dill==0.4.1",
    "einops==0.8.2",
    "fastapi==0.165.0",
    "gguf==0.19.0",
    "ipython==9.18.1",
    "jsonschema==4.26.0",
    "msgspec==0.23.0",
    "numpy==2.4.6",
    "orjson==3.13.0",
    "packaging==26.4",
    "partial-json-parser==0.2.1.1.post7",
    "pillow==13.0.0",
    "prometheus-client==0.26.0",
    "psutil==7.2.2",
    "pybase64==1.5.1",
    "pydantic==2.14.4",
    "python-multipart==0.0.34",
    "pyyaml==6.0.4",
    "pyzmq==27.3.0",
    "requests==2.34.2",
    "sentencepiece==0.2.3",
    "setproctitle==1.3.8",
    "soundfile==0.14.0",
    "tqdm==4.70.1",
    "uvicorn==0.54.0",
    "uvloop==0.23.0",
)

#: The environment; its name carries the version, so a bump builds a new one beside the old.
VENV = Venv(
    name=f"sglang-{SGLANG_VERSION}",
    requirements=REQUIREMENTS,
    no_deps=(f"sglang=={SGLANG_VERSION}",),
)

#: The probe script run inside the environment.
PROBE_SCRIPT = Path(__file__).with_name("sglang_probe.py")


def probe(command: str, payload: Any = None, *, timeout: float = 300) -> Any:
    """Run one probe ``command`` in the environment with ``payload`` (JSON) and return what it
    printed (JSON).

    Raises:
        VenvError: the environment is not prepared (the message says: run
            ``agentrl dev prepare``) or the probe failed.
    """
    out = VENV.run_probe(
        PROBE_SCRIPT.read_text(encoding="utf-8"),
        command,
        json.dumps(payload),
        timeout=timeout,
    )
    return json.loads(out.strip().splitlines()[-1])


def parser_lists() -> dict[str, Any]:
    """The release's parser names, as ``agentrl/api/sglang_parsers.json`` holds them."""
    return probe("parsers")


def write_parser_lists() -> Path:
    """Rewrite ``agentrl/api/sglang_parsers.json`` from the pinned release."""
    # Not through agentrl.api: importing it reads the file this may be about to repair.
    path = Path(__file__).parents[1] / "api" / "sglang_parsers.json"
    path.write_text(json.dumps(parser_lists(), indent=2) + "\n", encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m agentrl.devcluster.sglang_env parsers [--write]``: print (or write) the
    parser lists of the pinned release."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m agentrl.devcluster.sglang_env")
    sub = parser.add_subparsers(dest="command", required=True)
    lists = sub.add_parser("parsers", help="the reasoning and tool-call parser names")
    lists.add_argument("--write", action="store_true", help="rewrite agentrl/api's data file")
    args = parser.parse_args(argv)
    if args.command == "parsers":
        if args.write:
            print(write_parser_lists())
        else:
            print(json.dumps(parser_lists(), indent=2))
    return 0


def _run() -> None:
    from agentrl.devcluster.steps import PrepareError, say

    say(f"  pip install sglang=={SGLANG_VERSION} (no deps) and torch into {VENV.path}")
    try:
        VENV.create()
    except VenvError as exc:
        raise PrepareError(f"sglang: {exc}") from exc


def sglang_step() -> Step:
    """The ``sglang`` step of ``agentrl dev prepare`` (listed in its ``STEPS``)."""
    from agentrl.devcluster.steps import Step

    return Step(
        name="sglang",
        describe=f"SGLang {SGLANG_VERSION} (the engine image's release) in its own environment "
        "for the contract tests (~/.cache/agentrl/venvs; torch included, about 5 GB)",
        is_done=VENV.is_done,
        run=_run,
    )


if __name__ == "__main__":
    raise SystemExit(main())
