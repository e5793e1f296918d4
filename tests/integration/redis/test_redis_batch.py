"""A batch handler on a real Redis: everything published handled once, in per-stream
order across batches, and acknowledged (nothing pending in the group afterwards)."""

from __future__ import annotations

from collections import Counter, defaultdict

import msgspec

from conveyor import App, Client, Publish, WorkerDaemon
from conveyor.adapters.redis import RedisAdapter
from conveyor.platform.config import load_config
from tests.conftest import wait_until
from tests.integration.redis.conftest import RedisServer

N = 5000
STREAMS = 37


class Click(msgspec.Struct):
    stream: str
    seq: int
    page: str


async def test_a_batch_handler_on_redis_handles_everything_once_in_stream_order(
    redis_server: RedisServer,
) -> None:
    config = load_config(None, environ={}, overrides={
        "queues": {"adapter": "redis", "total": 4},
        "redis": {"url": redis_server.url, "prefix": "t"},
        "balancer": {"kind": "dynamic", "membership": "redis"},
    })
    handled: Counter[tuple[str, int, str]] = Counter()
    order: dict[str, list[int]] = defaultdict(list)
    sizes: list[int] = []
    app = App("batch")

    @app.handler("clicks", batch_size=200, batch_wait_ms=20)
    async def on_clicks(batch: list[Click]) -> None:
        sizes.append(len(batch))
        for c in batch:
            handled[c.stream, c.seq, c.page] += 1
            order[c.stream].append(c.seq)

    sent = [Click(f"s{i % STREAMS}", i, f"/page/{i * 7 % 101}") for i in range(N)]
    daemon = WorkerDaemon(app, config)
    adapter = RedisAdapter(config.redis)
    try:
        await daemon.start()
        client = Client(adapter, daemon.mapper)
        for i in range(0, N, 1000):  # in several rounds, so batches span pulls
            await client.publish_batch(Publish("clicks", c.stream, c) for c in sent[i:i + 1000])
        await wait_until(lambda: sum(handled.values()) >= N, 30, what="every click handled")
        report = await daemon.stop()
        # No crash, no lost lease, a graceful stop: not one duplicate is allowed.
        assert handled == Counter((c.stream, c.seq, c.page) for c in sent)
        for stream, seqs in order.items():
            assert seqs == sorted(seqs), f"stream {stream} out of order across batches"
        assert max(sizes) <= 200 and len(sizes) < N / 10  # batched, within the bound
        assert report.acked == N and report.dead_lettered == 0
        for q in range(4):
            assert await adapter.lag(q, "batch") == 0
            pending = await adapter.redis.xpending(adapter.keys.queue(q), "batch")
            assert pending["pending"] == 0
    finally:
        await daemon.stop()
        await adapter.close()
