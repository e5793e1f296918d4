"""Tracing: the consumer span of each delivery, a span per retry, a span per dead letter.

Span shape (OpenTelemetry messaging semantic conventions)::

    publish orders          PRODUCER   Client.publish; writes traceparent into headers
    └── process orders      CONSUMER   one per (message, handler): decode + handler
        ├── retry <name>    INTERNAL   one per retry (conveyor.attempt = 2, 3, ...)
        └── dead-letter     INTERNAL   when the message is dead-lettered (both in error)
    └── dead-letter         INTERNAL   a message no handler takes (no consumer span)

The first attempt gets no span of its own — the consumer span already covers it, and
spans are the dominant cost of tracing (see ``conveyor bench telemetry``). Present
only when a tracer is configured.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextvars import Token
from functools import partial
from random import getrandbits
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
from opentelemetry.trace import (
    Span,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
)
from opentelemetry.util.types import AttributeValue

from conveyor.platform.delivery.chain import Delivery, Interceptor, Step
from conveyor.platform.delivery.dead_letter import PutLetter
from conveyor.platform.errors import error_text
from conveyor.platform.handlers import HandlerSpec
from conveyor.platform.message import DeadLetter, Message
from conveyor.platform.sampling import (
    EVEN_HEX,
    FLAGS_LAST,
    TRACEPARENT_LENGTH,
    DroppedSpan,
    RemoteSpan,
    ratio_roots,
    remote_span,
)
from conveyor.platform.telemetry import (
    ATTEMPT,
    CONSUMER_GROUP,
    DESTINATION,
    HANDLER,
    KEY,
    MESSAGE_ID,
    OPERATION_NAME,
    OPERATION_TYPE,
    PARTITION,
    PROPAGATOR,
    RANDOM_TRACE_ID,
    ROOT_FLAGS,
    SAMPLED,
    SYSTEM,
    random_span_id,
)
from conveyor.platform.trace_context import (
    SPAN_KEY,
    get_context,
    in_context,
    reset_context,
    set_context,
)

if TYPE_CHECKING:
    from conveyor.platform.spans import LeanRecorder, LeanSpan

class ConsumerSpans(Interceptor):
    """``process <namespace>``, continuing the producer's trace from the headers.

    Each handler's deliveries go through one :class:`ConsumerScope` (:meth:`scope`):
    the step this interceptor wraps around the rest of the chain enters it and leaves
    it around each delivery, and the agent's runner does the same around the shipped
    chain's one step (:class:`~conveyor.platform.delivery.dead_letter.DirectCall`).
    With a ``recorder`` (what :meth:`~conveyor.platform.telemetry.Telemetry.from_config`
    builds for the OTLP exporter) a kept trace's consumer span is a
    :class:`~conveyor.platform.spans.LeanSpan`, recorded and encoded without the SDK;
    without one, the SDK's tracer starts it."""

    def __init__(self, tracer: Tracer, *, system: str, group: str,
                 recorder: LeanRecorder | None = None) -> None:
        self._tracer = tracer
        self._system = system
        self._group = group
        self._recorder = recorder

    def scope(self, handler: HandlerSpec) -> ConsumerScope:
        """The consumer span of ``handler``'s deliveries."""
        return ConsumerScope(self._tracer, handler, system=self._system, group=self._group,
                             recorder=self._recorder)

    def wrap(self, handler: HandlerSpec, next: Step) -> Step:
        return self.around(self.scope(handler), next)

    @staticmethod
    def around(scope: ConsumerScope, next: Step) -> Step:
        """``next`` inside ``scope``: what use_span does (an exception leaving the span
        is recorded on it, and sets its status to error; a BaseException is no error)."""
        enter, leave = scope.enter, scope.leave

        async def spanned(delivery: Delivery) -> Any:
            entered = enter(delivery.message)
            failure = None
            try:
                return await next(delivery)
            except Exception as exc:
                failure = exc
                raise
            finally:
                leave(entered, failure)

        return spanned


_ID_LIMIT = TraceIdRatioBased.TRACE_ID_LIMIT
"""The lower 64 bits of a trace id, which the ratio's rule compares."""
_get_context, _set_context, _reset_context = get_context, set_context, reset_context
_SPAN_KEY, _in_context = SPAN_KEY, in_context

Spare = tuple[Context, DroppedSpan | RemoteSpan, Context]
"""A dropped trace's context, its span, and the context it was made in: kept by a
:class:`ConsumerScope` to serve the next dropped trace (see its "Reused")."""
Entered = tuple[Token[Context], Span | None, Spare | None]
"""What :meth:`ConsumerScope.enter` returns for :meth:`ConsumerScope.leave`: the
context to restore, the span to end (None: a dropped trace's, nothing to end) and a
dropped trace's :data:`Spare`, to keep for the next one if nothing else holds it."""


