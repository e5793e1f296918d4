"""Traces from producer to handler and metrics against known workloads (in process)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricsData
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from conveyor import App, Client, MessageContext
from conveyor.platform.delivery.metrics import HandlerDuration
from conveyor.platform.delivery.tracing import ConsumerSpans, RetrySpans
from conveyor.platform.histograms import LocalMetrics
from conveyor.platform.message import Message, StreamId
from conveyor.platform.telemetry import SCOPE, Telemetry
from tests.conftest import wait_until
from tests.integration.memory_harness import (
    Item,
    Record,
    config,
    daemon,
    fresh_adapter,
    recording_app,
)


class MergingReader(InMemoryMetricReader):
    """An in-memory reader that merges the locally counted histograms in, as the readers
    ``Telemetry.from_config`` builds do."""

    def __init__(self, local: LocalMetrics) -> None:
        super().__init__()
        self._local = local

    def _receive_metrics(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
                         **kwargs: Any) -> None:
        super()._receive_metrics(self._local.merge(metrics_data, self), timeout_millis)


def in_memory() -> tuple[Telemetry, InMemorySpanExporter, InMemoryMetricReader]:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    local = LocalMetrics(SCOPE)
    reader = MergingReader(local)
    telemetry = Telemetry(tracer_provider, MeterProvider(metric_readers=[reader]), local=local)
    return telemetry, spans, reader


def by_name(spans: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def metric_points(reader: InMemoryMetricReader) -> dict[str, dict[tuple[Any, ...], Any]]:
    """Each metric's current points keyed by their sorted attribute items."""
    data = reader.get_metrics_data()
    assert data is not None
    return {
        metric.name: {
            tuple(sorted((p.attributes or {}).items())): getattr(p, "value", None)
            for p in metric.data.data_points
        }
        for rm in data.resource_metrics for sm in rm.scope_metrics for metric in sm.metrics
    }


def metric_values(reader: InMemoryMetricReader) -> dict[str, Any]:
    data = reader.get_metrics_data()
    out: dict[str, Any] = {}
    assert data is not None
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                points = list(metric.data.data_points)
                if metric.name == "conveyor.handler.duration":
                    out[metric.name] = sum(p.count for p in points)  # type: ignore[union-attr]
                else:
                    out[metric.name] = sum(p.value for p in points)  # type: ignore[union-attr]
    return out


async def test_one_trace_from_producer_to_handler_with_retries_and_dead_letter() -> None:
    telemetry, spans, _ = in_memory()
    adapter = fresh_adapter()
    record = Record()
    d = daemon(recording_app(record), adapter, telemetry=telemetry)
    client = Client(adapter, d.mapper, telemetry=telemetry)
    await client.publish("items", "k1", Item(1))  # succeeds at once
    await client.publish("items", "k2", Item(2, fail=2))  # fails twice, then succeeds
    await client.publish("items", "k3", Item(3, fail=-1))  # dead-lettered after 3
    await d.start()
    await wait_until(lambda: record.handled == 2 and d.stats.dead_lettered == 1, 10,
                     what="handled and dead-lettered")
    await d.stop()
    finished = spans.get_finished_spans()
    producers = by_name(finished, "publish items")
    assert [s.kind for s in producers] == [SpanKind.PRODUCER] * 3
    traces = {}  # what each producer's trace holds, by the message's stream key
    for producer in producers:
        trace_id = producer.context.trace_id
        in_trace = [s for s in finished if s.context.trace_id == trace_id]
        [consumer] = [s for s in in_trace if s.kind == SpanKind.CONSUMER]
        c_attrs, p_attrs = dict(consumer.attributes or {}), dict(producer.attributes or {})
        children = [s for s in in_trace if s.parent and s.parent.span_id ==
                    consumer.context.span_id]
        traces[p_attrs["conveyor.stream.key"]] = {
            "parent": consumer.parent is not None
            and consumer.parent.span_id == producer.context.span_id,
            "id": c_attrs["messaging.message.id"] == p_attrs["messaging.message.id"],
            "consumer": [c_attrs[k] for k in (
                "messaging.operation.type", "messaging.consumer.group.name",
                "messaging.system")],
            "retries": sorted(s.attributes["conveyor.attempt"]  # type: ignore[index]
                              for s in children if s.name.startswith("retry ")),
            "dead letters": len([s for s in children if s.name == "dead-letter"]),
            "error": consumer.status.status_code == StatusCode.ERROR,
        }
    expected = {"parent": True, "id": True, "consumer": ["process", "test", "memory"]}
    assert traces == {
        "k1": {**expected, "retries": [], "dead letters": 0, "error": False},
        "k2": {**expected, "retries": [2, 3], "dead letters": 0, "error": False},
        # only the dead-lettered message's consumer span is in error
        "k3": {**expected, "retries": [2, 3], "dead letters": 1, "error": True},
    }


