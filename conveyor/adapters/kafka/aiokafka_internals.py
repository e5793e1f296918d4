"""What Conveyor takes from aiokafka beyond its public API, all in this one module.

aiokafka's public API lacks a few things Conveyor needs. Each reach into its private
parts is here, named for what it gives, and ``tests/unit/test_aiokafka_internals.py``
pins every name and call shape relied on, so an aiokafka upgrade that moves one fails
that one test rather than a daemon in production:

* a group's committed offsets *with their metadata* (``consumer.committed()`` drops
  it): ``consumer._coordinator.fetch_committed_offsets``;
* the heartbeats the group coordinator answers, and a member's id and generation:
  ``consumer._coordinator._do_heartbeat``, ``.member_id``, ``.generation``;
* whether a started producer is idempotent: ``producer._txn_manager``;
* stopping a producer without delivering what it holds (``stop`` waits for that, up
  to the request timeout): ``producer._message_accumulator.fail_all`` (what aiokafka
  does when its sender dies), the futures of the batches it held marked retrieved
  (``_batches``, ``_pending_batches``, a batch's ``future`` and ``_drain_waiter``), and
  its ``client``'s connections closed;
* the batch ``send_batch`` queued, whose own future the shield it returns stops reading
  once its caller cancels (:func:`queued_batch`), and taking it back while the sender
  has not yet taken it (:func:`withdraw`): the accumulator's ``_batches`` again, a
  batch's ``_builder``, ``future``, ``retry_count``, ``tp`` and ``_drain_waiter``;
* requests the admin client does not offer (DeleteGroups, LeaveGroup):
  ``admin._send_request`` and the request classes of ``aiokafka.protocol``;
* a record's size as the producer's own check counts it:
  ``DefaultRecordBatchBuilder.estimate_size_in_bytes``;
* records handed over as the record batch holds them, without a ``ConsumerRecord``
  built for each (:func:`raw_records`), or converted as a fetch is unpacked
  (:func:`record_converters`): ``aiokafka.consumer.fetcher.PartitionRecords``, its
  ``_consumer_record``, ``_unpack_records`` (mirrored for uncommitted reads) and
  ``__next__`` (bypassed by ``FetchResult.getall``), a consumer's
  ``_key_deserializer``, and the fetcher's ``MemoryRecords`` (wrapped to keep a
  fetch's bytes: :func:`lenient_records` reads a batch the parser refuses from them,
  with ``_DefaultRecordBatchPy``'s header and decompression);
* a batch's record builder, appended to without the keyword wrapper per record:
  ``batch._builder.append`` and the count it keeps, ``batch._relative_offset``;
* the consumer protocol's member metadata and assignment (``aiokafka.coordinator``),
  also built by :mod:`~conveyor.adapters.kafka.app_check`, which subclasses the
  assignors' ``metadata`` / ``assign`` / ``on_assignment`` classmethods;
* the sticky assignor's state, which it keeps in class attributes;
* where aiokafka's SCRAM code raises on a refused login, and the log line of its sender
  for a refused InitProducerId (matched by function names and text);
* the addresses in the error of a client that reached no bootstrap server
  (:func:`bootstrap_unreachable`, matched by text).
"""

from __future__ import annotations

import re
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import aiokafka.consumer.fetcher as aiokafka_fetcher
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka import errors as kerrors
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor
from aiokafka.coordinator.protocol import (  # re-exported: app_check.py builds them
    ConsumerProtocolMemberAssignment as ConsumerProtocolMemberAssignment,
)
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberMetadata as ConsumerProtocolMemberMetadata,
)
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.group import LeaveGroupRequest
from aiokafka.protocol.types import Array, Int16, Int32, Schema, String
from aiokafka.record.default_records import DefaultRecordBatchBuilder, _DefaultRecordBatchPy
from aiokafka.record.util import decode_varint

# -- consumers in a group --------------------------------------------------------------


async def fetch_committed(
    consumer: AIOKafkaConsumer, tp: TopicPartition
) -> tuple[int, str] | None:
    """The group's committed offset and metadata (aiokafka's public API drops metadata)."""
    found = await consumer._coordinator.fetch_committed_offsets([tp])
    entry = found.get(tp)
    if entry is None or entry.offset < 0:
        return None
    return int(entry.offset), str(entry.metadata or "")


