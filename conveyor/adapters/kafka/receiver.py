"""The consumer side of one Kafka partition: :class:`KafkaReceiver`.

One receiver per owned partition, manually assigned (or, under the ``kafka-group``
balancer, read through the group's consumer). It commits the *watermark* — the offset
below which everything is done — never past an unfinished message, and records the
offsets done above it (:mod:`conveyor.adapters.kafka.offsets`) in the commit metadata.
Brokers that drop commit metadata (tansu) are covered by a hand-off record written on a
graceful drain (:mod:`conveyor.adapters.kafka.handoff`). A new owner starts at the
watermark and skips the recorded offsets, so a hand-off replays only what was really
unfinished. The same hand-off records carry the delivery counts the delivery limit needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka import errors as kerrors
from aiokafka.structs import OffsetAndMetadata

from conveyor.adapters.kafka import offsets as kafka_offsets
from conveyor.adapters.kafka.aiokafka_internals import (
    RecordConverter,
    fetch_committed,
    raw_records,
    record_converters,
)
from conveyor.adapters.kafka.cluster import KafkaCluster
from conveyor.adapters.kafka.codec import RecordDecoder
from conveyor.adapters.kafka.connection import kafka_errors
from conveyor.adapters.kafka.handoff import FETCH_LOOKAHEAD, HandoffLog
from conveyor.adapters.kafka.offsets import DoneOffsets
from conveyor.platform.adapter import QueueReceiver
from conveyor.platform.deadlines import StallTolerantTimeout
from conveyor.platform.errors import BrokerConnectionError, BrokerError
from conveyor.platform.ids import SequenceToken
from conveyor.platform.message import Message

log = logging.getLogger("conveyor.kafka")

COMMIT_WAIT_S = 10.0
"""How long a commit may take before the receiver asks whether the topic still exists
(:meth:`KafkaReceiver._commit_stuck`)."""
_LOG_START_WAIT_S = 5.0
"""How long a fetch that skipped offsets waits for the partition's log start."""


def _offset(msg: Message) -> int:
    """The offset of a message this receiver decoded (its token is always set)."""
    token = msg.token
    assert token is not None
    return token.major


def unhandled_deletion(expected: int, first_fetched: int, log_start: int) -> range:
    """The offsets a fetch that should have started at ``expected`` and started at
    ``first_fetched`` skipped because the broker deleted them: those below the
    partition's ``log_start`` (the rest are not records, see
    :meth:`KafkaReceiver._check_gap`). Empty where nothing was deleted."""
    return range(expected, min(log_start, first_fetched))


