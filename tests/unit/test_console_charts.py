"""The console's charts from its own polls: a daemon's rate is taken between its
heartbeats and held in between, so polls faster than heartbeats draw a steady line."""

from __future__ import annotations

import asyncio
import contextlib

from conveyor.console.poller import Poller, Sample, chart_sample, rates
from conveyor.platform.config import Config
from conveyor.platform.operations.status import MemberStatus, QueueStatus, StatusReport

T0 = 1_700_000_000.0  # a daemon's clock: heartbeat times are seconds since the epoch


def sample(at: float, beat: float, handled: int, dead: int = 0, lag: int = 0,
           daemon: str = "d1") -> Sample:
    return Sample(T0 + at, {daemon: (T0 + beat, handled, dead)}, {0: lag})


def test_a_rate_between_heartbeats_is_held_while_polls_see_the_same_heartbeat() -> None:
    # Polled every 0.5 s; the daemon heartbeats every 1.5 s, handling 100/s.
    polls = [sample(t * 0.5, (t // 3) * 1.5, int((t // 3) * 150), lag=600 - 25 * t)
             for t in range(10)]
    points = rates(polls)
    assert len(points) == 9
    assert [p["handled_per_s"] for p in points[:2]] == [0, 0]  # one heartbeat: no rate yet
    assert all(p["handled_per_s"] == 100 for p in points[2:])
    assert points[-1]["lag"] == {"0": 375}


def test_a_restarted_daemon_never_draws_a_negative_rate() -> None:
    polls = [sample(0, 0, 500, dead=5), sample(1, 1, 600, dead=6),
             sample(2, 2, 10, dead=0, daemon="d1")]  # restarted: counts from zero
    points = rates(polls)
    assert points[0]["handled_per_s"] == 100 and points[0]["dead_per_s"] == 1
    assert points[1]["handled_per_s"] == 0 and points[1]["dead_per_s"] == 0


def test_rates_are_summed_over_the_daemons_of_the_app() -> None:
    polls = [Sample(T0, {"a": (T0, 0, 0), "b": (T0, 0, 0)}, {}),
             Sample(T0 + 1, {"a": (T0 + 1, 30, 1), "b": (T0 + 1, 20, 0)}, {})]
    (point,) = rates(polls)
    assert (point["handled_per_s"], point["dead_per_s"]) == (50, 1)


def member(stats: dict[str, float], started_at: float = T0) -> MemberStatus:
    return MemberStatus("d1", "host", 7, stats, [0], "1.0", started_at)


def reading(at: float, *members: MemberStatus) -> Sample:
    return chart_sample(StatusReport("app", list(members), [QueueStatus(0, "d1", 0)], at))


def test_a_run_shorter_than_two_heartbeats_draws_its_rate_from_the_daemon_s_start() -> None:
    # Seen joining (its record has no counts yet), then one heartbeat: 300 handled in 3 s.
    polls = [reading(T0 + 0.5, member({})),
             reading(T0 + 3.5, member({"at": T0 + 3, "handled": 300}))]
    (point,) = rates(polls)
    assert point["handled_per_s"] == 100


def test_a_baseline_of_unknown_time_draws_no_rate() -> None:
    # A member the Kafka coordinator lists before its first report: no start, no counts.
    polls = [reading(T0, member({}, started_at=0.0)),
             reading(T0 + 3, member({"at": T0 + 2, "handled": 300}))]
    assert rates(polls)[0]["handled_per_s"] == 0


def test_latency_is_the_slowest_daemon_s_in_milliseconds_and_none_when_unknown() -> None:
    fast = MemberStatus("a", "h", 1, {"at": T0, "latency.p50_s": 0.002, "latency.p99_s": 0.01})
    slow = MemberStatus("b", "h", 2, {"at": T0, "latency.p50_s": 0.004, "latency.p99_s": 0.05})
    polls = [reading(T0, fast), reading(T0 + 1, fast, slow), reading(T0 + 2, member({}))]
    first, second = rates(polls)
    assert first["latency_ms"] == {"p50": 4.0, "p95": None, "p99": 50.0}
    assert second["latency_ms"] == {"p50": None, "p95": None, "p99": None}


def test_messages_in_per_second_come_from_the_queues_end_positions_between_polls() -> None:
    def at(t: float, ends: dict[int, int]) -> Sample:
        return Sample(T0 + t, {}, {}, {}, ends)

    polls = [at(0, {0: 100, 1: 50}), at(2, {0: 140, 1: 70}), at(4, {0: 140}),
             at(6, {0: 10, 1: 70})]  # queue 0 re-created: no rate, never a negative one
    points = rates(polls)
    assert [p["in_per_s"] for p in points] == [30, 0, None]
    assert points[0]["in_per_s_by_queue"] == {"0": 20, "1": 10}
    assert rates([at(0, {}), at(1, {})])[0]["in_per_s"] is None  # the broker does not tell


class LosesACancel(Poller):
    """A poll that swallows the cancel it gets, as Python 3.11's ``asyncio.wait_for``
    does when the awaited call completes just as the cancel arrives."""

    def __init__(self) -> None:
        super().__init__(Config(), None, interval_s=0.05)
        self.started = asyncio.Event()

    async def poll(self) -> None:
        self.polls += 1
        self._fresh.set()
        self.started.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.2)


async def test_the_poll_loop_ends_promptly_even_when_a_poll_loses_its_cancel() -> None:
    poller = LosesACancel()
    poller.start()
    await poller.current()  # someone looks: the loop polls
    await poller.started.wait()
    loop = asyncio.get_running_loop()
    began = loop.time()
    await poller.stop(timeout_s=5.0)
    assert loop.time() - began < 1.0  # ended after the poll, not at the 5 s cap
    assert poller._task is not None and poller._task.done()