def observe_heartbeats(consumer: AIOKafkaConsumer, answered: Callable[[float], None]) -> bool:
    """Call ``answered(sent)`` for each heartbeat the coordinator answers as a member
    (``sent``: ``time.monotonic()`` taken before the request); False when this aiokafka
    does not let heartbeats be observed."""
    coordinator: Any = getattr(consumer, "_coordinator", None)
    heartbeat = getattr(coordinator, "_do_heartbeat", None)
    if heartbeat is None:
        return False

    async def observed() -> bool:
        sent = time.monotonic()
        still_member: bool = await heartbeat()  # True: still a member (even mid-rebalance)
        if still_member:
            answered(sent)
        return still_member

    coordinator._do_heartbeat = observed
    return True


def membership(consumer: AIOKafkaConsumer) -> tuple[str, int]:
    """The consumer's member id and generation in its group ("", -1 when unknown)."""
    coordinator = getattr(consumer, "_coordinator", None)
    return getattr(coordinator, "member_id", ""), getattr(coordinator, "generation", -1)


def sticky_assignor() -> type[StickyPartitionAssignor]:
    """The sticky assignor (KIP-54): a re-balance moves only the partitions that must move
    (the eager protocol still pauses all of them while it runs).

    aiokafka's keeps its member's last assignment in class attributes: a subclass per
    balancer keeps two daemons of one process from sharing it."""
    return type("ConveyorStickyAssignor", (StickyPartitionAssignor,), {
        "member_assignment": None,
        "generation": StickyPartitionAssignor.DEFAULT_GENERATION_ID,
    })


def subscription(member_metadata: bytes) -> list[str]:
    """The topics a member subscribes to, from DescribeGroups' ``member_metadata``
    (raises on bytes that are not the consumer protocol's)."""
    return list(ConsumerProtocolMemberMetadata.decode(member_metadata).subscription)


def assignment(member_assignment: bytes) -> list[TopicPartition]:
    """The partitions in DescribeGroups' ``member_assignment`` (raises on foreign bytes)."""
    return list(ConsumerProtocolMemberAssignment.decode(member_assignment).partitions())


# -- a batch the parser refuses ----------------------------------------------------------
# Kafka header names are strings, and aiokafka decodes each as UTF-8 while it parses a
# batch; any client that writes other bytes there (librdkafka, kcat, a hand-built batch)
# makes its C parser raise UnicodeDecodeError at that record, again on every fetch: the
# partition would stall behind it forever. lenient_records reads the batch's bytes
# itself, as aiokafka's pure-Python reader does (its header and decompression), and hands
# such a record over as an UnreadableRecord (names as text, the bytes UTF-8 refuses
# escaped as \xff) for the receiver to dead-letter; the batch's other records come as
# they are. Only a batch the parser refused goes this way.

_BATCH_HEAD = struct.Struct(">qi")
"""BaseOffset, Length: how every batch of a fetch begins (Length counts what follows)."""


@dataclass(frozen=True, slots=True)
class Record:
    """A record read by :func:`lenient_records`, with what a parsed record offers."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


@dataclass(frozen=True, slots=True)
class UnreadableRecord:
    """A record whose header names are not all UTF-8: ``headers`` has them as text,
    the bytes UTF-8 refuses escaped (``\\xff``); ``reason`` names them."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    reason: str


def batch_bytes(fetched: bytes, base_offset: int) -> bytes | None:
    """The batch at ``base_offset`` among a fetch's bytes (batches back to back)."""
    pos, end = 0, len(fetched)
    while pos + _BATCH_HEAD.size <= end:
        offset, length = _BATCH_HEAD.unpack_from(fetched, pos)
        stop = pos + _BATCH_HEAD.size + length
        if offset == base_offset:
            return fetched[pos:stop] if stop <= end else None
        pos = stop
    return None


def _nullable(buf: Any, pos: int) -> tuple[bytes | None, int]:
    length, pos = decode_varint(buf, pos)
    if length < 0:
        return None, pos
    return bytes(buf[pos:pos + length]), pos + length


