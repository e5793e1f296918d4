"""The Kafka wire format: a record read as a :class:`Message`, a message's headers, a
dead letter as a record and back.

Metadata lives beside the body (see "Wire format" in docs/kafka.md), so any Kafka client
can publish: key = stream key; headers carry the namespace, message id, content type,
enqueue time, attempt and the message's own headers; the value is the body. A record
without Conveyor's headers is read with the defaults (the configured namespace, JSON).
A record that is not a message — a null value (a tombstone), an empty ``cv-ns`` — is an
:class:`Undecodable`, dead-lettered with the reason, as malformed metadata is.
Dead letters are records of the dead-letter topic in the layout of
:mod:`conveyor.platform.letters`.

Headers a record's defaults already say are not written (:func:`message_headers`): no
``content-type`` for JSON, no ``cv-ts`` when the record's timestamp is the enqueue
time (Conveyor's producer sets it so). The common record then carries two headers,
``cv-ns`` and ``cv-id``, and costs aiokafka's parser (and a producer) half of what four
did. Records written with every header (older Conveyor versions, other clients, dead
letters) read as before: both layouts are the one documented format, whose absent
headers have always meant the defaults.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import msgspec

from conveyor.adapters.interning import INTERN_MAX, NAMED_MAX, StreamIds
from conveyor.adapters.kafka.aiokafka_internals import UnreadableRecord
from conveyor.platform import letters as layout
from conveyor.platform.errors import DecodeError, error_text
from conveyor.platform.ids import SequenceToken, StreamId
from conveyor.platform.message import (
    ATTEMPT_MAX,
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
    first_not_utf8,
    given_twice,
    not_utf8,
)

_decode_legacy_letter = msgspec.json.Decoder(DeadLetter).decode


TS_MAX = 2**63 - 1


def _wire_number(raw: bytes | None, field: str, limit: int) -> int | None:
    """A number header: ASCII digits, at most ``limit``; None when absent or empty."""
    if not raw:
        return None
    if not raw.isdigit() or len(raw) > 19 or int(raw) > limit:
        raise DecodeError(f"{field} is not a whole number from 0 to {limit}: {raw[:40]!r}")
    return int(raw)


NULL_VALUE = ("null value (a Kafka tombstone): no message to handle (an empty body is an "
              "empty value, not a null one)")
EMPTY_NAMESPACE = ("cv-ns header is empty (the namespace that selects the handlers; a record "
                   "without the header is read under [kafka] default_namespace)")


def _record_id(record: Any, queue: int, topic: str | None) -> str:
    """The id of a record without ``cv-id``: topic, partition (= queue) and offset."""
    return f"{record.topic if topic is None else topic}-{queue}-{record.offset}"


def _once(headers: Sequence[tuple[str, bytes | None]], name: str) -> None:
    """Raises unless every header ``name`` of a record has the same value (then the
    second reads as the first did): see :func:`given_twice`."""
    values = [raw for n, raw in headers if n == name]
    for raw in values[1:]:
        if raw != values[0]:
            raise DecodeError(given_twice(name, values[0], raw))


def record_to_message(record: Any, queue: int, default_ns: str,
                      topic: str | None = None) -> Message:
    """A fetched record as a :class:`Message`; foreign records get the defaults.

    ``topic``: the record's topic, for a record that does not say it (as
    :func:`~conveyor.adapters.kafka.aiokafka_internals.raw_records` hands them over).
    Raises on a record that is no message — a null value (:data:`NULL_VALUE`: foreign
    or not, a tombstone has no body to hand over), an empty ``cv-ns``
    (:data:`EMPTY_NAMESPACE`: absent means the default, empty is a producer's mistake) —
    on one of Conveyor's headers given twice with different values (:func:`given_twice`),
    and on metadata that cannot be read (not UTF-8, a malformed number): see
    :func:`decode_record`, which isolates such a record instead.
    """
    body = record.value
    if body is None:
        raise DecodeError(NULL_VALUE)
    ns = default_ns
    key = record.key.decode() if record.key is not None else ""
    msg_id = ""
    ctype = CONTENT_JSON
    attempt = 0
    ts = record.timestamp
    headers: dict[str, str] = {}
    seen = 0  # a bit per header of Conveyor's read: a second one is checked (_once)
    for name, raw in record.headers:
        if name == H_NAMESPACE:  # the headers Conveyor writes, most frequent first
            if seen & 1:
                _once(record.headers, name)
            seen |= 1
            if not raw:  # b"" or None: not the default a missing header means
                raise DecodeError(EMPTY_NAMESPACE)
            ns = raw.decode()
        elif name == H_ID:
            if seen & 2:
                _once(record.headers, name)
            seen |= 2
            msg_id = raw.decode() if raw is not None else ""
        elif name == H_CONTENT_TYPE:
            if seen & 4:
                _once(record.headers, name)
            seen |= 4
            ctype = raw.decode() if raw else CONTENT_JSON
        elif name == H_ENQUEUED_MS:
            if seen & 8:
                _once(record.headers, name)
            seen |= 8
            if raw and raw.isdigit() and len(raw) < 19:  # fewer than 19 digits: < TS_MAX
                ts = int(raw)
            else:
                ts = _wire_number(raw, H_ENQUEUED_MS, TS_MAX) or ts
        elif name == H_ATTEMPT:
            if seen & 16:
                _once(record.headers, name)
            seen |= 16
            attempt = _wire_number(raw, H_ATTEMPT, ATTEMPT_MAX) or 0
        elif name == H_KEY:  # the record key wins; a header that does not read is bad
            if seen & 32:
                _once(record.headers, name)
            seen |= 32
            value = raw.decode() if raw is not None else ""
            key = key or value
        else:
            headers[name] = raw.decode() if raw is not None else ""
    return Message(
        msg_id or _record_id(record, queue, topic),
        StreamId(ns, key),
        body,
        headers,
        ctype,
        attempt,
        ts,
        SequenceToken(queue, record.offset),
    )


def decode_record(record: Any, queue: int, default_ns: str,
                  topic: str | None = None) -> Message:
    """:func:`record_to_message`, or an :class:`Undecodable` keeping the record's bytes.

    One record that cannot be read never fails the batch fetched with it: its
    neighbours flow on, and it goes to the dead-letter store with the reason.
    """
    try:
        return record_to_message(record, queue, default_ns, topic)
    except UnicodeDecodeError as exc:  # which header, or the key: Python's names none
        return undecodable_record(record, queue, topic, _not_utf8_reason(record, exc))
    except Exception as exc:  # malformed metadata, whatever the failure: isolate it
        return undecodable_record(record, queue, topic, error_text(exc))


def _not_utf8_reason(record: Any, exc: UnicodeDecodeError) -> str:
    """The reason of a record whose metadata does not read as UTF-8, naming the header
    (or the record key) at fault."""
    culprit = first_not_utf8(record.headers, "header")
    if culprit is None and record.key is not None:
        try:
            record.key.decode()
        except UnicodeDecodeError:
            culprit = not_utf8("the record key", record.key)
    return f"DecodeError: {culprit}" if culprit else error_text(exc)


def undecodable_record(record: Any, queue: int, topic: str | None, reason: str
                       ) -> Undecodable:
    """What a receiver delivers for a record it cannot read: key, headers and value as
    they were (header names as text: see
    :func:`~conveyor.adapters.kafka.aiokafka_internals.lenient_records`)."""
    return Undecodable(
        id=_record_id(record, queue, topic),
        stream=StreamId("", ""),
        body=record.value if record.value is not None else b"",
        content_type=CONTENT_BYTES,
        enqueued_at_ms=record.timestamp if isinstance(record.timestamp, int) else 0,
        token=SequenceToken(queue, record.offset),
        reason=reason,
        raw_fields=tuple((name.encode(), raw) for name, raw in record.headers),
        raw_key=record.key,
        null_value=record.value is None,
    )


_OWN_HEADERS = frozenset({H_NAMESPACE, H_ID, H_CONTENT_TYPE, H_ENQUEUED_MS, H_ATTEMPT, H_KEY})


def _user_headers(headers: Sequence[tuple[str, bytes | None]]) -> dict[str, str] | None:
    """The headers after ``cv-ns`` and ``cv-id`` as a message's user headers (a
    ``traceparent`` with tracing on), as :func:`record_to_message` reads them; None when
    one of them is Conveyor's own (a content type, an attempt: the general way reads
    it). Raises on a value that is not UTF-8."""
    user: dict[str, str] = {}
    own = _OWN_HEADERS
    for name, raw in headers[2:]:
        if name in own:
            return None
        user[name] = raw.decode() if raw is not None else ""
    return user


class RecordDecoder:
    """Turns one partition's fetched records into messages: a record at a time
    (:meth:`one`, which the receiver's consumer calls as it unpacks a fetch) or a batch.

    Same result as :func:`decode_record` on each record. The common record —
    ``cv-ns`` and ``cv-id`` first (as :func:`message_headers` writes a JSON message),
    then user headers if any, a key and a value — is read without a loop over
    Conveyor's headers, and its stream id is
    interned: a batch of one stream's records shares one :class:`StreamId` (the cache's
    lane lookups compare it by identity). Any other record goes the general way; a
    record that cannot be read becomes an :class:`Undecodable` without failing the
    batch. ``topic``: the records' topic, for records that do not say it (raw ones).
    """

    __slots__ = ("_keys", "_last_ns", "_ns", "_queue", "_streams", "_topic")

    def __init__(self, queue: int, default_ns: str, topic: str | None = None) -> None:
        self._queue = queue
        self._ns = default_ns
        self._topic = topic
        self._streams = StreamIds()
        # The last namespace read (as the wire has it) and its keys' stream ids: most
        # records share one namespace, whose ids are then found by key alone (no tuple
        # built and hashed a record). Bounded as the interning is (INTERN_MAX).
        self._last_ns = b""
        self._keys: dict[bytes, StreamId] = {}

    def _stream(self, ns: bytes, key: bytes) -> StreamId:
        """The interned stream id of ``key`` in namespace ``ns`` (as the wire has them)."""
        if ns != self._last_ns:  # another namespace: its own keys from now on
            self._last_ns = ns
            self._keys = {}
        keys = self._keys
        sid = keys.get(key)
        if sid is None:
            sid = self._streams[ns, key]
            if len(ns) + len(key) <= NAMED_MAX:  # a stream a client can name
                if len(keys) >= INTERN_MAX:
                    keys.clear()
                keys[key] = sid
        return sid

    def decode(self, records: Sequence[Any]) -> list[Message]:
        one, unreadable = self.one, self.unreadable
        return [unreadable(r) if isinstance(r, UnreadableRecord) else one(r) for r in records]

    def unreadable(self, record: UnreadableRecord) -> Undecodable:
        """A record aiokafka's parser refused (a header name that is not UTF-8), as
        :func:`~conveyor.adapters.kafka.aiokafka_internals.lenient_records` read it: undecodable."""
        return undecodable_record(record, self._queue, self._topic,
                                  f"DecodeError: {record.reason}")

    def one(self, r: Any) -> Message:
        """One record as :func:`decode_record` reads it (what a receiver's consumer
        calls on each record as it unpacks a fetch: ``record_converters``)."""
        headers = r.headers
        key = r.key
        if len(headers) == 2 and key is not None:
            (n0, ns), (n1, ident) = headers
            value = r.value
            if n0 == H_NAMESPACE and n1 == H_ID and ns and ident and value is not None:
                try:  # (self._stream, inlined: this is every plain record)
                    if ns != self._last_ns:
                        self._last_ns = ns
                        self._keys = {}
                    keys = self._keys
                    sid = keys.get(key)
                    if sid is None:
                        sid = self._stream(ns, key)
                    return Message(
                        ident.decode(),
                        sid,
                        value,
                        {},
                        CONTENT_JSON,
                        0,
                        r.timestamp,
                        SequenceToken(self._queue, r.offset),
                    )
                except Exception:  # not UTF-8: the general way isolates it
                    pass
        elif len(headers) > 2 and key is not None:
            (n0, ns), (n1, ident) = headers[0], headers[1]
            value = r.value
            if n0 == H_NAMESPACE and n1 == H_ID and ns and ident and value is not None:
                try:  # user headers after Conveyor's two (a traceparent, tracing on)
                    if len(headers) == 3:  # one: _user_headers' loop without the call
                        name, raw = headers[2]
                        user = ({name: raw.decode()} if raw is not None
                                and name not in _OWN_HEADERS else _user_headers(headers))
                    else:
                        user = _user_headers(headers)
                    if user is not None:
                        sid = self._keys.get(key) if ns == self._last_ns else None
                        return Message(ident.decode(), sid or self._stream(ns, key), value,
                                       user, CONTENT_JSON, 0, r.timestamp,
                                       SequenceToken(self._queue, r.offset))
                except Exception:  # not UTF-8: the general way isolates it
                    pass
        return decode_record(r, self._queue, self._ns, self._topic)


def message_headers(msg: Message, full: bool = False) -> list[tuple[str, bytes]]:
    """The record headers of ``msg`` when the record's timestamp is its enqueue time
    (``timestamp=msg.enqueued_at_ms or None``): ``content-type`` only when it is not
    JSON, no ``cv-ts`` (see the module docstring). ``full``: every header, for a record
    whose timestamp is not the message's (a dead letter)."""
    headers = [(H_NAMESPACE, msg.stream.namespace.encode()), (H_ID, msg.id.encode())]
    if full or msg.content_type != CONTENT_JSON:
        headers.append((H_CONTENT_TYPE, msg.content_type.encode()))
    if full:  # a record without a timestamp (-1) has no enqueue time: 0 reads as none
        headers.append((H_ENQUEUED_MS, str(max(msg.enqueued_at_ms, 0)).encode()))
    if msg.attempt:
        headers.append((H_ATTEMPT, str(msg.attempt).encode()))
    if msg.headers:  # most messages have none: no generator built for them
        headers += [(k, v.encode()) for k, v in msg.headers.items()]
    return headers


