"""Hand-off records: done offsets left for the next owner when commit metadata is dropped.

Brokers such as tansu keep committed offsets but drop their metadata, so the done
offsets above the watermark (:mod:`conveyor.adapters.kafka.offsets`) would be lost on
a hand-off. A draining owner therefore also writes a record to
``<topic>.conveyor-handoff``: partition = queue, key = group, value =
``{"watermark": W, "done": "cv1:..."}``. The next owner uses the latest record of its
group only if its ``watermark`` equals the committed offset (otherwise someone moved
on since, and the record is stale). ``rewind`` writes one with no done offsets.

The same record carries what the delivery limit needs (``max_deliveries``), since
commit metadata cannot: ``fetched`` — the highest offset its writer may have handed to
handlers without finishing (written ahead of the fetch position, one record per
:data:`FETCH_LOOKAHEAD` records; -1 after a graceful drain, when nothing was left
half-done) — and ``starts``, the handler starts counted for redelivered offsets. After a
crash the next owner takes the offsets from the committed watermark to ``fetched`` for
redelivered ones.

Only the latest record per (partition, key) matters, so the topic is created with
``cleanup.policy=compact``, and a reader scans backwards from the end in windows of
``scan_step`` records, stopping at the first window that holds a record of its group:
with one app per topic that is the last window, however long the topic has grown.
Reading too little is safe: a missing hand-off only makes the next owner redo work. So
is reading something else: a record another client wrote there (a header name not
UTF-8, a value that is not a hand-off) is passed over.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition

from conveyor.adapters.kafka import offsets as kafka_offsets
from conveyor.adapters.kafka.aiokafka_internals import raw_records
from conveyor.adapters.kafka.cluster import KafkaCluster

log = logging.getLogger("conveyor.kafka")

TOPIC_CONFIG = {"cleanup.policy": "compact"}


FETCH_LOOKAHEAD = 1024
"""A fetch past the last ``fetched`` mark writes one this many offsets further on."""


class Handoff(msgspec.Struct, frozen=True):
    """What an owner leaves for the next one (see the module's docstring)."""

    watermark: int
    done: str
    fetched: int = -1
    starts: dict[int, int] = {}


class Deliveries(msgspec.Struct, frozen=True):
    """What the previous owners' records say of the offsets from ``watermark`` on."""

    done: set[int]
    redelivered_through: int
    """Offsets from the watermark up to this one were handed out before (-1: none)."""
    starts: dict[int, int]


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(Handoff).decode


class HandoffLog:
    """The hand-off topic of one cluster's topic (created on the first write)."""

    def __init__(self, cluster: KafkaCluster, scan_step: int = 500) -> None:
        self.cluster = cluster
        self.topic = f"{cluster.topic}.conveyor-handoff"
        self.scan_step = scan_step
        self.last_scan_records = 0
        """Records the last :meth:`read` fetched (how far back it had to look)."""
        self._ready = False
        self._preparing: asyncio.Future[None] | None = None
        """The topic's preparation under way: the first writes of a daemon's receivers
        come together, and one attempt (one admin client) serves all of them — they
        share its outcome, so a broker that is down fails them together rather than one
        after another; the next write after a failure tries again."""

    async def write(self, group: str, queue: int, watermark: int, done: str,
                    fetched: int = -1, starts: dict[int, int] | None = None) -> None:
        cluster = self.cluster
        if not self._ready:
            await cluster.producer()  # the app's topic first
            await self._prepared()
        producer = await cluster.producer(self.topic)
        record = Handoff(watermark, done, fetched, starts or {})
        await producer.send_and_wait(self.topic, _encode(record),
                                     key=group.encode(), partition=queue)

    async def _prepared(self) -> None:
        attempt = self._preparing
        if attempt is None:
            attempt = self._preparing = asyncio.ensure_future(self._prepare())
            # Retrieved here, so an attempt every waiter gave up on logs nothing.
            attempt.add_done_callback(lambda done: done.cancelled() or done.exception())
        await asyncio.shield(attempt)  # a cancelled writer leaves it to the others

    async def _prepare(self) -> None:
        cluster = self.cluster
        try:
            await cluster.create_topics({self.topic: cluster.total_queues}, TOPIC_CONFIG)
            self._ready = True
        finally:
            self._preparing = None

    async def read(self, group: str, queue: int, watermark: int) -> set[int]:
        """Done offsets the last owner recorded at ``watermark`` (none if it moved on)."""
        return (await self.read_deliveries(group, queue, watermark)).done

    async def read_deliveries(self, group: str, queue: int, watermark: int) -> Deliveries:
        """The latest record of ``group`` on ``queue``, as of the committed ``watermark``:
        its done offsets if it was written at that watermark, and what it says of the
        redelivered offsets at or above it."""
        tp = TopicPartition(self.topic, queue)
        # Records as the batch holds them: one whose header names are not UTF-8 (another
        # client's) is read leniently, not a parse error that stops the receiver's start.
        consumer = self.cluster.new_consumer(None, **raw_records())
        self.last_scan_records = 0
        try:
            await consumer.start()
            if self.topic not in await consumer.topics():
                return Deliveries(set(), -1, {})
            consumer.assign([tp])
            begin = int((await consumer.beginning_offsets([tp]))[tp])
            end = await self.cluster.high_watermark(consumer, tp, begin)
            latest: Handoff | None = None
            while latest is None and end > begin:
                start = max(begin, end - self.scan_step)
                latest = await self._latest_in(consumer, tp, group.encode(), start, end)
                end = start
        finally:
            await consumer.stop()
        log.debug("hand-off of %s on queue %d: %d record(s) read", group, queue,
                  self.last_scan_records)
        if latest is None:
            return Deliveries(set(), -1, {})
        done = (kafka_offsets.decode(watermark, latest.done)
                if latest.watermark == watermark else set())
        return Deliveries(done, latest.fetched if latest.fetched >= watermark else -1,
                          {o: n for o, n in latest.starts.items() if o >= watermark})

    async def _latest_in(self, consumer: AIOKafkaConsumer, tp: TopicPartition, key: bytes,
                         start: int, end: int) -> Handoff | None:
        """The last record of ``key`` at offsets ``[start, end)`` (gaps from compaction)."""
        consumer.seek(tp, start)
        latest: Handoff | None = None
        position, empty_fetches = start, 0
        while position < end and empty_fetches < 10:  # 5 s without data: give up (safe)
            batch = (await consumer.getmany(tp, timeout_ms=500, max_records=500)).get(tp, [])
            empty_fetches = 0 if batch else empty_fetches + 1
            for record in batch:
                position = record.offset + 1
                if record.offset >= end:
                    break
                self.last_scan_records += 1
                if record.key == key and record.value:
                    try:
                        latest = _decode(record.value)
                    except msgspec.DecodeError:  # not written by Conveyor: no hand-off
                        log.warning("hand-off topic %s, queue %d: the record at offset %d "
                                    "of app %r is not a hand-off; ignored", self.topic,
                                    tp.partition, record.offset, key.decode())
        return latest
