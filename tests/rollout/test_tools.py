"""The toy tasks' tools over a sandbox: candidate edits are alternatives, not a stack."""

from __future__ import annotations

from agentrl.rollout.swe_tools import SWEToolRunner
from agentrl.sandbox.fake import FakeProvider
from agentrl.sandbox.provider import SandboxRequest
from tests.rollout.fakes import pytest_handler, toy_task


async def _runner() -> tuple[SWEToolRunner, FakeProvider]:
    provider = FakeProvider(pytest_handler)
    sandbox = await provider.create(SandboxRequest(episode_id="tools-1"))
    task = toy_task()
    for path, text in task.files.items():
        await sandbox.write_file(path, text)
    return SWEToolRunner(sandbox, task, timeout_seconds=5, output_max_bytes=4096), provider


async def test_applying_a_candidate_first_undoes_the_one_applied_before() -> None:
    runner, _ = await _runner()
    first = await runner.call("apply_edit", {"name": "decoy"})
    assert first.observation == "applied decoy to app.py"
    assert (await runner.sandbox.read_file("app.py")).decode() == "VALUE = 'BUG'\nOTHER = 2\n"

    second = await runner.call("apply_edit", {"name": "fix"})
    assert second.observation == "applied fix to app.py"
    # Only the fix: the decoy's change is gone.
    assert (await runner.sandbox.read_file("app.py")).decode() == "VALUE = 'OK'\nOTHER = 1\n"
    tests = await runner.call("run_tests")
    assert tests.observation.startswith("PASSED")


async def test_applying_the_same_candidate_twice_leaves_it_applied_once() -> None:
    runner, _ = await _runner()
    await runner.call("apply_edit", {"name": "fix"})
    again = await runner.call("apply_edit", {"name": "fix"})
    assert again.observation == "applied fix to app.py"
    assert (await runner.sandbox.read_file("app.py")).decode() == "VALUE = 'OK'\nOTHER = 1\n"


async def test_an_unknown_candidate_changes_nothing() -> None:
    runner, _ = await _runner()
    await runner.call("apply_edit", {"name": "decoy"})
    refused = await runner.call("apply_edit", {"name": "nonsense"})
    assert refused.observation == "unknown edit 'nonsense'; candidate edits: fix decoy"
    assert (await runner.sandbox.read_file("app.py")).decode() == "VALUE = 'BUG'\nOTHER = 2\n"