class KafkaReceiver(QueueReceiver):
    """One partition for one group. Not shared between tasks (the agent is its only user).

    With ``shared`` set (``kafka-group`` balancer) records are read and offsets committed
    through the group's consumer, under its generation; otherwise the receiver has a
    consumer of its own, manually assigned to its partition.

    Its attributes are one partition's position (consumer, done offsets, offsets to
    skip, the offset reached) and its delivery counts (redelivered range, handler
    starts, the ``fetched`` mark): both go into the one hand-off record it writes.
    """

    records_done_out_of_order = True

    def __init__(self, cluster: KafkaCluster, handoffs: HandoffLog, queue: int, group: str,
                 shared: AIOKafkaConsumer | None) -> None:
        self._cluster = cluster
        self._handoffs = handoffs
        self._queue = queue
        self._group = group
        self._tp = TopicPartition(cluster.topic, queue)
        self._shared = shared
        self._consumer: AIOKafkaConsumer | None = shared
        self._started = False
        self._offsets = DoneOffsets(0)
        self._noted: list[SequenceToken] = []
        """Tokens the agent reported done out of order, not yet in ``_offsets`` (see
        :meth:`_fold`): the agent's call is this list's ``append``, one C call a message."""
        # The agent calls this once a message finished above the watermark: as a C call.
        self.message_done_out_of_order = self._noted.append  # type: ignore[method-assign,assignment]
        self._skip: set[int] = set()
        self._decoder = RecordDecoder(queue, cluster.config.default_namespace, cluster.topic)
        self._converters: dict[TopicPartition, RecordConverter] = {}
        """The consumer's record converters, once this receiver's decoder is in them."""
        self._closed = False
        # Deliveries (see handoff.py): offsets up to this one were handed out by a
        # previous owner that did not finish them; handler starts of redelivered ones;
        # the ``fetched`` mark our last record declared.
        self._redelivered_through = -1
        self._starts: dict[int, int] = {}
        self._fetched_mark = -1
        self._reached = 0
        """The offset after the last record fetched (at the start: the watermark): a
        partition that now ends before it (or before the watermark) was deleted and
        re-created, or truncated; a fetch that starts past it skipped offsets
        (:meth:`_check_gap`)."""
        self._started_at = 0
        """Where this receiver started (the committed watermark): while ``_reached`` is
        still there it has read nothing, so a partition ending before it was not
        re-created under this worker (:meth:`_start_past_the_end`)."""
        self.records_lost = 0
        """Records of this partition the broker deleted before they were handled, found
        by this receiver (:meth:`_note_deleted`)."""

    # -- lifecycle ---------------------------------------------------------------------
    async def initialize(self) -> None:
        """Position at the committed watermark; a broker that is down is waited for on pull."""
        try:
            await self._start(None)
        except BrokerError as exc:
            log.warning("queue %d: %s; will retry", self._queue, exc)

    async def _start(self, wait_s: float | None) -> bool:
        """Position the consumer once the topic is ready; False if it is not yet.

        ``wait_s`` bounds the wait for the cluster's shared topic preparation (which
        backs off while the broker is down); ``None`` waits for its first answer only.
        """
        if self._started:
            return True
        cluster = self._cluster
        if not await cluster.wait_topic_ready(wait_s):
            return False
        try:
            with kafka_errors(f"starting the receiver of queue {self._queue}"):
                if self._consumer is None:
                    consumer = cluster.new_consumer(self._group, **raw_records())
                    await consumer.start()
                    consumer.assign([self._tp])
                    self._consumer = consumer
                consumer = self._consumer
                # Its records come decoded out of the fetch (aiokafka_internals).
                converters = record_converters(consumer)
                converters[self._tp] = self._decoder
                self._converters = converters
                committed = await fetch_committed(consumer, self._tp)
                if committed is None:
                    start = await cluster.new_group_offset(consumer, self._tp, commit=True)
                    meta = ""
                else:
                    start, meta = committed
                # What the previous owners left (handoff.py): done offsets when the
                # broker drops commit metadata, and their unfinished deliveries.
                state = await self._handoffs.read_deliveries(self._group, self._queue, start)
                done = kafka_offsets.decode(start, meta) or state.done
                self._redelivered_through = state.redelivered_through
                self._starts = dict(state.starts)
                self._fetched_mark = state.redelivered_through
                if committed is not None:  # (a new group starts at the log start)
                    log_start = int((await consumer.beginning_offsets([self._tp]))[self._tp])
                    if log_start > start:  # deleted before anyone handled them
                        self._note_deleted(start, log_start, log_start)
                        start = log_start
                self._offsets = DoneOffsets(start, done)
                self._skip = set(self._offsets.done)
                consumer.seek(self._tp, self._offsets.watermark)
                self._reached = self._started_at = self._offsets.watermark
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
        if self._cluster.topic_changed is not None:
            # Its offsets mean nothing now: read nothing more (see topic_gone) — after the
            # poll's wait, as a pull that finds nothing does: returned at once, the agent's
            # pull loop ran without letting the event loop run, until its ownership lapsed.
            await asyncio.sleep(timeout_s)
            return []
        if not self._started and not await self._start(timeout_s):
            return []  # the broker is down: the adapter backs off and logs the outage
        consumer = self._consumer
        assert consumer is not None
        tp = self._tp
        # A group re-balance parks getmany until the new assignment; it is bounded so a
        # draining agent's pull returns (empty). The bound is outside kafka_errors, which
        # would make its TimeoutError (an OSError) a broker error, and tolerant of a
        # stall: a handler that blocked the loop past it is no reason to call the pull
        # failed and back off (tests/integration/kafka/test_kafka_blocking_handlers.py).
        bound_s = None if self._shared is None else timeout_s + 1.0
        try:
            async with StallTolerantTimeout(bound_s):
                with kafka_errors(f"fetching queue {self._queue}"):
                    batches = await consumer.getmany(
                        tp, timeout_ms=int(timeout_s * 1000), max_records=max_count
                    )
        except TimeoutError:
            return []
        fetched = batches.get(tp)
        if not fetched:
            high = consumer.highwater(tp)
            reached = max(self._reached, self._offsets.watermark)
            if high is not None and high < reached:
                if self._reached == self._started_at:  # nothing read: a stale commit
                    await self._start_past_the_end(consumer, high)
                else:
                    self._cluster.topic_gone(self._queue, high, reached)
            return []
        if not isinstance(fetched[0], Message):  # fetched before the decoder was given
            fetched = self._decoder.decode(fetched)
        out: list[Message] = fetched
        first_fetched = _offset(out[0])
        if first_fetched < self._started_at and self._reached == self._started_at:
            # Nothing read yet, and the fetch came from below the start: the broker
            # answered the committed offset with OffsetOutOfRange (past the partition's
            # end: Apache Kafka does; tansu answers with no records, seen below) and
            # aiokafka reset the position to the log start without a word.
            high = consumer.highwater(tp)
            await self._start_past_the_end(consumer, first_fetched if high is None else high)
            return []  # fetched again from the log start, under the new watermark
        if first_fetched > self._reached:  # once a batch, not a record
            try:
                await self._check_gap(consumer, first_fetched)
            except BaseException:  # not handed out: fetched again, and checked again
                with contextlib.suppress(Exception):
                    consumer.seek(tp, first_fetched)
                raise
        self._reached = _offset(out[-1]) + 1
        skip = self._skip
        skipped: list[int] = []
        if skip:
            out = [m for m in out if _offset(m) not in skip]
            skipped = [o for m in fetched if (o := _offset(m)) in skip]
            skip.difference_update(skipped)
        if not out:
            return []
        first, last = _offset(out[0]), _offset(out[-1])
        if last > self._fetched_mark:
            try:  # declared before any handler starts one of them (handoff.py)
                await self._record(last + FETCH_LOOKAHEAD)
            except BaseException:
                # Not handed out: read them again from ``first`` — skipping again the
                # offsets the last owner finished among them, or they would run twice.
                skip.update(o for o in skipped if o > first)
                with contextlib.suppress(Exception):
                    consumer.seek(tp, first)
                raise
        if self._starts or self._redelivered_through >= first:
            out = self._with_deliveries(out)
        return out

    async def _start_past_the_end(self, consumer: AIOKafkaConsumer, high: int) -> None:
        """The offset this receiver started at, committed by its group, lies past the
        partition's end ``high``, and it has read nothing: that offset was committed on a
        topic since deleted and re-created (a commit under way then lands on the new one:
        commits name the topic, not its id), or on records the broker has since lost (a
        broker restarted without its data, as tansu's memory storage is). Every record of
        the partition now came after that commit, so it is read from its log start, as
        Kafka's ``auto.offset.reset=earliest`` would (the first acknowledgement replaces the
        stale commit). Said once (WARNING); not the topic re-created under this worker
        (:meth:`KafkaCluster.topic_gone`), which stops the worker."""
        stale = self._started_at
        with kafka_errors(f"reading the log start of queue {self._queue}"):
            log_start = int((await consumer.beginning_offsets([self._tp]))[self._tp])
        log.warning("queue %d (kafka topic %r partition %d): app %r's committed offset %d is "
                    "past the partition's end %d (the topic was deleted and re-created, or "
                    "the broker lost records, since it was committed): reading the "
                    "partition from its start, offset %d", self._queue, self._cluster.topic,
                    self._queue, self._group, stale, high, log_start)
        self._offsets = DoneOffsets(log_start)
        self._skip = set()
        self._redelivered_through, self._starts, self._fetched_mark = -1, {}, -1
        consumer.seek(self._tp, log_start)
        self._reached = self._started_at = log_start

    async def _check_gap(self, consumer: AIOKafkaConsumer, first_fetched: int) -> None:
        """The fetch skipped offsets ``_reached`` to ``first_fetched - 1``: those below
        the partition's log start were deleted by the broker (retention, DeleteRecords)
        before they were handled — aiokafka answered the fetch's OffsetOutOfRange by
        resetting to the log start (``auto_offset_reset='earliest'``) without a word.

        Offsets skipped *above* the log start are not records: transaction markers (a
        transactional producer of another client; Conveyor's producer is not
        transactional) or records compaction removed (the queues' topic compacted is
        refused at the start; compacted since, it is not looked at here). They are not
        reported. One ListOffsets per fetch that skips offsets — none on a topic that only
        Conveyor writes, one per transaction marker crossed on one a transactional
        producer writes — and no cost on a fetch that skips nothing (one comparison a
        batch, on the caller's side)."""
        expected = self._reached
        try:
            async with asyncio.timeout(_LOG_START_WAIT_S):
                with kafka_errors(f"reading the log start of queue {self._queue}"):
                    log_start = int((await consumer.beginning_offsets([self._tp]))[self._tp])
        except (BrokerError, TimeoutError) as exc:
            log.warning("queue %d: the fetch skipped offsets %d-%d and the partition's log "
                        "start could not be read (%s): records there may have been "
                        "deleted by the broker's retention before they were handled",
                        self._queue, expected, first_fetched - 1, exc or "no answer")
            return
        if deleted := unhandled_deletion(expected, first_fetched, log_start):
            self._note_deleted(deleted.start, deleted.stop, log_start)
        else:
            log.debug("queue %d: offsets %d-%d skipped by the fetch are above the log start "
                      "%d: transaction markers or compacted records, not deleted ones",
                      self._queue, expected, first_fetched - 1, log_start)

    def _note_deleted(self, first: int, end: int, log_start: int) -> None:
        """Offsets ``first`` to ``end - 1`` were deleted before this app handled them:
        said (WARNING) and counted (:attr:`records_lost`), never silent."""
        lost = end - first
        self.records_lost += lost
        log.warning("queue %d (kafka topic %r partition %d): %d record(s), offsets %d-%d, "
                    "were deleted by the broker (retention, or DeleteRecords) before app %r "
                    "handled them; the partition's log starts at offset %d", self._queue,
                    self._cluster.topic, self._queue, lost, first, end - 1, self._group,
                    log_start)

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
        """Write this partition's record (handoff.py): done offsets, the ``fetched``
        mark (never below a previous owner's unfinished range) and the start counts."""
        offsets = self._fold()
        fetched = max(fetched, self._redelivered_through) if fetched >= 0 else -1
        self._starts = {o: n for o, n in self._starts.items() if o >= offsets.watermark}
        with kafka_errors(f"recording the deliveries of queue {self._queue}"):
            await self._handoffs.write(self._group, self._queue, offsets.watermark,
                                       offsets.metadata(), fetched, self._starts)
        self._fetched_mark = fetched

    async def count_start(self, msg: Message) -> Message:
        assert msg.token is not None
        offset = msg.token.major
        self._starts[offset] = starts = self._starts.get(offset, 0) + 1
        await self._record(self._fetched_mark)
        return msgspec.structs.replace(msg, deliveries=starts + 1)

    async def handed_back(self, tokens: Sequence[SequenceToken], *,
                          all_unfinished: bool = False) -> None:
        """A graceful drain: with nothing started left unfinished, no offset of this
        owner counts as redelivered (the start counts stay)."""
        if all_unfinished and self._started and (self._fetched_mark >= 0 or self._starts):
            self._redelivered_through = -1
            await self._record(-1)

    def message_done_out_of_order(self, token: SequenceToken) -> None:
        """Each instance has ``self._noted.append`` instead (see ``__init__``)."""
        self._noted.append(token)

    def _fold(self, through: int = -1) -> DoneOffsets:
        """The done offsets with the reported tokens in: once per acknowledgement or
        record rather than once a message. Offsets below the watermark, or up to
        ``through`` (being acknowledged), are dropped."""
        offsets, noted = self._offsets, self._noted
        if noted:
            least = max(offsets.watermark, through + 1)
            offsets.done.update([o for t in noted if (o := t.major) >= least])
            noted.clear()
        return offsets

    async def acknowledge(self, tokens: Sequence[SequenceToken]) -> None:
        """Commit the watermark (with the done offsets above it as metadata).

        ``tokens`` is the agent's contiguous done prefix, in queue order. An empty call
        (on drain) also leaves a hand-off record when done offsets remain above the
        watermark, for brokers that drop commit metadata.
        """
        if tokens:
            through = tokens[-1].major
            offsets = self._fold(through)  # what this acknowledges never enters the set
            offsets.acknowledge_through(through)
        elif not (offsets := self._fold()).done:
            return
        if not self._started or self._cluster.topic_changed is not None:
            return  # an old watermark committed on a re-created topic would skip records
        meta = offsets.metadata()
        watermark = offsets.watermark
        consumer = self._consumer
        assert consumer is not None
        with kafka_errors(f"committing queue {self._queue}"):
            try:
                if not tokens:
                    await self._handoffs.write(
                        self._group, self._queue, watermark, meta,
                        max(self._fetched_mark, self._redelivered_through), self._starts)
                async with StallTolerantTimeout(COMMIT_WAIT_S):
                    await consumer.commit({self._tp: OffsetAndMetadata(watermark, meta)})
            except TimeoutError:  # (before kafka_errors, which would call it a broker's)
                await self._commit_stuck(watermark)
            except kerrors.CommitFailedError as exc:
                # The group re-balanced and the partition may be someone else's now: our
                # unacknowledged messages will be redelivered there. Nothing to retry.
                log.warning("queue %d: commit refused (%s); the new owner resumes at its "
                            "last committed offset", self._queue, exc)
            except kerrors.IllegalStateError as exc:
                log.warning("queue %d: partition no longer assigned (%s)", self._queue, exc)

    async def _commit_stuck(self, watermark: int) -> None:
        """A commit did not complete within :data:`COMMIT_WAIT_S`: aiokafka retries one
        for a partition the broker does not know without end (every 100 ms, an ERROR line
        each), and the topic deleted under the worker is the one case where it never
        will. Then it is :meth:`KafkaCluster.topic_gone`; else a broker error, and the
        acknowledgements are tried again."""
        if not await self._cluster.topic_exists():
            self._cluster.topic_gone(self._queue, 0, max(self._reached, watermark))
            return
        raise BrokerConnectionError(f"kafka: committing queue {self._queue} did not complete "
                                    f"in {COMMIT_WAIT_S:g}s")

    async def lag(self) -> int:
        consumer = self._consumer
        high = consumer.highwater(self._tp) if consumer is not None else None
        if high is None:
            return await self._cluster.lag(self._queue, self._group)
        offsets = self._fold()
        return max(0, int(high) - offsets.watermark - len(offsets.done))

    async def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._converters.get(self._tp) is self._decoder:  # not a successor's
            del self._converters[self._tp]
        if self._shared is None and self._consumer is not None:
            with contextlib.suppress(Exception):
                await self._consumer.stop()
        self._consumer = None

    def holder(self, queue: int, group: str) -> str | None:
        """Who this receiver is while it is open on ``queue`` for ``group`` (owners())."""
        if self._closed or self._queue != queue or self._group != group:
            return None
        return "a receiver in this process"
