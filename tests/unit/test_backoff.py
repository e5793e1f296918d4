"""The one back-off rule every retry loop uses: capped, jittered, exponential."""

from __future__ import annotations

import pytest
from tenacity import AsyncRetrying, RetryCallState, stop_after_attempt

from conveyor.platform.backoff import Backoff


def test_waits_start_at_first_s_and_grow_by_the_multiplier() -> None:
    backoff = Backoff(first_s=0.1, multiplier=3.0, cap_s=100.0)
    assert [backoff.delay(n) for n in (1, 2, 3, 4)] == pytest.approx([0.1, 0.3, 0.9, 2.7])


def test_no_failure_yet_waits_like_the_first() -> None:
    backoff = Backoff(first_s=0.2)
    assert backoff.delay(0) == backoff.delay(-5) == backoff.delay(1) == 0.2


def test_the_cap_is_reached_and_kept() -> None:
    backoff = Backoff(first_s=0.05, multiplier=2.0, cap_s=5.0)
    waits = [backoff.delay(n) for n in range(1, 20)]
    assert waits == sorted(waits), "never shrinks"
    assert waits[7] == 5.0, "0.05 * 2**7 = 6.4 is capped"
    assert set(waits[7:]) == {5.0}


@pytest.mark.parametrize("failures", [1_000, 10**6, 10**100])
def test_huge_failure_counts_neither_overflow_nor_exceed_the_cap(failures: int) -> None:
    assert Backoff(first_s=0.05, cap_s=5.0).delay(failures) == 5.0
    assert Backoff(first_s=0.05, cap_s=5.0, jitter_s=1.0).delay(failures) == 5.0
    assert Backoff(first_s=0.0, cap_s=5.0).delay(failures) == 0.0, "no delay stays none"
    assert Backoff(first_s=0.3, multiplier=1.0, cap_s=5.0).delay(failures) == 0.3


def test_jitter_stays_within_its_range_and_varies() -> None:
    backoff = Backoff(first_s=1.0, multiplier=2.0, cap_s=100.0, jitter_s=0.5)
    firsts = [backoff.delay(1) for _ in range(500)]
    thirds = [backoff.delay(3) for _ in range(500)]
    assert all(1.0 <= w <= 1.5 for w in firsts)
    assert all(4.0 <= w <= 4.5 for w in thirds)
    assert max(firsts) - min(firsts) > 0.4, "spread over the range, not a constant"


def test_jitter_never_takes_a_wait_past_the_cap() -> None:
    backoff = Backoff(first_s=1.0, cap_s=1.2, jitter_s=5.0)
    assert all(backoff.delay(n) <= 1.2 for n in (1, 2, 50) for _ in range(200))


@pytest.mark.parametrize(
    "bad", [{"first_s": -1.0}, {"cap_s": -0.1}, {"jitter_s": -1.0}, {"multiplier": 0.5},
            {"first_s": float("nan")}],
)
def test_nonsense_settings_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        Backoff(**bad)


async def test_sleep_waits_the_delay_and_says_how_long() -> None:
    assert await Backoff(first_s=0.001, cap_s=0.01).sleep(2) == pytest.approx(0.002)


async def test_tenacity_waits_by_the_same_rule() -> None:
    backoff = Backoff(first_s=0.001, multiplier=2.0, cap_s=0.004)
    waits: list[float] = []

    def record(state: RetryCallState) -> None:
        assert state.next_action is not None
        waits.append(state.next_action.sleep)

    retrying = AsyncRetrying(wait=backoff.tenacity_wait(), stop=stop_after_attempt(5),
                             before_sleep=record, reraise=True)
    with pytest.raises(RuntimeError):
        async for attempt in retrying:
            with attempt:
                raise RuntimeError("down")
    assert waits == pytest.approx([0.001, 0.002, 0.004, 0.004])
