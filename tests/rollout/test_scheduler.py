"""The scheduler keeps the concurrency in effect in flight, follows live changes without
killing anything, and admits episodes under the trainer's staleness bound."""

from __future__ import annotations

import asyncio

from agentrl.api.rollout import FailurePolicy, TerminalClass
from agentrl.rollout.admission import StalenessAdmission
from agentrl.rollout.agent import TokenAgent, WordTurnTokenizer
from agentrl.rollout.balancer import EnginePool
from agentrl.rollout.caps import EpisodeCaps
from agentrl.rollout.episode import EpisodeRunner
from agentrl.rollout.scheduler import RolloutScheduler
from agentrl.rollout.trajectory import Trajectory
from agentrl.sandbox.fake import FakeProvider
from tests.rollout.fakes import ScriptedEngine, pytest_handler, toy_task


def runner(engine: ScriptedEngine, provider: FakeProvider) -> EpisodeRunner:
    pool = EnginePool([engine])
    caps = EpisodeCaps(max_turns=4, max_trajectory_tokens=4096, max_tokens_per_turn=32)
    return EpisodeRunner(
        provider=provider,
        agent=TokenAgent(pool, WordTurnTokenizer(), caps),
        caps=caps,
        failure_policy=FailurePolicy(),
        on_release=pool.release,
    )


async def collect(scheduler: RolloutScheduler) -> list[Trajectory]:
    return [t async for t in scheduler.trajectories()]


async def wait_for(predicate: object, timeout: float = 5.0) -> None:
    async def poll() -> None:
        while not predicate():  # type: ignore[operator]
            await asyncio.sleep(0.005)

    await asyncio.wait_for(poll(), timeout)


async def test_never_more_live_sandboxes_than_the_concurrency_over_many_episodes() -> None:
    provider = FakeProvider(pytest_handler, startup_seconds=0.001, exec_seconds=0.001)
    engine = ScriptedEngine(["apply fix", "submit"], latency=0.002)
    tasks = [toy_task(f"t{i}") for i in range(300)]
    async with RolloutScheduler(
        runner=runner(engine, provider), tasks=tasks, concurrency=24
    ) as scheduler:
        trajectories = await collect(scheduler)
    assert len(trajectories) == 300
    assert provider.stats.peak_live == 24
    assert scheduler.peak_in_flight == 24
    assert provider.stats.created == provider.stats.closed == 300
    assert {t.terminal_class for t in trajectories} == {TerminalClass.COMPLETED}


async def test_raising_the_concurrency_starts_more_episodes_at_once() -> None:
    gate = asyncio.Event()
    engine = ScriptedEngine(["submit"], gate=gate)
    provider = FakeProvider(pytest_handler)
    scheduler = RolloutScheduler(
        runner=runner(engine, provider), tasks=[toy_task(f"t{i}") for i in range(12)], concurrency=2
    )
    consumer = asyncio.create_task(collect(scheduler))
    await wait_for(lambda: len(engine.inputs) == 2)
    scheduler.set_concurrency(6)
    # Four more start without any of the first two finishing (the engine is still gated).
    await wait_for(lambda: len(engine.inputs) == 6)
    assert provider.stats.live == 6
    gate.set()
    trajectories = await consumer
    assert len(trajectories) == 12


async def test_lowering_the_concurrency_lets_running_episodes_finish_and_admits_fewer() -> None:
    gate = asyncio.Event()
    engine = ScriptedEngine(["submit"], gate=gate)
    provider = FakeProvider(pytest_handler)
    live_at_create: list[int] = []
    original = provider.create

    async def create(request):  # type: ignore[no-untyped-def]
        sandbox = await original(request)
        live_at_create.append(provider.stats.live)
        return sandbox

    provider.create = create  # type: ignore[method-assign]
    scheduler = RolloutScheduler(
        runner=runner(engine, provider), tasks=[toy_task(f"t{i}") for i in range(10)], concurrency=5
    )
    consumer = asyncio.create_task(collect(scheduler))
    await wait_for(lambda: len(engine.inputs) == 5)
    scheduler.set_concurrency(1)
    created_before = len(live_at_create)
    gate.set()
    trajectories = await consumer
    # Nothing was killed: all 10 completed. After the change each new sandbox was the only one.
    assert [t.terminal_class for t in trajectories] == [TerminalClass.COMPLETED] * 10
    assert live_at_create[created_before:] == [1] * (10 - created_before)


