"""A batch handler on the Kafka-protocol broker: each message once, in per-stream order,
the poison one dead-lettered with its own reason, every offset committed."""

from __future__ import annotations

from collections import Counter, defaultdict

import msgspec
import pytest

from conveyor.backends import create_adapter
from conveyor.client import Client, Publish
from conveyor.platform.app import App
from conveyor.workers.daemon import WorkerDaemon
from tests.conftest import wait_until
from tests.integration.kafka.conftest import Tansu
from tests.integration.kafka.helpers import kafka_config

pytestmark = pytest.mark.kafka

N = 1200
POISON = 517


class Click(msgspec.Struct):
    stream: str
    seq: int


async def test_a_batch_handler_on_kafka_handles_each_once_and_commits(
    tansu: Tansu, topic: str
) -> None:
    config = kafka_config(tansu.bootstrap, topic, queues={"adapter": "kafka", "total": 2})
    handled: Counter[tuple[str, int]] = Counter()
    order: dict[str, list[int]] = defaultdict(list)
    app = App("kafka-batch")

    @app.handler("clicks", batch_size=100, batch_wait_ms=20, retry_attempts=2,
                 retry_delay_s=0.001)
    async def on_clicks(batch: list[Click]) -> None:
        if any(c.seq == POISON for c in batch):
            raise ValueError(f"click {POISON} is poison")
        for c in batch:
            handled[c.stream, c.seq] += 1
            order[c.stream].append(c.seq)

    daemon = WorkerDaemon(app, config)
    await daemon.start()
    try:
        async with Client.from_config(config) as client:
            await client.publish_batch(
                Publish("clicks", f"s{i % 13}", Click(f"s{i % 13}", i)) for i in range(N))
        await wait_until(lambda: sum(handled.values()) == N - 1
                         and daemon.stats.dead_lettered == 1, 30, what="all but one handled")
    finally:
        report = await daemon.stop()
    # Graceful run: no duplicate allowed; the poison click alone is dead-lettered.
    assert handled == Counter((f"s{i % 13}", i) for i in range(N) if i != POISON)
    for stream, seqs in order.items():
        assert seqs == sorted(seqs), f"stream {stream} out of order"
    assert report.acked == N
    adapter = create_adapter("kafka", config)
    try:
        [letter] = await adapter.read_dead_letters("kafka-batch")
        assert letter.error == f"click {POISON} is poison" and letter.attempts == 2
        assert [await adapter.lag(q, "kafka-batch") for q in range(2)] == [0, 0]
    finally:
        await adapter.close()
