"""Hand-offs on Kafka: done offsets above the watermark are skipped; rewind replays."""

from __future__ import annotations

import asyncio
import time

import pytest

from conveyor.adapters.kafka import KafkaAdapter
from conveyor.adapters.kafka_group import KafkaGroupBalancer
from conveyor.platform.client import Client, Publish
from conveyor.platform.ids import SequenceToken
from conveyor.workers.daemon import WorkerDaemon
from tests.conftest import wait_until
from tests.integration.kafka.conftest import Tansu
from tests.integration.kafka.helpers import Recorder, kafka_config

pytestmark = pytest.mark.kafka


async def test_a_drain_that_times_out_replays_only_the_unfinished_message(
    tansu: Tansu, topic: str
) -> None:
    config = kafka_config(tansu.bootstrap, topic, worker={"drain_timeout_s": 0.3})
    items = [Publish("orders", "slow", {"k": "slow", "seq": 0})]
    items += [Publish("orders", f"f{i}", {"k": f"f{i}", "seq": 0}) for i in range(60)]
    async with Client.from_config(config) as client:
        await client.publish_batch(items)

    first = Recorder()
    first.hold["slow"] = asyncio.Event()  # never set: the first owner cannot finish it
    daemon = WorkerDaemon(first.app, config)
    await daemon.start()
    await wait_until(lambda: len(first.seen) == 60, 20, what="the fast messages handled")
    report = await daemon.stop()
    assert report.handled == 60 and report.abandoned >= 1

    second = Recorder()
    daemon = WorkerDaemon(second.app, config)
    await daemon.start()
    try:
        await wait_until(lambda: len(second.seen) >= 1, 20, what="the unfinished message")
        adapter = daemon.adapter
        await wait_until(lambda: _lag_is(adapter, 0), 10, what="lag 0")
    finally:
        await daemon.stop()
    assert second.seen == [("slow", 0)], "done messages above the watermark were replayed"


async def _lag_is(adapter: object, want: int) -> bool:
    assert isinstance(adapter, KafkaAdapter)
    return await adapter.lag(0, "kafka-test") == want


async def test_rewind_to_a_token_and_to_a_time_replays_exactly_that_range(
    tansu: Tansu, topic: str
) -> None:
    config = kafka_config(tansu.bootstrap, topic)
    async with Client.from_config(config) as client:
        early = await client.publish_batch(
            [Publish("orders", "a", {"k": "a", "seq": i}) for i in range(10)]
        )
        await asyncio.sleep(0.05)  # a timestamp strictly between the two ranges
        cut = time.time()
        await asyncio.sleep(0.05)
        await client.publish_batch([Publish("orders", "a", {"k": "a", "seq": i})
                                    for i in range(10, 15)])

    async def run_once() -> list[int]:
        rec = Recorder()
        daemon = WorkerDaemon(rec.app, config)
        await daemon.start()
        try:
            await wait_until(lambda: _lag_is(daemon.adapter, 0), 20, what="caught up")
        finally:
            await daemon.stop()
        return rec.by_key["a"]

    assert await run_once() == list(range(15))
    adapter = KafkaAdapter(config.kafka, 1)
    try:
        await adapter.rewind(0, "kafka-test", early[6])
        assert await adapter.lag(0, "kafka-test") == 9
    finally:
        await adapter.close()
    assert await run_once() == list(range(6, 15))

    adapter = KafkaAdapter(config.kafka, 1)
    try:
        await adapter.rewind(0, "kafka-test", cut)
    finally:
        await adapter.close()
    assert await run_once() == list(range(10, 15))
    assert isinstance(early[0], SequenceToken)


async def test_a_graceful_group_rebalance_redelivers_nothing(tansu: Tansu, topic: str) -> None:
    config = kafka_config(
        tansu.bootstrap, topic, queues={"total": 4}, balancer={"kind": "kafka-group"},
    )
    n = 400
    rec = Recorder(max_delay_s=0.01)
    a = WorkerDaemon(rec.app, config)
    await a.start()
    assert isinstance(a.balancer, KafkaGroupBalancer)
    assert await a.balancer.wait_assigned(20)
    async with Client.from_config(config) as client:
        await client.publish_batch(
            [Publish("orders", f"k{i % 40}", {"k": f"k{i % 40}", "seq": i // 40})
             for i in range(n)]
        )
    await wait_until(lambda: len(rec.seen) > 40, 20, what="work under way")
    b = WorkerDaemon(rec.app, config)  # same app, same group: a re-balance
    await b.start()
    try:
        await wait_until(lambda: bool(b.balancer.owned()) and len(a.balancer.owned()) < 4,
                         30, what="the partitions shared")
        await wait_until(lambda: len(rec.seen) >= n, 60, what="all handled")
    finally:
        await b.stop()
        await a.stop()
    assert len(rec.seen) == n, f"{len(rec.seen) - n} duplicate(s)"
    for key, seqs in rec.by_key.items():
        assert seqs == sorted(seqs), key
