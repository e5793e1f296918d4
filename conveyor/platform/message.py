"""The message envelope and the wire format's names.

The body travels as opaque bytes next to its metadata, never wrapped in it, so any
broker client can publish: see "Wire format" in the README.
"""

from __future__ import annotations

import os
import time

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
RESERVED_HEADERS = frozenset(
    {H_NAMESPACE, H_KEY, H_ID, H_CONTENT_TYPE, H_ATTEMPT, H_ENQUEUED_MS}
)


def new_message_id() -> str:
    """128 random bits as 32 hex digits (a UUID4's entropy without building a UUID)."""
    return os.urandom(16).hex()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Message(msgspec.Struct, frozen=True, gc=False):
    """One message as producers create it and handlers' contexts see it.

    ``token`` is set by the receiver that delivered it (its position in the queue);
    ``attempt`` counts deliveries to a handler that failed before (0 on first try).
    """

    id: str
    stream: StreamId
    body: bytes
    headers: dict[str, str] = {}
    content_type: str = CONTENT_JSON
    attempt: int = 0
    enqueued_at_ms: int = 0
    token: SequenceToken | None = None

    def with_token(self, token: SequenceToken) -> Message:
        return msgspec.structs.replace(self, token=token)


class DeadLetter(msgspec.Struct, frozen=True):
    """A message that could not be handled, with why."""

    message: Message
    handler: str
    error_type: str
    error: str
    attempts: int
    failed_at_ms: int
