"""The pod exec subresource over websockets: URL, channel framing, exit status, file transfer.

The API server streams an exec as websocket messages whose first byte is the channel
(0 stdin, 1 stdout, 2 stderr, 3 error/status, 4 resize; ``v5.channel.k8s.io`` adds 255 close).
The status channel carries a ``metav1.Status``: ``Success``, or ``Failure`` with reason
``NonZeroExitCode`` and the code in ``details.causes[reason=ExitCode].message``. A streaming
server that does not hand the kubelet library an exit error of its own type (kwok's local exec,
which the local control plane uses) reports the same exit as ``InternalError`` whose message
ends in Go's ``exit status N``; that form is read as exit code N too, so a failing command is a
result on every server rather than an infrastructure error on some.

Files travel as commands, which works on every protocol version (v4 cannot close stdin):
base64 chunks appended with ``printf | base64 -d``, read back with ``cat``.

Everything here is pure except :func:`run_exec`, which drives one websocket. Callers:
:mod:`agentrl.sandbox.kubernetes`.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
from collections.abc import Iterable, Sequence
from urllib.parse import quote, urlencode

import aiohttp

from agentrl.sandbox.errors import SandboxExecError

STDOUT, STDERR, STATUS = 1, 2, 3
PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
#: Bytes of file content per write command (base64 makes it 4/3 larger; ARG_MAX is ≥ 128 KiB
#: per argument on Linux).
FILE_CHUNK_BYTES = 48 * 1024
#: The tail of Go's ``*exec.ExitError`` message, as servers that wrap it send it.
_GO_EXIT_STATUS = re.compile(r"(?:^|: )exit status (\d+)$")


def exec_url(server: str, namespace: str, pod: str, argv: Sequence[str], container: str) -> str:
    """``wss://…/api/v1/namespaces/NS/pods/POD/exec?command=…&stdout=true&stderr=true``."""
    base = server.rstrip("/").replace("https://", "wss://", 1).replace("http://", "ws://", 1)
    query = [("container", container), ("stdout", "true"), ("stderr", "true")]
    query += [("command", arg) for arg in argv]
    return f"{base}/api/v1/namespaces/{quote(namespace)}/pods/{quote(pod)}/exec?" + urlencode(query)


def exit_code_from_status(status: dict[str, object] | None) -> int:
    """The exit code a status-channel message reports (0 for ``Success``)."""
    if not status or status.get("status") == "Success":
        return 0
    details = status.get("details")
    if status.get("reason") == "NonZeroExitCode" and isinstance(details, dict):
        for cause in details.get("causes") or []:
            if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
                try:
                    return int(str(cause.get("message")))
                except ValueError:
                    break
    wrapped = _GO_EXIT_STATUS.search(str(status.get("message") or "").strip())
    if wrapped is not None:
        return int(wrapped.group(1))
    raise SandboxExecError(f"exec failed: {status.get('message') or status}", provider="kubernetes")


def demultiplex(frames: Iterable[bytes]) -> tuple[bytes, bytes, dict[str, object] | None]:
    """(stdout, stderr, status) from the binary frames of one exec."""
    out, err = bytearray(), bytearray()
    status: dict[str, object] | None = None
    for frame in frames:
        if not frame:
            continue
        channel, payload = frame[0], frame[1:]
        if channel == STDOUT:
            out += payload
        elif channel == STDERR:
            err += payload
        elif channel == STATUS and payload:
            status = json.loads(payload)
    return bytes(out), bytes(err), status


def timed_command(command: str, timeout: float, cwd: str | None) -> list[str]:
    """argv that runs ``command`` in ``cwd`` under coreutils ``timeout`` (exit 124, and SIGKILL
    one second after SIGTERM), so a runaway command dies inside the pod, not just our socket."""
    script = command if cwd is None else f"cd {shlex.quote(cwd)} && {command}"
    return ["timeout", "-k", "1", f"{max(timeout, 0.001):g}", "/bin/sh", "-c", script]


def write_commands(path: str, data: bytes) -> list[list[str]]:
    """argv lists that create ``path`` (and its directory) holding ``data``: one command per
    chunk, the first also creating the directory and truncating the file, so a small file
    (the common case: source files, test files) costs a single exec round trip."""
    quoted = shlex.quote(path)
    parent = shlex.quote(path.rsplit("/", 1)[0] or "/")
    create = f"mkdir -p {parent} && : > {quoted}"
    commands = []
    for start in range(0, max(len(data), 1), FILE_CHUNK_BYTES):
        chunk = base64.b64encode(data[start : start + FILE_CHUNK_BYTES]).decode()
        append = f"printf %s {chunk} | base64 -d >> {quoted}" if chunk else ":"
        script = f"{create} && {append}" if start == 0 else append
        commands.append(["/bin/sh", "-c", script])
    return commands


async def run_exec(
    session: aiohttp.ClientSession, url: str, *, headers: dict[str, str], timeout: float
) -> tuple[bytes, bytes, int]:
    """One exec through the API server; (stdout, stderr, exit code)."""
    frames: list[bytes] = []
    try:
        async with session.ws_connect(
            url,
            protocols=PROTOCOLS,
            headers=headers,
            # ws_receive bounds the silence between frames: a command that prints nothing for
            # its whole timeout is still answered by its status frame when `timeout` kills it.
            timeout=aiohttp.ClientWSTimeout(ws_receive=timeout, ws_close=10.0),
            max_msg_size=0,
        ) as ws:
            async for message in ws:
                if message.type == aiohttp.WSMsgType.BINARY:
                    frames.append(message.data)
                elif message.type == aiohttp.WSMsgType.TEXT:  # some proxies re-frame as text
                    frames.append(message.data.encode("latin-1"))
                elif message.type in (aiohttp.WSMsgType.ERROR, aiohttp.WSMsgType.CLOSE):
                    break
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise SandboxExecError(f"exec websocket failed: {exc}", provider="kubernetes") from exc
    out, err, status = demultiplex(frames)
    return out, err, exit_code_from_status(status)
