"""Cluster-wide rate limits on a real Redis: one bucket shared by every daemon of an app."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from conveyor import Client, Publish
from conveyor.adapters.redis.rate import RedisTokenSource, rate_key
from conveyor.platform.config import load_config
from conveyor.platform.errors import ConfigError
from conveyor.platform.slots import SlotReleaseReason
from conveyor.workers.slots.fixed import FixedSlotSupplier
from conveyor.workers.slots.rate import RateLimitedSlotSupplier
from tests.conftest import wait_until, wait_until_sync
from tests.integration.memory_harness import Item
from tests.integration.redis.conftest import (
    RedisServer,
    Worker,
    read_records,
    wait_file_lines,
    write_config,
)
from tests.slot_context import CTX

RATE = 50  # handler starts per second, for the whole app
BURST = 10
MESSAGES = RATE * 10 + BURST  # ten seconds of work after the burst




@pytest.mark.slow
def test_three_daemons_share_one_limit(redis_server: RedisServer, tmp_path: Path,
                                       workers: list[Worker]) -> None:
    """Three `conveyor worker` processes with `[slots.rate] per_second = 50, burst = 10`
    and 64 slots each: over the ~10 s the backlog takes, handlers start at 50/s between
    them (±10 %), never more than 50 + 10 in any one second, and every message published
    is handled once (no faults here, so no duplicates are allowed)."""
    config = write_config(tmp_path / "rate.toml", redis_server.url,
                          slots={"count": 64},
                          balancer={"lease_ttl_s": 3.0, "rebalance_interval_s": 0.2})
    config.write_text(config.read_text()
                      + f"[slots.rate]\nper_second = {RATE}\nburst = {BURST}\n")
    for i in range(3):
        workers.append(Worker(f"w{i}", config, tmp_path))
    wait_until_sync(lambda: all("ready" in w.stderr for w in workers), 30,
                    "three daemons ready")

    async def publish() -> None:
        cfg = load_config(config, environ={})
        async with Client.from_config(cfg) as client:
            await client.publish_batch(
                Publish("items", f"s{i % 40}", Item(i)) for i in range(MESSAGES)
            )

    asyncio.run(publish())
    records = [w.record for w in workers]
    wait_file_lines(records, MESSAGES, 40, "every message handled")
    rows = read_records(records)
    assert sorted(r[4] for r in rows) == list(range(MESSAGES))  # each published body, once
    assert len({r[5] for r in rows}) == MESSAGES
    assert len({r[1] for r in rows}) >= 2  # the limit really was shared between processes

    starts = sorted(r[0] for r in rows)
    span = starts[-1] - starts[0]
    rate = (MESSAGES - BURST) / span
    assert RATE * 0.9 <= rate <= RATE * 1.1, f"{rate:.1f}/s over {span:.2f}s"
    # Any one second (from each start): at most RATE + BURST starts; +1 for the
    # recorder's 1 ms timestamps.
    j = 0
    for i, t in enumerate(starts):
        while starts[j] < t - 1.0:
            j += 1
        assert i - j + 1 <= RATE + BURST + 1, f"{i - j + 1} starts in the second to {t}"


async def test_two_sources_on_one_key_share_the_bucket(redis_server: RedisServer) -> None:
    cfg = load_config(None, environ={}, overrides={
        "queues": {"adapter": "redis"}, "redis": {"url": redis_server.url, "prefix": "t"},
        "balancer": {"membership": "redis"},
    })
    a = RedisTokenSource(cfg.redis, "app", per_second=10, burst=5)
    b = RedisTokenSource(cfg.redis, "app", per_second=10, burst=5)
    other = RedisTokenSource(cfg.redis, "other", per_second=10, burst=5)
    try:
        assert (await a.take(3))[0] == 3
        granted, _ = await b.take(5)
        assert granted == 2  # what a left of the burst
        granted, wait_s = await a.take(1)
        assert granted == 0 and 0 < wait_s <= 0.1
        assert (await other.take(5))[0] == 5  # another app has its own bucket
        assert a.key == rate_key("t", "app") == "t:app:app:rate"
    finally:
        for source in (a, b, other):
            await source.close()


async def test_no_grants_while_redis_is_down_then_they_resume(
    redis_server: RedisServer,
) -> None:
    cfg = load_config(None, environ={}, overrides={
        "queues": {"adapter": "redis"},
        "redis": {"url": redis_server.url, "prefix": "t", "connect_timeout_s": 0.2},
        "balancer": {"membership": "redis"},
    })
    source = RedisTokenSource(cfg.redis, "app", per_second=100, burst=1)
    slots = RateLimitedSlotSupplier(FixedSlotSupplier(4), source, per_second=100)
    try:
        first = await slots.reserve_slot(CTX)
        first.release(SlotReleaseReason.TASK_COMPLETE)
        redis_server.stop()
        waiting = asyncio.create_task(slots.reserve_slot(CTX))
        down_at = time.monotonic()
        while time.monotonic() - down_at < 1.0:  # a second of outage: nothing granted
            assert not waiting.done()
            await asyncio.sleep(0.05)
        redis_server.start()
        permit = await asyncio.wait_for(waiting, 10)
        permit.release(SlotReleaseReason.TASK_COMPLETE)
        await wait_until(lambda: slots.waiting == 0, what="no reservation left waiting")
        assert slots.granted == 2
    finally:
        await slots.close()


def test_a_shared_limit_without_redis_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"\$\.slots\.rate\.store"):
        load_config(None, environ={}, overrides={"slots": {"rate": {"per_second": 5}}})
    local = load_config(None, environ={}, overrides={
        "slots": {"rate": {"per_second": 5, "store": "local"}}})
    assert local.slots.rate.per_second == 5
