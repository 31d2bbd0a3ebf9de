"""The local provider: a directory per sandbox, each command in fresh namespaces, limits and a
timeout that kills everything a command started."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from agentrl.sandbox.errors import SandboxFileError
from agentrl.sandbox.local import LocalProvider, available_namespaces
from agentrl.sandbox.provider import SandboxRequest


def request() -> SandboxRequest:
    return SandboxRequest(episode_id="ep-1")


def needs(kind: str) -> None:
    if kind not in available_namespaces():
        pytest.skip(f"this kernel refuses {kind} namespaces (the provider logs the fallback)")


async def test_files_written_into_the_sandbox_are_what_commands_see(tmp_path: Path) -> None:
    provider = LocalProvider(base_dir=str(tmp_path))
    async with await provider.create(request()) as sandbox:
        await sandbox.write_file("pkg/mod.py", "X = 41\n")
        result = await sandbox.exec("python3 -c 'import pkg.mod as m; print(m.X + 1)'", timeout=30)
        assert result.exit_code == 0, result.output
        assert result.stdout == "42\n"
        assert await sandbox.read_file("pkg/mod.py") == b"X = 41\n"


async def test_a_non_zero_exit_is_a_result_not_an_error(tmp_path: Path) -> None:
    async with await LocalProvider(base_dir=str(tmp_path)).create(request()) as sandbox:
        result = await sandbox.exec("echo oops >&2; exit 3", timeout=10)
    assert (result.exit_code, result.stderr, result.timed_out) == (3, "oops\n", False)


async def test_closing_removes_the_sandbox_directory(tmp_path: Path) -> None:
    sandbox = await LocalProvider(base_dir=str(tmp_path)).create(request())
    root = Path(sandbox.workdir)
    await sandbox.write_file("a.txt", "x")
    assert root.is_dir()
    await sandbox.close()
    assert not root.exists()


async def test_paths_outside_the_sandbox_are_refused(tmp_path: Path) -> None:
    async with await LocalProvider(base_dir=str(tmp_path)).create(request()) as sandbox:
        with pytest.raises(SandboxFileError):
            await sandbox.write_file("../escape.txt", "x")
        with pytest.raises(SandboxFileError):
            await sandbox.read_file("/etc/hostname")
    assert not (tmp_path / "escape.txt").exists()


async def test_a_command_past_its_timeout_is_killed_with_its_background_children(
    tmp_path: Path,
) -> None:
    needs("pid")
    async with await LocalProvider(base_dir=str(tmp_path)).create(request()) as sandbox:
        marker = Path(sandbox.workdir) / "late.txt"
        # The background child would write the marker after 1.5 s; the command is killed at
        # 0.5 s, and with it (PID namespace) the child.
        result = await sandbox.exec("(sleep 1.5; touch late.txt) & sleep 30", timeout=0.5)
        assert result.timed_out
        assert result.exit_code == 124
        await asyncio.sleep(2.0)
        assert not marker.exists()


async def test_commands_run_as_pid_one_of_their_own_pid_namespace(tmp_path: Path) -> None:
    needs("pid")
    async with await LocalProvider(base_dir=str(tmp_path)).create(request()) as sandbox:
        result = await sandbox.exec("echo $$", timeout=10)
    assert result.stdout == "1\n"


async def test_commands_cannot_reach_a_server_on_the_hosts_loopback(tmp_path: Path) -> None:
    needs("net")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        script = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)"
        async with await LocalProvider(base_dir=str(tmp_path)).create(request()) as sandbox:
            result = await sandbox.exec(f'python3 -c "{script}"', timeout=10)
    assert result.exit_code != 0
    assert "Connection refused" in result.stderr or "unreachable" in result.stderr


async def test_runaway_output_is_bounded_keeping_head_and_tail(tmp_path: Path) -> None:
    provider = LocalProvider(base_dir=str(tmp_path), max_capture_bytes=1000)
    async with await provider.create(request()) as sandbox:
        # 100,000 bytes of output: 500 head bytes and 500 tail bytes are kept, 99,000 dropped.
        result = await sandbox.exec("python3 -c \"print('a' * 99999)\"", timeout=20)
    assert result.stdout.startswith("a" * 500)
    assert "[... 99000 bytes dropped ...]" in result.stdout
    assert result.stdout.endswith("a" * 499 + "\n")


async def test_the_memory_limit_stops_a_command_that_allocates_beyond_it(tmp_path: Path) -> None:
    provider = LocalProvider(base_dir=str(tmp_path), memory_bytes=512 * 1024 * 1024)
    async with await provider.create(request()) as sandbox:
        result = await sandbox.exec('python3 -c "b = bytearray(1024 ** 3)"', timeout=20)
    assert result.exit_code != 0
    assert "MemoryError" in result.stderr