async def test_a_message_without_trace_context_starts_a_new_trace() -> None:
    """No ``traceparent`` (a producer without telemetry): the consumer span is the root
    of a trace of its own, and the handler runs inside it."""
    telemetry, spans, _ = in_memory()
    adapter = fresh_adapter()
    inside: list[tuple[int, int, str, bool]] = []
    app = App("test")

    @app.handler("items")
    async def handle(item: Item, ctx: MessageContext) -> None:
        context = trace.get_current_span().get_span_context()
        inside.append((context.trace_id, context.span_id, ctx.message.id,
                       "traceparent" in ctx.headers))

    d = daemon(app, adapter, telemetry=telemetry)
    plain = Client(adapter, d.mapper)  # no telemetry: no traceparent header
    await plain.publish("items", "k", Item(1))
    await d.start()
    await wait_until(lambda: len(inside) == 1, 10, what="handled")
    await d.stop()
    [consumer] = [s for s in spans.get_finished_spans() if s.kind == SpanKind.CONSUMER]
    assert consumer.name == "process items" and consumer.parent is None  # a root
    assert consumer.context.trace_flags.sampled
    assert consumer.attributes is not None
    assert inside == [(consumer.context.trace_id, consumer.context.span_id,
                       consumer.attributes["messaging.message.id"], False)]


async def test_metrics_count_exactly_the_known_workload() -> None:
    telemetry, _, reader = in_memory()
    adapter = fresh_adapter()
    record = Record()
    d = daemon(recording_app(record), adapter, config(slots={"count": 7}),
               telemetry=telemetry)
    client = Client(adapter, d.mapper)
    for i in range(50):
        await client.publish("items", f"k{i % 5}", Item(i, fail=-1 if i % 10 == 0 else 0))
    await d.start()
    await wait_until(lambda: record.handled == 45 and d.stats.dead_lettered == 5, 10,
                     what="45 handled, 5 dead-lettered")
    values = metric_values(reader)
    await d.stop()
    assert values["conveyor.messages.handled"] == 45
    assert values["conveyor.messages.dead_lettered"] == 5
    assert values["conveyor.messages.retried"] == 5 * 2
    assert values["conveyor.messages.failed"] == 5 * 3
    assert values["conveyor.handler.duration"] == 50  # one record per (message, handler)
    assert values["conveyor.slots.in_use"] == 0
    assert values["conveyor.queues.owned"] == 8
    # Stopped: every agent returned its permit, so every configured slot is free.
    after = metric_values(reader)
    assert after["conveyor.slots.available"] == 7
    assert after["conveyor.slots.in_use"] == 0
    assert after["conveyor.queues.owned"] == 0