def lenient_records(batch: bytes) -> Iterator[Record | UnreadableRecord]:
    """The records of one v2 batch (``batch``: its bytes, as :func:`batch_bytes` finds
    them), decompressed as aiokafka does; a record whose header names are not UTF-8 as
    an :class:`UnreadableRecord`."""
    parsed = _DefaultRecordBatchPy(batch)
    parsed._maybe_uncompress()
    buf, pos = parsed._buffer, parsed._pos
    log_append = parsed.timestamp_type == parsed.LOG_APPEND_TIME
    for _ in range(parsed._num_records):
        length, pos = decode_varint(buf, pos)
        end = pos + length
        _, pos = decode_varint(buf, pos)  # attributes: unused
        ts_delta, pos = decode_varint(buf, pos)
        offset_delta, pos = decode_varint(buf, pos)
        key, pos = _nullable(buf, pos)
        value, pos = _nullable(buf, pos)
        count, pos = decode_varint(buf, pos)
        headers: list[tuple[str, bytes | None]] = []
        refused: list[bytes] = []
        for _ in range(max(count, 0)):
            size, pos = decode_varint(buf, pos)
            raw = bytes(buf[pos:pos + size])
            pos += size
            try:
                name = raw.decode()
            except UnicodeDecodeError:
                name = raw.decode("utf-8", "backslashreplace")
                refused.append(raw)
            value_of_header, pos = _nullable(buf, pos)
            headers.append((name, value_of_header))
        pos = end
        offset = parsed.base_offset + offset_delta
        timestamp = parsed.max_timestamp if log_append else parsed.first_timestamp + ts_delta
        if refused:
            names = ", ".join(repr(r[:40]) for r in refused[:3])
            yield UnreadableRecord(
                offset, timestamp, key, value, headers,
                f"header name(s) not UTF-8: {names} (Kafka header names are strings; "
                "kept escaped as \\xNN)")
        else:
            yield Record(offset, timestamp, key, value, headers)


class RecordConverter(Protocol):
    """What a consumer made with :func:`raw_records` passes one partition's records
    through as it unpacks a fetch (a receiver's decoder)."""

    def one(self, record: Any) -> Any:
        """A record as aiokafka parsed it, converted (called for every record)."""

    def unreadable(self, record: UnreadableRecord) -> Any:
        """A record aiokafka's parser refused, read again by
        :func:`lenient_records`, converted."""


class _RawRecords:
    """The key deserializer that marks a consumer as reading raw records (never called
    while :class:`_PartitionRecords` is installed; should it be, keys pass unchanged).

    One per consumer: ``converters`` maps a partition to what its records go through
    as they are unpacked (a receiver's decoder, :func:`record_converters`)."""

    def __init__(self) -> None:
        self.converters: dict[TopicPartition, RecordConverter] = {}

    def __call__(self, key: bytes | None) -> bytes | None:
        return key


def _as_read(tp: TopicPartition, record: Any) -> Any:
    return record


_MemoryRecords = aiokafka_fetcher.MemoryRecords


class _Fetched:
    """One partition's fetched bytes and aiokafka's ``MemoryRecords`` of them: what the
    fetcher builds in its place once :func:`raw_records` is called, so that
    :class:`_PartitionRecords` keeps the bytes (a batch its parser refuses is read from
    them again). The fetcher calls the two methods; the records object then goes on
    unwrapped."""

    __slots__ = ("data", "records")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.records = _MemoryRecords(data)

    def has_next(self) -> bool:
        return bool(self.records.has_next())

    def size_in_bytes(self) -> int:
        return int(self.records.size_in_bytes())


