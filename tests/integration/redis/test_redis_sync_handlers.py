"""Plain ``def`` handlers on a real Redis: blocking calls run on threads up to the slot
bound while the event loop (pulls, acks, lease renewals) keeps running."""

from __future__ import annotations

from collections import Counter

from conveyor import Client, WorkerDaemon
from conveyor.adapters.redis import RedisAdapter
from conveyor.platform.config import load_config
from tests.integration.redis.conftest import RedisServer
from tests.integration.test_sync_handlers import napping_app, run_naps


async def test_def_handlers_on_redis_sleep_concurrently_up_to_the_slots_without_stalling_the_loop(
    redis_server: RedisServer,
) -> None:
    """9 streams, one ``time.sleep(1)`` each, 3 slots: three rounds of three on three
    threads; the loop never goes 100 ms without running; each message handled and
    acknowledged once (a graceful run: no duplicate allowed)."""
    config = load_config(None, environ={}, overrides={
        "queues": {"adapter": "redis", "total": 4},
        "redis": {"url": redis_server.url, "prefix": "t"},
        "balancer": {"kind": "dynamic", "membership": "redis"},
        "slots": {"count": 3},
    })
    app, calls, handled = napping_app("sync-naps")
    daemon = WorkerDaemon(app, config)
    adapter = RedisAdapter(config.redis)
    try:
        elapsed, lag_s, report = await run_naps(daemon, Client(adapter, daemon.mapper), 9,
                                                handled)
    finally:
        await adapter.close()
    assert handled == Counter(range(9))
    assert calls.peak == 3 and daemon.threads.peak_threads == 3
    assert 2.9 < elapsed < 5.5  # three rounds of 1 s
    assert lag_s < 0.1, f"the event loop stalled {lag_s:.3f}s"
    assert report.acked == 9 and report.lost == 0
