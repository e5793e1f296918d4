"""Dead letters on Kafka (the adapter's ``dead_letters`` facet): store, list, find,
count, purge and replay them.

Letters are records of ``<topic>.conveyor-dlq`` (partition 0, every app's, see
:mod:`conveyor.platform.letters`); a letter's id is ``PARTITION:OFFSET`` there. Kafka
cannot delete one record, so what is done to letters is written down beside them, in
``<topic>.conveyor-dlq-ops`` (partition 0, key = app, value JSON, kept forever)::

    {"op": "replaying", "ids": ["0:41"], "queue": 3, "from_offset": 1200}
    {"op": "replayed",  "ids": ["0:41"]}
    {"op": "purged",    "ids": ["0:42", "0:43"]}

A letter named by a ``replayed`` or ``purged`` record is removed: it is listed, counted
and replayed no more (``kcat`` still shows it in the dead-letter topic).

Replay, without transactions (tansu has none), a batch at a time: (1) ``replaying``
names the batch's letters, their queue and its end offset *before* the publish (one
record per queue); (2) the messages are published with ``cv-replay-of`` = their letter's
id and the publish confirmed; (3) ``replayed`` names them all. A replay killed between
(1) and (3) leaves ``replaying`` records alone; running it again first looks for those
letters' messages in their queues from ``from_offset`` on (by ``cv-replay-of``): found,
it only writes (3) for them; not found, it publishes. So each letter is published once,
killed at any point. The window that remains: a publish request the broker had received but not yet
appended when the re-run scanned the queue (the re-run would come milliseconds after
the kill for that), and an ops topic someone deleted by hand.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka import errors as kerrors

from conveyor.adapters.kafka.aiokafka_internals import raw_records
from conveyor.adapters.kafka.cluster import QUICK_FETCH_MS, KafkaCluster
from conveyor.adapters.kafka.codec import letter_record
from conveyor.adapters.kafka.connection import broker_error, kafka_errors, start_client
from conveyor.platform.adapter import DeadLetters
from conveyor.platform.errors import BrokerConnectionError, InvalidArgumentError
from conveyor.platform.ids import SequenceToken
from conveyor.platform.letters import Replay, StoredLetter
from conveyor.platform.message import H_REPLAY_OF, DeadLetter, Message
from conveyor.platform.operations.dlq import checkpoint

ReadLetter = Callable[[Any, str], DeadLetter | None]
"""(record, app) -> the app's letter in that record, or None (the adapter's decoder)."""
Publish = Callable[[int, Sequence[Message]], Awaitable[list[SequenceToken]]]
"""(queue, messages) -> their tokens: the adapter's enqueue, which replays publish with."""

_LETTER_ID = re.compile(r"([0-9]{1,9}):([0-9]{1,19})")
_BATCH = 500
_STALL_S = 10.0  # no record within this long below the high watermark: give up


class LetterOp(msgspec.Struct, frozen=True, omit_defaults=True):
    """One record of the ops topic (see the module docstring)."""

    op: str
    ids: list[str]
    queue: int = -1
    from_offset: int = -1


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(LetterOp).decode