async def test_the_staleness_bound_holds_new_episodes_until_the_policy_advances() -> None:
    # 2 trajectories per step, staleness 0: (0 + v + 1) · 2 episodes may be admitted at v.
    admission = StalenessAdmission(trajectories_per_step=2, max_staleness=0)
    provider = FakeProvider(pytest_handler)
    scheduler = RolloutScheduler(
        runner=runner(ScriptedEngine(["submit"]), provider),
        tasks=[toy_task(f"t{i}") for i in range(6)],
        concurrency=8,
        admission=admission,
    )
    seen: list[int] = []
    async with scheduler:
        async for trajectory in scheduler.trajectories():
            seen.append(trajectory.policy_version)
            if len(seen) % 2 == 0 and len(seen) < 6:
                await asyncio.sleep(0.05)
                assert provider.stats.created == len(seen)  # held back: nothing new started
                admission.set_policy_version(len(seen) // 2)
    assert seen == [0, 0, 1, 1, 2, 2]


async def test_episodes_of_one_task_form_a_group() -> None:
    provider = FakeProvider(pytest_handler)
    scheduler = RolloutScheduler(
        runner=runner(ScriptedEngine(["submit"]), provider),
        tasks=[toy_task("a"), toy_task("b")],
        concurrency=4,
        group_size=3,
    )
    async with scheduler:
        trajectories = await collect(scheduler)
    groups: dict[str, list[str]] = {}
    for t in trajectories:
        groups.setdefault(t.group_id, []).append(t.task_id)
    assert sorted(groups.values()) == [["a"] * 3, ["b"] * 3]


async def test_a_provider_limit_caps_the_effective_concurrency() -> None:
    provider = FakeProvider(pytest_handler, exec_seconds=0.002)
    scheduler = RolloutScheduler(
        runner=runner(ScriptedEngine(["submit"]), provider),
        tasks=[toy_task(f"t{i}") for i in range(20)],
        concurrency=10,
        provider_limit=3,
    )
    async with scheduler:
        await collect(scheduler)
    assert scheduler.effective_concurrency == 3
    assert provider.stats.peak_live == 3


async def test_the_long_tail_share_of_each_batch_is_recorded() -> None:
    provider = FakeProvider(pytest_handler)
    scheduler = RolloutScheduler(
        runner=runner(ScriptedEngine(["submit"]), provider),
        tasks=[toy_task(f"t{i}") for i in range(8)],
        concurrency=8,
        batch_size=4,
    )
    async with scheduler:
        await collect(scheduler)
    assert len(scheduler.long_tail_shares) == 2
    assert all(0.0 <= share <= 1.0 for share in scheduler.long_tail_shares)


async def test_cancelling_stops_promptly_and_closes_every_sandbox() -> None:
    gate = asyncio.Event()  # never set: every episode is stuck in its first LLM call
    engine = ScriptedEngine(["submit"], gate=gate)
    provider = FakeProvider(pytest_handler)
    scheduler = RolloutScheduler(
        runner=runner(engine, provider), tasks=[toy_task(f"t{i}") for i in range(10)], concurrency=5
    )
    scheduler.start()
    await wait_for(lambda: len(engine.inputs) == 5)
    await asyncio.wait_for(scheduler.cancel(), 2.0)
    assert scheduler.in_flight == 0
    assert (provider.stats.created, provider.stats.live) == (5, 0)


async def test_cancelling_episodes_that_never_got_to_run_still_ends_the_scheduler() -> None:
    provider = FakeProvider(pytest_handler)
    scheduler = RolloutScheduler(
        runner=runner(ScriptedEngine(["submit"]), provider),
        tasks=[toy_task(f"t{i}") for i in range(10)],
        concurrency=5,
    )
    scheduler.start()
    await asyncio.sleep(0)  # the admission loop launched 5 episode tasks; none has run yet
    assert scheduler.in_flight == 5
    async with asyncio.timeout(2.0):
        await scheduler.cancel()  # inline: the tasks are cancelled before their first step
    assert scheduler.in_flight == 0
    assert provider.stats.created == 0
