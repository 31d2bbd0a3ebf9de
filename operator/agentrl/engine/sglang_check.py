"""The launcher's last check: the engine flags parse with the installed SGLang's own argument
parser, before ``agentrl engine launch`` execs the server.

A flag the installed release does not know (or an ambiguous prefix, a bad choice, a missing
value) makes ``sglang.launch_server`` exit at once; the kubelet then restarts the container
with the same flags, for ever. Checked here, the launcher instead exits with
:data:`~agentrl.engine.launch.EXIT_REFUSED` and a message naming the flag and the spec field it
came from (:func:`agentrl.engine.launch.prepare`).

The check runs where SGLang is importable (the engine image); elsewhere there is nothing to
check against and :func:`sglang_installed` says so. It builds an ``argparse`` parser with
``ServerArgs.add_cli_args`` and parses the flags; it does not build a ``ServerArgs`` (its
``__post_init__`` probes the accelerator and reads the model, which the real start does
anyway). Importing ``sglang.srt.server_args`` takes seconds (it imports torch), once per
container start.

This module imports only the standard library at the top, so the check can also run in an
environment holding nothing but SGLang (the contract tests run it in the pinned one).
"""

from __future__ import annotations

import argparse
import importlib.util
import re
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Rejection:
    """SGLang's parser refused the flags."""

    message: str
    """argparse's own words (``unrecognized arguments: ...``, ``ambiguous option: ...``)."""
    index: int | None
    """Index of the offending token in the checked list, when the message names one."""


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]  # argparse exits here
        raise _Refused(message)


def sglang_installed() -> bool:
    """Whether SGLang can be imported here (the engine image)."""
    return importlib.util.find_spec("sglang") is not None


def _offending_index(message: str, args: Sequence[str]) -> int | None:
    """The first token of ``args`` the message names (argparse names flags as it saw them,
    or by their full option strings ``--a/--b``)."""
    named = re.findall(r"--[A-Za-z0-9][A-Za-z0-9_-]*", message)
    names = [a.split("=", 1)[0] if a.startswith("--") else None for a in args]
    for flag in named:
        for index, name in enumerate(names):
            if name == flag:
                return index
    # a value argparse refused ("invalid choice: 'x'") without naming our spelling
    quoted = re.findall(r"'([^']*)'", message)
    for value in quoted:
        if value in args:
            return list(args).index(value)
    return None


def check_args(args: Sequence[str]) -> Rejection | None:
    """Parse ``args`` (``sglang.launch_server``'s arguments) with the installed SGLang's parser;
    None when it accepts them."""
    from sglang.srt.server_args import ServerArgs

    parser = _Parser(prog="sglang.launch_server", add_help=False)
    ServerArgs.add_cli_args(parser)
    try:
        parser.parse_args(list(args))
    except _Refused as exc:
        message = str(exc)
        return Rejection(message=message, index=_offending_index(message, args))
    return None


if __name__ == "__main__":  # ``python sglang_check.py ARGS...``: prints the rejection, exit 2
    import json
    import sys

    rejection = check_args(sys.argv[1:])
    print(json.dumps(None if rejection is None else rejection.__dict__))
    sys.exit(0 if rejection is None else 2)
