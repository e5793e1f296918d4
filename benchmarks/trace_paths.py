"""Microseconds of CPU per message for each tracing path, the SDK's way and Conveyor's
(``ConsumerScope``, ``conveyor.platform.sampling``, lean spans) side by side, in the
same run.

Each path runs ``--calls`` times in a loop that does nothing else, best of
``--repeats``; the ratio column is SDK / Conveyor. What is timed:

* *consumer, dropped parent*: a message whose ``traceparent`` says "not sampled" —
  the SDK: extract the header, start a non-recording consumer span as the current
  span, end it; Conveyor: ``ConsumerScope.enter`` and ``leave`` (match the header,
  make the parent's span current — its ids parsed only if asked for — and restore).
* *consumer, new trace, dropped*: a message without ``traceparent`` at a ratio that
  drops it (the SDK: a root span through the ratio sampler; Conveyor: the decision on
  a drawn trace id and a non-recording span made current).
* *consumer, kept*: a message whose ``traceparent`` says "sampled": the span started
  as the current one, ended and encoded to OTLP protobuf, not posted — the SDK's
  span through ``BatchSpanProcessor`` to an exporter that encodes and discards
  (flushed inside the timing); Conveyor's lean span (``conveyor.platform.spans``,
  encoded as it ends) to a recorder that discards.
* *producer, new trace, dropped*: ``Telemetry.publish_span`` outside any span at a
  ratio that drops it (SDK span + ``inject`` against a hand-written ``traceparent``).
* *producer, dropped parent*: the same under a current span whose trace was dropped
  (a handler's publish, its message's producer having dropped the trace): the SDK's
  non-recording child against ``publish_span``'s.
* *producer, kept*: the same at a ratio that keeps it: the SDK's span through
  ``BatchSpanProcessor`` to an exporter that encodes and discards (flushed inside the
  timing) against ``publish_span`` with a recorder (a lean span, encoded as it ends).

    .venv/bin/python benchmarks/trace_paths.py [--calls 20000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec

# Run from a clone as `.venv/bin/python benchmarks/NAME.py`: import this checkout's conveyor.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opentelemetry import trace
from opentelemetry.context import attach, detach
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

from conveyor.platform.app import App
from conveyor.platform.delivery.tracing import ConsumerScope
from conveyor.platform.ids import SequenceToken, StreamId
from conveyor.platform.message import Message
from conveyor.platform.sampling import ratio_tracer_provider
from conveyor.platform.spans import LeanRecorder
from conveyor.platform.telemetry import PROPAGATOR, Telemetry

ATTRIBUTES = {
    "messaging.system": "redis", "messaging.destination.name": "orders",
    "messaging.operation.type": "process", "messaging.operation.name": "process",
    "messaging.consumer.group.name": "shop", "conveyor.handler": "orders",
    "messaging.message.id": "1764000000000-0", "conveyor.stream.key": "customer-1",
    "messaging.destination.partition.id": "3",
}
PRODUCER_ATTRIBUTES = {
    "messaging.system": "redis", "messaging.destination.name": "orders",
    "messaging.operation.type": "send", "messaging.operation.name": "publish",
    "messaging.destination.partition.id": "3", "messaging.message.id": "m",
    "conveyor.stream.key": "customer-1",
}
"""What ``Telemetry.publish_span`` puts on a producer span."""
DROPPED = {"traceparent": f"00-{'4b' * 16}-{'00f0' * 4}-02"}
KEPT = {"traceparent": f"00-{'4b' * 16}-{'00f0' * 4}-03"}


class Discard(SpanExporter):
    def export(self, spans: object) -> SpanExportResult:
        return SpanExportResult.SUCCESS


class EncodeAndDiscard(SpanExporter):
    """What the OTLP exporter does but the post."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        encode_spans(spans).SerializePartialToString()
        return SpanExportResult.SUCCESS


def sdk_provider(ratio: float, exporter: SpanExporter | None = None) -> TracerProvider:
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
    provider.add_span_processor(BatchSpanProcessor(exporter or Discard(),
                                                   max_queue_size=1 << 18))
    return provider


def shortcut_provider(ratio: float) -> TracerProvider:
    provider = ratio_tracer_provider(ratio)
    provider.add_span_processor(BatchSpanProcessor(Discard(), max_queue_size=1 << 18))
    return provider


def discarding_recorder() -> LeanRecorder:
    """A recorder that encodes lean spans as they end and discards the posts."""
    return LeanRecorder(lambda data: True, Resource.create({}),
                        InstrumentationScope("conveyor"), max_queue_size=1 << 18,
                        max_export_batch_size=512)


def lean_telemetry(ratio: float) -> Telemetry:
    """What ``[telemetry] exporter = "otlp"`` builds, its lean spans discarded."""
    provider = ratio_tracer_provider(ratio)
    recorder = discarding_recorder()
    provider.add_span_processor(recorder)
    return Telemetry(provider, recorder=recorder)


