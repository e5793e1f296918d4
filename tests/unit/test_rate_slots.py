"""The GCRA arithmetic on a fake clock, and the rate-limited supplier on a real loop."""

from __future__ import annotations

import asyncio
import time

import pytest

from conveyor.platform.slots import SlotReleaseReason
from conveyor.workers.slots.fixed import FixedSlotSupplier
from conveyor.workers.slots.rate import Gcra, RateLimitedSlotSupplier
from tests.conftest import wait_until
from tests.slot_context import CTX


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_gcra_grants_the_burst_then_one_token_per_interval() -> None:
    clock = Clock()
    bucket = Gcra(per_second=10, burst=3, clock=clock)
    assert bucket.take_now(10) == (3, 0.0)  # the burst, at once
    granted, wait = bucket.take_now(1)
    assert granted == 0 and wait == pytest.approx(0.1)
    clock.now += 0.1
    assert bucket.take_now(5)[0] == 1
    clock.now += 0.35  # 3.5 intervals: 3 tokens are due (the 4th is half-way)
    assert bucket.take_now(5)[0] == 3
    clock.now += 10  # idle: back to a full burst, never more
    assert bucket.take_now(100)[0] == 3


def test_gcra_never_exceeds_rate_times_window_plus_burst() -> None:
    clock = Clock()
    bucket = Gcra(per_second=50, burst=7, clock=clock)
    grants: list[float] = []
    for _ in range(20_000):  # greedy asks every 1 ms for 20 s
        granted, _ = bucket.take_now(1000)
        grants += [clock.now] * granted
        clock.now += 0.001
    assert 50 * 20 <= len(grants) <= 50 * 20 + 7
    for i, t in enumerate(grants):  # every 1 s window from each grant
        in_window = sum(1 for u in grants[i:i + 200] if u < t + 1.0)
        assert in_window <= 50 + 7


def test_gcra_refuses_a_rate_that_grants_nothing() -> None:
    with pytest.raises(ValueError):
        Gcra(per_second=0, burst=1)
    with pytest.raises(ValueError):
        Gcra(per_second=1, burst=0)


async def test_supplier_starts_at_the_rate_and_the_inner_bound_still_holds() -> None:
    inner = FixedSlotSupplier(4)
    slots = RateLimitedSlotSupplier(inner, Gcra(per_second=200, burst=5), per_second=200)
    started: list[float] = []

    async def call() -> None:
        permit = await slots.reserve_slot(CTX)
        started.append(time.monotonic())
        assert inner.available >= 0
        await asyncio.sleep(0.001)
        permit.release(SlotReleaseReason.TASK_COMPLETE)

    t0 = time.monotonic()
    await asyncio.gather(*(call() for _ in range(65)))
    elapsed = time.monotonic() - t0
    assert len(started) == 65
    assert elapsed >= (65 - 5) / 200 * 0.95  # 60 tokens after the burst, 5 ms apart
    assert elapsed < 2.0
    assert slots.granted == 65 and slots.waiting == 0
    assert not slots.keep_slot(await slots.reserve_slot(CTX))
    await slots.close()


async def test_a_token_granted_and_not_used_goes_to_the_next_reservation() -> None:
    slots = RateLimitedSlotSupplier(FixedSlotSupplier(10), Gcra(per_second=1, burst=1),
                                    per_second=1)
    permit = await slots.reserve_slot(CTX)  # the one token of the next second
    permit.release(SlotReleaseReason.NEVER_USED)
    again = slots.try_reserve_slot(CTX)  # the spare, no wait
    assert again is not None
    again.release(SlotReleaseReason.TASK_COMPLETE)
    assert slots.try_reserve_slot(CTX) is None  # a used token is gone
    assert slots.granted == 1
    await slots.close()


async def test_a_cancelled_reservation_gives_back_its_slot_and_takes_no_token() -> None:
    inner = FixedSlotSupplier(1)
    slots = RateLimitedSlotSupplier(inner, Gcra(per_second=1, burst=1), per_second=1)
    first = await slots.reserve_slot(CTX)
    first.release(SlotReleaseReason.TASK_COMPLETE)
    waiting = asyncio.create_task(slots.reserve_slot(CTX))  # no token for ~1 s
    await wait_until(lambda: slots.waiting == 1, what="a reservation waiting for a token")
    assert inner.available == 0  # it holds the inner slot while it waits
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert inner.available == 1
    await slots.close()


class Flaky:
    """A token source whose store fails until told otherwise (an outage)."""

    def __init__(self) -> None:
        self.failing = True
        self.calls = 0
        self.bucket = Gcra(per_second=1000, burst=10)

    async def take(self, want: int) -> tuple[int, float]:
        self.calls += 1
        if self.failing:
            raise ConnectionError("store down")
        return await self.bucket.take(want)

    async def close(self) -> None:
        return None


async def test_no_token_while_the_store_fails_and_grants_resume_when_it_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source = Flaky()
    slots = RateLimitedSlotSupplier(FixedSlotSupplier(10), source, per_second=1000)
    reservations = [asyncio.create_task(slots.reserve_slot(CTX)) for _ in range(3)]
    await wait_until(lambda: source.calls >= 3, what="the limiter asking a failing store")
    assert not any(r.done() for r in reservations)  # fail safe: nothing starts
    assert slots.granted == 0
    source.failing = False
    await asyncio.wait_for(asyncio.gather(*reservations), 5)
    assert slots.granted == 3
    outage_lines = [r for r in caplog.records if "no tokens while its store fails" in r.message]
    assert len(outage_lines) == 1  # logged once, not per attempt
    await slots.close()
