"""The Redis wire format: stream entries to messages and back, dead-letter entries.

Every entry carries the message's metadata as fields beside the body
(``cv-ns``, ``cv-key``, ``cv-id``, ``content-type``, ``cv-ts``, ``cv-attempt``,
``body``; any other field is a user header), so ``redis-cli XADD`` can publish.
:class:`EntryDecoder` reads entries laid out as :func:`encode_fields` writes them by
position; anything else goes the general (dict) way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from conveyor.adapters.interning import StreamIds
from conveyor.adapters.redis.keys import token_of
from conveyor.platform import letters as layout
from conveyor.platform.errors import (
    ConveyorError,
    DecodeError,
    InvalidArgumentError,
    error_text,
)
from conveyor.platform.ids import SequenceToken, StreamId
from conveyor.platform.letters import StoredLetter
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
    headers_size,
    now_ms,
)

F_BODY = "body"
_NS, _KEY, _ID, _CT, _TS, _ATT, _BODY = (
    f.encode() for f in (H_NAMESPACE, H_KEY, H_ID, H_CONTENT_TYPE, H_ENQUEUED_MS, H_ATTEMPT,
                         F_BODY)
)
_KNOWN = frozenset({_NS, _KEY, _ID, _CT, _TS, _ATT, _BODY})
# Header names that would be read back as metadata (or the body), not as headers.
_RESERVED = frozenset(f.decode() for f in _KNOWN)
# The field order encode_fields writes: entries in it decode without building a dict.
_LAYOUT = [_NS, _KEY, _ID, _CT, _TS, _BODY]
_LAYOUT_LEN = 2 * len(_LAYOUT)
_TYPES_MAX = 64  # distinct content types remembered per receiver
PUBLISH_CHUNK = 1000
"""Entries per publishing script call at most (one call runs ~1 ms with small bodies)."""
PUBLISH_CHUNK_BYTES = 4 << 20
"""Bytes of bodies and headers per publishing script call, about (a call with one larger
message goes alone)."""
MAX_HEADERS = 3900
"""A message's own headers at most. Every entry is written by a script, whose
``unpack`` hands ``XADD`` at most about 8,000 values (Lua's stack): 3,998 headers was the
most a publish wrote, and a dead letter (ten fields more) or a replay must still fit.
The client refuses a message with more as it builds it (``RedisAdapter.max_headers``),
before any send: what reaches :func:`extra_fields` fits."""
_decode_legacy_letter = msgspec.msgpack.Decoder(DeadLetter).decode
_decode_numbers = msgspec.json.Decoder(list[int]).decode


def extra_fields(msg: Message) -> list[bytes | str]:
    """The fields after the fixed ones: ``cv-attempt`` if set, then the user's headers."""
    extra: list[bytes | str] = [_ATT, b"%d" % msg.attempt] if msg.attempt else []
    for name, value in msg.headers.items():
        if name in _RESERVED:  # the caller's data: no retry can store it
            raise InvalidArgumentError(
                f"message {msg.id}: header {name!r} is reserved by the Redis wire format "
                f"(reserved: {', '.join(sorted(_RESERVED))}); rename the header"
            )
        extra += (name, value)
    return extra


def encode_fields(msg: Message) -> dict[bytes | str, bytes | str]:
    """The stream fields of one message (see the module docstring), in the order
    :class:`EntryDecoder` reads fastest."""
    fields: dict[bytes | str, bytes | str] = {
        _NS: msg.stream.namespace,
        _KEY: msg.stream.key,
        _ID: msg.id,
        _CT: msg.content_type,
        _TS: b"%d" % (msg.enqueued_at_ms or now_ms()),
        _BODY: msg.body,
    }
    extra = extra_fields(msg)
    fields.update(zip(extra[0::2], extra[1::2], strict=True))
    return fields


def enqueue_args(messages: Sequence[Message]) -> list[bytes | str | int]:
    """The entries as :data:`~conveyor.adapters.redis.scripts.ENQUEUE` reads them (after
    its first argument): per message its extra fields' count, the six metadata values in
    :func:`encode_fields`' order (the script supplies their names), the extra fields."""
    args: list[bytes | str | int] = []
    for msg in messages:
        extra: Sequence[bytes | str] = (
            extra_fields(msg) if msg.attempt or msg.headers else ())  # () is not built anew
        stream = msg.stream
        args += (len(extra), stream.namespace, stream.key, msg.id, msg.content_type,
                 msg.enqueued_at_ms or now_ms(), msg.body)
        if extra:
            args += extra
    return args


def publish_chunks(messages: Sequence[Message]) -> list[Sequence[Message]]:
    """``messages`` cut into script calls of at most :data:`PUBLISH_CHUNK` entries and
    about :data:`PUBLISH_CHUNK_BYTES` of bodies and headers (a script blocks the server
    while it runs, and Redis caps one argument at 512 MB)."""
    sizes = [len(m.body) + headers_size(m.headers) if m.headers else len(m.body)
             for m in messages]
    if len(messages) <= PUBLISH_CHUNK and sum(sizes) <= PUBLISH_CHUNK_BYTES:
        return [messages]
    chunks: list[Sequence[Message]] = []
    start, size = 0, 0
    for i, more in enumerate(sizes):
        if i > start and (i - start >= PUBLISH_CHUNK or size + more > PUBLISH_CHUNK_BYTES):
            chunks.append(messages[start:i])
            start, size = i, 0
        size += more
    if start < len(messages):
        chunks.append(messages[start:])
    return chunks


def tokens_of_runs(runs: bytes, queue: int) -> list[SequenceToken]:
    """The entry ids :data:`~conveyor.adapters.redis.scripts.ENQUEUE` returns as runs
    (``MS-SEQ COUNT ...``), one token each."""
    words = runs.split()
    tokens: list[SequenceToken] = []
    for first, count in zip(words[0::2], words[1::2], strict=True):
        start = token_of(first, queue)
        tokens += (SequenceToken(queue, start.major, start.minor + k) for k in range(int(count)))
    return tokens


TS_MAX = 2**63 - 1


def wire_number(raw: bytes, field: str, limit: int) -> int:
    """A number field as the wire format writes it: ASCII digits, at most ``limit``.

    Stricter than ``int()``, which takes signs, spaces, underscores and other scripts'
    digits: a value that would not survive a round trip is a malformed entry.
    """
    if not raw.isdigit() or len(raw) > 19 or int(raw) > limit:
        raise DecodeError(f"{field} is not a whole number from 0 to {limit}: {raw[:40]!r}")
    return int(raw)


def decode_entry(queue: int, eid: bytes, fields: dict[bytes, bytes]) -> Message:
    """A message from a stream entry (raises on malformed metadata: see EntryDecoder).

    Missing optional metadata gets neutral defaults; ``cv-ns`` and ``body`` are required
    (an empty body is an empty field).
    """
    get = fields.get
    token = token_of(eid, queue)
    ns = get(_NS)
    if not ns:
        raise DecodeError("no cv-ns field (the namespace that selects the handlers)")
    body = get(_BODY)
    if body is None:
        raise DecodeError("no body field (an empty body is written as an empty field)")
    headers = {k.decode(): v.decode() for k, v in fields.items() if k not in _KNOWN}
    ts = get(_TS)
    att = get(_ATT)
    ident = get(_ID)
    ctype = get(_CT)
    return Message(
        id=ident.decode() if ident else eid.decode(),
        stream=StreamId(ns.decode(), (get(_KEY) or b"").decode()),
        body=body,
        headers=headers,
        content_type=ctype.decode() if ctype else CONTENT_JSON,
        attempt=wire_number(att, H_ATTEMPT, ATTEMPT_MAX) if att else 0,
        enqueued_at_ms=wire_number(ts, H_ENQUEUED_MS, TS_MAX) if ts else token.major,
        token=token,
    )


def undecodable_entry(queue: int, eid: bytes, fl: list[bytes], exc: Exception) -> Undecodable:
    """What a receiver delivers for an entry it cannot read: every field, byte for byte."""
    raw = tuple(zip(fl[0::2], fl[1::2], strict=False))
    body = next((value for name, value in raw if name == _BODY), b"")
    token = token_of(eid, queue)
    if isinstance(exc, UnicodeDecodeError):  # which field: Python's error names none
        culprit = first_not_utf8(raw, "field", _BODY)
        if culprit is not None:
            exc = DecodeError(culprit)
    return Undecodable(
        id=eid.decode(), stream=StreamId("", ""), body=body, content_type=CONTENT_BYTES,
        enqueued_at_ms=token.major, token=token,
        reason=error_text(exc), raw_fields=raw,
    )


def letter_entry(letter: DeadLetter, app: str) -> list[bytes | str]:
    """A dead letter's stream fields: ``cv-dl-*`` first, then the message's own fields
    (an undecodable one's byte for byte); see conveyor.platform.letters."""
    flat: list[bytes | str] = [x for pair in layout.meta_pairs(letter, app) for x in pair]
    msg = letter.message
    if isinstance(msg, Undecodable) and letter.form == "full":
        for name, value in msg.raw_fields:
            flat += (name, value if value is not None else b"")
    else:
        flat += [x for pair in encode_fields(msg).items() for x in pair]
    return flat


def letter_from_entry(fl: list[bytes]) -> DeadLetter | None:
    """A stored dead letter read back; None for an entry that is not one."""
    names = fl[0::2]
    if layout.is_letter(names):
        count = layout.meta_count(fl[1])
        values = fl[1 : 2 * count : 2]
        token = SequenceToken.parse(values[7].decode()) if values[7] else SequenceToken(0, 0)
        eid = b"%d-%d" % (token.major, token.minor)
        message = EntryDecoder(token.queue).decode(eid, fl[2 * count :])
        return layout.letter_from_meta(values, message)
    if b"letter" in names:  # stored by Conveyor 0.1 (one msgpack field)
        return _decode_legacy_letter(fl[2 * names.index(b"letter") + 1])
    return None


def stored_letters(entries: list[Any], skipped: list[str] | None = None) -> list[StoredLetter]:
    """The letters of a dead-letter stream's entries, under their entry ids; the ids of
    the entries that are no letters go to ``skipped``.

    An entry is no letter when it lacks the layout's fields (another tool's ``XADD``), or
    has them but cannot be read back (corrupt: a ``cv-dl-token`` that is no token, a
    0.1 ``letter`` field that is no msgpack letter). It is skipped, not raised: one such
    entry made every listing of the app fail."""
    out = []
    for eid, fields in entries:
        try:
            letter = letter_from_entry(fields) if fields else None
        except Exception:  # anyone's bytes: whatever they break is "no letter"
            letter = None
        if letter is not None:
            out.append(StoredLetter(eid.decode(), letter))
        elif skipped is not None:
            skipped.append(eid.decode())
    return out


class _NotPlain(ConveyorError):
    """An entry :meth:`EntryDecoder._build` leaves to the entry-at-a-time path."""


def _user_headers(fl: list[bytes]) -> dict[str, str]:
    """The user headers after :func:`encode_fields`' layout; :class:`_NotPlain` for a
    ``cv-attempt`` or a repeated field (the entry-at-a-time path reads those)."""
    known = _KNOWN
    if len(fl) == _LAYOUT_LEN + 2:  # one header (a traceparent): no loop
        name = fl[_LAYOUT_LEN]
        if name in known:
            raise _NotPlain
        return {name.decode(): fl[_LAYOUT_LEN + 1].decode()}
    headers: dict[str, str] = {}
    for at in range(_LAYOUT_LEN, len(fl), 2):
        name = fl[at]
        if name in known:
            raise _NotPlain
        headers[name.decode()] = fl[at + 1].decode()
    return headers


class EntryDecoder:
    """Turns raw entries (``[id, [field, value, ...]]``) of one queue into messages.

    Same result as :func:`decode_entry` on the entry's field dict, except that an entry
    whose metadata cannot be read becomes an :class:`Undecodable` (with its raw fields
    and the reason) instead of an exception: one bad entry never fails the batch it came
    with. Entries laid out as
    :func:`encode_fields` writes them are read by position; stream ids and content
    types are interned, so a batch of one stream's messages shares one
    :class:`StreamId` (and the cache's lane lookups compare it by identity).
    """

    __slots__ = ("_queue", "_streams", "_types")

    def __init__(self, queue: int) -> None:
        self._queue = queue
        self._streams = StreamIds()
        self._types: dict[bytes, str] = {CONTENT_JSON.encode(): CONTENT_JSON}

    def _type(self, ctype: bytes) -> str:
        types = self._types
        if len(types) >= _TYPES_MAX:
            types.clear()
        text = types[ctype] = ctype.decode()
        return text

    def decode(self, eid: bytes, fl: list[bytes]) -> Message:
        try:
            if len(fl) < _LAYOUT_LEN or fl[0:_LAYOUT_LEN:2] != _LAYOUT:
                return self._general(eid, fl)
            att: bytes | None = None
            headers: dict[str, str] = {}
            if len(fl) > _LAYOUT_LEN:
                for i in range(_LAYOUT_LEN, len(fl) - 1, 2):
                    name = fl[i]
                    if name == _ATT and att is None:
                        att = fl[i + 1]
                    elif name in _KNOWN:  # a repeated field: the general way's rules
                        return self._general(eid, fl)
                    else:
                        headers[name.decode()] = fl[i + 1].decode()
            ns, key, ident, ctype, ts = fl[1], fl[3], fl[5], fl[7], fl[9]
            if not ns or att or not (ts.isdigit() and len(ts) < 19):
                # Rare here (a retried message, a hand-written entry): the strict path.
                return self._general(eid, fl)
            stream = self._streams[ns, key]
            ms, _, seq = eid.partition(b"-")
            major = int(ms)
            return Message(
                ident.decode() if ident else eid.decode(),
                stream,
                fl[11],
                headers,
                (self._types.get(ctype) or self._type(ctype)) if ctype else CONTENT_JSON,
                0,
                int(ts),  # ASCII digits, fewer than 19: within TS_MAX
                SequenceToken(self._queue, major, int(seq or 0)),
            )
        except Exception as exc:  # malformed metadata, whatever the failure: isolate it
            return undecodable_entry(self._queue, eid, fl, exc)

    def decode_all(self, entries: Sequence[Any]) -> list[Message]:
        """The messages of a reply's entries (``[id, fields]``; entries without fields —
        trimmed or deleted while pending — are left out), as :meth:`decode` reads each.

        A batch whose every entry is in :func:`encode_fields`' layout, followed by
        user headers if any (a ``traceparent`` with tracing on) but no ``cv-attempt``
        (the common reply), has its numbers — each id's two parts and each ``cv-ts`` —
        read in one call rather than three ``int()`` an entry; any other batch is read
        an entry at a time.
        """
        layout, length = _LAYOUT, _LAYOUT_LEN
        numbers: list[bytes] = []
        with_headers = False
        for eid, fl in entries:
            if not fl or fl[0:length:2] != layout:
                return self._each(entries)
            if len(fl) != length:
                if len(fl) < length or len(fl) & 1:
                    return self._each(entries)
                with_headers = True
            ts = fl[9]
            if not (ts.isdigit() and len(ts) < 19) or not fl[1]:
                return self._each(entries)
            numbers += (eid, ts)
        try:  # "MS-SEQ" and TS as JSON numbers: MS, SEQ, TS per entry
            parsed = _decode_numbers(b"[" + b",".join(numbers).replace(b"-", b",") + b"]")
        except msgspec.DecodeError:  # a number JSON refuses (a leading 0): one by one
            return self._each(entries)
        if len(parsed) != 3 * len(entries):
            return self._each(entries)
        try:
            return self._build(entries, parsed, with_headers)
        except Exception:  # metadata that does not read (not UTF-8): isolate the entry
            return self._each(entries)

    def _build(self, entries: Sequence[Any], parsed: list[int], with_headers: bool
               ) -> list[Message]:
        queue, streams, types = self._queue, self._streams, self._types
        out: list[Message] = []
        append = out.append
        for i, (eid, fl) in enumerate(entries):
            ns, key, ident, ctype = fl[1], fl[3], fl[5], fl[7]
            j = 3 * i
            append(Message(
                ident.decode() if ident else eid.decode(),
                streams[ns, key],
                fl[11],
                _user_headers(fl) if with_headers else {},
                (types.get(ctype) or self._type(ctype)) if ctype else CONTENT_JSON,
                0,
                parsed[j + 2],
                SequenceToken(queue, parsed[j], parsed[j + 1]),
            ))
        return out

    def _each(self, entries: Sequence[Any]) -> list[Message]:
        decode = self.decode
        return [decode(eid, fl) for eid, fl in entries if fl]

    def _general(self, eid: bytes, fl: list[bytes]) -> Message:
        it = iter(fl)
        fields = dict(zip(it, it, strict=False))
        if 2 * len(fields) < len(fl) - 1:  # a name repeated: the dict kept its last value
            _refuse_conflicts(fl)
        return decode_entry(self._queue, eid, fields)


def _refuse_conflicts(fl: list[bytes]) -> None:
    """Raises on a wire-format field (``cv-ns``, ``body``, …) given twice with different
    values (:func:`~conveyor.platform.message.given_twice`); a user header given twice
    keeps its last value, as Kafka's ``lastHeader`` reads one."""
    first: dict[bytes, bytes] = {}
    for at in range(0, len(fl) - 1, 2):
        name, value = fl[at], fl[at + 1]
        if name in _KNOWN:
            seen = first.setdefault(name, value)
            if seen != value:
                raise DecodeError(given_twice(name.decode(), seen, value))