async def test_back_to_back_calls_are_each_timed_on_their_own() -> None:
    """A lane's calls of 0.1 ms run about ten to a run (its 1 ms budget), the runner
    timing each: nearly every call reads about 0.1 ms. Timed from the run's start, the
    k-th call of a run would count k x 0.1 ms, half of them over 0.5 ms; timed from
    the end of the call before, it would count the runner's bookkeeping in between,
    garbage collections included (tried: a 0.1 ms call read 55 ms)."""
    telemetry, _, reader = in_memory()
    adapter = fresh_adapter()
    app = App("timed")
    busy_s, n = 0.0001, 60

    spins: list[int] = []

    @app.handler("busy")
    async def busy(body: bytes) -> None:
        until = time.perf_counter() + busy_s
        turns = 0
        while time.perf_counter() < until:
            turns += 1
        spins.append(turns)

    d = daemon(app, adapter, telemetry=telemetry)
    client = Client(adapter, d.mapper)
    for i in range(n):  # one stream: one lane, its calls back to back
        await client.publish("busy", "k", b"%d" % i)
    await d.start()
    await wait_until(lambda: d.stats.handled == n, 10, what=f"{n} handled")
    data = reader.get_metrics_data()
    await d.stop()
    assert data is not None
    assert len(spins) == n and min(spins) > 0  # each call was busy for its 0.1 ms
    [point] = [p for rm in data.resource_metrics for sm in rm.scope_metrics
               for m in sm.metrics if m.name == "conveyor.handler.duration"
               for p in m.data.data_points]
    assert point.count == n
    assert point.sum >= n * busy_s  # at least each call's own time
    # Timed from its run's start, the k-th call of a run of about ten would read k x 0.1
    # ms: half of them over the first bucket's 0.5 ms. Timed on its own, a call stays in
    # it unless the machine preempts it mid-call (a loaded VM's 4 ms, once, put the sum
    # past any bound on it; a CI run under load put 7 of 60 past it): a quarter of the
    # calls is left for that, still well clear of the half a run-timed lane would show.
    assert point.explicit_bounds[0] == 0.0005
    assert point.bucket_counts[0] >= 0.75 * n, (point.bucket_counts, point.sum, point.max)


async def test_slots_cache_fill_and_lag_gauges_follow_a_held_workload() -> None:
    """Three messages on one stream held by a blocked handler: one slot in use, three
    messages cached and three lagging on their queue; released, all drop to zero."""
    from conveyor import App

    telemetry, _, reader = in_memory()
    adapter = fresh_adapter()
    app = App("test")
    gate = asyncio.Event()
    seen: list[int] = []

    @app.handler("items")
    async def held(item: Item) -> None:
        await gate.wait()
        seen.append(item.seq)

    cfg = config(slots={"count": 7}, telemetry={"metrics_interval_s": 0.02})
    d = daemon(app, adapter, cfg, telemetry=telemetry)
    client = Client(adapter, d.mapper)
    for i in range(3):
        await client.publish("items", "one-stream", Item(i))
    q = str(d.mapper.queue_for(StreamId("items", "one-stream")))

    def point(name: str, queue: str | None = None, handler: str | None = None) -> Any:
        attrs = () if queue is None else (("queue", queue),)
        if handler is not None:
            attrs = (("handler", handler),)
        return metric_points(reader).get(name, {}).get(attrs)

    def readings() -> dict[str, Any]:
        return {"cache": point("conveyor.cache.fill", q),
                "slots": point("conveyor.slots.in_use", handler="*"),  # the daemon's total
                "other queues' caches": [
                    v for (attrs), v in metric_points(reader)["conveyor.cache.fill"].items()
                    if attrs != (("queue", q),)]}

    await d.start()
    try:
        await wait_until(lambda: point("conveyor.cache.fill", q) == 3, 10,
                         what="the held queue's agent to cache all three")
        await wait_until(lambda: point("conveyor.queue.lag", q) == 3, 10,
                         what="lag 3 sampled on the held queue")
        held = readings()
        gate.set()
        await wait_until(lambda: seen == [0, 1, 2], 10, what="all three handled in order")
        await wait_until(lambda: point("conveyor.queue.lag", q) == 0, 10, what="lag back to 0")
        released = readings()
    finally:
        gate.set()
        await d.stop()
    # One stream: one handler at a time.
    assert held == {"cache": 3, "slots": 1, "other queues' caches": [0] * 7}
    assert released == {"cache": 0, "slots": 0, "other queues' caches": [0] * 7}