def _spare_refs() -> tuple[int, int] | None:
    """What ``sys.getrefcount`` says of a :data:`Spare`'s context and span once nothing
    but the spare holds them (the context's span counts for the span), counted by the
    expressions :meth:`ConsumerScope.leave` uses; None where the interpreter keeps no
    such count (then no spare is ever reused)."""
    getrefcount = getattr(sys, "getrefcount", None)
    if getrefcount is None or not _SPAN_KEY:
        return None
    span = DroppedSpan(1)
    spare: Spare = (Context({_SPAN_KEY: span}), span, Context())
    del span
    _reset_context(_set_context(spare[0]))
    return getrefcount(spare[0]), getrefcount(spare[1])


_FREE_CONTEXT, _FREE_SPAN = _spare_refs() or (-1, -1)
"""The counts of a spare nothing else holds; -1 (no count is): never reused."""


def _no_count(_: object) -> int:
    """Where the interpreter keeps no reference counts: a count no spare has."""
    return -2


_getrefcount: Callable[[object], int] = getattr(sys, "getrefcount", _no_count)


class ConsumerScope:
    """The ``process <namespace>`` span of one handler's deliveries, entered before the
    handler is called and left after: the span (or, for a dropped trace, the producer's
    context) is the current one meanwhile, so spans the handler starts and messages it
    publishes continue the trace.

    Which trace a delivery belongs to is decided the SDK's way
    (:mod:`conveyor.platform.sampling`): the producer's ``traceparent`` when it has
    one, else a new trace kept at the sampler's ratio. A dropped trace costs no span,
    only its context; a header that says "not sampled" is taken on its length and last
    digit and checked only when asked for (that module's "Decided"). A kept one starts
    a :class:`~conveyor.platform.spans.LeanSpan` when there is a ``recorder``, else an
    SDK span. A ``traceparent`` with a ``tracestate``, a sampled or other-length one
    that does not parse cleanly, and a tracer whose provider Conveyor did not build (no
    :class:`~conveyor.platform.sampling.RatioRoots`), go to the SDK and its
    propagator, as they would without any of this.

    *Reused:* a dropped trace's context and span, once left, serve the next dropped
    trace of their kind (new, or the producer's) with that trace's ids written in,
    instead of two new objects a message — unless something still holds either when
    it is left: a task or thread the handler started (its copy of the context), a
    span or context the handler kept, an exception's frames. CPython's reference
    counts say so (:data:`_FREE_CONTEXT`); any count above a spare's own keeps that
    context and span as they are, for good, and the next dropped trace gets new
    ones, so whatever holds them goes on seeing its message's ids. One spare of each
    kind; one in use is not a spare (deliveries running at once each get their own);
    and a spare made in another context than the current one is not used."""

    def __init__(self, tracer: Tracer, handler: HandlerSpec, *, system: str, group: str,
                 recorder: LeanRecorder | None = None) -> None:
        self._tracer = tracer
        self._fixed = {
            SYSTEM: system,
            DESTINATION: handler.namespace,
            OPERATION_TYPE: "process",
            OPERATION_NAME: "process",
            CONSUMER_GROUP: group,
            HANDLER: handler.name,
        }
        self._name = f"process {handler.namespace}"
        self._roots = ratio_roots(tracer)
        self._bound = self._roots.bound if self._roots is not None else 0
        """The ratio's bound on a new trace id's lower 64 bits (TraceIdRatioBased's);
        unused without :class:`~conveyor.platform.sampling.RatioRoots`."""
        self._partitions: dict[int, str] = {}
        self._new_spare: Spare | None = None
        """A dropped new trace's context to reuse (the class's "Reused")."""
        self._parent_spare: Spare | None = None
        """A dropped producer's trace's context to reuse."""
        self._lean: Callable[[int, int, int, int, dict[str, str]], LeanSpan] | None = None
        """A kept trace's span, recorded by ``recorder`` (given trace id, span id, parent
        span id, flags and the per-message attributes); None: the SDK's."""
        if recorder is not None and self._roots is not None:
            from conveyor.platform.spans import LeanSpan, SpanShape

            self._lean = partial(LeanSpan, SpanShape(recorder, self._name, SpanKind.CONSUMER,
                                                     self._fixed))
            recorder.on_hand_to_sdk(self._sdk_spans)

    def _sdk_spans(self) -> None:
        """Kept traces' spans are the SDK's from now on (a span processor was added:
        :meth:`~conveyor.platform.spans.LeanRecorder.hand_to_sdk`)."""
        self._lean = None

    def _attributes(self, msg: Message) -> dict[str, str]:
        """The attributes that differ from message to message."""
        attributes = {MESSAGE_ID: msg.id, KEY: msg.stream.key}
        if msg.token is not None:
            queue = msg.token.queue
            partition = self._partitions.get(queue)
            if partition is None:
                partition = self._partitions[queue] = str(queue)
            attributes[PARTITION] = partition
        return attributes

    def enter(self, msg: Message) -> Entered:
        """Make ``msg``'s consumer span (or dropped context) the current one."""
        headers = msg.headers
        header = headers.get("traceparent")
        roots = self._roots
        if roots is None:  # not our provider: the SDK's way
            return self._sdk(msg, PROPAGATOR.extract(headers))
        if header is None:  # a new trace (RatioRoots.draw, inlined)
            trace_id = getrandbits(128) or 1
            if trace_id & _ID_LIMIT >= self._bound:  # dropped
                # Reused (the class's "Reused"), inline here and for a dropped parent
                # below, as the rest of this method: a call would cost a message some
                # 300 instructions of the 6,300 a dropped trace takes.
                spare = self._new_spare
                if spare is not None and spare[2] is _get_context():
                    self._new_spare = None
                    dropped = spare[1]
                    dropped._trace_id = trace_id  # type: ignore[union-attr]
                    dropped._context = None
                    return _set_context(spare[0]), None, spare
                return self._spare(DroppedSpan(trace_id))
            lean = self._lean
            if lean is None:
                roots.take_next(trace_id)
                return self._sdk(msg, Context())
            span: Span = lean(trace_id, random_span_id(), 0, ROOT_FLAGS,
                              self._attributes(msg))
            return _set_context(_in_context(span)), span, None
        if (len(header) == TRACEPARENT_LENGTH and header[FLAGS_LAST] in EVEN_HEX
                and "tracestate" not in headers):  # the producer dropped its trace
            # (taken unchecked: RemoteSpan checks it if someone asks, see sampling)
            spare = self._parent_spare
            if spare is not None and spare[2] is _get_context():  # reused
                self._parent_spare = None
                remote = spare[1]
                remote._traceparent = header  # type: ignore[union-attr]
                remote._context = None
                return _set_context(spare[0]), None, spare
            return self._spare(RemoteSpan(header))
        parent = remote_span(headers)
        if parent is None:  # a header to read the SDK's way
            return self._sdk(msg, PROPAGATOR.extract(headers))
        lean = self._lean  # a sampled parent (the dropped ones are above)
        if lean is None:
            return self._sdk(msg, _in_context(parent))
        trace_id, parent_id, flags = parent.ids()
        span = lean(trace_id, random_span_id(), parent_id,
                    SAMPLED | (flags & RANDOM_TRACE_ID), self._attributes(msg))
        return _set_context(_in_context(span)), span, None

    @staticmethod
    def _spare(span: DroppedSpan | RemoteSpan) -> Entered:
        """A dropped trace's context, made new, and the :data:`Spare` to keep of it."""
        base = _get_context()
        spare: Spare = (_in_context(span), span, base)
        return _set_context(spare[0]), None, spare

    def _sdk(self, msg: Message, parent: Context) -> Entered:
        attributes: dict[str, AttributeValue] = {**self._fixed, **self._attributes(msg)}
        span = self._tracer.start_span(self._name, parent, SpanKind.CONSUMER, attributes)
        return _set_context(_in_context(span)), span, None

    def leave(self, entered: Entered, exc: BaseException | None = None) -> None:
        """Restore the context :meth:`enter` found and end the span; ``exc``, an
        exception that left the span, is recorded on it and sets its status to error,
        as use_span does. A dropped trace's context is kept for the next one if nothing
        but its spare holds it or its span now (the class's "Reused")."""
        token, span, spare = entered
        _reset_context(token)
        if span is not None:
            if exc is not None and span.is_recording():
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, error_text(exc)))
            span.end()
        elif (spare is not None and _getrefcount(spare[0]) == _FREE_CONTEXT
              and _getrefcount(spare[1]) == _FREE_SPAN):
            if type(spare[1]) is RemoteSpan:  # not isinstance: an ABC's costs 1,700
                self._parent_spare = spare  # instructions
            else:
                self._new_spare = spare


