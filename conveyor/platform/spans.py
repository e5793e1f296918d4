"""Lean spans: a consumer span for a few µs where the SDK's costs about 70.

The OpenTelemetry SDK pays for generality on every span: a ``Span`` with a lock,
bounded attribute maps, a ``ReadableSpan`` copy at end, then in the export thread a
protobuf object per span, attribute and value (about 25 µs to start and end one, 42 µs
to encode it, on the reference machine). A consumer span has one shape per handler —
the same name, kind and six attributes on every message — and three per-message
strings. Here:

* :class:`SpanShape` encodes the fixed part once per handler;
* :class:`LeanSpan` is an ``opentelemetry.trace.Span`` holding ids, times and the
  per-message attributes; everything else the Span API allows (more attributes,
  events, links, a status, a new name) is kept the SDK's way — its
  ``BoundedAttributes``, ``Event``, ``Link`` and ``SpanLimits`` — and encoded the
  slower, general way, only for the spans that use it;
* :class:`LeanRecorder` is what ``BatchSpanProcessor`` + ``OTLPSpanExporter`` do —
  the queue, the export thread, the ``OTEL_BSP_*`` settings — with the protobuf written
  by hand (:mod:`conveyor.platform.otlp_wire`) and posted by a ``send`` callable;
  :func:`otlp_sender` makes one from the shipped exporter's HTTP client (both live in
  :mod:`conveyor.platform.span_recorder` and are imported from here).

Measured by ``benchmarks/lean_spans.py`` (µs of CPU a consumer span, every thread):
the SDK 27 to start and end, 42 to encode and post; lean 3.6 to start and end
(encoding included, 2.4 of it), 1.8 to post.

The bytes are the ones the SDK's ``encode_spans`` serializes for an equivalent SDK span
(``tests/unit/test_lean_spans.py`` compares them field by field).

A span is encoded at :meth:`LeanSpan.end`, in the thread that ends it, not later in
the export thread. The CPU is this process's either way (measured, 100 000 spans ended
back to back, all threads' CPU: 3.7-4.3 µs a span encoding at end, 4.0-4.1 µs
encoding in the thread), but the export thread only runs when the event loop lets go
of the GIL: left with the encoding, it fell behind in that burst and the queue
overflowed; left with a join and a POST, it kept up. And a queue of ``bytes`` holds
no references: 2048 queued spans are no work for the garbage collector.

Only sampled spans are made this way: the sampling decision is the caller's (a span
without the sampled flag records but is not exported). Spans of other shapes — retry,
dead-letter — stay SDK spans beside these.

Threads: a LeanSpan belongs to the thread that started it (the worker's event loop);
unlike the SDK's span it takes no lock, so two threads must not call it at once.
:meth:`LeanSpan.end` hands it to the recorder, which is thread-safe.
"""

from __future__ import annotations

import logging
import struct
import time
import traceback
from collections.abc import Mapping, MutableMapping
from types import TracebackType
from typing import Any

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import Event
from opentelemetry.sdk.util import BoundedList
from opentelemetry.trace import (
    Link,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)
from opentelemetry.util import types

from conveyor.platform import otlp_wire as wire
from conveyor.platform.span_recorder import LeanRecorder, otlp_sender

__all__ = ["LeanRecorder", "LeanSpan", "SpanShape", "otlp_sender"]

logger = logging.getLogger(__name__)

_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200  # SpanFlags of trace.proto
_MASK64 = (1 << 64) - 1
# trace_id (1), span_id (2), parent_span_id (4): big-endian ids behind their tags.
_IDS_CHILD = struct.Struct(">HQQHQHQ")
_IDS_ROOT = struct.Struct(">HQQHQ")
_TAG_TRACE, _TAG_SPAN, _TAG_PARENT = 0x0A10, 0x1208, 0x2208
_TIMES = struct.Struct("<BQBQ")  # start (7) and end (8), fixed64
_TAG_START, _TAG_END = 0x39, 0x41
# status (15, always present in the SDK's encoding) and flags (16, fixed32).
_TAIL_REMOTE = b"\x7a\x00\x85\x01" + (_HAS_IS_REMOTE | _IS_REMOTE).to_bytes(4, "little")
_UNSET = Status(StatusCode.UNSET)
_TAIL_LOCAL = b"\x7a\x00\x85\x01" + _HAS_IS_REMOTE.to_bytes(4, "little")


