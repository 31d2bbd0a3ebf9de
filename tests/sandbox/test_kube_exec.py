"""The exec subresource's wire format: URL, channel frames, exit status, file transfer."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from agentrl.sandbox import kube_exec
from agentrl.sandbox.errors import SandboxExecError


def test_the_exec_url_carries_every_argument_and_switches_to_websocket() -> None:
    url = kube_exec.exec_url("https://10.0.0.1:6443", "ns-a", "pod-1", ["sh", "-c", "a b"], "sb")
    assert url == (
        "wss://10.0.0.1:6443/api/v1/namespaces/ns-a/pods/pod-1/exec?container=sb&stdout=true"
        "&stderr=true&command=sh&command=-c&command=a+b"
    )


def test_frames_are_split_by_channel_and_the_status_gives_the_exit_code() -> None:
    status = {
        "status": "Failure",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": "3"}]},
    }
    frames = [b"\x01hel", b"\x02warn", b"\x01lo", b"\x03" + json.dumps(status).encode()]
    out, err, parsed = kube_exec.demultiplex(frames)
    assert (out, err) == (b"hello", b"warn")
    assert kube_exec.exit_code_from_status(parsed) == 3


def test_a_success_status_is_exit_code_zero() -> None:
    assert kube_exec.exit_code_from_status({"status": "Success"}) == 0


def test_an_exit_status_wrapped_in_an_internal_error_is_still_the_exit_code() -> None:
    # What kwok's local exec (the local control plane) sends for `exit 3`: Go's ExitError text
    # at the end of the message instead of a NonZeroExitCode cause.
    status = {
        "status": "Failure",
        "reason": "InternalError",
        "message": "Internal error occurred: error executing command in container: cmd wait: "
        "timeout -k 1 10 /bin/sh -c exit 3: exit status 3",
    }
    assert kube_exec.exit_code_from_status(status) == 3


def test_a_message_that_merely_mentions_an_exit_status_is_not_an_exit_code() -> None:
    with pytest.raises(SandboxExecError, match="exit status 3 expected"):
        kube_exec.exit_code_from_status(
            {"status": "Failure", "reason": "InternalError", "message": "exit status 3 expected"}
        )


def test_a_failure_without_an_exit_code_is_an_exec_error() -> None:
    with pytest.raises(SandboxExecError, match="container not found"):
        kube_exec.exit_code_from_status(
            {"status": "Failure", "reason": "InternalError", "message": "container not found"}
        )


def test_the_timed_command_runs_in_the_working_directory_under_coreutils_timeout() -> None:
    assert kube_exec.timed_command("make test", 30, "/w d") == [
        "timeout",
        "-k",
        "1",
        "30",
        "/bin/sh",
        "-c",
        "cd '/w d' && make test",
    ]


def test_file_write_commands_recreate_the_exact_bytes(tmp_path: Path) -> None:
    # 100,000 bytes of every byte value: three chunks of at most 48 KiB each.
    data = bytes(range(256)) * 390 + b"tail"
    target = tmp_path / "sub dir" / "blob.bin"
    commands = kube_exec.write_commands(str(target), data)
    # 100,000 = 2 × 49,152 + 1,696: three chunks, the first one also creating the file
    assert len(commands) == 3
    for argv in commands:
        subprocess.run(argv, check=True)
    assert target.read_bytes() == data


def test_a_small_file_is_written_with_one_command_and_an_empty_one_too(tmp_path: Path) -> None:
    for data in (b"VALUE = 'BUG'\n", b""):
        target = tmp_path / "new dir" / "app.py"
        commands = kube_exec.write_commands(str(target), data)
        assert len(commands) == 1
        subprocess.run(commands[0], check=True)
        assert target.read_bytes() == data
