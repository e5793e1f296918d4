"""The Kafka wire format: a JSON message is written with two headers (``cv-ns``,
``cv-id``; the record's timestamp is its enqueue time), and every record — that layout,
the four-header one older Conveyor versions wrote, foreign and malformed ones — reads
back as the same message through :class:`RecordDecoder` as through ``decode_record``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from conveyor.adapters.kafka.codec import (
    RecordDecoder,
    decode_record,
    letter_from_record,
    letter_record,
    message_headers,
)
from conveyor.platform.ids import SequenceToken, StreamId
from conveyor.platform.message import (
    CONTENT_JSON,
    CONTENT_MSGPACK,
    DeadLetter,
    Message,
    Undecodable,
)

TS = 1_700_000_000_123
TRACEPARENT = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _message(**changes: Any) -> Message:
    fields: dict[str, Any] = {"id": "m1", "stream": StreamId("orders", "o-7"),
                              "body": b'{"n":1}', "enqueued_at_ms": TS}
    return Message(**(fields | changes))


def _record(msg: Message, headers: list[tuple[str, bytes | None]], offset: int = 5,
            timestamp: int | None = None) -> Any:
    """What aiokafka's fetcher hands out, for a record written as the adapter writes it
    (``timestamp=msg.enqueued_at_ms``)."""
    return SimpleNamespace(topic="t", partition=0, offset=offset, key=msg.stream.key.encode(),
                           value=msg.body, headers=tuple(headers),
                           timestamp=msg.enqueued_at_ms if timestamp is None else timestamp)


def _older(msg: Message) -> list[tuple[str, bytes | None]]:
    """The four headers Conveyor wrote before the lean layout."""
    return [("cv-ns", msg.stream.namespace.encode()), ("cv-id", msg.id.encode()),
            ("content-type", msg.content_type.encode()),
            ("cv-ts", str(msg.enqueued_at_ms).encode())]


def test_a_json_message_is_written_with_two_headers() -> None:
    assert message_headers(_message()) == [("cv-ns", b"orders"), ("cv-id", b"m1")]


def test_what_a_default_cannot_say_is_still_written() -> None:
    headers = dict(message_headers(_message(content_type=CONTENT_MSGPACK, attempt=2,
                                            headers={"x-h": "v"})))
    assert headers == {"cv-ns": b"orders", "cv-id": b"m1",
                       "content-type": CONTENT_MSGPACK.encode(), "cv-attempt": b"2",
                       "x-h": b"v"}


@pytest.mark.parametrize("layout", ["lean", "older"])
def test_both_layouts_read_back_as_the_message_written(layout: str) -> None:
    msg = _message()
    headers = message_headers(msg) if layout == "lean" else _older(msg)
    # An older record on a topic with broker-side timestamps still has its cv-ts.
    record = _record(msg, headers, timestamp=TS if layout == "lean" else 1)
    [read] = RecordDecoder(3, "default").decode([record])
    assert read == msgspec.structs.replace(msg, token=SequenceToken(3, 5))
    assert read == decode_record(record, 3, "default")


def test_a_batch_of_one_stream_shares_one_stream_id() -> None:
    msgs = [_message(id=f"m{i}") for i in range(3)]
    read = RecordDecoder(0, "default").decode(
        [_record(m, message_headers(m), offset=i) for i, m in enumerate(msgs)])
    assert read[0].stream is read[1].stream is read[2].stream
    assert [m.token for m in read] == [SequenceToken(0, i) for i in range(3)]


def test_one_key_in_two_namespaces_reads_as_two_streams_across_batches() -> None:
    # The decoder finds a namespace's stream ids by key alone: a key read under one
    # namespace must not lend its stream to the same key under another.
    decoder = RecordDecoder(0, "default")
    msgs = [_message(id=f"m{i}", stream=StreamId(ns, "k"))
            for i, ns in enumerate(["a", "b", "a", "a", "b"])]
    first = decoder.decode([_record(m, message_headers(m), offset=i)
                            for i, m in enumerate(msgs[:3])])
    second = decoder.decode([_record(m, message_headers(m), offset=i)
                             for i, m in enumerate(msgs[3:], start=3)])
    read = first + second
    assert [m.stream for m in read] == [m.stream for m in msgs]
    assert read[0].stream is read[2].stream is read[3].stream  # still interned
    assert read[1].stream is read[4].stream


@pytest.mark.parametrize("headers", [
    [],  # a foreign record: the defaults
    [("cv-id", b"m1"), ("cv-ns", b"orders")],  # another order
    [("cv-ns", b""), ("cv-id", b"m1")],  # an empty namespace: undecodable
    [("cv-ns", b"orders"), ("cv-id", None)],  # no id: topic-partition-offset
    [("cv-ns", b"orders"), ("x-h", b"v")],
    # User headers after cv-ns and cv-id (a traceparent, with tracing on): the same
    # message whichever path reads it — several, repeated (the last wins), None ...
    [("cv-ns", b"orders"), ("cv-id", b"m1"), ("traceparent", TRACEPARENT)],
    [("cv-ns", b"orders"), ("cv-id", b"m1"), ("x-2", None)],
    [("cv-ns", b"orders"), ("cv-id", b"m1"), ("x-h", b"a"), ("x-2", None), ("x-h", b"b")],
    # ... and after them one of Conveyor's own, or a value that is not UTF-8
    [("cv-ns", b"orders"), ("cv-id", b"m1"), ("x-h", b"v"), ("content-type", b"text/plain")],
    [("cv-ns", b"orders"), ("cv-id", b"m1"), ("cv-attempt", b"2")],
    [("cv-ns", b"orders"), ("cv-id", b"m1"), ("x-h", b"v"), ("cv-ns", b"other")],
    [("cv-ns", b"orders"), ("cv-id", b"m1"), ("x-h", b"\xff")],
])
def test_other_records_read_as_the_general_decoder_reads_them(
    headers: list[tuple[str, bytes | None]],
) -> None:
    record = _record(_message(), headers)
    assert RecordDecoder(0, "default").decode([record]) == [decode_record(record, 0, "default")]


@pytest.mark.parametrize(("name", "first", "second"), [
    ("cv-ns", b"orders", b"refunds"),  # was handled by the last one's handlers
    ("cv-id", b"m1", b"m2"),
    ("content-type", b"application/json", b"application/msgpack"),
    ("cv-attempt", b"1", b"2"),
    ("cv-ts", b"1", None),
    ("cv-key", b"a", b"b"),
])
def test_a_conveyor_header_given_twice_with_different_values_is_undecodable(
    name: str, first: bytes, second: bytes | None,
) -> None:
    headers = [("cv-ns", b"orders"), ("cv-id", b"m1"), ("x-h", b"v")]
    headers = [h for h in headers if h[0] != name] + [(name, first), ("x-2", b"w"),
                                                      (name, second)]
    record = _record(_message(), headers)
    [read] = RecordDecoder(0, "default").decode([record])
    assert isinstance(read, Undecodable), read
    assert read.reason == (f"DecodeError: {name} given twice with different values "
                           f"({first!r}, then {'null' if second is None else repr(second)}): "
                           "which one is meant is not known")
    assert read.raw_fields == tuple((n.encode(), v) for n, v in headers)
    twice = _record(_message(), [*headers[:-1], (name, first)])  # the same value twice
    assert not isinstance(decode_record(twice, 0, "default"), Undecodable)


def test_user_headers_keep_a_record_on_the_interned_path() -> None:
    msgs = [_message(id=f"m{i}", headers={"traceparent": TRACEPARENT.decode()})
            for i in range(2)]
    records = [_record(m, [*message_headers(m)], offset=i) for i, m in enumerate(msgs)]
    read = RecordDecoder(0, "default").decode(records)
    assert read[0].stream is read[1].stream  # interned: not the general way
    assert [m.headers for m in read] == [m.headers for m in msgs]


@pytest.mark.parametrize("ns", [b"", None])
def test_an_empty_namespace_is_undecodable_not_the_default(ns: bytes | None) -> None:
    # It was read under the default namespace (then handled there, or skipped when no
    # handler took it); absent, the header still means the default.
    record = _record(_message(), [("cv-ns", ns), ("cv-id", b"m1")])
    [read] = RecordDecoder(0, "default").decode([record])
    assert isinstance(read, Undecodable) and "cv-ns header is empty" in read.reason
    assert read.raw_fields == ((b"cv-ns", ns), (b"cv-id", b"m1"))
    assert read.body == b'{"n":1}' and read.raw_key == b"o-7" and not read.null_value
    absent = decode_record(_record(_message(), [("cv-id", b"m1")]), 0, "default")
    assert not isinstance(absent, Undecodable) and absent.stream == StreamId("default", "o-7")


@pytest.mark.parametrize("headers", [
    message_headers(_message()),  # Conveyor's: the fast path's shape
    [("cv-ns", b"orders"), ("cv-id", b"m1"), ("content-type", b"text/plain")],
    [],  # a foreign tombstone (a compacted topic's delete marker)
    [("x-h", b"v")],
], ids=["conveyor", "conveyor-general", "foreign", "foreign-with-headers"])
def test_a_null_value_is_undecodable_foreign_or_not(
    headers: list[tuple[str, bytes | None]],
) -> None:
    # It was handed over as an empty body: a handler could not tell it from one.
    record = _record(_message(), headers)
    record.value = None
    [read] = RecordDecoder(0, "default").decode([record])
    assert read == decode_record(record, 0, "default")
    assert isinstance(read, Undecodable) and "null value (a Kafka tombstone)" in read.reason
    assert (read.body, read.null_value, read.raw_key) == (b"", True, b"o-7")
    assert read.raw_fields == tuple((n.encode(), v) for n, v in headers)
    empty = _record(_message(body=b""), headers)  # an empty body is an empty value
    assert not isinstance(decode_record(empty, 0, "default"), Undecodable)
    assert RecordDecoder(0, "default").one(empty).body == b""


def test_a_tombstones_dead_letter_keeps_its_value_null_and_is_not_replayable() -> None:
    from conveyor.platform.letters import StoredLetter
    from conveyor.platform.operations.dlq import not_replayable

    record = _record(_message(), message_headers(_message()))
    record.value = None
    undecodable = decode_record(record, 0, "default")
    key, value, headers = letter_record(DeadLetter.of(undecodable, "", "x", 0, "Undecodable"),
                                        "shop")
    assert (key, value) == (b"o-7", None)
    stored = SimpleNamespace(key=key, value=value, headers=tuple(headers), timestamp=TS)
    letter = letter_from_record(stored, "shop", "t", "default")
    assert letter is not None and isinstance(letter.message, Undecodable)
    assert letter.message.null_value and letter.error_type == "Undecodable"
    assert not_replayable(StoredLetter("0:1", letter)) is not None  # not an empty body


def test_an_undecodable_letter_stored_short_reads_back_undecodable() -> None:
    # The minimal form writes the placeholder stream's empty cv-ns; read back under the
    # default namespace, the letter was replayable there.
    from conveyor.platform.letters import StoredLetter
    from conveyor.platform.operations.dlq import not_replayable

    bad = decode_record(_record(_message(), [("cv-ns", b"\xff")]), 0, "default")
    letter = DeadLetter.of(bad, "", "x", 0, "Undecodable").shortened("too large")
    assert letter is not None and letter.form == "minimal"
    key, value, headers = letter_record(letter, "shop")
    stored = SimpleNamespace(key=key, value=value, headers=tuple(headers), timestamp=TS)
    read = letter_from_record(stored, "shop", "t", "default")
    assert read is not None and isinstance(read.message, Undecodable)
    assert read.message.body == b'{"n":1}'
    assert not_replayable(StoredLetter("0:1", read)) is not None


def test_raw_records_read_as_the_records_aiokafka_builds_with_the_decoders_topic() -> None:
    # raw_records(): what the batch parsed, no topic or partition on the record.
    msg = _message()
    records = [_record(msg, message_headers(msg), offset=1),
               _record(msg, [("cv-ns", b"orders")], offset=2),  # no id: topic-queue-offset
               _record(msg, [("cv-ns", b"\xff"), ("cv-id", b"b")], offset=3)]
    raw = [SimpleNamespace(**{k: v for k, v in vars(r).items() if k not in ("topic", "partition")})
           for r in records]
    read = RecordDecoder(0, "default", "t").decode(raw)
    assert read == RecordDecoder(0, "default").decode(records)
    assert read[1].id == "t-0-2" and read[2].id == "t-0-3"
    assert [decode_record(r, 0, "default", "t") for r in raw] == read


def test_a_malformed_record_does_not_fail_its_batch() -> None:
    good, bad = _message(id="g"), _message(id="b")
    records = [_record(good, message_headers(good), offset=1),
               _record(bad, [("cv-ns", b"\xff"), ("cv-id", b"b")], offset=2),
               _record(good, message_headers(good), offset=3)]
    read = RecordDecoder(0, "default").decode(records)
    assert [type(m) for m in read] == [Message, Undecodable, Message]
    assert [m.token for m in read] == [SequenceToken(0, o) for o in (1, 2, 3)]


def test_a_dead_letter_keeps_every_header_of_its_message() -> None:
    msg = _message(token=SequenceToken(0, 9))
    letter = DeadLetter(message=msg, handler="h", error_type="ValueError", error="boom",
                        attempts=3, failed_at_ms=TS + 5)
    key, value, headers = letter_record(letter, "shop")
    names = [name for name, _ in headers]
    assert {"content-type", "cv-ts"} <= set(names)
    # Read back with the letter record's own timestamp: cv-ts still says the enqueue time.
    stored = SimpleNamespace(key=key, value=value, headers=tuple(headers), timestamp=TS + 5)
    read = letter_from_record(stored, "shop", "t", "default")
    assert read is not None
    assert (read.message.enqueued_at_ms, read.message.content_type) == (TS, CONTENT_JSON)


def test_a_record_with_a_header_name_not_utf8_is_undecodable_and_its_letter_stays_so() -> None:
    # aiokafka's parser refuses the record; read again, it comes as an UnreadableRecord
    # with the name escaped. Its letter stores the escaped name (a Kafka header name
    # must be text): read back, it decodes, yet it is still not what was published.
    from conveyor.adapters.kafka.aiokafka_internals import UnreadableRecord
    from conveyor.platform.letters import StoredLetter
    from conveyor.platform.operations.dlq import not_replayable

    record = UnreadableRecord(4, TS, b"o-7", b'{"n":1}',
                              [("cv-ns", b"orders"), ("\\xff", b"v")], "header name(s) ...")
    decoder = RecordDecoder(2, "default", "t")
    [read] = decoder.decode([record])
    assert read == decoder.unreadable(record)
    assert isinstance(read, Undecodable) and read.reason == "DecodeError: header name(s) ..."
    assert (read.id, read.token, read.raw_key) == ("t-2-4", SequenceToken(2, 4), b"o-7")
    assert read.raw_fields == ((b"cv-ns", b"orders"), (b"\\xff", b"v"))
    key, value, headers = letter_record(DeadLetter.of(read, "", read.reason, 0, "Undecodable"),
                                        "shop")
    stored = SimpleNamespace(key=key, value=value, headers=tuple(headers), timestamp=TS)
    letter = letter_from_record(stored, "shop", "t", "default")
    assert letter is not None and isinstance(letter.message, Undecodable)
    assert letter.message.body == b'{"n":1}' and letter.message.reason == read.reason
    assert letter.message.raw_fields == read.raw_fields
    assert not_replayable(StoredLetter("0:1", letter)) is not None


@pytest.mark.parametrize("timestamp", [-1, -5])
def test_the_letter_of_a_record_without_a_timestamp_reads_back_as_its_message(
    timestamp: int,
) -> None:
    # A record with timestamp -1 (Kafka's "none": an old-format producer's) read as a
    # message whose body then did not decode: its letter was written with cv-ts=-1,
    # which reads back as undecodable; listed without its stream, never replayed.
    record = _record(_message(), [("cv-ns", b"orders"), ("cv-id", b"m1")],
                     timestamp=timestamp)
    msg = decode_record(record, 0, "default")
    assert msg.enqueued_at_ms == timestamp
    letter = DeadLetter.of(msg, "h", "cannot decode body as dict", 0, "DecodeError")
    key, value, headers = letter_record(letter, "app")
    stored = SimpleNamespace(key=key, value=value, headers=headers, timestamp=TS,
                             offset=3, topic="t.conveyor-dlq", partition=0)
    back = letter_from_record(stored, "app", "t", "default")
    assert back is not None and not isinstance(back.message, Undecodable), back
    assert (back.message.stream, back.message.id, back.message.body) == (
        StreamId("orders", "o-7"), "m1", b'{"n":1}')


def test_a_decoder_remembers_no_stream_whose_key_is_past_any_a_client_sends() -> None:
    # A foreign record's key is any bytes: a receiver interned each stream it read, key
    # and all, up to 4,096 of them (twice: by namespace and key, and by key), holding
    # what a worker had long handled. Such a stream is read as it is, not remembered.
    decoder = RecordDecoder(0, "default")
    keys = [b"%03d" % i + b"k" * 100_000 for i in range(50)]
    records = [_record(_message(id=f"m{i}", stream=StreamId("orders", k.decode())),
                       [("cv-ns", b"orders"), ("cv-id", f"m{i}".encode())], offset=i)
               for i, k in enumerate(keys)]
    read = decoder.decode(records)
    assert [m.stream.key for m in read] == [k.decode() for k in keys]
    held = sum(len(k) for _, k in decoder._streams) + sum(len(k) for k in decoder._keys)
    assert held < 10_000, held
    short = [_record(_message(id=f"s{i}"), [("cv-ns", b"orders"), ("cv-id", b"s")], i)
             for i in range(2)]
    first, again = decoder.decode(short)
    assert first.stream is again.stream  # a key a client sends: interned