def letter_record(letter: DeadLetter, app: str) -> tuple[bytes | None, bytes | None, list[Any]]:
    """A dead letter as (key, value, headers): ``cv-dl-*`` headers first, then the
    message's own (an undecodable one's byte for byte, its value null if it was: read
    back, it is undecodable again, not an empty body); see conveyor.platform.letters."""
    headers: list[tuple[str, bytes | None]] = [
        (name, value.encode()) for name, value in layout.meta_pairs(letter, app)
    ]
    msg = letter.message
    if isinstance(msg, Undecodable) and letter.form == "full":
        headers += [(name.decode(), value) for name, value in msg.raw_fields]
        return msg.raw_key, None if msg.null_value else msg.body, headers
    headers += message_headers(msg, full=True)  # read back with the letter's timestamp
    return msg.stream.key.encode(), msg.body, headers


def letter_from_record(record: Any, app: str, topic: str, default_ns: str) -> DeadLetter | None:
    """A stored dead letter of ``app`` read back; None for another app's, or not a letter.
    A record aiokafka's parser refused (an :class:`UnreadableRecord`) is a letter whose
    message is :class:`Undecodable`, with the reason."""
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
    if isinstance(record, UnreadableRecord):  # a name not UTF-8 (written by hand: a
        # letter Conveyor stores has them escaped): the message is not what it says
        message: Message = undecodable_record(original, token.queue, None,
                                              f"DecodeError: {record.reason}")
    else:
        message = decode_record(original, token.queue, default_ns)
    if values[3] == b"Undecodable" and not isinstance(message, Undecodable):
        # Stored with its header names escaped (a record aiokafka's parser refused):
        # readable now, it is still not the message that was published; not replayed.
        reason = values[4].decode("utf-8", "replace")
        message = undecodable_record(original, token.queue, None, reason)
    return layout.letter_from_meta(values, message)