@dataclass
class _Ops:
    """One app's ops read so far: the ops topic up to ``position``."""

    position: int = 0
    removed: set[str] = field(default_factory=set)
    replaying: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Letters whose replay started and did not finish: id -> (queue, from_offset)."""

    def apply(self, op: LetterOp) -> None:
        if op.op == "replaying":
            for letter_id in op.ids:
                self.replaying[letter_id] = (op.queue, op.from_offset)
        elif op.op in ("replayed", "purged"):
            self.removed.update(op.ids)
            for letter_id in op.ids:
                self.replaying.pop(letter_id, None)


def parse_id(letter_id: str) -> tuple[int, int]:
    match = _LETTER_ID.fullmatch(letter_id)
    if match is None:
        raise InvalidArgumentError(
            f"not a dead-letter id on kafka: {letter_id!r} (expected PARTITION:OFFSET of "
            "the dead-letter topic, e.g. 0:41)"
        )
    return int(match[1]), int(match[2])


class KafkaDeadLetters(DeadLetters):
    """One topic's dead letters: written by the cluster's producer, read by a consumer
    of their own."""

    def __init__(self, cluster: KafkaCluster, read_letter: ReadLetter,
                 publish: Publish) -> None:
        self.cluster = cluster
        self._read_letter = read_letter
        self._publish = publish
        self.ops_topic = cluster.dlq_ops_topic
        self._ops: dict[str, _Ops] = {}
        self._consumer: AIOKafkaConsumer | None = None
        self._ops_ready = False
        self._existing: set[str] = set()
        self._dlq_ready = False

    async def close(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            with kafka_errors("closing the dead-letter reader"):
                await consumer.stop()

    # -- reading -------------------------------------------------------------------------
    async def _reader(self) -> AIOKafkaConsumer:
        """The consumer that reads the letters, the ops and replayed messages back: its
        records come as the batch holds them (``offset``, ``key``, ``value``,
        ``headers``, no topic or partition), and a record whose header names are not
        UTF-8 — which aiokafka's parser fails on, every fetch — as an
        :class:`~conveyor.adapters.kafka.aiokafka_internals.UnreadableRecord`, the
        batch's others as usual (:func:`~conveyor.adapters.kafka.aiokafka_internals.raw_records`,
        as a receiver reads its queue). Its fetches are answered at once
        (:data:`~conveyor.adapters.kafka.cluster.QUICK_FETCH_MS`), and its partition is
        fetched only while it is read (from :meth:`_on` to :meth:`_rest`, at the end of
        :meth:`_high`, of :meth:`_records` or where its caller stops early): a reader
        kept between readings does not poll the broker."""
        if self._consumer is None:
            consumer = self.cluster.new_consumer(None, fetch_max_wait_ms=QUICK_FETCH_MS,
                                                 **raw_records())
            await start_client(consumer, "connecting a dead-letter reader")
            self._consumer = consumer
        return self._consumer

    async def _exists(self, topic: str) -> bool:
        """Whether ``topic`` exists (once it does, it is not asked again: Conveyor never
        deletes these topics)."""
        if topic in self._existing:
            return True
        with kafka_errors("reading the topics"):
            if topic in await (await self._reader()).topics():
                self._existing.add(topic)
                return True
        return False

    async def _on(self, tp: TopicPartition) -> AIOKafkaConsumer:
        """The reader, assigned ``tp`` alone. Assigned again only when it reads another
        partition: aiokafka's fetcher, stopped while it takes in a new assignment, can
        swallow the stop and fetch on for good (``consumer.stop()`` never returns), and
        a re-assignment followed by no read — a range of no records, an empty topic —
        then a close, hit that every other time."""
        consumer = await self._reader()
        if consumer.assignment() != {tp}:
            consumer.assign([tp])
        consumer.resume(tp)
        return consumer

    def _rest(self) -> None:
        """Stop fetching until the next read (:meth:`_on`)."""
        if self._consumer is not None:
            self._consumer.pause(*self._consumer.assignment())

    async def _high(self, tp: TopicPartition) -> int:
        try:
            with kafka_errors(f"reading the end of {tp.topic}"):
                consumer = await self._on(tp)
                return await self.cluster.high_watermark(consumer, tp, 0)
        finally:
            self._rest()

    async def _records(self, tp: TopicPartition, start: int, end: int) -> AsyncIterator[list[Any]]:
        """Batches of the records of ``tp`` from ``start`` up to ``end`` (exclusive)."""
        if start >= end:
            return
        loop = asyncio.get_running_loop()
        with kafka_errors(f"reading {tp.topic}"):
            consumer = await self._on(tp)
            consumer.seek(tp, start)
            position, stalled_at = start, loop.time()
            while position < end:
                records = (await consumer.getmany(tp, timeout_ms=500, max_records=_BATCH)
                           ).get(tp, [])
                if records:
                    position, stalled_at = records[-1].offset + 1, loop.time()
                    yield [r for r in records if r.offset < end]
                elif await consumer.position(tp) >= end:  # the rest were not records
                    break
                elif loop.time() - stalled_at > _STALL_S:
                    self._rest()
                    raise BrokerConnectionError(
                        f"kafka: no records of {tp.topic} from offset {position} in "
                        f"{_STALL_S:.0f}s (end {end})"
                    )
        # Not in a finally: a caller that stops early leaves the generator to be closed
        # later, in the middle of another read; it calls _rest itself.
        self._rest()

    async def ops(self, group: str) -> _Ops:
        """``group``'s ops, brought up to date with the ops topic."""
        state = self._ops.setdefault(group, _Ops())
        if not await self._exists(self.ops_topic):
            return state
        tp = TopicPartition(self.ops_topic, 0)
        high = await self._high(tp)
        key = group.encode()
        async for batch in self._records(tp, state.position, high):
            for record in batch:
                if record.key == key and record.value:
                    state.apply(_decode(record.value))
        state.position = max(state.position, high)
        return state

    async def _write(self, group: str, op: LetterOp) -> None:
        cluster = self.cluster
        if not self._ops_ready:
            await cluster.create_topics({self.ops_topic: 1}, {"retention.ms": "-1"})
            self._ops_ready = True
        producer = await cluster.producer()
        with kafka_errors("recording a dead-letter operation"):
            await producer.send_and_wait(self.ops_topic, _encode(op), key=group.encode(),
                                         partition=0)

    def _letter(self, partition: int, record: Any, group: str) -> StoredLetter | None:
        letter = self._read_letter(record, group)
        return None if letter is None else StoredLetter(f"{partition}:{record.offset}",
                                                        letter)

    # -- the port --------------------------------------------------------------------------
    async def put(self, group: str, letters: Sequence[DeadLetter]) -> int:
        """One record per letter on partition 0 of ``<topic>.conveyor-dlq`` (see
        conveyor.platform.letters), created with ``retention.ms = -1``: no bound here,
        the topic's retention is the broker's business (0 evicted, always)."""
        producer = await self.cluster.producer()
        if not self._dlq_ready:
            await self.cluster.create_topics({self.cluster.dlq_topic: 1}, {"retention.ms": "-1"})
            self._dlq_ready = True
        try:
            futures = [
                await producer.send(self.cluster.dlq_topic, value, key=key, partition=0,
                                    headers=headers)
                for key, value, headers in (letter_record(letter, group) for letter in letters)
            ]
            await asyncio.gather(*futures)
        except (kerrors.KafkaError, OSError) as exc:
            raise broker_error("writing dead letters", exc) from exc
        return 0

    async def page(self, group: str, limit: int = 100, *,
                   after: str | None = None) -> list[StoredLetter]:
        start = 0
        if after is not None:
            _, offset = parse_id(after)
            start = offset + 1
        out: list[StoredLetter] = []
        if limit <= 0 or not await self._exists(self.cluster.dlq_topic):
            return out
        removed = (await self.ops(group)).removed
        tp = TopicPartition(self.cluster.dlq_topic, 0)
        async for batch in self._records(tp, start, await self._high(tp)):
            for record in batch:
                stored = self._letter(0, record, group)
                if stored is not None and stored.id not in removed:
                    out.append(stored)
                    if len(out) >= limit:
                        self._rest()
                        return out
        return out

    async def find(self, group: str, letter_id: str) -> StoredLetter | None:
        partition, offset = parse_id(letter_id)
        if not await self._exists(self.cluster.dlq_topic):
            return None
        if letter_id in (await self.ops(group)).removed:
            return None
        tp = TopicPartition(self.cluster.dlq_topic, partition)
        if partition != 0 or offset >= await self._high(tp):
            return None
        async for batch in self._records(tp, offset, offset + 1):
            for record in batch:
                if record.offset == offset:
                    self._rest()
                    return self._letter(partition, record, group)
        return None

    async def count(self, group: str) -> int:
        return len(await self.page(group, sys.maxsize))

    async def delete(self, group: str, ids: Sequence[str]) -> int:
        """Recorded as purged in ``<topic>.conveyor-dlq-ops``: Kafka keeps the records."""
        for letter_id in ids:
            parse_id(letter_id)
        stored = {s.id for s in await self.page(group, sys.maxsize)}
        gone = sorted(stored.intersection(ids), key=parse_id)
        if gone:
            await self._write(group, LetterOp("purged", gone))
        return len(gone)

    async def replay(self, group: str, replays: Sequence[Replay]
                     ) -> list[SequenceToken | None]:
        """Recorded in ``<topic>.conveyor-dlq-ops`` before and after the publish, so a
        re-run finds a publish that was not recorded: see the module docstring
        (replaying, publish, replayed — per batch)."""
        for replay in replays:
            parse_id(replay.letter_id)
        state = await self.ops(group)
        stored = await self._stored_ids(group, [r.letter_id for r in replays], state.removed)
        tokens: dict[str, SequenceToken] = {}
        started = {r.letter_id: state.replaying[r.letter_id] for r in replays
                   if r.letter_id in stored and r.letter_id in state.replaying}
        if started:  # an earlier run was stopped: what it published is not published again
            tokens.update(await self._published(started))
        todo = [r for r in replays if r.letter_id in stored and r.letter_id not in tokens]
        by_queue: dict[int, list[Replay]] = {}
        for replay in todo:
            by_queue.setdefault(replay.queue, []).append(replay)
        for queue, batch in by_queue.items():
            end = await self._high(TopicPartition(self.cluster.topic, queue))
            await self._write(group, LetterOp("replaying", [r.letter_id for r in batch],
                                              queue, end))
        published = await asyncio.gather(*(
            self._publish(queue, [r.message for r in batch])
            for queue, batch in by_queue.items()
        ))
        for batch, queue_tokens in zip(by_queue.values(), published, strict=True):
            tokens.update((r.letter_id, t) for r, t in zip(batch, queue_tokens, strict=True))
        checkpoint("published")
        if tokens:
            await self._write(group, LetterOp("replayed", sorted(tokens, key=parse_id)))
        return [tokens.get(r.letter_id) for r in replays]

    async def _stored_ids(self, group: str, ids: list[str], removed: set[str]) -> set[str]:
        """Which of ``ids`` are letters of ``group`` still stored (one read of their range)."""
        wanted = {i for i in ids if i not in removed and parse_id(i)[0] == 0}
        if not wanted or not await self._exists(self.cluster.dlq_topic):
            return set()
        tp = TopicPartition(self.cluster.dlq_topic, 0)
        offsets = [parse_id(i)[1] for i in wanted]
        end = min(max(offsets) + 1, await self._high(tp))
        found: set[str] = set()
        async for batch in self._records(tp, min(offsets), end):
            for record in batch:
                letter_id = f"0:{record.offset}"
                if letter_id in wanted and self._letter(0, record, group) is not None:
                    found.add(letter_id)
        return found

    async def _published(self, started: dict[str, tuple[int, int]]) -> dict[str, SequenceToken]:
        """Where messages replayed from these letters (id: (queue, from_offset)) already
        sit in their queues, for those that do (found by their ``cv-replay-of``)."""
        found: dict[str, SequenceToken] = {}
        queues: dict[int, int] = {}
        for queue, from_offset in started.values():
            queues[queue] = min(from_offset, queues.get(queue, from_offset))
        for queue, from_offset in queues.items():
            tp = TopicPartition(self.cluster.topic, queue)
            async for batch in self._records(tp, from_offset, await self._high(tp)):
                for record in batch:
                    for name, value in record.headers:
                        letter_id = value.decode() if name == H_REPLAY_OF and value else ""
                        if started.get(letter_id, (-1, 0))[0] == queue:
                            found.setdefault(letter_id, SequenceToken(queue, record.offset))
        return found