class SpanShape:
    """What every span of one kind shares — name, kind, fixed attributes — encoded
    once (per handler, at subscription). The attributes are cleaned and bounded by the
    recorder's span limits as the SDK's span would; per-message keys must differ
    from these (a span whose keys overlap is encoded the general way)."""

    __slots__ = (
        "_fixed",
        "_head",
        "_ids_child",
        "_ids_root",
        "_keys",
        "_keyset",
        "_room",
        "_size_child",
        "_size_root",
        "_texts",
        "_times",
        "attributes",
        "kind",
        "name",
        "recorder",
    )

    def __init__(self, recorder: LeanRecorder, name: str, kind: SpanKind,
                 attributes: Mapping[str, str]) -> None:
        self.recorder = recorder
        self.name = name
        self.kind = kind
        self.attributes = dict(attributes)
        limits = recorder.limits
        self._head = wire.text(0x2A, name) + b"\x30" + wire.varint(kind.value + 1)
        self._fixed = wire.attributes(0x4A, self.attributes)
        # The ids with the name and kind after them (big-endian), the times with the
        # fixed attributes after them (little-endian): two packs a span.
        self._ids_root = struct.Struct(f"{_IDS_ROOT.format}{len(self._head)}s")
        self._ids_child = struct.Struct(f"{_IDS_CHILD.format}{len(self._head)}s")
        self._times = struct.Struct(f"{_TIMES.format}{len(self._fixed)}s")
        # A span's length but for its per-message attributes (the tails are as long).
        self._size_root = self._ids_root.size + self._times.size + len(_TAIL_LOCAL)
        self._size_child = self._ids_child.size + self._times.size + len(_TAIL_LOCAL)
        self._keyset = frozenset(self.attributes)
        # How many per-message attributes fit before the span limits bite; past that
        # (or with a length limit) a span keeps its attributes the SDK's way.
        count = limits.max_span_attributes
        plain = limits.max_span_attribute_length is None
        self._room = -1 if not plain else (1 << 30) if count is None else (
            count - len(self.attributes))
        self._keys: dict[str, bytes] = {}
        self._texts: dict[str, tuple[str, ...]] = {}

    def _key(self, key: str) -> bytes:
        encoded = self._keys.get(key)
        if encoded is None:
            encoded = self._keys[key] = wire.text(0x0A, key) + b"\x12"
            self._texts[key] = _text_prefixes(encoded) if (
                key.isascii() and len(encoded) < 128 and key not in self._keyset) else ()
        return encoded


def _text_prefixes(prefix: bytes) -> tuple[str, ...]:
    """What comes before a value of each length in its attribute field (``J``: 0x4A,
    a span's attribute; ``\\n``: 0x0A, a string value), as text, for an ASCII key
    (``prefix``: its field and the value's tag) and every length that leaves the
    field's lengths one byte each (under 128): so that, for an ASCII value, the text
    and its UTF-8 bytes are the same."""
    head = prefix.decode("ascii")
    return tuple(f"J{chr(len(prefix) + n + 3)}{head}{chr(n + 2)}\n{chr(n)}"
                 for n in range(125 - len(prefix)))


class _More:
    """The rarer parts of a span, present once one of them is used."""

    __slots__ = ("attributes", "events", "links", "name", "status", "trace_state")

    def __init__(self) -> None:
        self.name: str | None = None
        self.attributes: BoundedAttributes | None = None
        self.events: BoundedList[Any] | None = None
        self.links: BoundedList[Any] | None = None
        self.status: Status | None = None
        self.trace_state: TraceState | None = None