class _PartitionRecords(aiokafka_fetcher.PartitionRecords):  # type: ignore[misc]
    """aiokafka's records of one fetched partition; a consumer marked by
    :func:`raw_records` gets each record as the batch parsed it.

    Reading uncommitted records (Conveyor's consumers), such a consumer's records come
    from :meth:`_raw_unpack`, and ``getall``'s loop steps that generator itself
    (:meth:`__iter__`): no Python call a record beside the generator's own step."""

    next_fetch_offset: int

    def __init__(self, tp: TopicPartition, records: Any, aborted_transactions: Any,
                 fetch_offset: int, key_deserializer: Any, *rest: Any) -> None:
        data = None
        if isinstance(records, _Fetched):
            data, records = records.data, records.records
        super().__init__(tp, records, aborted_transactions, fetch_offset, key_deserializer,
                         *rest)
        self._raw = isinstance(key_deserializer, _RawRecords)
        if self._raw:  # the instance's own, looked up per record
            self._consumer_record = _as_read
            if self._isolation_level != aiokafka_fetcher.READ_COMMITTED:
                converter = key_deserializer.converters.get(tp)
                self._records_iterator = self._raw_unpack(converter, data)

    def __iter__(self) -> Any:
        iterator = self._records_iterator
        if self._raw:  # aiokafka's __next__ only adds a frame around it
            return iterator if iterator is not None else iter(())
        return self

    def _raw_unpack(self, converter: RecordConverter | None, data: bytes | None
                    ) -> Iterator[Any]:
        """``_unpack_records`` for uncommitted reads with each record as parsed, or as
        ``converter`` makes it: the same CRC check, control batches skipped, offsets
        below the fetch offset skipped and ``next_fetch_offset`` kept after each record
        and each batch.

        Converted as it is unpacked, a record (and its headers' list and tuples) is freed
        before the next one is parsed: a fetch no longer holds a few thousand objects
        the garbage collector tracks, whose collections and promotions cost ~6 % of a
        Kafka consumer's CPU.

        A batch whose parsing fails on a header name that is not UTF-8 (which would fail
        every fetch of the partition from then on) is read again from ``data``, the
        fetch's bytes (:func:`lenient_records`): that record
        comes as the converter's ``unreadable`` makes it, the others as usual."""
        convert = converter.one if converter is not None else None
        records = self._records
        while records.has_next():
            batch = records.next_batch()
            if self._check_crcs and not batch.validate_crc():
                raise kerrors.CorruptRecordException(f"Invalid CRC - {self._tp}")
            if not batch.is_control_batch:
                try:
                    for record in batch:
                        offset = record.offset
                        if offset < self.next_fetch_offset:
                            continue  # a compressed batch's records before the fetch offset
                        converted = record if convert is None else convert(record)
                        self.next_fetch_offset = offset + 1  # once it is converted: a
                        yield converted  # converter that raised leaves the record to read
                except UnicodeDecodeError:  # raised by aiokafka's parser, not a converter
                    raw = batch_bytes(data, batch.base_offset) if data is not None else None
                    if raw is None:
                        raise
                    yield from self._lenient(raw, converter)
            self.next_fetch_offset = batch.next_offset

    def _lenient(self, raw: bytes, converter: RecordConverter | None) -> Iterator[Any]:
        """The records of one batch not yet handed over, read by
        :func:`lenient_records`."""
        for record in lenient_records(raw):
            offset = record.offset
            if offset < self.next_fetch_offset:
                continue
            if converter is None:
                converted: Any = record
            elif isinstance(record, UnreadableRecord):
                converted = converter.unreadable(record)
            else:
                converted = converter.one(record)
            self.next_fetch_offset = offset + 1
            yield converted


def raw_records() -> dict[str, Any]:
    """Consumer options for a consumer whose ``getmany`` returns the records as the
    fetched batch holds them (``offset``, ``timestamp``, ``key``, ``value``,
    ``headers``; no ``topic`` or ``partition``) rather than a ``ConsumerRecord`` built
    per record: half of what aiokafka spends on a record read — or, for a partition
    given a converter (:func:`record_converters`), what the converter makes of each.
    Other consumers of the process are left as they are."""
    if aiokafka_fetcher.PartitionRecords is not _PartitionRecords:
        aiokafka_fetcher.PartitionRecords = _PartitionRecords
        aiokafka_fetcher.MemoryRecords = _Fetched
    return {"key_deserializer": _RawRecords()}


def record_converters(consumer: AIOKafkaConsumer) -> dict[TopicPartition, RecordConverter]:
    """Partition -> the converter through which a consumer made with :func:`raw_records`
    passes each of that partition's records as it unpacks a fetch (from the next fetch
    on); an empty dict, never read, for any other consumer."""
    marker = getattr(consumer, "_key_deserializer", None)
    return marker.converters if isinstance(marker, _RawRecords) else {}


