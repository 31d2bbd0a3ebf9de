"""Every provider is measured the same way: creates, live sandboxes, failures, latencies."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from agentrl.sandbox.errors import SandboxCreateError
from agentrl.sandbox.fake import FakeProvider
from agentrl.sandbox.metrics import InstrumentedProvider
from agentrl.sandbox.provider import SandboxRequest


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_live_sandboxes_creates_and_failures_are_counted_per_provider() -> None:
    live0 = value("agentrl_sandbox_live", provider="fake")
    creates0 = value("agentrl_sandbox_creates_total", provider="fake")
    fails0 = value(
        "agentrl_sandbox_failures_total",
        provider="fake",
        operation="create",
        error="SandboxCreateError",
    )
    startups0 = value("agentrl_sandbox_startup_seconds_count", provider="fake")
    provider = InstrumentedProvider(FakeProvider(fail_creates=1))
    with pytest.raises(SandboxCreateError):
        await provider.create(SandboxRequest(episode_id="a"))
    first = await provider.create(SandboxRequest(episode_id="b"))
    second = await provider.create(SandboxRequest(episode_id="c"))
    await first.exec("true", timeout=1)
    await first.close()
    await first.close()  # idempotent: counted once
    assert value("agentrl_sandbox_live", provider="fake") - live0 == 1
    assert value("agentrl_sandbox_creates_total", provider="fake") - creates0 == 2
    assert value("agentrl_sandbox_startup_seconds_count", provider="fake") - startups0 == 2
    assert (
        value(
            "agentrl_sandbox_failures_total",
            provider="fake",
            operation="create",
            error="SandboxCreateError",
        )
        - fails0
        == 1
    )
    await second.close()
