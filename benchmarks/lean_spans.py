"""Microseconds of CPU per consumer span: the SDK's span and OTLP exporter against
:mod:`conveyor.platform.spans`, in the same run.

A consumer span as the delivery chain makes it (``process orders``, CONSUMER, six fixed
and three per-message string attributes, a remote parent). Each figure is
``process_time`` (every thread of the process) over ``--spans`` spans, best of
``--repeats``:

* *start + end*: the SDK — ``tracer.start_span`` with the nine attributes and ``end``
  into a ``BatchSpanProcessor`` (its thread idle: a long delay, a queue that holds
  them all); lean — ``LeanSpan(...)`` and ``end``, which encodes the span and queues
  the bytes (the recorder's thread idle too).
* *encode*: the SDK — ``encode_spans(batch).SerializePartialToString()`` per batch of
  512; lean — the encoding alone (part of its *start + end*).
* *export to an endpoint*: flushing the queued spans to an OTLP/HTTP endpoint in
  another process (:mod:`conveyor.bench.otlp_sink`) through the shipped exporter —
  the SDK encodes and posts; lean joins and posts.

    .venv/bin/python benchmarks/lean_spans.py [--spans 20000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

# Run from a clone as `.venv/bin/python benchmarks/NAME.py`: import this checkout's conveyor.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

from conveyor.bench.telemetry_cost import Collector
from conveyor.platform.spans import LeanRecorder, LeanSpan, SpanShape, otlp_sender

FIXED = {
    "messaging.system": "redis", "messaging.destination.name": "orders",
    "messaging.operation.type": "process", "messaging.operation.name": "process",
    "messaging.consumer.group.name": "shop", "conveyor.handler": "orders",
}
IDLE = {"max_queue_size": 1 << 20, "max_export_batch_size": 512,
        "schedule_delay_millis": 3_600_000}
SAMPLED = TraceFlags(TraceFlags.SAMPLED | TraceFlags.RANDOM_TRACE_ID)


class Keep(SpanExporter):
    """Keeps what the SDK's processor exports (to time the encoder on it)."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: object) -> SpanExportResult:
        self.spans.extend(spans)  # type: ignore[call-overload]
        return SpanExportResult.SUCCESS


def per_message(i: int) -> dict[str, str]:
    return {"messaging.message.id": f"1764000000000-{i}", "conveyor.stream.key": f"s{i % 500}",
            "messaging.destination.partition.id": "3"}


def cpu_us(n: int, run: Callable[[], object]) -> float:
    started = time.process_time()
    run()
    return (time.process_time() - started) / n * 1e6


def measure(n: int, endpoint: str) -> dict[str, float]:
    resource = Resource.create({"service.name": "bench"})
    parents = [SpanContext(random.getrandbits(128), random.getrandbits(64), True, SAMPLED)
               for _ in range(n)]
    contexts = [trace.set_span_in_context(NonRecordingSpan(p)) for p in parents]
    attributes = [per_message(i) for i in range(n)]
    figures = {}

    keep = Keep()
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(keep, **IDLE))
    tracer = provider.get_tracer("conveyor")

    def sdk_spans() -> None:
        for context, extra in zip(contexts, attributes, strict=True):
            tracer.start_span("process orders", context, SpanKind.CONSUMER,
                              {**FIXED, **extra}).end()

    figures["sdk start + end"] = cpu_us(n, sdk_spans)
    provider.force_flush()
    batches = [keep.spans[i:i + 512] for i in range(0, n, 512)]
    figures["sdk encode"] = cpu_us(n, lambda: [
        encode_spans(b).SerializePartialToString() for b in batches])
    sdk_exporter = OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces")
    figures["sdk export to an endpoint"] = cpu_us(n, lambda: [
        sdk_exporter.export(b) for b in batches])
    provider.shutdown()

    exporter = OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces")
    send = otlp_sender(exporter)
    assert send is not None
    recorder = LeanRecorder(send, resource, InstrumentationScope("conveyor"), **IDLE)
    shape = SpanShape(recorder, "process orders", SpanKind.CONSUMER, FIXED)

    span_ids = [random.getrandbits(64) for _ in range(n)]

    def lean_spans() -> None:
        for parent, span_id, extra in zip(parents, span_ids, attributes, strict=True):
            LeanSpan(shape, parent.trace_id, span_id, parent.span_id, SAMPLED, extra).end()

    figures["lean start + end"] = cpu_us(n, lean_spans)
    ended = [LeanSpan(shape, p.trace_id, i, p.span_id, SAMPLED, a)
             for p, i, a in zip(parents, span_ids, attributes, strict=True)]
    for span in ended:
        span._end = span.start_time + 1000
    figures["lean encode"] = cpu_us(n, lambda: [s._encode() for s in ended])
    figures["lean export to an endpoint"] = cpu_us(n, recorder.force_flush)
    recorder.shutdown()
    exporter.shutdown()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    collector = Collector()
    try:
        runs = [measure(args.spans, collector.endpoint) for _ in range(args.repeats)]
    finally:
        collector.close()
    print(f"µs of CPU per consumer span, best of {args.repeats} x {args.spans}")
    for name in runs[0]:
        print(f"  {name:30} {min(r[name] for r in runs):7.2f}")


if __name__ == "__main__":
    main()