class RetrySpans(Interceptor):
    """``retry <handler>`` around every attempt after the first (inside retry)."""

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer

    def wrap(self, handler: HandlerSpec, next: Step) -> Step:
        if handler.retry.attempts == 1:
            return next
        tracer = self._tracer
        name = handler.name

        async def traced(delivery: Delivery) -> Any:
            with tracer.start_as_current_span(
                f"retry {name}", attributes={HANDLER: name, ATTEMPT: delivery.attempt}
            ):
                return await next(delivery)

        def step(delivery: Delivery) -> Any:
            return traced(delivery) if delivery.attempt > 1 else next(delivery)

        return step


def traced_dead_letters(put: PutLetter, tracer: Tracer) -> PutLetter:
    """``put`` inside a ``dead-letter`` span; the consumer span, if any, marked in error."""

    async def traced(letter: DeadLetter) -> None:
        msg = letter.message
        consumer = trace.get_current_span()
        # A message no handler takes has no consumer span around it: continue the
        # producer's trace from the headers rather than starting an orphan trace.
        context = None if consumer.get_span_context().is_valid else PROPAGATOR.extract(
            msg.headers)
        status = Status(StatusCode.ERROR, f"dead-lettered: {letter.error_type}")
        with tracer.start_as_current_span(
            "dead-letter", context=context,
            attributes={"error.type": letter.error_type, ATTEMPT: letter.attempts,
                        MESSAGE_ID: msg.id},
        ) as span:
            await put(letter)
            span.set_status(status)
        if consumer.is_recording():
            consumer.set_attribute("error.type", letter.error_type)
            consumer.set_status(status)

    return traced
