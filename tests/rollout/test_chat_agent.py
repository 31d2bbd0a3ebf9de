"""The chat scaffold drives an OpenAI-compatible server with tool calls."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from agentrl.api.rollout import FailurePolicy, TerminalClass
from agentrl.rollout.agent import ChatAgent, ChatClient
from agentrl.rollout.balancer import EnginePool
from agentrl.rollout.caps import EpisodeCaps
from agentrl.rollout.episode import EpisodeRunner
from agentrl.sandbox.fake import FakeProvider
from tests.rollout.fakes import ScriptedEngine, pytest_handler, toy_task


def tool_call(name: str, arguments: dict[str, str]) -> dict[str, Any]:
    return {
        "id": f"call-{name}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


async def test_tool_calls_are_executed_and_the_tool_results_sent_back() -> None:
    script = [tool_call("apply", {"name": "fix"}), tool_call("submit", {})]
    requests: list[dict[str, Any]] = []

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        requests.append(body)
        call = script[len(requests) - 1]
        return web.json_response(
            {
                "choices": [
                    {
                        "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                        "finish_reason": "tool_calls",
                    }
                ],
                "usage": {"total_tokens": 100 * len(requests)},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    client = ChatClient(model="policy", max_connections=4)
    try:
        url = str(server.make_url("/")).rstrip("/")
        pool = EnginePool([ScriptedEngine(["unused"], base_url=url)])
        caps = EpisodeCaps(max_turns=5, max_trajectory_tokens=4096)
        runner = EpisodeRunner(
            provider=FakeProvider(pytest_handler),
            agent=ChatAgent(pool, client, caps),
            caps=caps,
            failure_policy=FailurePolicy(infra_retries=0),
        )
        trajectory = await runner.run(toy_task(), group_id="g", policy_version=0)
    finally:
        await client.close()
        await server.close()
    assert trajectory.terminal_class == TerminalClass.COMPLETED
    assert trajectory.reward == 1.0
    assert trajectory.token_level is False
    assert trajectory.token_ids == []
    assert [t.action for t in trajectory.turns] == ['apply {"name": "fix"}', "submit {}"]
    # The second request carries the tool result of the first call, answered by its id.
    tool_message = requests[1]["messages"][-1]
    assert tool_message == {
        "role": "tool",
        "tool_call_id": "call-apply",
        "content": "applied fix to app.py",
    }
    assert requests[0]["model"] == "policy"
    assert {t["function"]["name"] for t in requests[0]["tools"]} == {
        "bash",
        "view",
        "edit",
        "submit",
        "run_tests",
        "apply",
    }
