"""Trace sampling without the SDK where the answer is "drop": the cheap path of tracing.

With ``[telemetry] sample_ratio`` below 1, most messages belong to a dropped trace, and
the OpenTelemetry SDK costs nearly as much to drop a span as to record one: the
parent-based sampler's call, a non-recording span, its context — measured at about
18 µs a message at the consumer (4 of them reading ``traceparent``) and 10 µs at the
producer. Conveyor takes those decisions first, the SDK's way, and calls the SDK only
for the traces it keeps:

* **A message whose producer dropped its trace** (``traceparent`` flags without the
  sampled bit): the consumer attaches the producer's context as a non-recording span
  and runs the handler in it — what the parent-based sampler does, so spans the
  handler starts and messages it publishes continue the same dropped trace. That
  span (:class:`RemoteSpan`) checks and parses the header only when someone asks for
  its context (the handler's spans and publishes, a retry's or dead letter's span):
  a handler that neither traces nor publishes costs a look at the
  header's length and last digit (in :meth:`ConsumerScope.enter
  <conveyor.platform.delivery.tracing.ConsumerScope.enter>`). *Decided:* a header of the
  right length whose flags say "not sampled" is taken as the producer's decision
  before its check; if the check then fails (the SDK's propagator would refuse it),
  the span's context is the invalid one, so spans and messages the handler starts
  begin new traces (each its own, at the sampler's ratio; a retry's span too) — where
  the SDK would have started the consumer span as a new trace at the ratio, the
  others its children. A malformed header costs that consumer span only;
  checking every header first cost about half a microsecond a message, a third of the
  dropped path.
* **A new trace** (a publish outside any span, a message without ``traceparent``):
  the trace id is drawn and ``TraceIdRatioBased``'s rule applied to it
  (:meth:`RatioRoots.draw`; the consumer's ``enter`` does the same inline). Dropped:
  only the context is propagated (a ``traceparent`` written by hand, a non-recording
  :class:`DroppedSpan`). Kept: a lean span of that trace where there is a recorder
  (:mod:`conveyor.platform.spans`), else the SDK starts the span, and its next root
  trace id is the one drawn, so its sampler agrees.
* **A publish under a dropped parent** (a handler's, in a trace its producer dropped):
  the parent-based sampler's non-recording child, a :class:`DroppedSpan` of the
  parent's trace, its ``traceparent`` written by hand.

Everything else — a ``tracestate``, a header of another length or with the sampled
bit that does not parse cleanly, a sampled parent without a recorder — goes through the
SDK and its propagator as before. Only a
provider built by :meth:`~conveyor.platform.telemetry.Telemetry.from_config` (whose
sampler is known: parent-based, ratio at the root) has :class:`RatioRoots`; an injected
provider gets no shortcut.
"""

from __future__ import annotations

import random
import re
import threading
from collections.abc import Callable, Mapping

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    TraceFlags,
    Tracer,
    get_current_span,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
"""A version-00 ``traceparent`` with valid (not all-zero) ids: one match, no other test."""
well_formed = _TRACEPARENT.fullmatch
EVEN_HEX = frozenset("02468ace")
"""The last hex digits of flags without the sampled bit."""
TRACEPARENT_LENGTH = 55
"""A version-00 ``traceparent``'s length. Any header of this length that the SDK's
propagator reads has its flags as its last two digits (longer ones may start with
blanks); the last is at :data:`FLAGS_LAST`."""
FLAGS_LAST = TRACEPARENT_LENGTH - 1
_PROPAGATOR = TraceContextTextMapPropagator()
_RANDOM_TRACE_ID = 0x02
"""The W3C level-2 trace flag the SDK sets on the trace ids it draws at random."""


def remote_span(headers: Mapping[str, str]) -> RemoteSpan | None:
    """The producer's span from a well-formed version-00 ``traceparent`` header, as the
    SDK's propagator reads it; None when it is absent, malformed, or comes with a
    ``tracestate`` (then the propagator must read both)."""
    header = headers.get("traceparent")
    if header is None or "tracestate" in headers or well_formed(header) is None:
        return None
    return RemoteSpan(header)


def remote_parent(headers: Mapping[str, str]) -> SpanContext | None:
    """The producer's span context from ``traceparent`` (see :func:`remote_span`)."""
    span = remote_span(headers)
    return None if span is None else span.get_span_context()


class RemoteSpan(NonRecordingSpan):
    """The producer's span, read from its ``traceparent``: what the propagator would put
    in the context, its :class:`SpanContext` built on first use. The header is checked
    then too, when the consumer took it unchecked (a dropped parent): one the SDK's
    propagator refuses gives the invalid context (see the module's "Decided")."""

    _context: SpanContext | None = None  # type: ignore[assignment]

    def __init__(self, traceparent: str) -> None:  # one attribute: one per message
        self._traceparent = traceparent

    def ids(self) -> tuple[int, int, int]:
        """The trace id, span id and flags the header gives."""
        header = self._traceparent
        return int(header[3:35], 16), int(header[36:52], 16), int(header[53:55], 16)

    def get_span_context(self) -> SpanContext:
        if self._context is None:
            if well_formed(self._traceparent):
                trace_id, span_id, flags = self.ids()
                self._context = SpanContext(trace_id, span_id, True, TraceFlags(flags))
            else:  # taken unchecked, and the SDK reads it its own way, or not at all
                self._context = get_current_span(_PROPAGATOR.extract(
                    {"traceparent": self._traceparent})).get_span_context()
        return self._context

    def __repr__(self) -> str:
        return f"RemoteSpan({self.get_span_context()!r})"


