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

from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context, attach, detach
from opentelemetry.trace import (
    Span,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
    set_span_in_context,
)

from conveyor.platform.delivery.chain import Delivery, Interceptor, Step
from conveyor.platform.delivery.dead_letter import PutLetter
from conveyor.platform.handlers import HandlerSpec
from conveyor.platform.message import DeadLetter
from conveyor.platform.sampling import ratio_roots, remote_span
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
    SYSTEM,
)


class ConsumerSpans(Interceptor):
    """``process <namespace>``, continuing the producer's trace from the headers."""

    def __init__(self, tracer: Tracer, *, system: str, group: str) -> None:
        self._tracer = tracer
        self._system = system
        self._group = group

    def wrap(self, handler: HandlerSpec, next: Step) -> Step:
        tracer = self._tracer
        fixed = {
            SYSTEM: self._system,
            DESTINATION: handler.namespace,
            OPERATION_TYPE: "process",
            OPERATION_NAME: "process",
            CONSUMER_GROUP: self._group,
            HANDLER: handler.name,
        }
        span_name = f"process {handler.namespace}"
        roots = ratio_roots(tracer)
        partitions: dict[int, str] = {}

        async def spanned(delivery: Delivery, parent: Context) -> Any:
            # start_span and use_span's own steps, without its two context managers:
            # the same span, context, exception event and error status, a few µs less.
            msg = delivery.message
            attributes = fixed.copy()
            attributes[MESSAGE_ID] = msg.id
            attributes[KEY] = msg.stream.key
            if msg.token is not None:
                queue = msg.token.queue
                partition = partitions.get(queue)
                if partition is None:
                    partition = partitions[queue] = str(queue)
                attributes[PARTITION] = partition
            span = tracer.start_span(span_name, parent, SpanKind.CONSUMER, attributes)
            token = attach(set_span_in_context(span))
            try:
                return await next(delivery)
            except Exception as exc:  # what use_span records (BaseException is no error)
                if span.is_recording():
                    span.record_exception(exc)
                    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                raise
            finally:
                detach(token)
                span.end()

        async def dropped(delivery: Delivery, span: Span) -> Any:
            token = attach(set_span_in_context(span))
            try:
                return await next(delivery)
            finally:
                detach(token)

        async def traced(delivery: Delivery) -> Any:
            return await spanned(delivery, PROPAGATOR.extract(delivery.message.headers))

        def sampled_first(delivery: Delivery) -> Any:
            # The shortcut of conveyor.platform.sampling: a dropped trace runs the
            # handler in its context, without the SDK.
            headers = delivery.message.headers
            parent = remote_span(headers)
            if parent is not None:
                if not parent.sampled:
                    return dropped(delivery, parent)
                return spanned(delivery, set_span_in_context(parent))
            if "traceparent" in headers:  # malformed or with a tracestate: the SDK's way
                return traced(delivery)
            assert roots is not None
            trace_id = roots.dropped_root()
            if trace_id is not None:
                return dropped(delivery, roots.dropped_span(trace_id))
            return spanned(delivery, Context())

        return traced if roots is None else sampled_first


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
