"""Microseconds of CPU per message for each tracing path, the SDK's way and Conveyor's
shortcut (conveyor.platform.sampling) side by side, in the same run.

Each path runs ``--calls`` times in a loop that does nothing else, best of
``--repeats``; the ratio column is SDK / shortcut. What is timed:

* *consumer, dropped parent*: a message whose ``traceparent`` says "not sampled" —
  the SDK: extract the header, start a non-recording consumer span as the current
  span, end it; the shortcut: match the header, attach the parent's span (its ids
  parsed only if asked for), detach.
* *consumer, new trace, dropped*: a message without ``traceparent`` at a ratio that
  drops it (the SDK: a root span through the ratio sampler; the shortcut: the
  decision on a drawn trace id and a non-recording span attached).
* *producer, new trace, dropped*: ``Telemetry.publish_span`` outside any span at a
  ratio that drops it (SDK span + ``inject`` against a hand-written ``traceparent``).
* *consumer, kept* (no shortcut: the SDK records it either way) — for scale.

    .venv/bin/python benchmarks/trace_paths.py [--calls 20000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

# Run from a clone as `.venv/bin/python benchmarks/NAME.py`: import this checkout's conveyor.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opentelemetry import context, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind

from conveyor.platform.ids import StreamId
from conveyor.platform.message import Message
from conveyor.platform.sampling import ratio_tracer_provider, remote_span
from conveyor.platform.telemetry import PROPAGATOR, Telemetry

ATTRIBUTES = {
    "messaging.system": "redis", "messaging.destination.name": "orders",
    "messaging.operation.type": "process", "messaging.operation.name": "process",
    "messaging.consumer.group.name": "shop", "conveyor.handler": "orders",
    "messaging.message.id": "1764000000000-0", "conveyor.stream.key": "customer-1",
    "messaging.destination.partition.id": "3",
}
DROPPED = {"traceparent": f"00-{'4b' * 16}-{'00f0' * 4}-02"}
KEPT = {"traceparent": f"00-{'4b' * 16}-{'00f0' * 4}-03"}


class Discard(SpanExporter):
    def export(self, spans: object) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def sdk_provider(ratio: float) -> TracerProvider:
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
    provider.add_span_processor(BatchSpanProcessor(Discard(), max_queue_size=1 << 18))
    return provider


def shortcut_provider(ratio: float) -> TracerProvider:
    provider = ratio_tracer_provider(ratio)
    provider.add_span_processor(BatchSpanProcessor(Discard(), max_queue_size=1 << 18))
    return provider


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
    kept = sdk_provider(1.0).get_tracer("bench")
    roots = fast.roots
    assert roots is not None

    def sdk_consumer(headers: dict[str, str]) -> Callable[[], object]:
        def run() -> None:
            with sdk.start_as_current_span("process orders", context=PROPAGATOR.extract(
                    headers), kind=SpanKind.CONSUMER, attributes=dict(ATTRIBUTES)):
                pass
        return run

    def fast_dropped_parent() -> None:
        parent = remote_span(DROPPED)
        assert parent is not None and not parent.sampled
        token = context.attach(trace.set_span_in_context(parent))
        context.detach(token)

    def fast_new_dropped() -> None:
        trace_id = roots.dropped_root()
        assert trace_id is not None
        token = context.attach(trace.set_span_in_context(roots.dropped_span(trace_id)))
        context.detach(token)

    def sdk_publish() -> None:
        msg = Message("m", StreamId("orders", "customer-1"), b"{}", headers={})
        span = sdk.start_span("publish orders", kind=SpanKind.PRODUCER,
                              attributes=dict(ATTRIBUTES))
        PROPAGATOR.inject(msg.headers, context=trace.set_span_in_context(span))
        span.end()

    def fast_publish() -> None:
        msg = Message("m", StreamId("orders", "customer-1"), b"{}", headers={})
        fast.publish_span(msg, "redis", 3).end()

    def kept_consumer() -> None:
        with kept.start_as_current_span("process orders", context=PROPAGATOR.extract(KEPT),
                                        kind=SpanKind.CONSUMER, attributes=dict(ATTRIBUTES)):
            pass

    rows = [
        ("consumer, dropped parent", sdk_consumer(DROPPED), fast_dropped_parent),
        ("consumer, new trace, dropped", sdk_consumer({}), fast_new_dropped),
        ("producer, new trace, dropped", sdk_publish, fast_publish),
    ]
    print(f"CPU µs per call, best of {args.repeats} x {args.calls:,} calls")
    print(f"{'path':<30} {'SDK':>8} {'shortcut':>9} {'ratio':>7}")
    for name, slow, quick in rows:
        s, q = best_us(slow, args.calls, args.repeats), best_us(quick, args.calls, args.repeats)
        print(f"{name:<30} {s:>8.2f} {q:>9.2f} {s / q:>6.1f}x")
    k = best_us(kept_consumer, args.calls, args.repeats)
    print(f"{'consumer, kept (SDK only)':<30} {k:>8.2f}")


if __name__ == "__main__":
    main()
