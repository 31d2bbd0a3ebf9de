"""The e2b provider against the real ``e2b`` package's names and signatures (no network).

``agentrl.sandbox.e2b`` looks the SDK's exception classes up by name and silently uses a class
nothing raises when a name is missing, so a rename in the SDK would turn, say, every 429 into an
infra error without a test noticing. These tests read the names out of the provider's source and
check them against the installed SDK, run the provider against an SDK whose methods refuse any
call the real method's signature would refuse, and check that the fake SDK of
``test_e2b_provider.py`` only uses names the real SDK has. Over-the-wire behaviour (the SDK's
HTTP and envd calls) is in ``test_e2b_sdk_http.py``.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import e2b  # in the `test` extra
import pytest
from e2b.sandbox_async.commands.command import Commands
from e2b.sandbox_async.filesystem.filesystem import Filesystem

import agentrl.sandbox.e2b as provider_module
from agentrl.sandbox.e2b import E2BProvider, E2BSandbox
from agentrl.sandbox.errors import SandboxCreateError, SandboxExecError, SandboxGone
from agentrl.sandbox.provider import SandboxRequest


def looked_up_exception_names() -> set[str]:
    """Every string handed to ``_exc``/``_excs`` in the provider's source, and the names in the
    module-level tuples it unpacks into them (``_excs(sdk, *REFUSED)``)."""
    tree = ast.parse(Path(provider_module.__file__).read_text())
    for helper in [n for n in tree.body if isinstance(n, ast.FunctionDef)]:
        if helper.name in ("_exc", "_excs"):  # their own bodies pass names through
            tree.body.remove(helper)
    names: set[str] = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        if node.func.id not in ("_exc", "_excs"):
            continue
        for arg in node.args[1:]:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                names.add(arg.value)
            elif isinstance(arg, ast.Starred) and isinstance(arg.value, ast.Name):
                names.update(getattr(provider_module, arg.value.id))
            else:
                raise AssertionError(f"cannot read an SDK name from {ast.dump(arg)}")
    return names


def test_every_exception_the_provider_catches_by_name_exists_in_the_sdk() -> None:
    names = looked_up_exception_names()
    # The scan found the lookups (a scan that finds nothing would prove nothing).
    assert {"CommandExitException", "RateLimitException", "TimeoutException"} <= names
    missing = sorted(n for n in names if not isinstance(getattr(e2b, n, None), type))
    assert missing == []
    assert all(issubclass(getattr(e2b, n), BaseException) for n in names)


def test_the_sdk_raises_those_classes_for_429_503_and_a_stopped_sandbox() -> None:
    from e2b.api import api_exception_from_code
    from e2b.exceptions import format_sandbox_unavailable_exception

    assert isinstance(api_exception_from_code(429, "slow down"), e2b.RateLimitException)
    assert isinstance(api_exception_from_code(503, "no capacity"), e2b.ServiceBusyException)
    stopped = format_sandbox_unavailable_exception("sandbox sbx-1 was not found")
    assert isinstance(stopped, e2b.SandboxNotRunningException)
    # Why the provider catches the "gone" classes before TimeoutException.
    assert issubclass(e2b.SandboxNotRunningException, e2b.TimeoutException)
    assert issubclass(e2b.SandboxUnreachableException, e2b.TimeoutException)


def test_a_command_exit_exception_carries_what_the_provider_reads() -> None:
    fields = {f.name for f in dataclasses.fields(e2b.CommandExitException)}
    assert {"exit_code", "stdout", "stderr"} <= fields
    assert {"exit_code", "stdout", "stderr"} <= {
        f.name for f in dataclasses.fields(e2b.CommandResult)
    }


def test_the_sandbox_has_the_attributes_the_provider_reads() -> None:
    for name in ("sandbox_id", "commands", "files"):
        assert isinstance(inspect.getattr_static(e2b.AsyncSandbox, name), property), name
    assert inspect.iscoroutinefunction(e2b.AsyncSandbox.create)


def test_kill_retries_are_the_sdks_default() -> None:
    from e2b.connection_config import DEFAULT_RETRIES

    assert provider_module.KILL_RETRIES == DEFAULT_RETRIES


def unpacked_options(fn: Callable[..., Any]) -> set[str]:
    """The keys of the ``**opts: Unpack[TypedDict]`` parameter of ``fn``, if it has one."""
    for param in inspect.signature(fn).parameters.values():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            (typed,) = typing.get_args(param.annotation)
            return set(typing.get_type_hints(typed))
    return set()


def assert_accepts(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """``fn(*args, **kwargs)`` binds to the real signature, and every keyword that lands in
    ``**opts`` is one of its documented options (``bind`` alone would accept any)."""
    signature = inspect.signature(fn)
    signature.bind(*args, **kwargs)
    named = {
        name
        for name, param in signature.parameters.items()
        if param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)
    }
    assert set(kwargs) - named <= unpacked_options(fn), f"{fn.__qualname__}: {sorted(kwargs)}"


class StrictCommands:
    """``commands`` whose ``run`` refuses what the real one would, and answers from a list."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.calls: list[dict[str, Any]] = []

    async def run(self, *args: Any, **kwargs: Any) -> Any:
        assert_accepts(Commands.run, None, *args, **kwargs)
        self.calls.append(inspect.signature(Commands.run).bind(None, *args, **kwargs).arguments)
        answer = self.answers.pop(0) if self.answers else None
        if isinstance(answer, BaseException):
            raise answer
        return answer or e2b.CommandResult(stdout="", stderr="", exit_code=0, error=None)


