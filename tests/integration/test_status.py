"""conveyor status reads members, owners, lag and the owners' heartbeat stats."""

from __future__ import annotations

from conveyor import App, Client
from conveyor.backends import for_config
from conveyor.platform.operations.status import AckRates, QueueStatus, StatusReport, collect_status
from tests.conftest import wait_until
from tests.integration.memory_harness import (
    Record,
    config,
    daemon,
    fresh_adapter,
    publish_items,
    recording_app,
)


async def test_status_shows_owners_lag_and_heartbeat_stats() -> None:
    adapter = fresh_adapter()
    record = Record()
    cfg = config(balancer={"lease_ttl_s": 0.6}, slots={"count": 9})
    d = daemon(recording_app(record, delay_s=0.001), adapter, cfg)
    await publish_items(Client(adapter, d.mapper), 500, streams=20)
    before = await collect_status(cfg, "test", for_config(cfg))
    assert before.members == [] and before.total_lag == 500
    assert all(q.owner is None for q in before.queues)
    await d.start()
    await wait_until(lambda: record.handled == 500, 20, what="all handled")

    async def heartbeat_caught_up() -> bool:
        report = await collect_status(cfg, "test", for_config(cfg))
        return (bool(report.members) and report.members[0].stats.get("handled") == 500
                and all(q.acks_per_s is not None for q in report.queues))

    await wait_until(heartbeat_caught_up, 10, what="a heartbeat with final stats and rates")
    report = await collect_status(cfg, "test", for_config(cfg))
    await d.stop()
    [member] = report.members
    assert member.id == d.member.id
    # Idle agents each wait on their queue holding one (unused) slot.
    assert member.stats["slots.in_use"] == 0
    assert member.stats["slots.available"] + member.stats["slots.issued"] == 9
    assert {q.owner for q in report.queues} == {d.member.id}
    assert report.total_lag == 0
    assert sum(q.acked or 0 for q in report.queues) == 500
    assert all(q.cache_fill == 0 for q in report.queues)
    # Heartbeats carry their own time and, from the second one on, the owner's rate.
    assert all(q.at == member.stats["at"] for q in report.queues)
    assert all(q.acks_per_s is not None and q.acks_per_s >= 0 for q in report.queues)
    assert report.rates() == {q.queue: q.acks_per_s for q in report.queues}
    later = await collect_status(cfg, "test", for_config(cfg))
    assert later.members == [] and all(q.owner is None for q in later.queues)


def report(at_read: float, owner: str, acked: int, heartbeat_at: float,
           acks_per_s: float | None = None) -> StatusReport:
    return StatusReport("g", [], [QueueStatus(0, owner, 0, 0, acked, acks_per_s, heartbeat_at)],
                        at_read)


def test_rates_divide_by_the_heartbeats_interval_not_the_readers() -> None:
    first = report(at_read=100.0, owner="a", acked=1000, heartbeat_at=99.0)
    # Read 0.2 s later, but the owner heartbeated 1 s after the last one: 500 acks/s.
    second = report(at_read=100.2, owner="a", acked=1500, heartbeat_at=100.0)
    assert second.rates(first) == {0: 500.0}
    # Read again before the next heartbeat: the same heartbeat is no new rate, not zero.
    again = report(at_read=100.4, owner="a", acked=1500, heartbeat_at=100.0, acks_per_s=480.0)
    assert again.rates(second) == {0: 480.0}  # the owner's own figure instead
    assert report(100.4, "a", 1500, 100.0).rates(second) == {}


def test_a_new_owner_or_a_reset_count_is_no_rate_across_readings() -> None:
    first = report(at_read=100.0, owner="a", acked=1000, heartbeat_at=99.0)
    assert report(101.0, "b", 1200, 100.5).rates(first) == {}
    assert report(101.0, "a", 10, 100.5).rates(first) == {}  # taken over and back


def test_the_daemons_ack_rate_covers_at_least_its_window() -> None:
    rates = AckRates(min_window_s=0.5)
    assert rates.sample({0: 0, 1: 0}, now=10.0) == {}
    assert rates.sample({0: 100, 1: 0}, now=11.0) == {0: 100.0, 1: 0.0}
    # 10 ms later (a second caller): the last rates again, not 1,000 x the truth.
    assert rates.sample({0: 101, 1: 0}, now=11.01) == {0: 100.0, 1: 0.0}
    assert rates.sample({0: 300, 1: 0}, now=12.0) == {0: 200.0, 1: 0.0}
    assert rates.sample({0: 5}, now=13.0) == {}  # count went down: a new window starts
    assert rates.sample({0: 55}, now=13.5) == {0: 100.0}


async def test_a_drain_after_the_last_heartbeat_shows_no_stale_cache_fill() -> None:
    """The cache fill comes from the owner's last heartbeat; read after a drain that came
    after that heartbeat, it is capped at the lag read now (what a cache holds is pulled
    and not acknowledged, which the lag counts): 0 on an empty queue, not the old fill."""
    import asyncio

    adapter = fresh_adapter()
    gate = asyncio.Event()
    handled = 0
    app = App("test")

    @app.handler("items")
    async def held(body: bytes) -> None:
        nonlocal handled
        await gate.wait()
        handled += 1

    cfg = config(balancer={"lease_ttl_s": 6.0}, queues={"total": 1})  # a beat every 2 s
    d = daemon(app, adapter, cfg)
    await publish_items(Client(adapter, d.mapper), 200, streams=20)
    await d.start()
    try:
        seen: list[StatusReport] = []

        async def holding() -> bool:
            report = await collect_status(cfg, "test", for_config(cfg))
            seen.append(report)
            return bool(report.members) and (report.queues[0].cache_fill or 0) > 0

        await wait_until(holding, 10, 0.02, what="a heartbeat while the cache holds")
        beat = seen[-1].members[0].stats["at"]
        gate.set()
        await wait_until(lambda: handled == 200 and d.queues.acked == 200, 10,
                         what="all acked")
        report = await collect_status(cfg, "test", for_config(cfg))
        assert report.members[0].stats["at"] == beat, "no heartbeat since: the test shows it"
        assert report.total_lag == 0 and report.queues[0].cache_fill == 0
    finally:
        await d.stop()
