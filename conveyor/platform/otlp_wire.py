"""OTLP trace protobuf, written by hand: the bytes ``encode_spans`` would serialize.

The SDK's OTLP exporter builds protobuf message objects for every span, attribute and
value, then serializes them: about 42 µs a consumer span on the reference machine.
Most of a consumer span never changes — its name, kind and the handler's attributes —
so :class:`~conveyor.platform.spans.SpanShape` encodes those once with the helpers
here, and a span adds only its ids, times and per-message strings.

Wire format of ``opentelemetry/proto/trace/v1/trace.proto`` (field numbers checked
against ``opentelemetry-proto`` 1.45 by ``tests/unit/test_lean_spans.py``, which
decodes these bytes and compares them with the SDK's own encoding). Fields come in
field-number order and proto3 defaults are left out, as the protobuf runtime does, so
for the same span the bytes are the SDK's bytes.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from conveyor.platform.errors import InvalidArgumentError

_logger = logging.getLogger(__name__)

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_MASK64 = (1 << 64) - 1
_DOUBLE = struct.Struct("<d")


def varint(n: int) -> bytes:
    """Base-128 varint of a non-negative ``n`` (negative int64s: pass ``n & 2**64-1``)."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


SMALL_VARINTS: tuple[bytes, ...] = tuple(varint(i) for i in range(16384))
"""Varints of 0..16383 (one or two bytes), looked up instead of computed on the hot path."""


def length(n: int) -> bytes:
    return SMALL_VARINTS[n] if n < 16384 else varint(n)


def field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field (``tag`` is ``number << 3 | 2``), present even if empty."""
    n = len(payload)
    return bytes((tag,)) + (SMALL_VARINTS[n] if n < 16384 else varint(n)) + payload


def text(tag: int, value: str | None) -> bytes:
    """A proto3 string field: absent when empty, as the runtime writes it."""
    return field(tag, value.encode()) if value else b""


def any_value(value: Any) -> bytes:
    """An ``AnyValue``'s body, choosing its case in the order the SDK's
    ``_encode_value`` does. Raises on a value the SDK's encoder rejects too."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return field(0x0A, value.encode())
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise InvalidArgumentError(f"Value out of range: {value}")
        return b"\x18" + varint(value & _MASK64)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    if isinstance(value, bytes):
        return field(0x3A, value)
    if isinstance(value, Sequence):
        return field(0x2A, b"".join(field(0x0A, any_value(v)) for v in value))
    if isinstance(value, Mapping):
        return field(0x32, b"".join(field(0x0A, key_value(str(k), v)) for k, v in value.items()))
    raise InvalidArgumentError(f"Invalid type {type(value)} of value {value}")


def key_value(key: str, value: Any) -> bytes:
    return text(0x0A, key) + field(0x12, any_value(value))


def attributes(tag: int, values: Mapping[str, Any] | None) -> bytes:
    """Repeated ``KeyValue`` field ``tag``; a key whose value cannot be encoded is left
    out and logged, as the SDK's ``_encode_attributes`` does."""
    if not values:
        return b""
    out = []
    for key, value in values.items():
        try:
            out.append(field(tag, key_value(key, value)))
        except Exception as error:  # what the SDK catches, for the same values
            _logger.exception("Failed to encode key %s: %s", key, error)
    return b"".join(out)


def fixed32(tag: bytes, value: int) -> bytes:
    return tag + value.to_bytes(4, "little")


def fixed64(tag: bytes, value: int) -> bytes:
    return tag + value.to_bytes(8, "little")


def uint(tag: bytes, value: int) -> bytes:
    """A proto3 varint field: absent when zero."""
    return tag + varint(value) if value else b""