# -- producers -------------------------------------------------------------------------


def is_idempotent(producer: AIOKafkaProducer) -> bool:
    """Whether the producer writes idempotently (it has a transaction manager)."""
    return producer._txn_manager is not None


async def drop_pending(producer: AIOKafkaProducer, exc: Exception) -> None:
    """Fail every batch the producer holds, sent or not, with ``exc``, and close its
    connections: its ``stop`` then returns at once instead of waiting for the answers
    (a sent batch may or may not be stored).

    Two of each batch's futures that get ``exc`` may have nobody left to read it: its
    own (``send_batch`` hands out a shield of it, which lets go of it once the caller
    cancels its wait) and, for a batch queued behind the partition's batch in flight,
    its drain waiter (only a later send to that partition awaits it). Both are marked
    retrieved here, or asyncio logs "Future exception was never retrieved" for each once
    it is collected (a client closed while a cancelled publish was under way). Senders
    still get ``exc``: from the futures ``send`` and ``send_batch`` returned (a shield
    reads its batch's future whether it was retrieved or not), and from the drain
    waiter a send waits on."""
    accumulator = producer._message_accumulator
    queued = [batch for batches in accumulator._batches.values() for batch in batches]
    held = [*queued, *accumulator._pending_batches]
    accumulator.fail_all(exc)
    for future in [*(b.future for b in held), *(b._drain_waiter for b in queued)]:
        if future.done() and not future.cancelled():
            future.exception()
    await producer.client.close()


def queued_batch(producer: AIOKafkaProducer, tp: TopicPartition, builder: BatchBuilder) -> Any:
    """The batch (aiokafka's ``MessageBatch``) ``send_batch`` just queued for ``tp`` from
    ``builder``: the one whose own ``future`` is inside the shield it returned; None if
    the partition's last queued batch is not ``builder``'s (an aiokafka that queues
    differently: see the pins).

    Call it right after ``send_batch`` returns: ``add_batch`` appends the batch to the
    partition's queue and returns without a pause, so the sender cannot have taken it.

    A caller cancelled while awaiting the shield cancels the shield, and the shield then
    stops reading the batch's future; ``failure`` reads it only for a batch with
    per-message futures (``send``'s), never for ``send_batch``'s. A batch failing later
    (the request timed out) would leave its error unread, and asyncio logs "Future
    exception was never retrieved" once the future is collected: whoever let go of the
    shield marks this one seen instead. The batch also tells whether it has been sent
    (:func:`withdraw`)."""
    queued = producer._message_accumulator._batches.get(tp)
    if not queued or queued[-1]._builder is not builder:
        return None
    return queued[-1]


def withdraw(producer: AIOKafkaProducer, batch: Any, exc: Exception) -> bool:
    """Take ``batch`` (from :func:`queued_batch`) back from the producer if its sender
    has never taken it: then it was never sent, and never will be; its future fails
    with ``exc`` (marked retrieved). False, and the batch left where it is, once the
    sender has taken it, even if it is queued again after a failed attempt (its
    ``retry_count`` counts the takes): it may be stored.

    A batch never taken has no sequence number yet (the idempotent producer numbers a
    batch as the sender first takes it), and every batch behind it in its partition's
    queue is untaken too (a batch queued again goes to the front), so taking it out
    leaves no gap in the sequence. A send waiting for room behind it (its drain waiter)
    is woken, as when the sender takes a batch, and looks again."""
    if batch.retry_count:
        return False
    batches = producer._message_accumulator._batches
    queued = batches.get(batch.tp)
    if queued is None or batch not in queued:
        return False
    queued.remove(batch)
    if not queued:
        del batches[batch.tp]
    batch.future.set_exception(exc)
    batch.future.exception()
    if not batch._drain_waiter.done():
        batch._drain_waiter.set_result(None)
    return True


def record_size(key: bytes | None, value: bytes | None, headers: list[Any]) -> int:
    """A record's size as the producer's ``send`` checks it against max_request_size."""
    size: int = DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers)
    return size