async def test_an_unroutable_messages_dead_letter_span_continues_the_producers_trace() -> None:
    telemetry, spans, _ = in_memory()
    adapter = fresh_adapter()
    d = daemon(recording_app(Record()), adapter, config(dead_letters={"unroutable": "dead-letter"}),
               telemetry=telemetry)
    client = Client(adapter, d.mapper, telemetry=telemetry)
    await client.publish("nobody-listens", "k", {"x": 1})
    await d.start()
    await wait_until(lambda: d.stats.dead_lettered == 1, 10, what="dead-lettered")
    await d.stop()
    [producer] = by_name(spans.get_finished_spans(), "publish")
    [dead] = by_name(spans.get_finished_spans(), "dead-letter")
    assert dead.parent is not None and dead.parent.span_id == producer.context.span_id
    assert dead.context.trace_id == producer.context.trace_id
    assert dead.status.status_code == StatusCode.ERROR
    [letter] = await adapter.dead_letters.read("test")
    assert letter.error_type == "Unroutable" and letter.message.id == producer.attributes[
        "messaging.message.id"]  # type: ignore[index]


def test_telemetry_off_leaves_no_tracing_or_metrics_step_in_the_chain() -> None:
    instrumented = (ConsumerSpans, RetrySpans, HandlerDuration)
    d = daemon(recording_app(Record()), fresh_adapter())
    steps = {type(i) for i in d.interceptors}
    assert steps and steps.isdisjoint(instrumented), steps  # a chain, and none of them
    assert not d.client.telemetry.enabled
    telemetry, _, _ = in_memory()
    d = daemon(recording_app(Record()), fresh_adapter(), telemetry=telemetry)
    assert {type(i) for i in d.interceptors} >= set(instrumented)


def test_producer_writes_w3c_traceparent_into_headers() -> None:
    telemetry, spans, _ = in_memory()
    msg = Message("m", StreamId("ns", "k"), b"{}", headers={})
    span = telemetry.publish_span(msg, "memory", 3)
    span.end()
    version, trace_id, span_id, flags = msg.headers["traceparent"].split("-")
    assert version == "00" and int(trace_id, 16) == span.get_span_context().trace_id
    assert int(span_id, 16) == span.get_span_context().span_id
    assert int(flags, 16) & 1  # the default sampler keeps it, and the header says so
    [exported] = spans.get_finished_spans()  # the span the header names was recorded
    assert (exported.name, exported.kind) == ("publish ns", SpanKind.PRODUCER)
    assert exported.context.span_id == int(span_id, 16)


async def test_pool_and_cell_sizes_are_exported_and_published_with_the_heartbeat() -> None:
    from conveyor import App

    telemetry, _, reader = in_memory()
    adapter = fresh_adapter()
    app = App("test")
    done: list[int] = []

    @app.handler("items", name="pooled", stateless=True, max_workers=3)
    async def pooled(item: Item) -> None:
        done.append(item.seq)

    @app.handler("items", name="celled", cell_key="body:seq", cell_size=2)
    async def celled(item: Item) -> None:
        done.append(item.seq)

    d = daemon(app, adapter, telemetry=telemetry)
    client = Client(adapter, d.mapper)
    for i in range(6):
        await client.publish("items", f"k{i}", Item(i % 2))
    await d.start()
    await wait_until(lambda: len(done) == 12, 10, what="both handlers done")
    values = metric_values(reader)
    stats = d.stats_snapshot()
    await d.stop()
    assert 1 <= values["conveyor.pool.workers"] <= 3
    assert values["conveyor.cell.workers"] == 2 * 2  # cells "0" and "1", two workers each
    assert 1 <= stats["pool.pooled.workers"] <= 3
    assert stats["cell.celled/0.workers"] == stats["cell.celled/1.workers"] == 2