def scope(ratio: float, lean: bool) -> ConsumerScope:
    """Conveyor's consumer span of an ``orders`` handler, at ``ratio``."""
    provider = ratio_tracer_provider(ratio)
    recorder = None
    if lean:
        recorder = discarding_recorder()
        provider.add_span_processor(recorder)
    app = App("shop")

    @app.handler("orders")
    async def orders(body: bytes) -> None:
        return None

    return ConsumerScope(provider.get_tracer("conveyor"), app.handlers[0], system="redis",
                         group="shop", recorder=recorder)


def best_us(fn: Callable[[], object], calls: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(calls):
            fn()
        best = min(best, time.process_time() - start)
    return best / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    sdk = sdk_provider(0.0).get_tracer("bench")
    fast = Telemetry(shortcut_provider(0.0))
    kept_provider = sdk_provider(1.0, EncodeAndDiscard())
    kept = kept_provider.get_tracer("bench")
    dropping, lean = scope(0.0, lean=False), scope(1.0, lean=True)
    message = Message("1764000000000-0", StreamId("orders", "customer-1"), b"{}",
                      token=SequenceToken(3, 1))

    def sdk_consumer(headers: dict[str, str]) -> Callable[[], object]:
        def run() -> None:
            with sdk.start_as_current_span("process orders", context=PROPAGATOR.extract(
                    headers), kind=SpanKind.CONSUMER, attributes=dict(ATTRIBUTES)):
                pass
        return run

    def entered(scope: ConsumerScope, headers: dict[str, str]) -> Callable[[], object]:
        msg = msgspec.structs.replace(message, headers=headers)

        def run() -> None:
            scope.leave(scope.enter(msg))
        return run

    def sdk_publisher(tracer: trace.Tracer) -> Callable[[], None]:
        """An SDK producer span and ``inject``, as ``publish_span`` did before."""
        def publish() -> None:
            msg = Message("m", StreamId("orders", "customer-1"), b"{}", headers={})
            span = tracer.start_span("publish orders", kind=SpanKind.PRODUCER,
                                     attributes=dict(PRODUCER_ATTRIBUTES))
            PROPAGATOR.inject(msg.headers, context=trace.set_span_in_context(span))
            span.end()
        return publish

    def publisher(telemetry: Telemetry) -> Callable[[], None]:
        def publish() -> None:
            msg = Message("m", StreamId("orders", "customer-1"), b"{}", headers={})
            telemetry.publish_span(msg, "redis", 3).end()
        return publish

    sdk_publish, fast_publish = sdk_publisher(sdk), publisher(fast)

    def under_dropped_parent(run: Callable[[], None]) -> Callable[[], object]:
        parent = trace.set_span_in_context(NonRecordingSpan(SpanContext(
            0x4B4B << 64, 0xF0F0, True, TraceFlags(0x02))))

        def publish() -> None:
            token = attach(parent)
            try:
                run()
            finally:
                detach(token)
        return publish

    sdk_kept_publish, lean_publish = sdk_publisher(kept), publisher(lean_telemetry(1.0))

    def kept_consumer() -> None:
        with kept.start_as_current_span("process orders", context=PROPAGATOR.extract(KEPT),
                                        kind=SpanKind.CONSUMER, attributes=dict(ATTRIBUTES)):
            pass

    def kept_flushed(run: Callable[[], object], provider: TracerProvider
                     ) -> Callable[[], object]:
        calls = [0]

        def flushed() -> None:  # the batch's encoding inside the timing
            run()
            calls[0] += 1
            if calls[0] % args.calls == 0:
                provider.force_flush()
        return flushed

    rows = [
        ("consumer, dropped parent", sdk_consumer(DROPPED), entered(dropping, DROPPED)),
        ("consumer, new trace, dropped", sdk_consumer({}), entered(dropping, {})),
        ("consumer, kept", kept_flushed(kept_consumer, kept_provider),
         entered(lean, KEPT)),
        ("producer, new trace, dropped", sdk_publish, fast_publish),
        ("producer, dropped parent", under_dropped_parent(sdk_publish),
         under_dropped_parent(fast_publish)),
        ("producer, kept", kept_flushed(sdk_kept_publish, kept_provider), lean_publish),
    ]
    print(f"CPU µs per call, best of {args.repeats} x {args.calls:,} calls")
    print(f"{'path':<30} {'SDK':>8} {'Conveyor':>9} {'ratio':>7}")
    for name, slow, quick in rows:
        s, q = best_us(slow, args.calls, args.repeats), best_us(quick, args.calls, args.repeats)
        print(f"{name:<30} {s:>8.2f} {q:>9.2f} {s / q:>6.1f}x")


if __name__ == "__main__":
    main()