class LeanSpan(Span):
    """A recording span of ``shape``, started now; :meth:`end` hands it to the recorder.

    ``parent_span_id`` 0 makes a root span. ``trace_flags`` are the W3C flags of its
    context (sampled 0x01; 0x02 when the trace id was drawn at random, as the SDK sets
    it, so that child spans inherit it); a span without the sampled bit records but is
    not exported, as with ``BatchSpanProcessor``. ``attributes`` are per-message strings
    (the dict is kept, not copied). ``parent_is_remote`` says whether the parent came
    from another process (the OTLP span flags tell a collector);
    ``trace_state`` is the context's W3C tracestate, if any.
    """

    __slots__ = (
        "_attributes",
        "_context",
        "_end",
        "_flags",
        "_more",
        "_parent_id",
        "_remote",
        "_shape",
        "_span_id",
        "_start",
        "_trace_id",
    )

    def __init__(self, shape: SpanShape, trace_id: int, span_id: int, parent_span_id: int,
                 trace_flags: int, attributes: dict[str, str] | None = None, *,
                 parent_is_remote: bool = True, trace_state: TraceState | None = None) -> None:
        self._start = time.time_ns()
        self._shape = shape
        self._trace_id = trace_id
        self._span_id = span_id
        self._parent_id = parent_span_id
        self._flags = trace_flags
        self._attributes = attributes
        self._end: int | None = None
        self._context: SpanContext | None = None
        self._remote = parent_is_remote
        self._more: _More | None = None
        over = (len(attributes) if attributes else 0) > shape._room
        if trace_state or over:
            more = self._more = _More()
            more.trace_state = trace_state
            if over:  # the span limits bite: the SDK's bounded attributes from the start
                self._bounded()

    def __repr__(self) -> str:
        return f'{type(self).__name__}(name="{self.name}", context={self.get_span_context()})'

    # -- reading ------------------------------------------------------------------------
    @property
    def name(self) -> str:
        more = self._more
        return more.name if more is not None and more.name is not None else self._shape.name

    @property
    def start_time(self) -> int:
        return self._start

    @property
    def end_time(self) -> int | None:
        return self._end

    @property
    def attributes(self) -> Mapping[str, types.AnyValue]:
        """All attributes, fixed and per message (a copy)."""
        more = self._more
        if more is not None and more.attributes is not None:
            return more.attributes.copy()
        return {**self._shape.attributes, **(self._attributes or {})}

    @property
    def status(self) -> Status:
        more = self._more
        return more.status if more is not None and more.status is not None else _UNSET

    def get_span_context(self) -> SpanContext:
        context = self._context
        if context is None:
            more = self._more
            context = self._context = SpanContext(
                self._trace_id, self._span_id, False, TraceFlags(self._flags),
                more.trace_state if more is not None else None)
        return context

    def is_recording(self) -> bool:
        return self._end is None

    # -- the Span API, with the SDK span's rules ---------------------------------------
    def _extra(self, method: str) -> _More | None:
        """The rarer parts, to change them; None (and the SDK's warning) once ended."""
        if self._end is not None:
            logger.warning("Tried calling %s on an ended span.", method)
            return None
        more = self._more
        if more is None:
            more = self._more = _More()
        return more

    def _bounded(self) -> BoundedAttributes:
        """The attributes as the SDK span keeps them, from here on."""
        assert self._more is not None
        bounded = self._more.attributes
        if bounded is None:
            limits = self._shape.recorder.limits
            bounded = self._more.attributes = BoundedAttributes(
                limits.max_span_attributes,
                {**self._shape.attributes, **(self._attributes or {})},
                immutable=False, max_value_len=limits.max_span_attribute_length)
        return bounded

    def set_attribute(self, key: str, value: types.AnyValue) -> None:
        if self._end is not None:
            logger.warning("Setting attribute on ended span.")
            return
        if self._more is None:
            self._more = _More()
        self._bounded()[key] = value

    def set_attributes(self, attributes: Mapping[str, types.AnyValue]) -> None:
        if self._end is not None:
            logger.warning("Setting attribute on ended span.")
            return
        if self._more is None:
            self._more = _More()
        self._bounded()._set_items(attributes)  # the SDK span's own call, for its drops

    def _list(self, method: str, name: str, maxlen: int | None) -> BoundedList[Any] | None:
        """The events or links, to append to; None (and a warning) once ended."""
        more = self._extra(method)
        if more is None:
            return None
        items: BoundedList[Any] | None = getattr(more, name)
        if items is None:
            items = BoundedList(maxlen)
            setattr(more, name, items)
        return items

    def add_event(self, name: str, attributes: types.Attributes = None,
                  timestamp: int | None = None) -> None:
        limits = self._shape.recorder.limits
        bounded = BoundedAttributes(limits.max_event_attributes, attributes,
                                    max_value_len=limits.max_attribute_length, immutable=True)
        events = self._list("_add_event", "events", limits.max_events)
        if events is not None:
            events.append(Event(name, bounded, timestamp))

    def add_link(self, context: SpanContext, attributes: types.Attributes = None) -> None:
        if not (context and (context.is_valid or attributes or context.trace_state)):
            return  # what the SDK calls an invalid link
        limits = self._shape.recorder.limits
        bounded = BoundedAttributes(limits.max_link_attributes, attributes,
                                    max_value_len=limits.max_attribute_length, immutable=True)
        links = self._list("_add_link", "links", limits.max_links)
        if links is not None:
            links.append(Link(context, bounded))

    def update_name(self, name: str) -> None:
        more = self._extra("update_name")
        if more is not None:
            more.name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        more = self._extra("set_status")
        if more is None:
            return
        current = more.status
        if current is not None and current.status_code is StatusCode.OK:
            return  # OK is final
        if isinstance(status, Status):
            if status.status_code is StatusCode.UNSET:
                return
            if description is not None:
                logger.warning("Description %s ignored. Use either `Status` or "
                               "`(StatusCode, Description)`", description)
            more.status = status
        elif status is not StatusCode.UNSET:
            more.status = Status(status, description)  # Status drops it unless ERROR

    def record_exception(self, exception: BaseException, attributes: types.Attributes = None,
                         timestamp: int | None = None, escaped: bool = False) -> None:
        """The SDK span's ``exception`` event, attribute for attribute."""
        module = type(exception).__module__
        qualname = type(exception).__qualname__
        event: MutableMapping[str, types.AnyValue] = {
            "exception.type": (f"{module}.{qualname}" if module and module != "builtins"
                               else qualname),
            "exception.message": str(exception),
            "exception.stacktrace": "".join(traceback.format_exception(exception)),
            "exception.escaped": str(escaped),
        }
        if attributes:
            event.update(attributes)
        self.add_event("exception", event, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self._end is not None:
            logger.warning("Calling end() on an ended span.")
            return
        self._end = end_time if end_time is not None else time.time_ns()
        if self._flags & 0x01:
            self._shape.recorder._record(self)

    def __exit__(self, exc_type: type[BaseException] | None, exc_val: BaseException | None,
                 exc_tb: TracebackType | None) -> None:
        """As the SDK span: an exception leaving ``with span:`` is recorded, and sets
        the status to ERROR, before the span ends."""
        if exc_val is not None and self._end is None:
            self.record_exception(exc_val, escaped=True)
            self.set_status(Status(StatusCode.ERROR, f"{type(exc_val).__name__}: {exc_val}"))
        super().__exit__(exc_type, exc_val, exc_tb)

    # -- encoding ----------------------------------------------------------------------
    def _encode(self) -> bytes:
        """This span as a ``ScopeSpans.spans`` entry (field 2, with its length).

        The per-message attributes are written as one text and encoded once, when
        each is short and ASCII — its lengths and tags are then single ASCII
        characters (:func:`_text_prefixes`) — else field by field
        (:meth:`_encode_fields`)."""
        if self._more is not None:
            return self._encode_general()
        shape = self._shape
        text = ""
        attributes = self._attributes
        if attributes:
            texts = shape._texts
            try:
                for key, value in attributes.items():
                    text += texts[key][len(value)] + value
            except LookupError:  # a key not seen yet, or not ASCII, or fixed; a long value
                return self._encode_fields()
        data = text.encode()
        if len(data) != len(text):  # a value not ASCII
            return self._encode_fields()
        trace_id = self._trace_id
        parent = self._parent_id
        if parent:
            ids = shape._ids_child.pack(_TAG_TRACE, trace_id >> 64, trace_id & _MASK64,
                                        _TAG_SPAN, self._span_id, _TAG_PARENT, parent,
                                        shape._head)
            n = shape._size_child + len(data)
            tail = _TAIL_REMOTE if self._remote else _TAIL_LOCAL
        else:
            ids = shape._ids_root.pack(_TAG_TRACE, trace_id >> 64, trace_id & _MASK64,
                                       _TAG_SPAN, self._span_id, shape._head)
            n = shape._size_root + len(data)
            tail = _TAIL_LOCAL
        return b"".join((
            b"\x12", wire.SMALL_VARINTS[n] if n < 16384 else wire.varint(n), ids,
            shape._times.pack(_TAG_START, self._start, _TAG_END, self._end, shape._fixed),
            data, tail))

    def _encode_fields(self) -> bytes:
        """:meth:`_encode`, the per-message attributes encoded one by one."""
        shape = self._shape
        trace_id = self._trace_id
        parent = self._parent_id
        if parent:
            ids = _IDS_CHILD.pack(_TAG_TRACE, trace_id >> 64, trace_id & _MASK64, _TAG_SPAN,
                                  self._span_id, _TAG_PARENT, parent)
        else:
            ids = _IDS_ROOT.pack(_TAG_TRACE, trace_id >> 64, trace_id & _MASK64, _TAG_SPAN,
                                 self._span_id)
        parts = [ids, shape._head, _TIMES.pack(_TAG_START, self._start, _TAG_END, self._end),
                 shape._fixed]
        attributes = self._attributes
        if attributes:
            if not shape._keyset.isdisjoint(attributes):
                return self._encode_general()
            small = wire.SMALL_VARINTS
            keys = shape._keys
            for key, value in attributes.items():
                data = value.encode()
                n = len(data)
                prefix = keys.get(key) or shape._key(key)
                size = len(prefix) + n + 3  # of the KeyValue, if its lengths are 1 byte
                if size < 128:
                    parts += (b"\x4a", small[size], prefix, small[n + 2],
                              b"\x0a", small[n], data)
                else:
                    kv = prefix + wire.field(0x0A, wire.field(0x0A, data))[1:]
                    parts.append(wire.field(0x4A, kv))
        parts.append(_TAIL_REMOTE if parent and self._remote else _TAIL_LOCAL)
        body = b"".join(parts)
        n = len(body)
        return b"\x12" + (wire.SMALL_VARINTS[n] if n < 16384 else wire.varint(n)) + body

    def _encode_general(self) -> bytes:
        """Any span, field by field as the SDK's ``_encode_span`` builds it."""
        more = self._more or _More()
        parent = self._parent_id
        state = more.trace_state
        bounded = more.attributes
        values = bounded if bounded is not None else self.attributes
        status = more.status or _UNSET
        events, links = more.events or (), more.links or ()
        flags = _HAS_IS_REMOTE | (_IS_REMOTE if parent and self._remote else 0)
        body = b"".join((
            wire.field(0x0A, self._trace_id.to_bytes(16, "big")),
            wire.field(0x12, self._span_id.to_bytes(8, "big")),
            wire.text(0x1A, ",".join(f"{k}={v}" for k, v in state.items()) if state else ""),
            wire.field(0x22, parent.to_bytes(8, "big")) if parent else b"",
            wire.text(0x2A, self.name),
            b"\x30" + wire.varint(self._shape.kind.value + 1),
            wire.fixed64(b"\x39", self._start),
            wire.fixed64(b"\x41", self._end or 0),
            wire.attributes(0x4A, values),
            wire.uint(b"\x50", bounded.dropped if bounded is not None else 0),
            b"".join(wire.field(0x5A, _event(e)) for e in events),
            wire.uint(b"\x60", more.events.dropped if more.events is not None else 0),
            b"".join(wire.field(0x6A, _link(link)) for link in links),
            wire.uint(b"\x70", more.links.dropped if more.links is not None else 0),
            wire.field(0x7A, wire.text(0x12, status.description)
                       + wire.uint(b"\x18", status.status_code.value)),
            wire.fixed32(b"\x85\x01", flags),
        ))
        return wire.field(0x12, body)


def _dropped(attributes: Any) -> int:
    return attributes.dropped if isinstance(attributes, BoundedAttributes) else 0


def _event(event: Event) -> bytes:
    return b"".join((
        wire.fixed64(b"\x09", event.timestamp) if event.timestamp else b"",
        wire.text(0x12, event.name),
        wire.attributes(0x1A, event.attributes),
        wire.uint(b"\x20", _dropped(event.attributes)),
    ))


def _link(link: Link) -> bytes:
    context = link.context
    return b"".join((
        wire.field(0x0A, context.trace_id.to_bytes(16, "big")),
        wire.field(0x12, context.span_id.to_bytes(8, "big")),
        wire.attributes(0x22, link.attributes),
        wire.uint(b"\x28", _dropped(link.attributes)),
        wire.fixed32(b"\x35", _HAS_IS_REMOTE | (_IS_REMOTE if context.is_remote else 0)),
    ))