RecordAppend = Callable[[int, int | None, bytes | None, bytes | None, list[Any]], Any]
"""``append(offset, timestamp_ms, key, value, headers)``: the record's metadata (``.size``),
or None when the batch is full (its first record always goes in)."""


def record_appender(batch: BatchBuilder) -> RecordAppend:
    """The append of the record builder inside ``batch`` (aiokafka's C
    ``DefaultRecordBatchBuilder``): positional, without ``BatchBuilder.append``'s keyword
    call and serializer step per record (~0.3 us of a record's ~0.8). ``offset`` counts
    from 0 in the batch; hand the batch over only after :func:`seal`."""
    append: RecordAppend = batch._builder.append
    return append


def seal(batch: BatchBuilder, records: int) -> None:
    """Close ``batch``, filled through :func:`record_appender` with ``records`` records.

    The count is the one ``BatchBuilder.append`` would have kept: the idempotent
    producer numbers the batch's sequence by it. Closed, the batch is sent at the
    sender's next turn instead of lingering ``linger_ms`` for records that can no longer
    join it (aiokafka's sender skips the linger of a closed batch)."""
    batch._relative_offset = records
    batch.close()


SENDER_LOGGER = "aiokafka.producer.sender"
"""The logger of the producer's sender task."""
INIT_PRODUCER_ID_ERROR = "Unexpected error during InitProducerIdRequest"
"""How the sender's error line for a refused InitProducerId begins (args: the error type)."""

SCRAM_STEPS = frozenset({"authenticator_scram", "process_server_first_message",
                         "process_server_final_message"})
"""Functions of ``aiokafka.conn`` whose ``KeyError`` / ``ValueError`` is a refused login."""


# -- requests the admin client does not offer -------------------------------------------


class _DeleteGroupsResponseV0(Response):  # type: ignore[misc]
    API_KEY = 42
    API_VERSION = 0
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("results", Array(("group_id", String("utf-8")), ("error_code", Int16))),
    )


class _DeleteGroupsRequestV0(RequestStruct):  # type: ignore[misc]
    API_KEY = 42
    API_VERSION = 0
    RESPONSE_TYPE = _DeleteGroupsResponseV0
    SCHEMA = Schema(("groups_names", Array(String("utf-8"))))


class _DeleteGroups(Request[_DeleteGroupsRequestV0]):  # type: ignore[misc]
    API_KEY = 42

    def __init__(self, groups: list[str]) -> None:
        self._groups = groups

    def build(self, request_struct_class: type[_DeleteGroupsRequestV0]) -> Any:
        return request_struct_class(self._groups)


def delete_groups_request(groups: list[str]) -> Any:
    """DeleteGroups (Kafka 1.1+); its response has ``results``: (group, error code)."""
    return _DeleteGroups(groups)


def leave_group_request(group: str, member_id: str) -> Any:
    """LeaveGroup; its response has ``error_code``."""
    return LeaveGroupRequest(group, member_id)


async def send_request(admin: AIOKafkaAdminClient, request: Any, node_id: int) -> Any:
    """Send ``request`` to broker ``node_id`` through a started admin client.

    Raises ``IncompatibleBrokerVersion`` or ``NotImplementedError`` when the broker
    supports no version of it that aiokafka can build."""
    return await admin._send_request(request, node_id)


# -- errors ------------------------------------------------------------------------------

BOOTSTRAP_ERROR = "Unable to bootstrap from "
"""How aiokafka's ``KafkaConnectionError`` starts when no bootstrap server answered; the
rest is the repr of its host list, ``[('127.0.0.1', 9092, <AddressFamily.AF_INET: 2>)]``."""
_BOOTSTRAP_HOST = re.compile(r"\('([^']*)', (\d+),")


def bootstrap_unreachable(exc: BaseException) -> list[str] | None:
    """The ``HOST:PORT`` addresses a client tried if ``exc`` says it reached none of its
    bootstrap servers, else None."""
    text = str(exc.args[0]) if isinstance(exc, kerrors.KafkaConnectionError) and exc.args \
        else ""
    if not text.startswith(BOOTSTRAP_ERROR):
        return None
    hosts = [f"{h}:{p}" if ":" not in h else f"[{h}]:{p}"
             for h, p in _BOOTSTRAP_HOST.findall(text)]
    return hosts or None
