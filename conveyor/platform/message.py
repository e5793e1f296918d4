"""The message envelope and the wire format's names.

The body travels as opaque bytes next to its metadata, never wrapped in it, so any
broker client can publish: see "Wire format" in the README.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping

import msgspec

from conveyor.platform.ids import SequenceToken, StreamId

CONTENT_JSON = "application/json"
CONTENT_MSGPACK = "application/msgpack"
CONTENT_BYTES = "application/octet-stream"
CONTENT_TEXT = "text/plain"

# Metadata names used by every backend (Kafka headers, Redis stream fields).
H_NAMESPACE = "cv-ns"
H_KEY = "cv-key"
H_ID = "cv-id"
H_CONTENT_TYPE = "content-type"
H_ATTEMPT = "cv-attempt"
H_ENQUEUED_MS = "cv-ts"
H_TRACEPARENT = "traceparent"
H_TRACESTATE = "tracestate"
H_REPLAY_OF = "cv-replay-of"
"""Set by ``conveyor dlq replay``: the id of the dead letter a message was replayed from."""
H_BODY = "body"
"""The payload's field on Redis (Kafka: the record value). Reserved on every backend, so
that a message's headers travel on any of them."""
RESERVED_HEADERS = frozenset(
    {H_NAMESPACE, H_KEY, H_ID, H_CONTENT_TYPE, H_ATTEMPT, H_ENQUEUED_MS, H_REPLAY_OF, H_BODY}
)
ATTEMPT_MAX = 2**31 - 1
"""The largest ``cv-attempt`` the wire carries (every reader refuses more), so the most
calls a handler's retry policy may make, and the most deliveries it may allow
(``retry_attempts``, ``max_deliveries``)."""
MAX_HEADER_BYTES = 64 << 10
"""A message's own headers at most, their names and values together, in UTF-8 bytes
(64 KiB): the client refuses more as it builds the message, on every backend. Headers
are metadata (a tenant, a trace context), not a second body; ``[queues] max_body_bytes``
bounds the body alone, so without this bound a message of a few bytes of body and
megabytes of headers reached the broker (Redis refuses an argument past 512 MB by
cutting the connection)."""


def headers_size(headers: Mapping[str, str]) -> int:
    """A message's headers' names and values, in characters (bytes, for ASCII): what
    they count for beside the body against ``[worker] prefetch_bytes`` and a publish
    chunk's size. A plain loop: it runs for every traced message (its ``traceparent``),
    and took 284 ns on one such header where ``sum`` of a comprehension took 449."""
    size = 0
    for name, value in headers.items():
        size += len(name) + len(value)
    return size


def given_twice(name: str, first: bytes | None, second: bytes | None) -> str:
    """Why an entry or record carrying the wire-format field ``name`` twice, with
    different values, is no message: which one its producer meant is not known (a
    ``cv-ns`` would pick the handler, a ``body`` the payload). The same value twice is
    one value, and reads as one."""
    def shown(raw: bytes | None) -> str:
        return "null" if raw is None else repr(raw[:40])

    return (f"{name} given twice with different values ({shown(first)}, then "
            f"{shown(second)}): which one is meant is not known")


def first_not_utf8(fields: Iterable[tuple[bytes | str, bytes | None]], kind: str,
                   skip: bytes | None = None) -> str | None:
    """Why an entry or record whose metadata does not read as UTF-8 is no message,
    naming the first of its ``fields`` (a ``kind``: "field", "header") at fault — its
    name, or its value (a field ``skip`` holds the payload, any bytes) — or None if each
    reads. Asked once a decode has failed: UnicodeDecodeError names no field."""
    for name, value in fields:
        if isinstance(name, bytes) and not _reads(name):
            return not_utf8(f"a {kind}'s name", name)
        if value is not None and name != skip and not _reads(value):
            shown = name if isinstance(name, str) else name.decode()
            return not_utf8(f"{kind} {shown!r}", value)
    return None


def not_utf8(what: str, raw: bytes) -> str:
    """Why ``what`` (a field, a header, a key, named) is no text: ``raw`` does not read
    as UTF-8."""
    return f"{what} is not UTF-8 text: {raw[:40]!r}"


