"""``agentrl engine launch``: the engine container's entrypoint.

Reads the resolved AgentRLJob the operator mounts from the job's ConfigMap
(:data:`~agentrl.api.wire.SPEC_FILE`), builds the
``python3 -m sglang.launch_server`` command through the static flag schema
(:mod:`agentrl.api.engine_flags`, the same function the operator renders the pod with),
sets the ROCm environment, and execs the engine.

Why exec: the engine must be the container's main process, so the kubelet's SIGTERM reaches it
directly and its exit — after a GPU fault, or when the watchdog stops it — ends the container,
which the kubelet restarts on the same GPU with the same command. Before exec the launcher
makes the engine lead its own process group (the watchdog stops that group) and forks a small
tee process that copies the engine's stdout and stderr both to the container log and to the
shared log volume the watchdog tails. The tee lives in its own session and ignores SIGTERM, so
it drains the engine's last lines — the fault signature — before it exits on end of file.

The operator passes the flags as the container's arguments (so ``kubectl get pod -o yaml``
shows them); without arguments the launcher builds them from the spec itself. Either way a
flag that would disable HIP graphs is refused here too (exit code 2), even if it got past the
API server's CEL rule.

Where SGLang is installed (the engine image), the flags are then parsed by SGLang's own
argument parser (:mod:`agentrl.engine.sglang_check`) before exec: a flag the image's release
refuses stops the launcher with exit code 2 and a message naming the flag and the spec field it
came from, instead of an engine that exits at once and crash-loops under the kubelet.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

import yaml

from agentrl.api import AgentRLJob, engine_flags, wire
from agentrl.engine import sglang_check

log = logging.getLogger(__name__)

#: Exit code for a spec the launcher refuses (like a usage error).
EXIT_REFUSED = 2
#: A log file larger than this at launch is moved to ``<name>.1`` (one generation kept).
DEFAULT_LOG_MAX_BYTES = 256 * 1024 * 1024


def load_job(path: Path) -> AgentRLJob:
    """The AgentRLJob in the YAML file at ``path`` (the ConfigMap the operator mounts)."""
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(document, dict):
        raise ValueError(f"{path}: expected an AgentRLJob mapping, got {type(document).__name__}")
    return AgentRLJob.model_validate(document)


def engine_environment(job: AgentRLJob, base: Mapping[str, str]) -> dict[str, str]:
    """``base`` (the container's environment) with the engine environment of ``job`` on top:
    the spec wins, so an image or pod cannot silently drop ``SGLANG_USE_AITER=1``."""
    return {**base, **engine_flags.rocm_env(job)}


def rotate_log(path: Path, max_bytes: int) -> None:
    """Move a log over ``max_bytes`` to ``<name>.1`` so the shared volume stays bounded."""
    with contextlib.suppress(FileNotFoundError):
        if path.stat().st_size > max_bytes:
            path.replace(path.with_name(path.name + ".1"))


def _tee(read_fd: int, log_file: Path) -> NoReturn:
    """The tee process: copy the pipe to our stdout and to ``log_file`` until end of file."""
    os.setsid()  # out of the engine's process group: stopping the engine must not stop us
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    status = 0
    try:
        with log_file.open("ab", buffering=0) as sink:
            while chunk := os.read(read_fd, 65536):
                sink.write(chunk)
                with contextlib.suppress(OSError):  # container stdout gone: keep the file
                    os.write(1, chunk)
    except OSError:
        status = 1
    os._exit(status)


def exec_engine(argv: list[str], env: dict[str, str], log_file: Path) -> NoReturn:
    """Exec ``argv`` as the leader of a new process group, stdout and stderr teed to
    ``log_file``."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    if os.fork() == 0:
        os.close(write_fd)
        _tee(read_fd, log_file)
    os.close(read_fd)
    with contextlib.suppress(PermissionError):  # already a group leader: nothing to do
        os.setpgid(0, 0)
    os.dup2(write_fd, 1)
    os.dup2(write_fd, 2)
    os.close(write_fd)
    os.write(1, f"agentrl engine launch: exec {shlex.join(argv)}\n".encode())
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        os.write(2, f"agentrl engine launch: cannot exec {argv[0]}: {exc}\n".encode())
        os._exit(127)


def _installed_sglang_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        return "unknown"


def check_with_sglang(args: list[str], sources: list[str]) -> None:
    """Parse ``args`` with the installed SGLang's parser; ``sources[i]`` names where token
    ``i`` came from.

    Raises:
        EngineFlagError: SGLang refuses them; the message names the flag, its source and the
            release (and the one agentrl's flags are checked against, if they differ).
    """
    rejection = sglang_check.check_args(args)
    if rejection is None:
        return
    installed = _installed_sglang_version()
    release = f"SGLang {installed}"
    if installed != wire.SGLANG_VERSION:
        release += (
            f" (agentrl's flags are checked against SGLang {wire.SGLANG_VERSION}: "
            "is the image's base the release agentrl pins?)"
        )
    if rejection.index is None:
        where = "the engine flags"
    else:
        index = rejection.index
        # a value token: name the flag it belongs to
        while index > 0 and not args[index].startswith("--"):
            index -= 1
        where = f"{args[index]!r}, from {sources[index]},"
    raise engine_flags.EngineFlagError(
        f"{release} refuses the engine flags: {rejection.message}. The flag {where} would make "
        "the engine exit at start (and the kubelet restart it in a loop); change it there."
    )


def prepare(
    job: AgentRLJob | None, port: int, sglang_args: list[str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """The engine command and environment.

    ``sglang_args`` (what the operator puts in the pod's ``args``) are used as given, after the
    graph check; without them the flags are built from ``job``. With a ``job`` the engine
    environment of the spec is laid over the container's. Where SGLang is installed, its
    parser must accept the flags (:func:`check_with_sglang`).

    Raises:
        EngineFlagError: a flag would disable HIP graphs (or ``extraArgs`` is refused), or the
            installed SGLang refuses a flag.
        ValueError: neither arguments nor a job were given.
    """
    if sglang_args:
        args = list(sglang_args)
        engine_flags.refuse_graph_disabling(args, source="the engine arguments")
        from_spec = engine_flags.launch_args_with_sources(job, port) if job is not None else None
        if from_spec is not None and args == [token for token, _ in from_spec]:
            sources = [source for _, source in from_spec]
        else:
            if from_spec is not None:
                log.warning(
                    "the engine arguments differ from those the spec in the ConfigMap gives; "
                    "running the arguments (the pod is rolled when the spec changes)"
                )
            sources = [f"the engine arguments[{i}]" for i in range(len(args))]
    elif job is not None:
        with_sources = engine_flags.launch_args_with_sources(job, port)
        args = [token for token, _ in with_sources]
        sources = [source for _, source in with_sources]
    else:
        raise ValueError("no engine arguments and no job spec")
    if sglang_check.sglang_installed():
        check_with_sglang(args, sources)
    command = ["python3", "-m", wire.SGLANG_MODULE, *args]
    with contextlib.suppress(OSError):
        Path(wire.CRASH_DUMP_PATH).mkdir(parents=True, exist_ok=True)
    base = dict(os.environ)
    return command, engine_environment(job, base) if job is not None else base
