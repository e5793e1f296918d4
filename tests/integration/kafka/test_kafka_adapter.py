"""The Kafka adapter against a real broker: order, concurrency, wire format, rewind."""

from __future__ import annotations

import time

import pytest
from aiokafka import AIOKafkaProducer

from conveyor.adapters.kafka import KafkaAdapter
from conveyor.client import Client, Publish
from conveyor.platform.app import App
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
    """Seconds from the first handler call to the end of the last (start-up excluded)."""
    daemon = WorkerDaemon(rec.app, config)
    try:
        await run_until(daemon, lambda: len(rec.seen) >= n, f"{n} handled")
    finally:
        await daemon.stop()
    assert rec.first_call_at is not None
    return rec.last_done_at - rec.first_call_at


async def test_per_key_order_holds_with_concurrency_inside_one_partition(
    tansu: Tansu, topic: str
) -> None:
    """Many keys, one partition, random handler delays: order per key, speed with slots.

    Handlers sleep 2-8 ms (mean 5): one slot needs about n x 5 ms = 2 s; 8 slots about
    a eighth of that; 64 slots are bounded by the per-key chains (4 x 8 ms) and the
    pull round-trips. Measured on the shared 2-core machine (load ~2): 2.3 s, 0.29 s and
    0.04 s, ratios ~8 and ~7. The asserted ratios (3 and 2) leave room for more load:
    load stretches the event loop's own work, not the sleeps, and hurts the short wide
    runs most (64 slots at 0.1 s would still pass); a lost concurrency gives ~1.
    """
    keys, per_key = 100, 4
    items = [Publish("orders", f"k{k}", {"k": f"k{k}", "seq": s})
             for s in range(per_key) for k in range(keys)]
    n = len(items)
    await publish(kafka_config(tansu.bootstrap, topic), items)

    took: dict[int, float] = {}
    for slots in (64, 8, 1):  # each under its own group, from the partition's start
        rec = Recorder(min_delay_s=0.002, max_delay_s=0.008)
        rec.app.name = f"kafka-test-{slots}"
        config = kafka_config(tansu.bootstrap, topic, slots={"count": slots})
        took[slots] = await timed_run(config, rec, n)
        assert sorted(rec.seen) == sorted((f"k{k}", s) for k in range(keys)
                                          for s in range(per_key))
        for key, seqs in rec.by_key.items():
            assert seqs == list(range(per_key)), f"order broken for {key}: {seqs}"
        assert rec.peak <= slots
        if slots > 1:
            assert rec.peak > slots // 2, "different keys of one partition should overlap"
    figures = ", ".join(f"{s} slot(s) {t:.2f}s" for s, t in took.items())
    assert took[1] / took[8] > 3, figures
    # The 64-slot run lasts ~0.04 s, so fetch round-trips on a loaded machine weigh on
    # it: ask only that it is faster (measured ~7x); its peak above shows the overlap.
    assert took[64] < took[8], figures


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


async def test_a_rewind_to_the_current_time_goes_to_the_end_on_every_partition(
    tansu: Tansu, topic: str,
) -> None:
    """tansu answers a lookup by time, now and then, with offset 0 stamped with the asked
    time, whatever offset 0 holds: a rewind to "now" then went back to the start of that
    partition (the status test, under load; 1 partition in 5 in a loop). Ten rounds of
    publish-then-rewind-to-now, each on a fresh group: every one lands at the end."""
    config = kafka_config(tansu.bootstrap, topic, queues={"total": 2})
    adapter = KafkaAdapter(config.kafka, 2)
    try:
        for round_ in range(10):
            await publish(config, [Publish("jobs", f"k{i}", {"i": i}) for i in range(3)])
            group = f"now-{round_}"
            await adapter.rewind_queues([0, 1], group, time.time(), create_group=True,
                                        allow_forward=True)
            lags = [await adapter.lag(q, group) for q in (0, 1)]
            assert lags == [0, 0], (round_, lags)
    finally:
        await adapter.close()
