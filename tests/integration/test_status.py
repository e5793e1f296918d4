"""conveyor status reads members, owners, lag and the owners' heartbeat stats."""

from __future__ import annotations

from conveyor import Client
from conveyor.platform.status import collect_status
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
    before = await collect_status(cfg, "test")
    assert before.members == [] and before.total_lag == 500
    assert all(q.owner is None for q in before.queues)
    await d.start()
    await wait_until(lambda: record.handled == 500, 20, what="all handled")

    async def heartbeat_caught_up() -> bool:
        report = await collect_status(cfg, "test")
        return bool(report.members) and report.members[0].stats.get("handled") == 500

    await wait_until(heartbeat_caught_up, 10, what="a heartbeat with the final stats")
    report = await collect_status(cfg, "test")
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
    later = await collect_status(cfg, "test")
    assert later.members == [] and all(q.owner is None for q in later.queues)