def _reads(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


def new_message_id() -> str:
    """128 random bits as 32 hex digits (a UUID4's entropy without building a UUID)."""
    return os.urandom(16).hex()


_ID_SUFFIXES = tuple(f"{i:08x}" for i in range(1024))
"""The last 8 hex digits of a batch's first 1,024 ids (see :func:`new_message_ids`)."""


def new_message_ids(count: int) -> list[str]:
    """``count`` ids for one batch, 32 hex digits each like :func:`new_message_id`'s:
    96 random bits drawn once for the batch, then the message's place in it as 8 hex
    digits (``…00000000``, ``…00000001``, …).

    Unique across processes and restarts as random ids are (a batch's 96 bits repeat
    with odds of 2**-96 per pair of batches), at the cost of one concatenation a
    message instead of 16 random bytes read and cut out of a hex string. Ids are
    opaque: nothing reads their parts, and any string is a valid id on the wire."""
    prefix = os.urandom(12).hex()
    ids = list(map(prefix.__add__, _ID_SUFFIXES[:count]))
    if count > len(_ID_SUFFIXES):
        ids += [f"{prefix}{i:08x}" for i in range(len(_ID_SUFFIXES), count)]
    return ids


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Message(msgspec.Struct, frozen=True, gc=False):
    """One message as producers create it and handlers' contexts see it.

    ``token`` is set by the receiver that delivered it (its position in the queue);
    ``attempt`` counts deliveries to a handler that failed before (0 on first try);
    ``deliveries`` counts the times the broker has handed it to a worker, this one
    included (1 the first time; more after a worker crashed or lost the queue holding it).
    """

    id: str
    stream: StreamId
    body: bytes
    headers: dict[str, str] = {}
    content_type: str = CONTENT_JSON
    attempt: int = 0
    enqueued_at_ms: int = 0
    token: SequenceToken | None = None
    deliveries: int = 1
    last_cause: str = ""
    """Not on the wire: why the previous delivery did not finish, where a worker recorded
    it (a stall past the lease); named by the delivery limit's dead letter."""

    def with_token(self, token: SequenceToken) -> Message:
        return msgspec.structs.replace(self, token=token)


class Undecodable(Message, frozen=True, gc=False):
    """A queue entry whose metadata could not be read: it goes to the dead-letter store.

    Receivers build one instead of failing the whole batch it came with, so its
    neighbours flow on. ``raw_fields`` are the entry's fields (Redis) or headers (Kafka)
    byte for byte, in their order; ``raw_key`` the Kafka record key; ``body`` the raw
    payload, and ``null_value`` whether a Kafka record had none at all (a null value, a
    tombstone: ``body`` is then ``b""``, and its dead letter's value is null again).
    ``stream.namespace`` is ``""``, which no handler can subscribe to, so the agent
    routes it to the dead-letter path without a lookup of its own.
    """

    reason: str = ""
    raw_fields: tuple[tuple[bytes, bytes | None], ...] = ()
    raw_key: bytes | None = None
    null_value: bool = False


ERROR_TEXT_MAX = 4096
"""Longest error text kept in a dead letter (a hostile body can make errors huge)."""

LETTER_FORMS = ("full", "minimal", "bare")


class DeadLetter(msgspec.Struct, frozen=True):
    """A message that could not be handled, with why.

    ``form`` says how much of it the store kept: ``full`` (the message as it was, every
    field and header), ``minimal`` (its id and body, when the full letter could not be
    stored) or ``bare`` (its id only, when the body could not be stored either); the
    reason is always there, and says why the shorter form was used.
    """

    message: Message
    handler: str
    error_type: str
    error: str
    attempts: int
    failed_at_ms: int
    form: str = "full"

    @classmethod
    def of(cls, message: Message, handler: str, error: BaseException | str, attempts: int,
           error_type: str | None = None) -> DeadLetter:
        """A full letter for ``message``, its error text bounded (``ERROR_TEXT_MAX``).

        An exception whose ``str()`` itself raises gets a placeholder text (as a
        traceback shows it), and text that is not UTF-8 (lone surrogates) is escaped:
        storing its letter must not fail with it."""
        try:
            text = str(error)
        except Exception as exc:  # the error's own __str__ is broken: keep the letter
            text = f"<str() of the error failed: {type(exc).__name__}>"
        if not text.isascii():
            # A lone surrogate (a path decoded with surrogateescape, say) is no UTF-8:
            # every store would refuse every form of the letter, for good.
            text = text.encode("utf-8", "backslashreplace").decode("utf-8")
        if len(text) > ERROR_TEXT_MAX:
            text = text[:ERROR_TEXT_MAX] + f"... ({len(text)} characters)"
        kind = error_type or (type(error).__name__ if isinstance(error, BaseException) else "")
        return cls(message, handler, kind, text, attempts, now_ms())

    @property
    def reason(self) -> str:
        """``Type: error``, as a traceback's last line ends; the error alone where the
        letter has no type (one stored by another producer, or made from a text)."""
        return f"{self.error_type}: {self.error}" if self.error_type else self.error

    def shortened(self, why: str) -> DeadLetter | None:
        """The next shorter form of this letter, or None if it is already ``bare``.

        ``minimal`` keeps the id, stream, body and content type; ``bare`` keeps the id and
        the stream (when the body's size was the problem). ``why`` (what failed storing
        the longer form) is added to the error text.
        """
        msg = self.message
        note = f"{self.error} [stored {{}} form: {why}]"
        if self.form == "full":
            short = Message(msg.id, msg.stream, msg.body, {}, msg.content_type,
                            msg.attempt, msg.enqueued_at_ms, msg.token)
            if isinstance(msg, Undecodable):  # its stream and id may be placeholders
                short = Message(msg.id, msg.stream, msg.body, {}, msg.content_type, 0, 0,
                                msg.token)
            return msgspec.structs.replace(
                self, message=short, form="minimal", error=note.format("minimal")
            )
        if self.form == "minimal":
            bare = Message(msg.id, msg.stream, b"", {}, msg.content_type, msg.attempt,
                           msg.enqueued_at_ms, msg.token)
            return msgspec.structs.replace(
                self, message=bare, form="bare",
                error=note.format(f"bare (body of {len(msg.body)} bytes dropped)"),
            )
        return None
