"""`conveyor status` on Kafka reads the lag of every queue at once. Each lag waits for a
fetch response, which the broker holds up to ``fetch_max_wait_ms`` for a partition with
nothing past the position asked: read one queue after the other, the README tour's
`status` (8 queues, tansu) took 3.3 s, and a long fetch wait made it longer still."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import TopicPartition

from conveyor import Client, Publish
from conveyor.adapters.kafka.cluster import KafkaCluster
from conveyor.backends import for_config
from conveyor.platform.operations.status import collect_status
from tests.integration.kafka.conftest import Tansu
from tests.integration.kafka.helpers import kafka_config

pytestmark = [pytest.mark.kafka]

QUEUES = 8
WAIT_MS = 500  # one after the other: at least 8 x 0.5 s for the lags alone


async def test_status_reads_every_queues_lag_at_once_and_each_right(
    tansu: Tansu, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = kafka_config(tansu.bootstrap, topic, queues={"total": QUEUES},
                          kafka={"fetch_max_wait_ms": WAIT_MS},
                          balancer={"kind": "kafka-group"})
    async with Client.from_config(config) as client:
        await client.publish_batch([Publish("orders", f"o-{n}", {"n": n}) for n in range(20)])
        expected = [0] * QUEUES
        for n in range(20):
            expected[client.queue_for("orders", f"o-{n}")] += 1
    assert sum(expected) == 20 and expected.count(0) < QUEUES - 1  # spread over queues

    started: list[Any] = []  # the lag probes' consumers: one per group, however many ask
    new_consumer = KafkaCluster.new_consumer

    def counted(self: KafkaCluster, group: str | None, **extra: Any) -> Any:
        consumer = new_consumer(self, group, **extra)
        if group == "shop":
            started.append(consumer)
        return consumer

    monkeypatch.setattr(KafkaCluster, "new_consumer", counted)
    loop = asyncio.get_running_loop()
    began = loop.time()
    report = await collect_status(config, "shop", for_config(config))
    took_s = loop.time() - began

    assert [q.lag for q in report.queues] == expected
    assert report.total_lag == 20
    assert len(started) == 1, "lag read concurrently, yet one probe consumer per group"
    # Read at once, the lags cost about one fetch wait (plus the group listing's one);
    # one after the other they would cost QUEUES of them, 4 s.
    assert took_s < QUEUES * WAIT_MS / 1000 / 2, f"status took {took_s:.2f}s"


async def test_a_high_watermark_is_the_one_a_fetch_after_the_seek_reports(
    tansu: Tansu, topic: str
) -> None:
    """The consumer keeps the watermark of its last fetch response: one from before more
    records were published is not the answer after them, even where the broker holds the
    fetch asked for (nothing past the offset) for its whole wait."""
    config = kafka_config(tansu.bootstrap, topic, queues={"total": 1},
                          kafka={"fetch_max_wait_ms": 1500})
    cluster = KafkaCluster(config.kafka, config.queues.total)
    tp = TopicPartition(topic, 0)
    try:
        async with Client.from_config(config) as client:
            await client.publish("orders", "o-1", {"n": 1})
            async with cluster.probing("shop") as consumer:
                assert await cluster.high_watermark(consumer, tp, 0) == 1
                await client.publish_batch([Publish("orders", "o-1", {"n": n})
                                            for n in range(3)])
                assert await cluster.high_watermark(consumer, tp, 4) == 4
    finally:
        await cluster.close()
