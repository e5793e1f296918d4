"""The Kafka queue adapter: one topic, partition ``i`` is queue ``i``.

Producer side: every message goes to the partition the hash ring chose (explicit
partition), with key = stream key and Conveyor's metadata in headers (see "Wire
format" in docs/kafka.md), so kcat or any Kafka client can publish.

Consumer side: one :class:`KafkaReceiver` per owned partition, manually assigned (or,
under the ``kafka-group`` balancer, read through the group's consumer). It commits
the *watermark* — the offset below which everything is done — never past an
unfinished message, and records the offsets done above it (see
:mod:`conveyor.adapters.kafka.offsets`) in the commit metadata. Brokers that drop
commit metadata (tansu) are covered by a hand-off record written on a graceful
drain (:mod:`conveyor.adapters.kafka.handoff`). A new owner starts at the watermark
and skips the recorded offsets, so a hand-off replays only what was really unfinished.

Connections, error translation and outage back-off live in
:mod:`conveyor.adapters.kafka.connection`; rewinding in :mod:`conveyor.adapters.kafka.rewind`.

Lag is ``high watermark - committed``, the high watermark taken from fetch
responses (tansu's ListOffsets(latest) is wrong for multi-record batches).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka import errors as kerrors
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.structs import OffsetAndMetadata

from conveyor.adapters.kafka import groups as kafka_groups
from conveyor.adapters.kafka import offsets as kafka_offsets
from conveyor.adapters.kafka import rewind as kafka_rewind
from conveyor.adapters.kafka.connection import (
    CLIENT_ERRORS,
    broker_error,
    client_options,
    fetch_committed,
    first_answer,
    kafka_errors,
    outage_log,
    retrying,
    start_client,
    start_producer,
)
from conveyor.adapters.kafka.handoff import FETCH_LOOKAHEAD, HandoffLog
from conveyor.adapters.kafka.letters import KafkaLetters
from conveyor.adapters.kafka.offsets import DoneOffsets
from conveyor.platform import letters as layout
from conveyor.platform.adapter import QueueAdapter, QueueReceiver, open_receivers
from conveyor.platform.config import Config, KafkaConfig
from conveyor.platform.errors import (
    BrokerConnectionError,
    BrokerError,
    ConfigError,
    DecodeError,
    MessageTooLargeError,
    PublishUncertain,
)
from conveyor.platform.groups import GroupInfo
from conveyor.platform.ids import SequenceToken, StreamId
from conveyor.platform.letters import Replay, StoredLetter
from conveyor.platform.message import (
    CONTENT_BYTES,
    CONTENT_JSON,
    H_ATTEMPT,
    H_CONTENT_TYPE,
    H_ENQUEUED_MS,
    H_ID,
    H_KEY,
    H_NAMESPACE,
    DeadLetter,
    Message,
    Undecodable,
)
from conveyor.platform.partial_publish import publish_failure
from conveyor.platform.tasks import cancel_and_wait

log = logging.getLogger("conveyor.kafka")

_decode_legacy_letter = msgspec.json.Decoder(DeadLetter).decode


TS_MAX = 2**63 - 1
ATTEMPT_MAX = 2**31 - 1


def _wire_number(raw: bytes | None, field: str, limit: int) -> int | None:
    """A number header: ASCII digits, at most ``limit``; None when absent or empty."""
    if not raw:
        return None
    if not raw.isdigit() or len(raw) > 19 or int(raw) > limit:
        raise DecodeError(f"{field} is not a whole number from 0 to {limit}: {raw[:40]!r}")
    return int(raw)


def record_to_message(record: Any, queue: int, default_ns: str) -> Message:
    """A fetched record as a :class:`Message`; foreign records get the defaults.

    Raises on metadata that cannot be read (not UTF-8, a malformed number): see
    :func:`decode_record`, which isolates such a record instead.
    """
    ns = default_ns
    key = record.key.decode() if record.key is not None else ""
    msg_id = ""
    ctype = CONTENT_JSON
    attempt = 0
    ts = record.timestamp
    headers: dict[str, str] = {}
    for name, raw in record.headers:
        if name == H_NAMESPACE:  # the headers Conveyor writes, most frequent first
            ns = raw.decode() if raw else default_ns
        elif name == H_ID:
            msg_id = raw.decode() if raw is not None else ""
        elif name == H_CONTENT_TYPE:
            ctype = raw.decode() if raw else CONTENT_JSON
        elif name == H_ENQUEUED_MS:
            if raw and raw.isdigit() and len(raw) < 19:  # fewer than 19 digits: < TS_MAX
                ts = int(raw)
            else:
                ts = _wire_number(raw, H_ENQUEUED_MS, TS_MAX) or ts
        elif name == H_ATTEMPT:
            attempt = _wire_number(raw, H_ATTEMPT, ATTEMPT_MAX) or 0
        elif name == H_KEY:  # the record key wins; a header that does not read is bad
            value = raw.decode() if raw is not None else ""
            key = key or value
        else:
            headers[name] = raw.decode() if raw is not None else ""
    return Message(
        msg_id or f"{record.topic}-{record.partition}-{record.offset}",
        StreamId(ns, key),
        record.value if record.value is not None else b"",
        headers,
        ctype,
        attempt,
        ts,
        SequenceToken(queue, record.offset),
    )


def decode_record(record: Any, queue: int, default_ns: str) -> Message:
    """:func:`record_to_message`, or an :class:`Undecodable` keeping the record's bytes.

    One record that cannot be read never fails the batch fetched with it: its
    neighbours flow on, and it goes to the dead-letter store with the reason.
    """
    try:
        return record_to_message(record, queue, default_ns)
    except Exception as exc:  # malformed metadata, whatever the failure: isolate it
        return Undecodable(
            id=f"{record.topic}-{record.partition}-{record.offset}",
            stream=StreamId("", ""),
            body=record.value if record.value is not None else b"",
            content_type=CONTENT_BYTES,
            enqueued_at_ms=record.timestamp if isinstance(record.timestamp, int) else 0,
            token=SequenceToken(queue, record.offset),
            reason=f"{type(exc).__name__}: {exc}",
            raw_fields=tuple((name.encode(), raw) for name, raw in record.headers),
            raw_key=record.key,
        )


def message_headers(msg: Message) -> list[tuple[str, bytes]]:
    headers = [
        (H_NAMESPACE, msg.stream.namespace.encode()),
        (H_ID, msg.id.encode()),
        (H_CONTENT_TYPE, msg.content_type.encode()),
        (H_ENQUEUED_MS, str(msg.enqueued_at_ms).encode()),
    ]
    if msg.attempt:
        headers.append((H_ATTEMPT, str(msg.attempt).encode()))
    headers.extend((k, v.encode()) for k, v in msg.headers.items())
    return headers


_FRAMING = 61 + 21
"""A record batch's header and aiokafka's bound on a record's own overhead: what its
size check (``estimate_size_in_bytes``) adds to the key, value and headers."""


class KafkaReceiver(QueueReceiver):
    """One partition for one group. Not shared between tasks (the agent is its only user).

    With ``shared`` set (``kafka-group`` balancer) records are read and offsets committed
    through the group's consumer, under its generation; otherwise the receiver has a
    consumer of its own, manually assigned to its partition.
    """

    records_done_out_of_order = True

    def __init__(
        self, adapter: KafkaAdapter, queue: int, group: str, shared: AIOKafkaConsumer | None
    ) -> None:
        self._adapter = adapter
        self._queue = queue
        self._group = group
        self._tp = TopicPartition(adapter.topic, queue)
        self._shared = shared
        self._consumer: AIOKafkaConsumer | None = shared
        self._started = False
        self._offsets = DoneOffsets(0)
        self._skip: set[int] = set()
        self._handed_over = False
        self._default_ns = adapter.config.default_namespace
        self._closed = False
        # Deliveries (see kafka_handoff): offsets up to this one were handed out by a
        # previous owner that did not finish them; handler starts of redelivered ones;
        # the ``fetched`` mark our last record declared.
        self._redelivered_through = -1
        self._starts: dict[int, int] = {}
        self._fetched_mark = -1
        self._reached = 0
        """The offset after the last record fetched: a partition that now ends before it
        (or before the watermark) was deleted and re-created, or truncated."""

    # -- lifecycle ---------------------------------------------------------------------
    async def initialize(self) -> None:
        """Position at the committed watermark; a broker that is down is waited for on pull."""
        try:
            await self._start(None)
        except BrokerError as exc:
            log.warning("queue %d: %s; will retry", self._queue, exc)

    async def _start(self, wait_s: float | None) -> bool:
        """Position the consumer once the topic is ready; False if it is not yet.

        ``wait_s`` bounds the wait for the adapter's shared topic preparation (which
        backs off while the broker is down); ``None`` waits for its first answer only.
        """
        if self._started:
            return True
        adapter = self._adapter
        if not await adapter.wait_topic_ready(wait_s):
            return False
        try:
            with kafka_errors(f"starting the receiver of queue {self._queue}"):
                if self._consumer is None:
                    consumer = adapter.new_consumer(self._group)
                    await consumer.start()
                    consumer.assign([self._tp])
                    self._consumer = consumer
                consumer = self._consumer
                committed = await fetch_committed(consumer, self._tp)
                if committed is None:
                    start = await adapter.new_group_offset(consumer, self._tp, commit=True)
                    meta = ""
                else:
                    start, meta = committed
                # What the previous owners left (kafka_handoff): done offsets when the
                # broker drops commit metadata, and their unfinished deliveries.
                state = await adapter.handoffs.read_deliveries(self._group, self._queue, start)
                done = kafka_offsets.decode(start, meta) or state.done
                self._redelivered_through = state.redelivered_through
                self._starts = dict(state.starts)
                self._fetched_mark = state.redelivered_through
                self._offsets = DoneOffsets(start, done)
                self._skip = set(self._offsets.done)
                consumer.seek(self._tp, self._offsets.watermark)
        except Exception:  # a half-started consumer of our own is not kept
            if self._shared is None and self._consumer is not None:
                with contextlib.suppress(Exception):
                    await self._consumer.stop()
                self._consumer = None
            raise
        self._started = True
        if self._skip:
            log.info("queue %d: resuming at %d, skipping %d offset(s) done by the last owner",
                     self._queue, self._offsets.watermark, len(self._skip))
        return True

    async def get_messages(self, max_count: int, timeout_s: float = 0.0) -> list[Message]:
        if self._adapter.topic_changed is not None:
            return []  # its offsets mean nothing now: read nothing more (see topic_gone)
        if not self._started and not await self._start(timeout_s):
            return []  # the broker is down: the adapter backs off and logs the outage
        consumer = self._consumer
        assert consumer is not None
        tp = self._tp
        try:
            with kafka_errors(f"fetching queue {self._queue}"):
                if self._shared is None:
                    batches = await consumer.getmany(
                        tp, timeout_ms=int(timeout_s * 1000), max_records=max_count
                    )
                else:
                    # A group re-balance parks getmany until the new assignment; bound it
                    # so a draining agent's pull returns.
                    async with asyncio.timeout(timeout_s + 1.0):
                        batches = await consumer.getmany(
                            tp, timeout_ms=int(timeout_s * 1000), max_records=max_count
                        )
        except TimeoutError:
            return []
        records = batches.get(tp)
        if not records:
            high = consumer.highwater(tp)
            reached = max(self._reached, self._offsets.watermark)
            if high is not None and high < reached:
                self._adapter.topic_gone(self._queue, high, reached)
            return []
        self._reached = records[-1].offset + 1
        queue, ns = self._queue, self._default_ns
        skip = self._skip
        if skip:
            records = [r for r in records if r.offset not in skip]
            skip.difference_update(r.offset for r in batches[tp])
        if not records:
            return []
        try:
            out = [record_to_message(r, queue, ns) for r in records]
        except Exception:  # a malformed record: decode one by one, isolating it
            out = [decode_record(r, queue, ns) for r in records]
        last = records[-1].offset
        if last > self._fetched_mark:
            try:  # declared before any handler starts one of them (kafka_handoff)
                await self._record(last + FETCH_LOOKAHEAD)
            except BaseException:
                with contextlib.suppress(Exception):  # not handed out: read them again
                    consumer.seek(tp, records[0].offset)
                raise
        if self._starts or self._redelivered_through >= records[0].offset:
            out = self._with_deliveries(out)
        return out

    def _with_deliveries(self, out: list[Message]) -> list[Message]:
        """Messages a previous owner handed out without finishing, marked redelivered
        (``deliveries`` = its counted handler starts + 1, at least 2)."""
        through, starts = self._redelivered_through, self._starts
        replace = msgspec.structs.replace
        marked = []
        for m in out:
            offset = m.token.major if m.token is not None else -1
            if offset <= through or offset in starts:
                m = replace(m, deliveries=max(2, starts.get(offset, 0) + 1))
            marked.append(m)
        return marked

    async def _record(self, fetched: int) -> None:
        """Write this partition's record (kafka_handoff): done offsets, the ``fetched``
        mark (never below a previous owner's unfinished range) and the start counts."""
        offsets = self._offsets
        fetched = max(fetched, self._redelivered_through) if fetched >= 0 else -1
        self._starts = {o: n for o, n in self._starts.items() if o >= offsets.watermark}
        with kafka_errors(f"recording the deliveries of queue {self._queue}"):
            await self._adapter.handoffs.write(self._group, self._queue, offsets.watermark,
                                               offsets.metadata(), fetched, self._starts)
        self._fetched_mark = fetched

    async def count_start(self, msg: Message) -> int:
        assert msg.token is not None
        offset = msg.token.major
        self._starts[offset] = starts = self._starts.get(offset, 0) + 1
        await self._record(self._fetched_mark)
        return starts

    async def handed_back(self, tokens: Sequence[SequenceToken], *,
                          all_unfinished: bool = False) -> None:
        """A graceful drain: with nothing started left unfinished, no offset of this
        owner counts as redelivered (the start counts stay)."""
        if all_unfinished and self._started and (self._fetched_mark >= 0 or self._starts):
            self._redelivered_through = -1
            await self._record(-1)

    def message_done_out_of_order(self, token: SequenceToken) -> None:
        self._offsets.mark_done(token.major)

    async def messages_delivered(self, tokens: Sequence[SequenceToken]) -> None:
        """Commit the watermark (with the done offsets above it as metadata).

        ``tokens`` is the agent's contiguous done prefix, in queue order. An empty call
        (on drain) also leaves a hand-off record when done offsets remain above the
        watermark, for brokers that drop commit metadata.
        """
        offsets = self._offsets
        if tokens:
            offsets.acknowledge_through(tokens[-1].major)
        elif not offsets.done:
            return
        if not self._started or self._adapter.topic_changed is not None:
            return  # an old watermark committed on a re-created topic would skip records
        meta = offsets.metadata()
        watermark = offsets.watermark
        consumer = self._consumer
        assert consumer is not None
        with kafka_errors(f"committing queue {self._queue}"):
            try:
                if not tokens:
                    await self._adapter.handoffs.write(
                        self._group, self._queue, watermark, meta,
                        max(self._fetched_mark, self._redelivered_through), self._starts)
                    self._handed_over = True
                await consumer.commit({self._tp: OffsetAndMetadata(watermark, meta)})
            except kerrors.CommitFailedError as exc:
                # The group re-balanced and the partition may be someone else's now: our
                # unacknowledged messages will be redelivered there. Nothing to retry.
                log.warning("queue %d: commit refused (%s); the new owner resumes at its "
                            "last committed offset", self._queue, exc)
            except kerrors.IllegalStateError as exc:
                log.warning("queue %d: partition no longer assigned (%s)", self._queue, exc)

    async def lag(self) -> int:
        consumer = self._consumer
        high = consumer.highwater(self._tp) if consumer is not None else None
        if high is None:
            return await self._adapter.lag(self._queue, self._group)
        return max(0, int(high) - self._offsets.watermark - len(self._offsets.done))

    async def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._shared is None and self._consumer is not None:
            with contextlib.suppress(Exception):
                await self._consumer.stop()
        self._consumer = None

    def holder(self, queue: int, group: str) -> str | None:
        """Who this receiver is while it is open on ``queue`` for ``group`` (owners())."""
        if self._closed or self._queue != queue or self._group != group:
            return None
        return "a receiver in this process"


class KafkaAdapter(QueueAdapter):
    name = "kafka"
    coalesce_publishes = False  # the producer batches concurrent sends itself (linger_ms)

    def __init__(self, config: KafkaConfig, total_queues: int, *,
                 new_group_start: str = "earliest") -> None:
        self.config = config
        self.new_group_start = new_group_start
        """``[queues] new_group_start``: where a group with no committed offset starts."""
        self.topic = config.topic
        self.dlq_topic = f"{config.topic}.conveyor-dlq"
        self._dlq_ready = False
        self._default_ns = config.default_namespace
        self.total_queues = total_queues
        self._options = client_options(config)
        self._producer: AIOKafkaProducer | None = None
        self.idempotent = False
        """Whether the producer is idempotent (known once it has started)."""
        self._lock = asyncio.Lock()
        self._topic_ready = False
        self._group_consumers: dict[str, AIOKafkaConsumer] = {}
        self._probes: dict[str, AIOKafkaConsumer] = {}
        # Receivers handed out and not yet shut down (weakly: a dropped one stops counting).
        self._receivers: weakref.WeakSet[KafkaReceiver] = weakref.WeakSet()
        self.outage = outage_log(config.bootstrap)
        self.handoffs = HandoffLog(self)
        self.letters = KafkaLetters(self, lambda record, app: letter_from_record(
            record, app, config.topic, config.default_namespace))
        self._preparing: asyncio.Task[None] | None = None
        self._first_answer_awaited = False
        self.topic_changed: BrokerError | None = None
        """Set once a receiver finds the topic deleted or re-created under it: from then
        on no receiver reads or commits (see :meth:`topic_gone`)."""
        self.on_topic_changed: Callable[[BrokerError], None] | None = None
        """Told :attr:`topic_changed` (the kafka-group balancer fails the daemon)."""

    # -- connections -------------------------------------------------------------------
    def new_consumer(self, group: str | None, **extra: Any) -> AIOKafkaConsumer:
        opts: dict[str, Any] = {
            "group_id": group,
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest",
            "fetch_max_wait_ms": self.config.fetch_max_wait_ms,
            "max_poll_records": 1000,
            **self._options,
            **extra,
        }
        return AIOKafkaConsumer(**opts)

    def attach_group_consumer(self, group: str, consumer: AIOKafkaConsumer | None) -> None:
        """Receivers of ``group`` read and commit through this consumer (kafka-group)."""
        if consumer is None:
            self._group_consumers.pop(group, None)
        else:
            self._group_consumers[group] = consumer

    async def producer(self) -> AIOKafkaProducer:
        if self._producer is not None:
            return self._producer
        async with self._lock:
            if self._producer is None:
                await self.ensure_topic()
                producer = await start_producer(self.config, self._options)
                self.idempotent = producer._txn_manager is not None
                self._producer = producer
        return self._producer

    def topic_gone(self, queue: int, end: int, reached: int) -> None:
        """Partition ``queue`` ends at ``end``, before the offset ``reached`` this process
        had already read or acknowledged: the topic was deleted (and maybe re-created)
        under it. The group's committed offsets went with the old topic, so a worker
        started now reads the new one from its start; this one reads and commits nothing
        more, and says so once (through :attr:`on_topic_changed` if set, else a log)."""
        if self.topic_changed is not None:
            return
        self.topic_changed = BrokerError(
            f"kafka topic {self.topic!r} was deleted or re-created under this worker "
            f"(partition {queue} ends at offset {end}, before offset {reached} it had "
            "reached): nothing more is read or committed; restart the workers, they read "
            "the new topic from its start")
        if self.on_topic_changed is not None:
            self.on_topic_changed(self.topic_changed)
        else:
            log.error("%s", self.topic_changed)

    async def ensure_topic(self) -> None:
        """Create the topic with ``total_queues`` partitions if absent; check it if present."""
        if self._topic_ready:
            return
        await self.create_topics({self.topic: self.total_queues})
        self._topic_ready = True

    async def wait_topic_ready(self, timeout_s: float | None) -> bool:
        """Whether the topic is ready, after waiting at most ``timeout_s`` for it.

        One task per adapter prepares the topic, backing off while the broker is down
        (:func:`~conveyor.adapters.kafka.connection.retrying`), however many receivers
        wait. ``None`` waits for a first answer
        (:func:`~conveyor.adapters.kafka.connection.first_answer`), once per adapter; later
        calls with ``None`` do not wait.
        A non-retriable failure (a topic with too few partitions) is raised.
        """
        if self._topic_ready:
            return True
        task = self._preparing
        if task is None:
            task = self._preparing = asyncio.create_task(
                retrying(self.outage, "preparing the topic", self.ensure_topic),
                name="kafka-prepare-topic",
            )
        if not task.done():
            if timeout_s is None:
                if not self._first_answer_awaited:  # one start-up wait, not one per queue
                    self._first_answer_awaited = True
                    await first_answer(task, self.outage)
            elif timeout_s > 0:
                await asyncio.wait([task], timeout=timeout_s)
        if not task.done():
            return False
        task.result()
        return True

    async def create_topics(
        self, wanted: dict[str, int], topic_config: dict[str, str] | None = None
    ) -> None:
        """Create the topics of ``wanted`` (name: partitions) that are absent."""
        admin = AIOKafkaAdminClient(**self._options)
        try:
            with kafka_errors("preparing topics"):
                await admin.start()
                existing = set(await admin.list_topics())
                missing = {t: n for t, n in wanted.items() if t not in existing}
                if missing and self.config.create_topic:
                    rf = self.config.replication_factor
                    topics = [NewTopic(t, n, rf, topic_configs=topic_config)
                              for t, n in missing.items()]
                    response = await admin.create_topics(topics)
                    for topic, code, *_ in response.topic_errors:
                        if code not in (0, 36):  # 36: created meanwhile by another process
                            raise BrokerError(
                                f"kafka: creating topic {topic!r} failed (error {code})"
                            )
                elif missing:
                    raise ConfigError(f"kafka topic(s) {sorted(missing)} do not exist and "
                                      "$.kafka.create_topic is false")
                if self.topic in wanted and self.topic in existing:
                    described = await admin.describe_topics([self.topic])
                    have = len(described[0]["partitions"])
                    if have < self.total_queues:
                        raise ConfigError(
                            f"kafka topic {self.topic!r} has {have} partitions but "
                            f"$.queues.total is {self.total_queues}; add partitions or lower it"
                        )
                    if have > self.total_queues:  # records there would never be read
                        raise ConfigError(
                            f"kafka topic {self.topic!r} has {have} partitions but "
                            f"$.queues.total is {self.total_queues}: partitions "
                            f"{self.total_queues}-{have - 1} would never be read; set "
                            f"$.queues.total = {have}"
                        )
        finally:
            with contextlib.suppress(Exception):
                await admin.close()

    async def close(self) -> None:
        if self._preparing is not None and not self._preparing.done():
            with contextlib.suppress(Exception):
                await cancel_and_wait(self._preparing)
        for consumer in [*self._probes.values()]:
            with contextlib.suppress(Exception):
                await consumer.stop()
        self._probes.clear()
        with contextlib.suppress(Exception):
            await self.letters.close()
        if self._producer is not None:
            with contextlib.suppress(Exception):
                await self._producer.stop()
            self._producer = None

    # -- producing ---------------------------------------------------------------------
    async def enqueue(self, queue: int, messages: Sequence[Message]) -> list[SequenceToken]:
        """Append in order: record batches built here (``create_batch``), one send each.

        A record over ``$.kafka.max_request_size`` refuses the call before anything is
        sent. The producer retries a send after a cut connection by itself; idempotent
        (see ``$.kafka.idempotence``), the broker writes a retried batch once. Each
        record batch is stored whole or not at all: when some were and others not (or
        may not have been), :class:`PartialPublishError` says which; when nothing is
        known stored and some may be, :class:`PublishUncertain`.
        """
        if not messages:
            return []
        producer = await self.producer()  # unreachable here: nothing was sent
        what = f"publishing {len(messages)} messages to queue {queue}"
        if len(messages) == 1:  # into the partition's open batch, with concurrent sends
            return [await self._send_one(producer, queue, messages[0], what)]
        batches = self._batches(producer, messages)  # all built, so none is sent if one
        sent: list[tuple[Sequence[Message], asyncio.Future[Any]]] = []  # record is too big
        unsent: BrokerError | None = None
        try:
            with kafka_errors(what):
                for msgs, batch in batches:
                    sent.append((msgs, await producer.send_batch(batch, self.topic,
                                                                 partition=queue)))
        except BrokerError as exc:
            if not sent:  # failed before the first batch was handed over: none was sent
                raise
            unsent = exc
        results = await asyncio.gather(*(future for _, future in sent), return_exceptions=True)
        return self._stored(queue, messages, sent, results, unsent, what)

    def _batches(self, producer: AIOKafkaProducer, messages: Sequence[Message]
                 ) -> list[tuple[Sequence[Message], Any]]:
        """``messages`` as record batches (with the messages each holds); a record over
        ``$.kafka.max_request_size`` refuses them all (aiokafka's ``send`` would refuse
        it; ``send_batch`` does not check)."""
        limit = self.config.max_request_size
        batches: list[tuple[Sequence[Message], Any]] = []
        start, batch = 0, producer.create_batch()
        for i, msg in enumerate(messages):
            key, headers = msg.stream.key.encode(), message_headers(msg)
            ts = msg.enqueued_at_ms or None
            meta = batch.append(key=key, value=msg.body, timestamp=ts, headers=headers)
            if meta is None:  # full: start the next (a batch always takes its first record)
                batches.append((messages[start:i], batch))
                start, batch = i, producer.create_batch()
                meta = batch.append(key=key, value=msg.body, timestamp=ts, headers=headers)
            if meta.size + _FRAMING > limit:  # near it: as aiokafka's send() counts
                size = DefaultRecordBatchBuilder.estimate_size_in_bytes(key, msg.body, headers)
                if size > limit:
                    raise self._too_large(msg, size)
        batches.append((messages[start:], batch))
        return batches

    def _too_large(self, msg: Message, size: int) -> MessageTooLargeError:
        return MessageTooLargeError(
            f"kafka: message {msg.id} to stream {msg.stream.namespace}/{msg.stream.key} "
            f"is {size} bytes as a record, larger than $.kafka.max_request_size "
            f"({self.config.max_request_size}); nothing was sent: raise it together with "
            "the broker's message.max.bytes, or send less")

    def _stored(self, queue: int, messages: Sequence[Message],
                sent: list[tuple[Sequence[Message], asyncio.Future[Any]]],
                results: list[Any], unsent: BrokerError | None,
                what: str) -> list[SequenceToken]:
        """The tokens of a multi-batch send, or the error saying which batches failed."""
        tokens: list[SequenceToken] = []
        published: dict[str, SequenceToken] = {}
        failures: list[tuple[list[str], BaseException]] = []
        for (msgs, _), meta in zip(sent, results, strict=True):
            if isinstance(meta, BaseException):
                if not isinstance(meta, CLIENT_ERRORS):
                    raise meta
                error = broker_error(what, meta)
                if isinstance(error, BrokerConnectionError):
                    error = PublishUncertain(
                        f"{error}: the messages may or may not have been written; their "
                        "ids are in .message_ids", tuple(m.id for m in msgs))
                failures.append(([m.id for m in msgs], error))
                continue
            batch_tokens = [SequenceToken(queue, meta.offset + i) for i in range(len(msgs))]
            published.update(zip((m.id for m in msgs), batch_tokens, strict=True))
            tokens += batch_tokens
        if unsent is not None:
            handed = sum(len(msgs) for msgs, _ in sent)
            failures.append(([m.id for m in messages[handed:]], unsent))
        if failures:
            raise publish_failure(f"kafka: {what}", [m.id for m in messages], published,
                                  failures)
        return tokens

    async def _send_one(self, producer: AIOKafkaProducer, queue: int, msg: Message,
                        what: str) -> SequenceToken:
        """One record through ``send``: the producer appends it to the partition's open
        batch, so concurrent single publishes share a request (Client.publish)."""
        headers = message_headers(msg)
        try:
            with kafka_errors(what):
                delivery = await producer.send(
                    self.topic, msg.body, key=msg.stream.key.encode(), partition=queue,
                    headers=headers, timestamp_ms=msg.enqueued_at_ms or None,
                )
        except BrokerError as exc:  # aiokafka checks the size before sending
            if not isinstance(exc.__cause__, kerrors.MessageSizeTooLargeError):
                raise
            raise self._too_large(msg, DefaultRecordBatchBuilder.estimate_size_in_bytes(
                msg.stream.key.encode(), msg.body, headers)) from None
        try:
            with kafka_errors(what):
                meta = await delivery
        except BrokerConnectionError as exc:
            raise PublishUncertain(
                f"{exc}: the message may or may not have been written; its id is in "
                ".message_ids", (msg.id,)
            ) from exc
        return SequenceToken(queue, meta.offset)

    # -- consuming ---------------------------------------------------------------------
    def create_receiver(self, queue: int, group: str) -> QueueReceiver:
        receiver = KafkaReceiver(self, queue, group, self._group_consumers.get(group))
        self._receivers.add(receiver)
        return receiver

    async def probe(self, group: str) -> AIOKafkaConsumer:
        """A consumer of ``group`` assigned every partition, for lag and rewind (no reads)."""
        consumer = self._probes.get(group)
        if consumer is None:
            await self.ensure_topic()
            consumer = self.new_consumer(group)
            await start_client(consumer, "connecting a consumer")
            consumer.assign([TopicPartition(self.topic, q) for q in range(self.total_queues)])
            self._probes[group] = consumer
        return consumer

    async def new_group_offset(self, consumer: AIOKafkaConsumer, tp: TopicPartition, *,
                               commit: bool = False) -> int:
        """Where ``consumer``'s group, which committed nothing on ``tp``, starts: the
        partition's first offset, or with ``new_group_start = "latest"`` its high
        watermark — then committed with ``commit``, so that a daemon stopped before its
        first acknowledgement does not move the start to a later end."""
        start = int((await consumer.beginning_offsets([tp]))[tp])
        if self.new_group_start != "latest":
            return start
        start = await self.high_watermark(consumer, tp, start)
        if commit:
            try:
                await consumer.commit({tp: OffsetAndMetadata(start, "")})
            except (kerrors.CommitFailedError, kerrors.IllegalStateError) as exc:
                log.warning("%s: could not record the new group's start %d (%s)", tp, start,
                            exc)
        return start

    async def high_watermark(self, consumer: AIOKafkaConsumer, tp: TopicPartition,
                             from_offset: int, timeout_s: float = 5.0) -> int:
        """The partition's high watermark, as a fetch response reports it."""
        consumer.seek(tp, from_offset)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            await consumer.getmany(tp, timeout_ms=200, max_records=1)
            high = consumer.highwater(tp)
            if high is not None:
                return int(high)
            if loop.time() > deadline:
                raise BrokerConnectionError(f"kafka: no fetch response for {tp} in {timeout_s}s")

    async def lag(self, queue: int, group: str) -> int:
        with kafka_errors(f"reading the lag of queue {queue}"):
            consumer = await self.probe(group)
            tp = TopicPartition(self.topic, queue)
            committed = await fetch_committed(consumer, tp)
            if committed is None:
                start = await self.new_group_offset(consumer, tp)
                done = 0
            else:
                start = int(committed[0])
                done = len(kafka_offsets.decode(start, committed[1]))
            high = await self.high_watermark(consumer, tp, start)
        return max(0, high - start - done)

    async def rewind(self, queue: int, group: str, to: SequenceToken | float) -> None:
        await kafka_rewind.rewind(self, queue, group, to)

    async def forward_gap(self, queue: int, group: str, to: SequenceToken | float) -> int:
        return await kafka_rewind.forward_gap(self, queue, group, to)

    async def owners(self, queues: Sequence[int], group: str) -> dict[int, str]:
        """This adapter's open receivers, then the group's members that the broker says
        hold the queues (see :func:`conveyor.adapters.kafka.rewind.owners`)."""
        return {**open_receivers(self._receivers, queues, group),
                **await kafka_rewind.owners(self, queues, group)}

    # -- dead letters ------------------------------------------------------------------
    async def dead_letter(self, group: str, letters: Sequence[DeadLetter]) -> int:
        """One record per letter on partition 0 of ``<topic>.conveyor-dlq`` (see
        conveyor.platform.letters), created with ``retention.ms = -1``: no bound here,
        the topic's retention is the broker's business (0 evicted, always)."""
        producer = await self.producer()
        if not self._dlq_ready:
            await self.create_topics({self.dlq_topic: 1}, {"retention.ms": "-1"})
            self._dlq_ready = True
        try:
            futures = [
                await producer.send(self.dlq_topic, value, key=key, partition=0, headers=headers)
                for key, value, headers in (letter_record(letter, group) for letter in letters)
            ]
            await asyncio.gather(*futures)
        except (kerrors.KafkaError, OSError) as exc:
            raise broker_error("writing dead letters", exc) from exc
        return 0

    # -- dead letters, for operators (see conveyor.adapters.kafka.letters) --------------
    async def list_dead_letters(self, group: str, limit: int = 100, *,
                                after: str | None = None) -> list[StoredLetter]:
        return await self.letters.list_letters(group, limit, after)

    async def find_dead_letter(self, group: str, letter_id: str) -> StoredLetter | None:
        return await self.letters.find(group, letter_id)

    async def count_dead_letters(self, group: str) -> int:
        return await self.letters.count(group)

    async def delete_dead_letters(self, group: str, ids: Sequence[str]) -> int:
        """Recorded as purged in ``<topic>.conveyor-dlq-ops``: Kafka keeps the records."""
        return await self.letters.delete(group, ids)

    async def replay_dead_letters(self, group: str, replays: Sequence[Replay]
                                  ) -> list[SequenceToken | None]:
        """Recorded in ``<topic>.conveyor-dlq-ops`` before and after the publish, so a
        re-run finds a publish that was not recorded (conveyor.adapters.kafka.letters)."""
        return await self.letters.replay(group, replays)

    # -- consumer groups, for operators (see conveyor.adapters.kafka.groups) -----------
    retention_follows_groups = False  # Kafka keeps records by time or size

    async def groups(self, queues: Sequence[int]) -> list[GroupInfo]:
        return await kafka_groups.groups(self, queues)

    async def has_group(self, queues: Sequence[int], group: str) -> bool:
        return await kafka_groups.has_group(self, queues, group)

    async def delete_group(self, group: str, queues: Sequence[int], *,
                           dead_letters: bool = False) -> list[int]:
        return await kafka_groups.delete_group(self, group, queues, dead_letters=dead_letters)


def letter_record(letter: DeadLetter, app: str) -> tuple[bytes | None, bytes, list[Any]]:
    """A dead letter as (key, value, headers): ``cv-dl-*`` headers first, then the
    message's own (an undecodable one's byte for byte); see conveyor.platform.letters."""
    headers: list[tuple[str, bytes | None]] = [
        (name, value.encode()) for name, value in layout.meta_pairs(letter, app)
    ]
    msg = letter.message
    if isinstance(msg, Undecodable) and letter.form == "full":
        headers += [(name.decode(), value) for name, value in msg.raw_fields]
        return msg.raw_key, msg.body, headers
    headers += message_headers(msg)
    return msg.stream.key.encode(), msg.body, headers


def letter_from_record(record: Any, app: str, topic: str, default_ns: str) -> DeadLetter | None:
    """A stored dead letter of ``app`` read back; None for another app's, or not a letter."""
    names = [name for name, _ in record.headers]
    if not layout.is_letter(names):  # stored by Conveyor 0.1: JSON, keyed by app
        if record.key == app.encode() and record.value:
            return _decode_legacy_letter(record.value)
        return None
    count = layout.meta_count(record.headers[0][1] or b"")
    values = [value or b"" for _, value in record.headers[:count]]
    if layout.app_of(values) != app:
        return None
    token_text = values[7].decode("utf-8", "replace")
    token = SequenceToken.parse(token_text) if token_text else SequenceToken(0, 0)
    original = SimpleNamespace(
        topic=topic, partition=token.queue, offset=token.major, key=record.key,
        value=record.value, timestamp=record.timestamp,
        headers=record.headers[count:],
    )
    return layout.letter_from_meta(values, decode_record(original, token.queue, default_ns))


def from_config(config: Config) -> KafkaAdapter:
    return KafkaAdapter(config.kafka, config.queues.total,
                        new_group_start=config.queues.new_group_start)
