"""The e2b provider driving the real ``e2b`` SDK over HTTP, against a local fake of E2B.

One aiohttp server plays both halves of E2B: the control-plane REST API (``POST
/v2/sandboxes``, ``DELETE /sandboxes/{id}``: the routes SDK 2.x calls) and the envd of every
sandbox (Connect ``process.Process/Start`` with the JSON codec the SDK uses, ``/files``,
``/health``). The SDK is pointed at it by its own ``E2B_API_URL`` and ``E2B_SANDBOX_URL``.

The fake envd runs each command it is sent in a real shell on this machine, in a temporary
directory: the ``cwd`` it was sent is recorded, and refused while the sandbox would not have it
yet, but not used. Its ``PATH`` puts stub ``mkdir``/``chown``/``id`` first, so preparing
``/workspace`` touches nothing here: as envd's default user ``mkdir`` is refused (as on E2B's
base template, where ``/`` is root's) and ``id`` answers 1000/1001; as ``root`` they record their
arguments. Everything else (``timeout``, ``/bin/sh``, ``printf``, ``sleep``) is real, so exit
codes, output and the in-sandbox timeout are the shell's, carried back through the SDK.

What this does not cover: E2B's real servers (authentication, real templates, real envd and its
process handling), and the SDK 1.x routes.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import REGISTRY

import agentrl.sandbox.e2b as provider_module
from agentrl.api.sandbox import SandboxSpec
from agentrl.sandbox import open_provider
from agentrl.sandbox.e2b import E2BProvider
from agentrl.sandbox.errors import SandboxExecError, SandboxGone
from agentrl.sandbox.provider import SandboxRequest

API_KEY = "e2b_0123456789abcdef"
ENVD_VERSION = "0.5.7"
ENVD_TOKEN = "envd-token-1"
ROOT_STUBS = {  # as root, the stubs record their arguments and succeed
    "mkdir": 'echo "mkdir $*" >> "$STUB_LOG"',
    "chown": 'echo "chown $*" >> "$STUB_LOG"',
}
USER_STUBS = {  # as envd's default user, /workspace cannot be made
    "mkdir": 'echo "mkdir: cannot create directory: Permission denied" >&2; exit 1',
    "id": 'case "$1" in -u) echo 1000;; -g) echo 1001;; esac',
}


def frame(flags: int, message: dict[str, Any]) -> bytes:
    """One Connect streaming envelope: flags, big-endian length, JSON."""
    data = json.dumps(message).encode()
    return struct.pack(">BI", flags, len(data)) + data


@dataclass
class FakeE2B:
    """The fake E2B, and everything it was asked."""

    workdir: Path
    refusals: list[int] = field(default_factory=list)  # statuses for the next POSTs
    kill_refusals: list[int] = field(default_factory=list)
    default_user_may_mkdir: bool = False
    rpc_error: dict[str, str] | None = None  # answer every Start with this Connect error
    hang: bool = False  # start every process and never end it
    creates: list[tuple[Mapping[str, str], dict[str, Any]]] = field(default_factory=list)
    create_paths: list[str] = field(default_factory=list)
    deletes: list[tuple[str, Mapping[str, str]]] = field(default_factory=list)
    processes: list[dict[str, Any]] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)
    url: str = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v2/sandboxes", self.create)
        app.router.add_post("/sandboxes", self.create)  # SDK 1.x
        app.router.add_delete("/sandboxes/{sandbox_id}", self.delete)
        app.router.add_post("/process.Process/Start", self.start)
        app.router.add_get("/files", self.read)
        app.router.add_post("/files", self.write)
        app.router.add_get("/health", self.health)
        return app

    async def create(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.create_paths.append(request.path)
        self.creates.append((request.headers.copy(), body))
        if self.refusals:
            status = self.refusals.pop(0)
            return web.json_response({"code": status, "message": "refused"}, status=status)
        return web.json_response(
            {
                "templateID": body["templateID"],
                "sandboxID": f"sbx-{len(self.creates)}",
                "clientID": "client",
                "envdVersion": ENVD_VERSION,
                "envdAccessToken": ENVD_TOKEN,
            },
            status=201,
        )

    async def delete(self, request: web.Request) -> web.Response:
        self.deletes.append((request.match_info["sandbox_id"], request.headers.copy()))
        if self.kill_refusals:
            status = self.kill_refusals.pop(0)
            return web.json_response({"code": status, "message": "busy"}, status=status)
        return web.Response(status=204)

    async def start(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        (length,) = struct.unpack(">I", raw[1:5])
        process = json.loads(raw[5 : 5 + length])["process"]
        auth = request.headers.get("Authorization", "")
        user = base64.b64decode(auth.removeprefix("Basic ")).decode().rstrip(":") or None
        self.processes.append(
            {
                **process,
                "user": user,
                "timeout_ms": int(request.headers["Connect-Timeout-Ms"]),
                "access_token": request.headers.get("X-Access-Token"),
            }
        )
        response = web.StreamResponse(headers={"Content-Type": "application/connect+json"})
        await response.prepare(request)
        error = self.rpc_error
        if error is None and not self.directory_exists(process.get("cwd", "/")):
            # What we expect of envd (Go's exec refuses a working directory that does not
            # exist); the code and message are ours, not checked against the real envd.
            error = {"code": "internal", "message": f"chdir {process['cwd']}: no such file"}
        if error is not None:
            await response.write(frame(2, {"error": error}))
            return response
        await response.write(frame(0, {"event": {"start": {"pid": len(self.processes)}}}))
        if self.hang:
            await asyncio.sleep(60)  # cancelled when the server shuts down
        code, out, err = await self.run(process["args"][-1], process.get("envs", {}), user)
        for stream, data in (("stdout", out), ("stderr", err)):
            if data:
                chunk = {stream: base64.b64encode(data).decode()}
                await response.write(frame(0, {"event": {"data": chunk}}))
        end = {"exitCode": code, "exited": True, "status": f"exit status {code}"}
        await response.write(frame(0, {"event": {"end": end}}))
        await response.write(frame(2, {}))
        return response

    async def run(
        self, script: str, envs: dict[str, str], user: str | None
    ) -> tuple[int, bytes, bytes]:
        stubs = self.workdir / f"bin-{user or 'default'}"
        stubs.mkdir(exist_ok=True)
        wanted = ROOT_STUBS if user == "root" or self.default_user_may_mkdir else USER_STUBS
        for name, body in wanted.items():
            (stubs / name).write_text(f"#!/bin/sh\n{body}\n")
            (stubs / name).chmod(0o755)
        env = {**envs, "PATH": f"{stubs}:/usr/bin:/bin", "STUB_LOG": str(self.stub_log)}
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", script, cwd=self.workdir, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await proc.communicate()
        assert proc.returncode is not None
        return proc.returncode, out, err

    def directory_exists(self, path: str) -> bool:
        return path in ("/", "/tmp", "/etc") or f"mkdir -p {path}" in self.stub_calls()

    @property
    def stub_log(self) -> Path:
        return self.workdir / "stub.log"

    def stub_calls(self) -> list[str]:
        return self.stub_log.read_text().splitlines() if self.stub_log.exists() else []

    async def read(self, request: web.Request) -> web.Response:
        path = request.query["path"]
        if path not in self.files:
            return web.json_response({"code": 404, "message": f"{path} not found"}, status=404)
        return web.Response(body=self.files[path], content_type="application/octet-stream")

    async def write(self, request: web.Request) -> web.Response:
        path = request.query["path"]
        reader = await request.multipart()
        part = await reader.next()
        assert part is not None and part.name == "file"  # type: ignore[union-attr]
        self.files[path] = bytes(await part.read())  # type: ignore[union-attr]
        return web.json_response([{"name": Path(path).name, "type": "file", "path": path}])

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=204)


@pytest.fixture
async def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeE2B]:
    server = FakeE2B(workdir=tmp_path)
    runner = web.AppRunner(server.app(), shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    server.url = f"http://127.0.0.1:{port}"
    for name in ("E2B_DEBUG", "E2B_DOMAIN", "E2B_HTTP_VERSION", "E2B_ACCESS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("E2B_API_URL", server.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", server.url)
    monkeypatch.setenv("E2B_API_KEY", API_KEY)
    try:
        yield server
    finally:
        await runner.cleanup()


def refusals_counted() -> float:
    labels = {"provider": "e2b", "operation": "create", "error": "SandboxRateLimited"}
    return REGISTRY.get_sample_value("agentrl_sandbox_failures_total", labels) or 0.0


def e2b_spec() -> SandboxSpec:
    return SandboxSpec.model_validate(
        {
            "provider": "e2b",
            "e2b": {
                "apiKeySecretRef": {"name": "e2b"},
                "template": "spec-default",
                "maxCreatesPerSecond": 1000,
                "timeoutSeconds": 600,
            },
        }
    )


async def test_open_provider_creates_through_the_api_after_a_429_and_deletes_on_close(
    fake: FakeE2B, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(provider_module, "BACKOFF_INITIAL_SECONDS", 0.01)
    monkeypatch.setattr(provider_module, "BACKOFF_MAX_SECONDS", 0.02)
    fake.refusals = [429, 429]
    before = refusals_counted()
    provider = open_provider(e2b_spec())
    request = SandboxRequest(episode_id="ep-1", template="swe-task-7", env={"TASK": "7"})
    sandbox = await provider.create(request)

    # Each refusal was one request: the SDK's own retries are off, ours backed off.
    assert len(fake.creates) == 3
    assert refusals_counted() - before == 2
    assert set(fake.create_paths) == {"/v2/sandboxes"}
    for headers, body in fake.creates:
        assert headers["X-API-KEY"] == API_KEY
        assert body == {
            "templateID": "swe-task-7",
            "timeout": 600,
            "metadata": {"agentrl-episode": "ep-1"},
            "envVars": {"TASK": "7"},
        }
    assert sandbox.id == "sbx-3"

    await sandbox.close()
    ((deleted, headers),) = fake.deletes
    assert deleted == "sbx-3"
    assert headers["X-API-KEY"] == API_KEY
    await provider.aclose()


async def test_a_task_without_a_template_gets_the_specs(fake: FakeE2B) -> None:
    provider = open_provider(e2b_spec())
    sandbox = await provider.create(SandboxRequest(episode_id="ep-2"))
    assert fake.creates[0][1]["templateID"] == "spec-default"
    await sandbox.close()


async def test_429_and_503_back_off_exponentially_one_request_each(fake: FakeE2B) -> None:
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    fake.refusals = [429, 503, 429]
    provider = E2BProvider(
        template="base",
        max_concurrent=2,
        max_creates_per_second=1000.0,
        sandbox_timeout_seconds=600,
        sleep=sleep,
    )
    sandbox = await provider.create(SandboxRequest(episode_id="ep-3"))
    assert sleeps == [1.0, 2.0, 4.0]
    assert len(fake.creates) == 4
    await sandbox.close()


async def test_the_workdir_is_made_by_root_and_given_to_the_default_user(fake: FakeE2B) -> None:
    sandbox = await open_provider(e2b_spec()).create(SandboxRequest(episode_id="ep-4"))
    probe, made = fake.processes
    assert (probe["user"], probe["cwd"]) == (None, "/")  # cwd: /workspace does not exist yet
    assert (made["user"], made["cwd"]) == ("root", "/")
    assert fake.stub_calls() == ["mkdir -p /workspace", "chown 1000:1001 /workspace"]
    assert {p["access_token"] for p in fake.processes} == {ENVD_TOKEN}
    await sandbox.close()


async def test_the_default_user_makes_the_workdir_when_it_may(fake: FakeE2B) -> None:
    fake.default_user_may_mkdir = True
    sandbox = await open_provider(e2b_spec()).create(SandboxRequest(episode_id="ep-5"))
    (probe,) = fake.processes
    assert probe["user"] is None
    assert fake.stub_calls() == ["mkdir -p /workspace"]
    await sandbox.close()


async def test_a_command_runs_in_envd_and_its_exit_code_and_output_come_back(
    fake: FakeE2B,
) -> None:
    request = SandboxRequest(episode_id="ep-6", env={"TASK": "7"})
    sandbox = await open_provider(e2b_spec()).create(request)
    result = await sandbox.exec(
        "printf 'out %s\\n' \"$TASK$EXTRA\"; printf 'err\\n' >&2; exit 3",
        timeout=20,
        env={"EXTRA": "+x"},
    )
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out 7+x\n", "err\n")
    assert not result.timed_out
    sent = fake.processes[-1]
    assert sent["cwd"] == "/workspace"
    assert sent["envs"] == {"TASK": "7", "EXTRA": "+x"}
    assert sent["user"] is None
    assert sent["timeout_ms"] == (20 + provider_module.EXEC_DEADLINE_GRACE_SECONDS) * 1000
    ok = await sandbox.exec("echo fine", timeout=20, cwd="/tmp")
    assert (ok.exit_code, ok.stdout, fake.processes[-1]["cwd"]) == (0, "fine\n", "/tmp")
    await sandbox.close()


async def test_a_command_past_its_timeout_is_killed_in_the_sandbox_and_is_a_result(
    fake: FakeE2B,
) -> None:
    sandbox = await open_provider(e2b_spec()).create(SandboxRequest(episode_id="ep-7"))
    result = await sandbox.exec("echo started; sleep 30; echo late", timeout=0.5)
    assert (result.exit_code, result.timed_out, result.stdout) == (124, True, "started\n")
    await sandbox.close()


async def test_a_command_whose_stream_never_ends_is_timed_out_by_our_deadline(
    fake: FakeE2B, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(provider_module, "EXEC_DEADLINE_GRACE_SECONDS", 0.2)
    sandbox = await open_provider(e2b_spec()).create(SandboxRequest(episode_id="ep-12"))
    fake.hang = True
    result = await sandbox.exec("sleep 1000", timeout=0.2)
    assert (result.exit_code, result.timed_out) == (124, True)
    await sandbox.close()


async def test_a_stopped_sandbox_is_gone_not_a_timed_out_command(fake: FakeE2B) -> None:
    sandbox = await open_provider(e2b_spec()).create(SandboxRequest(episode_id="ep-8"))
    fake.rpc_error = {"code": "unavailable", "message": "The sandbox sbx-1 was not found"}
    with pytest.raises(SandboxGone):
        await sandbox.exec("true", timeout=30)
    await sandbox.close()


async def test_a_stream_cancelled_before_the_timeout_is_an_infra_error(fake: FakeE2B) -> None:
    sandbox = await open_provider(e2b_spec()).create(SandboxRequest(episode_id="ep-9"))
    fake.rpc_error = {"code": "canceled", "message": "cancelled by the proxy"}
    with pytest.raises(SandboxExecError):
        await sandbox.exec("true", timeout=30)
    await sandbox.close()


async def test_files_go_through_envds_files_api(fake: FakeE2B) -> None:
    sandbox = await open_provider(e2b_spec()).create(SandboxRequest(episode_id="ep-10"))
    await sandbox.write_file("src/a.bin", b"\x00\xff\x10data")
    await sandbox.write_file("/etc/b.txt", "text\n")
    assert fake.files == {"/workspace/src/a.bin": b"\x00\xff\x10data", "/etc/b.txt": b"text\n"}
    assert await sandbox.read_file("src/a.bin") == b"\x00\xff\x10data"
    with pytest.raises(FileNotFoundError):
        await sandbox.read_file("missing.txt")
    await sandbox.close()


async def test_close_retries_a_busy_delete(fake: FakeE2B) -> None:
    sandbox = await open_provider(e2b_spec()).create(SandboxRequest(episode_id="ep-11"))
    fake.kill_refusals = [503]
    await sandbox.close()
    assert [sandbox_id for sandbox_id, _ in fake.deletes] == ["sbx-1", "sbx-1"]
