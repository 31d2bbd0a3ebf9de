"""The creation token bucket paces callers at the configured rate."""

from __future__ import annotations

from agentrl.sandbox.ratelimit import TokenBucket


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


async def test_callers_beyond_the_burst_wait_one_interval_each() -> None:
    clock = FakeClock()
    bucket = TokenBucket(2.0, burst=1.0, clock=clock, sleep=clock.sleep)
    waits = [await bucket.acquire() for _ in range(3)]
    # Rate 2/s: the first uses the saved token, the next two wait 1/2 s each.
    assert waits == [0.0, 0.5, 0.5]
    assert clock.now == 1.0


async def test_idle_time_refills_the_bucket_up_to_its_burst() -> None:
    clock = FakeClock()
    bucket = TokenBucket(1.0, burst=2.0, clock=clock, sleep=clock.sleep)
    assert [await bucket.acquire() for _ in range(2)] == [0.0, 0.0]
    clock.now += 10.0  # ten seconds idle saves 2 tokens at most, not 10
    assert [await bucket.acquire() for _ in range(3)] == [0.0, 0.0, 1.0]