class DroppedSpan(NonRecordingSpan):
    """A span the sampler dropped, as the SDK would put it in the context — a
    non-recording span of trace ``trace_id``, its flags without the sampled bit — with
    its span id (unless given) drawn, and its :class:`SpanContext` built, only when
    someone asks (a handler that neither traces nor publishes never does). A new
    trace's root (:meth:`RatioRoots.dropped_span`) has the flags "random trace id";
    a producer's child of a dropped parent keeps its parent's."""

    _context: SpanContext | None = None  # type: ignore[assignment]

    def __init__(self, trace_id: int, span_id: int = 0,
                 flags: int = _RANDOM_TRACE_ID) -> None:
        self._trace_id = trace_id
        self._span_id = span_id
        """Its span id when it was drawn already (a producer writes it into the
        message's ``traceparent``); 0: drawn on first use."""
        self._flags = flags

    def get_span_context(self) -> SpanContext:
        if self._context is None:
            self._context = SpanContext(self._trace_id,
                                        self._span_id or random.getrandbits(64) or 1, False,
                                        TraceFlags(self._flags))
        return self._context

    def __repr__(self) -> str:
        return f"DroppedSpan({self.get_span_context()!r})"


class RatioRoots(RandomIdGenerator):
    """The id generator that decides new traces ahead of the SDK's ratio sampler."""

    new_dropped = DroppedSpan
    """The span of a new trace the ratio dropped, given its trace and span ids (what
    :meth:`dropped_span` makes, a call less for a producer's hot path)."""

    def __init__(self, ratio: float) -> None:
        self.bound: int = TraceIdRatioBased.get_bound_for_rate(ratio)
        """A trace id is kept when its lower 64 bits are below it."""
        self._next = threading.local()

    def draw(self) -> tuple[int, bool]:
        """A new trace's id, and whether the ratio keeps it (``TraceIdRatioBased``'s
        rule, on the id's lower 64 bits)."""
        trace_id = random.getrandbits(128) or 1
        return trace_id, trace_id & TraceIdRatioBased.TRACE_ID_LIMIT < self.bound

    def take_next(self, trace_id: int) -> None:
        """Make ``trace_id`` the id of the SDK's next root trace in this thread (one the
        ratio keeps: the SDK's sampler then agrees)."""
        self._next.trace_id = trace_id

    @staticmethod
    def dropped_span(trace_id: int, span_id: int = 0,
                     flags: int = _RANDOM_TRACE_ID) -> NonRecordingSpan:
        """A span of trace ``trace_id`` that the sampler dropped, as the SDK makes it:
        by default a new root the ratio dropped; ``flags``, a dropped parent's (see
        :class:`DroppedSpan`)."""
        return DroppedSpan(trace_id, span_id, flags)

    def generate_trace_id(self) -> int:
        trace_id: int = getattr(self._next, "trace_id", 0)
        if trace_id:
            self._next.trace_id = 0
            return trace_id
        return super().generate_trace_id()


class ConveyorTracerProvider(TracerProvider):
    """The SDK's provider, which calls :attr:`processor_added` (when set) after each
    span processor added to it: Conveyor sets it once its own processors are in, so that
    one a user adds later turns the lean spans off (they bypass span processors; see
    :meth:`LeanRecorder.hand_to_sdk <conveyor.platform.spans.LeanRecorder.hand_to_sdk>`).
    """

    processor_added: Callable[[], None] | None = None

    def add_span_processor(self, span_processor: SpanProcessor) -> None:
        super().add_span_processor(span_processor)
        if self.processor_added is not None:
            self.processor_added()


def ratio_tracer_provider(ratio: float, resource: Resource | None = None
                          ) -> ConveyorTracerProvider:
    """The tracer provider of Conveyor's telemetry (span processors to be added).

    Parent-based: a consumer follows its producer's decision, so a trace is whole or
    absent; the ratio applies where a trace starts, decided first by
    :class:`RatioRoots`."""
    return ConveyorTracerProvider(
        resource=resource, sampler=ParentBased(TraceIdRatioBased(ratio)),
        id_generator=RatioRoots(ratio),
    )


def ratio_roots(tracer: Tracer) -> RatioRoots | None:
    """The :class:`RatioRoots` of ``tracer``'s provider, if it was built with one."""
    roots = getattr(tracer, "id_generator", None)
    return roots if isinstance(roots, RatioRoots) else None
