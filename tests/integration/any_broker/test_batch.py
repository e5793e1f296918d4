"""A batch handler on each broker: every message once, in per-stream order across
batches, the poison one dead-lettered alone with its own reason, everything
acknowledged (no lag; on Redis nothing pending in the group either)."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import msgspec

from conveyor import App, Client, Publish, WorkerDaemon
from conveyor.adapters.redis import RedisAdapter
from conveyor.backends import create_adapter
from tests.conftest import wait_until
from tests.integration.any_broker.conftest import Broker

N = 3000
STREAMS = 37
POISON = 517
QUEUES = 4


class Click(msgspec.Struct):
    stream: str
    seq: int
    page: str


async def test_a_batch_handler_handles_each_once_in_stream_order_and_acknowledges_all(
    broker: Broker, tmp_path: Path
) -> None:
    config = broker.config(tmp_path, queues={"total": QUEUES})
    handled: Counter[tuple[str, int, str]] = Counter()
    order: dict[str, list[int]] = defaultdict(list)
    sizes: list[int] = []
    app = App("batch")

    @app.handler("clicks", batch_size=200, batch_wait_ms=20, retry_attempts=2,
                 retry_delay_s=0.001)
    async def on_clicks(batch: list[Click]) -> None:
        sizes.append(len(batch))
        if any(c.seq == POISON for c in batch):
            raise ValueError(f"click {POISON} is poison")
        for c in batch:
            handled[c.stream, c.seq, c.page] += 1
            order[c.stream].append(c.seq)

    sent = [Click(f"s{i % STREAMS}", i, f"/page/{i * 7 % 101}") for i in range(N)]
    daemon = WorkerDaemon(app, config)
    await daemon.start()
    try:
        async with Client.from_config(config) as client:
            for i in range(0, N, 1000):  # in several rounds, so batches span pulls
                await client.publish_batch(
                    Publish("clicks", c.stream, c) for c in sent[i:i + 1000])
        await wait_until(lambda: sum(handled.values()) == N - 1
                         and daemon.stats.dead_lettered == 1, 30, what="all but one handled")
    finally:
        report = await daemon.stop()
    # No crash, no lost lease, a graceful stop: not one duplicate is allowed; the poison
    # click alone is dead-lettered (its batch is split until it stands alone).
    assert handled == Counter((c.stream, c.seq, c.page) for c in sent if c.seq != POISON)
    for stream, seqs in order.items():
        assert seqs == sorted(seqs), f"stream {stream} out of order across batches"
    assert max(sizes) <= 200 and len(sizes) < N / 10  # batched, within the bound
    assert report.acked == N and report.dead_lettered == 1
    adapter = create_adapter(broker.name, config)
    try:
        [letter] = await adapter.dead_letters.read("batch")
        assert letter.error == f"click {POISON} is poison" and letter.attempts == 2
        assert [await adapter.lag(q, "batch") for q in range(QUEUES)] == [0] * QUEUES
        if isinstance(adapter, RedisAdapter):
            for q in range(QUEUES):
                pending = await adapter.redis.xpending(adapter.keys.queue(q), "batch")
                assert pending["pending"] == 0
    finally:
        await adapter.close()
