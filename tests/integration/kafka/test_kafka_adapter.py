"""The Kafka adapter against a real broker: order, concurrency, wire format, rewind."""

from __future__ import annotations

import time

import pytest
from aiokafka import AIOKafkaProducer

from conveyor.platform.app import App
from conveyor.platform.client import Client, Publish
from conveyor.platform.config import Config
from conveyor.workers.daemon import WorkerDaemon
from tests.conftest import wait_until
from tests.integration.kafka.conftest import Tansu
from tests.integration.kafka.helpers import Recorder, kafka_config

pytestmark = pytest.mark.kafka


async def publish(config: Config, items: list[Publish]) -> list[object]:
    async with Client.from_config(config) as client:
        return list(await client.publish_batch(items))


async def run_until(daemon: WorkerDaemon, cond: object, what: str, timeout_s: float = 30) -> None:
    await daemon.start()
    await wait_until(cond, timeout_s, 0.02, what)  # type: ignore[arg-type]


async def timed_run(config: Config, rec: Recorder, n: int) -> float:
    daemon = WorkerDaemon(rec.app, config)
    t0 = time.perf_counter()
    try:
        await run_until(daemon, lambda: len(rec.seen) >= n, f"{n} handled")
        return time.perf_counter() - t0
    finally:
        await daemon.stop()


async def test_per_key_order_holds_with_concurrency_inside_one_partition(
    tansu: Tansu, topic: str
) -> None:
    keys, per_key = 100, 6
    items = [Publish("orders", f"k{k}", {"k": f"k{k}", "seq": s})
             for s in range(per_key) for k in range(keys)]
    n = len(items)
    base = kafka_config(tansu.bootstrap, topic)
    await publish(base, items)

    concurrent = Recorder(max_delay_s=0.004)
    wide = kafka_config(tansu.bootstrap, topic, slots={"count": 64})
    fast_s = await timed_run(wide, concurrent, n)
    assert len(concurrent.seen) == n
    for key, seqs in concurrent.by_key.items():
        assert seqs == list(range(per_key)), f"order broken for {key}: {seqs}"
    assert concurrent.peak > 8, "different keys of one partition should run concurrently"

    # The same partition again under a new group with one slot: serial, much slower.
    serial = Recorder(max_delay_s=0.004)
    narrow = kafka_config(tansu.bootstrap, topic, slots={"count": 1})
    narrow_app = serial.app
    narrow_app.name = "kafka-test-serial"
    slow_s = await timed_run(narrow, serial, n)
    assert serial.peak == 1
    assert slow_s / fast_s > 3, f"64 slots took {fast_s:.2f}s, 1 slot {slow_s:.2f}s"


async def test_a_plain_producer_record_is_handled_under_the_default_namespace(
    tansu: Tansu, topic: str
) -> None:
    config = kafka_config(tansu.bootstrap, topic, kafka={"default_namespace": "plain"})
    app = App("plain-app")
    got: list[tuple[str, dict[str, object]]] = []

    @app.handler("plain")
    async def handle(body: dict[str, object]) -> None:
        got.append((str(body["v"]), body))

    daemon = WorkerDaemon(app, config)
    await daemon.start()  # creates the topic
    try:
        producer = AIOKafkaProducer(bootstrap_servers=tansu.bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(topic, b'{"v": "hello"}', key=b"user-1")
        finally:
            await producer.stop()
        await wait_until(lambda: len(got) == 1, 20, what="the plain record handled")
    finally:
        await daemon.stop()
    assert got[0][0] == "hello"
