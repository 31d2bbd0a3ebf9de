"""The e2b provider against a fake ``e2b`` module: 429 backoff, plan concurrency, results."""

from __future__ import annotations

import asyncio
import shlex
import types
from typing import Any, ClassVar

import pytest

from agentrl.sandbox.e2b import E2BProvider
from agentrl.sandbox.errors import SandboxCreateError
from agentrl.sandbox.provider import SandboxRequest


class RateLimitException(Exception):
    pass


class CommandExitException(Exception):
    def __init__(self, exit_code: int, stdout: str, stderr: str) -> None:
        super().__init__(stderr)
        self.exit_code, self.stdout, self.stderr = exit_code, stdout, stderr


class FakeCommands:
    async def run(self, command: str, **kwargs: Any) -> Any:
        command = shlex.split(command)[-1]  # the provider runs `timeout ... /bin/sh -c COMMAND`
        if command.startswith("fail"):
            raise CommandExitException(2, "", "boom\n")
        return types.SimpleNamespace(exit_code=0, stdout=f"ran {command}\n", stderr="")


class FakeAsyncSandbox:
    refusals = 0
    created: ClassVar[list[dict[str, Any]]] = []
    killed = 0

    def __init__(self) -> None:
        self.sandbox_id = f"sbx-{len(FakeAsyncSandbox.created)}"
        self.commands = FakeCommands()

    @classmethod
    async def create(cls, **kwargs: Any) -> FakeAsyncSandbox:
        if cls.refusals > 0:
            cls.refusals -= 1
            raise RateLimitException("429: maximum number of concurrent E2B sandboxes")
        cls.created.append(kwargs)
        return cls()

    async def kill(self) -> None:
        FakeAsyncSandbox.killed += 1


def fake_sdk() -> types.ModuleType:
    FakeAsyncSandbox.refusals = 0
    FakeAsyncSandbox.created = []
    FakeAsyncSandbox.killed = 0
    module = types.ModuleType("e2b")
    module.AsyncSandbox = FakeAsyncSandbox  # type: ignore[attr-defined]
    module.RateLimitException = RateLimitException  # type: ignore[attr-defined]
    module.CommandExitException = CommandExitException  # type: ignore[attr-defined]
    return module


def make(sdk: types.ModuleType, sleeps: list[float], **kw: Any) -> E2BProvider:
    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    args: dict[str, Any] = {
        "template": "base",
        "max_concurrent": 10,
        "max_creates_per_second": 1000.0,
        "sandbox_timeout_seconds": 600,
        "api_key": "k",
        "sdk": sdk,
        "sleep": sleep,
    }
    args.update(kw)
    return E2BProvider(**args)


async def test_a_429_is_retried_with_exponential_backoff() -> None:
    sdk = fake_sdk()
    FakeAsyncSandbox.refusals = 3
    sleeps: list[float] = []
    sandbox = await make(sdk, sleeps).create(SandboxRequest(episode_id="e", template="swe"))
    # Three refusals: waits of 1, 2 and 4 seconds, then the fourth call succeeds.
    assert sleeps == [1.0, 2.0, 4.0]
    assert FakeAsyncSandbox.created[0]["template"] == "swe"
    assert FakeAsyncSandbox.created[0]["api_key"] == "k"
    await sandbox.close()


async def test_a_non_zero_exit_is_a_result() -> None:
    sandbox = await make(fake_sdk(), []).create(SandboxRequest(episode_id="e"))
    result = await sandbox.exec("fail now", timeout=5)
    assert (result.exit_code, result.stderr) == (2, "boom\n")
    assert (await sandbox.exec("echo", timeout=5)).stdout == "ran echo\n"


async def test_the_plan_concurrency_holds_a_create_until_a_sandbox_closes() -> None:
    provider = make(fake_sdk(), [], max_concurrent=2)
    first = await provider.create(SandboxRequest(episode_id="a"))
    await provider.create(SandboxRequest(episode_id="b"))
    third = asyncio.create_task(provider.create(SandboxRequest(episode_id="c")))
    await asyncio.sleep(0.05)
    assert not third.done()
    await first.close()
    await asyncio.wait_for(third, 1)
    assert FakeAsyncSandbox.killed == 1


async def test_without_an_api_key_creation_fails_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    provider = make(fake_sdk(), [], api_key=None)
    with pytest.raises(SandboxCreateError, match="E2B_API_KEY"):
        await provider.create(SandboxRequest(episode_id="a"))
