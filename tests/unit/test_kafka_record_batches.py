"""The record batches ``KafkaAdapter.enqueue`` hands the producer: every message written
as :func:`message_headers` writes it (the common one's headers are built inline), in
order, split where a batch is full, each batch closed with its record count set."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.record.memory_records import MemoryRecords

from conveyor.adapters.kafka import KafkaAdapter
from conveyor.adapters.kafka.codec import decode_record, message_headers
from conveyor.platform.config import KafkaConfig
from conveyor.platform.ids import SequenceToken, StreamId
from conveyor.platform.message import CONTENT_MSGPACK, Message

TS = 1_700_000_000_123


class _Producer:
    """What ``_batches`` asks of the producer: empty batches of ``batch_size`` bytes."""

    def __init__(self, batch_size: int = 16_384) -> None:
        self.batch_size = batch_size

    def create_batch(self) -> BatchBuilder:
        return BatchBuilder(self.batch_size, 0)


def _read(batch: BatchBuilder) -> list[Any]:
    records = MemoryRecords(bytes(batch._build())).next_batch()
    assert records is not None
    return list(records)


def _messages() -> list[Message]:
    plain = [Message(f"m{i}", StreamId("orders", f"o-{i % 3}"), b'{"n":%d}' % i,
                     enqueued_at_ms=TS + i) for i in range(6)]
    return [
        *plain[:2],
        Message("x1", StreamId("billing", "b-1"), b"\x81\xa1n\x01", {},
                CONTENT_MSGPACK, 0, TS),
        *plain[2:4],
        Message("x2", StreamId("orders", "o-1"), b"{}", {"tenant": "t9"}, enqueued_at_ms=TS),
        Message("x3", StreamId("billing", "b-2"), b"{}", {}, attempt=2, enqueued_at_ms=TS),
        Message("x4", StreamId("billing", "b-2"), b"{}", enqueued_at_ms=TS),
        *plain[4:],
    ]


def test_each_message_is_written_with_the_headers_message_headers_gives_it() -> None:
    messages = _messages()
    [(held, batch)] = KafkaAdapter(KafkaConfig(), 4)._batches(_Producer(), messages)
    assert list(held) == messages
    records = _read(batch)
    assert [r.offset for r in records] == list(range(len(messages)))
    for msg, record in zip(messages, records, strict=True):
        assert list(record.headers) == message_headers(msg), msg.id
        assert (record.key, bytes(record.value), record.timestamp) == (
            msg.stream.key.encode(), msg.body, msg.enqueued_at_ms)
        fetched = SimpleNamespace(topic="t", partition=0, offset=record.offset,
                                  key=record.key, value=bytes(record.value),
                                  headers=tuple(record.headers), timestamp=record.timestamp)
        token = SequenceToken(0, record.offset)
        assert decode_record(fetched, 0, "default") == msg.with_token(token)


def test_a_full_batch_is_closed_and_the_rest_go_on_in_order_in_the_next() -> None:
    messages = [Message(f"m{i}", StreamId("orders", f"o-{i}"), b"x" * 100, enqueued_at_ms=TS)
                for i in range(40)]
    batches = KafkaAdapter(KafkaConfig(), 4)._batches(_Producer(batch_size=1024), messages)
    assert len(batches) > 2
    assert [m for held, _ in batches for m in held] == messages
    for held, batch in batches:
        assert batch.closed()  # sent at once: no linger for records that cannot come
        assert batch.record_count() == len(held)  # what the idempotent producer counts
        assert [r.headers[1][1].decode() for r in _read(batch)] == [m.id for m in held]