class StrictFiles:
    def __init__(self) -> None:
        self.stored: dict[str, bytes | str] = {}

    async def write(self, *args: Any, **kwargs: Any) -> Any:
        assert_accepts(Filesystem.write, None, *args, **kwargs)
        bound = inspect.signature(Filesystem.write).bind(None, *args, **kwargs).arguments
        self.stored[bound["path"]] = bound["data"]

    async def read(self, *args: Any, **kwargs: Any) -> Any:
        assert_accepts(Filesystem.read, None, *args, **kwargs)
        bound = inspect.signature(Filesystem.read).bind(None, *args, **kwargs).arguments
        literal = inspect.signature(Filesystem.read).parameters["format"].annotation
        assert bound["format"] in typing.get_args(literal)
        if bound["path"] not in self.stored:
            raise e2b.FileNotFoundException(f"{bound['path']} not found")
        data = self.stored[bound["path"]]
        return bytearray(data.encode() if isinstance(data, str) else data)  # what "bytes" returns


class StrictSandbox:
    """``AsyncSandbox`` whose methods refuse any call the real ones would."""

    refusals: typing.ClassVar[list[BaseException]] = []
    created: typing.ClassVar[list[dict[str, Any]]] = []
    answers: typing.ClassVar[list[Any]] = []

    def __init__(self) -> None:
        self.sandbox_id = f"sbx-{len(StrictSandbox.created)}"
        self.commands = StrictCommands(StrictSandbox.answers)
        self.files = StrictFiles()
        self.kills: list[dict[str, Any]] = []

    @classmethod
    async def create(cls, *args: Any, **kwargs: Any) -> StrictSandbox:
        assert_accepts(e2b.AsyncSandbox.create, *args, **kwargs)
        if cls.refusals:
            raise cls.refusals.pop(0)
        cls.created.append(kwargs)
        return cls()

    async def kill(self, *args: Any, **kwargs: Any) -> bool:
        assert_accepts(e2b.AsyncSandbox.kill, self, *args, **kwargs)
        self.kills.append(kwargs)
        return True


def strict_sdk(
    refusals: list[BaseException] | None = None, answers: list[Any] | None = None
) -> types.ModuleType:
    """The real ``e2b`` module with ``AsyncSandbox`` replaced by :class:`StrictSandbox`."""
    StrictSandbox.refusals = list(refusals or [])
    StrictSandbox.created = []
    StrictSandbox.answers = list(answers or [])
    module = types.ModuleType("e2b")
    module.__dict__.update({k: v for k, v in vars(e2b).items() if not k.startswith("__")})
    module.AsyncSandbox = StrictSandbox  # type: ignore[attr-defined]
    return module


def make(sdk: types.ModuleType, sleeps: list[float] | None = None) -> E2BProvider:
    async def sleep(seconds: float) -> None:
        if sleeps is not None:
            sleeps.append(seconds)

    return E2BProvider(
        template="base",
        max_concurrent=4,
        max_creates_per_second=1000.0,
        sandbox_timeout_seconds=900,
        api_key="e2b_k",
        domain="e2b.example.org",
        sdk=sdk,
        sleep=sleep,
    )


async def created(
    refusals: list[BaseException] | None = None,
    answers: list[Any] | None = None,
    sleeps: list[float] | None = None,
) -> tuple[E2BSandbox, StrictSandbox]:
    sandbox = await make(strict_sdk(refusals, answers), sleeps).create(
        SandboxRequest(episode_id="ep-3", template="swe-7", env={"TASK": "7"})
    )
    inner = sandbox._inner
    assert isinstance(inner, StrictSandbox)
    inner.commands.calls.clear()  # drop the working-directory preparation
    return sandbox, inner


async def test_create_passes_only_options_the_real_create_takes() -> None:
    sandbox, _ = await created()
    (options,) = StrictSandbox.created
    assert options == {
        "template": "swe-7",
        "timeout": 900,
        "envs": {"TASK": "7"},
        "metadata": {"agentrl-episode": "ep-3"},
        "api_key": "e2b_k",
        "domain": "e2b.example.org",
        "retries": 0,
    }
    await sandbox.close()


async def test_429_and_503_from_the_real_sdk_are_backed_off() -> None:
    sleeps: list[float] = []
    refusals = [e2b.RateLimitException("429"), e2b.ServiceBusyException("503")]
    sandbox, _ = await created(refusals=refusals, sleeps=sleeps)
    assert sleeps == [1.0, 2.0]
    assert len(StrictSandbox.created) == 1
    await sandbox.close()


async def test_other_sdk_errors_fail_the_creation_at_once() -> None:
    sleeps: list[float] = []
    with pytest.raises(SandboxCreateError, match="401"):
        await created(refusals=[e2b.AuthenticationException("401: bad key")], sleeps=sleeps)
    assert sleeps == []


async def test_exec_passes_only_options_the_real_run_takes() -> None:
    answer = e2b.CommandResult(stdout="hi\n", stderr="", exit_code=0, error=None)
    sandbox, inner = await created(answers=[None, answer])
    result = await sandbox.exec("echo hi", timeout=7, env={"X": "1"})
    assert (result.exit_code, result.stdout, result.timed_out) == (0, "hi\n", False)
    (call,) = inner.commands.calls
    assert call["cwd"] == "/workspace"
    assert call["envs"] == {"TASK": "7", "X": "1"}
    assert call["timeout"] == 7 + provider_module.EXEC_DEADLINE_GRACE_SECONDS
    assert call["cmd"] == "timeout -k 1 7 /bin/sh -c 'echo hi'"
    assert "user" not in call  # envd's default user
    await sandbox.close()
    assert inner.kills == [{"retries": 3}]


async def test_a_real_command_exit_exception_is_a_result() -> None:
    exited = e2b.CommandExitException(stdout="o", stderr="boom\n", exit_code=2, error=None)
    sandbox, _ = await created(answers=[None, exited])
    result = await sandbox.exec("false", timeout=5)
    assert (result.exit_code, result.stdout, result.stderr) == (2, "o", "boom\n")
    await sandbox.close()


async def test_a_stopped_sandbox_is_gone_not_a_timed_out_command() -> None:
    stopped = e2b.SandboxNotRunningException("sbx-0 was not found")
    sandbox, _ = await created(answers=[None, stopped])
    with pytest.raises(SandboxGone):
        await sandbox.exec("sleep 1", timeout=60)
    await sandbox.close()


async def test_a_timeout_before_the_commands_own_is_an_infra_error() -> None:
    cancelled = e2b.TimeoutException("cancelled by a proxy")
    sandbox, _ = await created(answers=[None, cancelled])
    with pytest.raises(SandboxExecError):
        await sandbox.exec("sleep 1", timeout=60)
    await sandbox.close()


async def test_files_use_the_real_read_and_write_signatures() -> None:
    sandbox, inner = await created()
    await sandbox.write_file("src/a.py", b"\x00\xffx")
    await sandbox.write_file("/etc/b.txt", "text")
    assert set(inner.files.stored) == {"/workspace/src/a.py", "/etc/b.txt"}
    assert await sandbox.read_file("src/a.py") == b"\x00\xffx"
    assert await sandbox.read_file("/etc/b.txt") == b"text"
    with pytest.raises(FileNotFoundError):
        await sandbox.read_file("missing.txt")
    await sandbox.close()


def test_the_fake_sdk_of_the_provider_tests_only_uses_real_names() -> None:
    from tests.sandbox import test_e2b_provider as fake

    module = fake.fake_sdk()
    public = {k: v for k, v in vars(module).items() if not k.startswith("__")}
    assert public, "the fake SDK defines nothing"
    for name, value in public.items():
        real = getattr(e2b, name, None)
        assert real is not None, f"the fake SDK has {name}, the real one does not"
        if isinstance(value, type) and issubclass(value, BaseException):
            assert isinstance(real, type) and issubclass(real, BaseException), name
    for method in ("create", "kill"):
        assert inspect.iscoroutinefunction(getattr(fake.FakeAsyncSandbox, method))
        assert hasattr(e2b.AsyncSandbox, method)
    assert inspect.iscoroutinefunction(fake.FakeCommands.run) and hasattr(Commands, "run")
    exited = fake.CommandExitException(2, "out", "err")
    real_fields = {f.name for f in dataclasses.fields(e2b.CommandExitException)}
    assert {"exit_code", "stdout", "stderr"} <= real_fields
    assert (exited.exit_code, exited.stdout, exited.stderr) == (2, "out", "err")
