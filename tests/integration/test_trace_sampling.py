"""The sampling shortcut (conveyor.platform.sampling): dropped traces skip the SDK, and
every decision is the one the SDK's ParentBased(TraceIdRatioBased) sampler makes.

In process, on the memory adapter, with a provider built as ``Telemetry.from_config``
builds it (the ratio sampler and :class:`RatioRoots`) but exporting to memory.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Sized

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from conveyor import App, Client, MessageContext
from conveyor.platform.delivery.chain import Delivery
from conveyor.platform.delivery.tracing import ConsumerSpans
from conveyor.platform.ids import StreamId
from conveyor.platform.message import Message
from conveyor.platform.sampling import ratio_tracer_provider, remote_parent
from conveyor.platform.telemetry import Telemetry
from tests.conftest import wait_until
from tests.integration.memory_harness import Item, daemon, fresh_adapter

RATIO = 0.25


def ratio_telemetry(ratio: float = RATIO) -> tuple[Telemetry, InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    provider = ratio_tracer_provider(ratio)
    provider.add_span_processor(SimpleSpanProcessor(spans))
    telemetry = Telemetry(provider)
    assert telemetry.roots is not None
    return telemetry, spans


def within_binomial(hits: int, n: int, p: float) -> bool:
    """``hits`` out of ``n`` is within six standard deviations of ``n·p`` (a false
    failure about once in 10⁹ runs)."""
    return abs(hits - n * p) <= 6 * math.sqrt(n * p * (1 - p))


async def publish_and_handle(app: App, telemetry: Telemetry, n: int, handled: Sized, *,
                             traced_producer: bool) -> None:
    """Publish ``n`` items (through a traced client, or one without telemetry: no
    ``traceparent``), run a daemon until ``handled`` holds every one, once each."""
    adapter = fresh_adapter()
    d = daemon(app, adapter, telemetry=telemetry)
    client = Client(adapter, d.mapper, telemetry=telemetry if traced_producer else None)
    for i in range(n):
        await client.publish("items", f"k{i % 50}", Item(i))
    await d.start()
    await wait_until(lambda: len(handled) == n, 20, what="every message handled")
    await d.stop()
    assert len(handled) == n


def flags_of(headers: dict[str, str]) -> int:
    return int(headers["traceparent"].split("-")[3], 16)


def test_a_new_trace_is_kept_at_the_ratio_and_its_header_says_so() -> None:
    telemetry, spans = ratio_telemetry()
    n = 4000
    sent: list[Message] = []
    for i in range(n):
        msg = Message(f"m{i}", StreamId("ns", "k"), b"{}", headers={})
        telemetry.publish_span(msg, "memory", 0).end()
        sent.append(msg)
    recorded = {s.context.trace_id for s in spans.get_finished_spans()}
    kept = [m for m in sent if flags_of(m.headers) & 1]
    assert within_binomial(len(kept), n, RATIO), len(kept)
    # A kept trace's header names the span the SDK recorded; a dropped one is valid
    # W3C with the sampled bit clear (and the random-trace-id bit, as the SDK sets).
    assert {remote_parent(m.headers).trace_id for m in kept} == recorded  # type: ignore[union-attr]
    parents = [remote_parent(m.headers) for m in sent]
    assert [p is not None and p.is_valid for p in parents] == [True] * n
    assert {flags_of(m.headers) for m in sent} == {0x02, 0x03}
    assert len(recorded) == len(kept)


def test_a_publish_inside_a_span_follows_its_parent_not_the_ratio() -> None:
    telemetry, spans = ratio_telemetry(ratio=0.0)  # the ratio alone would keep nothing
    assert telemetry.tracer is not None
    with telemetry.tracer.start_as_current_span("outer", context=None) as outer:
        recorded = outer.is_recording()
    assert not recorded  # a new root at ratio 0: dropped
    assert list(spans.get_finished_spans()) == []
    # A sampled parent (forced by a remote sampled context) keeps its child publish.
    parent = remote_parent({"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-01"})
    assert parent is not None
    ctx = trace.set_span_in_context(trace.NonRecordingSpan(parent))
    with telemetry.tracer.start_as_current_span("handler", context=ctx):
        msg = Message("m", StreamId("ns", "k"), b"{}", headers={})
        telemetry.publish_span(msg, "memory", 0).end()
    assert msg.headers["traceparent"].startswith(f"00-{'ab' * 16}-")
    assert flags_of(msg.headers) & 1
    assert [s.name for s in spans.get_finished_spans()] == ["publish ns", "handler"]


async def test_the_consumer_follows_the_producers_decision_and_keeps_the_trace() -> None:
    """Each message handled once (no fault here: no duplicates allowed); a consumer span
    exactly for the kept traces, parented on the producer span; the handler of a
    dropped trace runs in that trace's context, and what it publishes carries it on."""
    telemetry, spans = ratio_telemetry()
    calls: list[int] = []
    seen: dict[int, tuple[int, bool]] = {}
    published: dict[int, str] = {}
    onward: dict[int, str] = {}
    app = App("test")

    @app.handler("items")
    async def handle(item: Item, ctx: MessageContext) -> None:
        calls.append(item.seq)
        context = trace.get_current_span().get_span_context()
        seen[item.seq] = (context.trace_id, trace.get_current_span().is_recording())
        published[item.seq] = ctx.headers["traceparent"]
        child = Message(f"c{item.seq}", StreamId("out", "k"), b"{}", headers={})
        telemetry.publish_span(child, "memory", 0).end()
        onward[item.seq] = child.headers["traceparent"]

    n = 600
    await publish_and_handle(app, telemetry, n, calls, traced_producer=True)
    assert sorted(calls) == list(range(n))
    assert len(seen) == len(published) == len(onward) == n  # the checks below cover all
    finished = spans.get_finished_spans()
    producers = {s.context.trace_id: s for s in finished if s.kind == SpanKind.PRODUCER
                 and s.name == "publish items"}
    consumers = {s.context.trace_id: s for s in finished if s.kind == SpanKind.CONSUMER}
    assert set(consumers) == set(producers)
    assert within_binomial(len(producers), n, RATIO), len(producers)
    assert {trace_id: consumer.parent and consumer.parent.span_id
            for trace_id, consumer in consumers.items()} == {
        trace_id: producer.context.span_id for trace_id, producer in producers.items()}
    # Each handler ran in its message's trace, recording only if it was kept, and what
    # it published carries the same trace and decision on.
    expected = {}
    for i, header in published.items():
        kept = bool(flags_of({"traceparent": header}) & 1)
        expected[i] = (int(header.split("-")[1], 16), kept, header.split("-")[1], kept)
    assert {i: (*seen[i], onward[i].split("-")[1],
                bool(flags_of({"traceparent": onward[i]}) & 1)) for i in published} == expected


async def test_a_message_without_a_traceparent_starts_traces_at_the_ratio() -> None:
    telemetry, spans = ratio_telemetry()
    handled: list[int] = []
    in_a_trace: list[bool] = []
    app = App("test")

    @app.handler("items")
    async def handle(item: Item, ctx: MessageContext) -> None:
        in_a_trace.append(trace.get_current_span().get_span_context().is_valid)
        handled.append(item.seq)

    n = 2000
    await publish_and_handle(app, telemetry, n, handled, traced_producer=False)
    assert sorted(handled) == list(range(n))
    assert in_a_trace == [True] * n  # kept or dropped, every handler runs in a trace
    consumers = [s for s in spans.get_finished_spans() if s.kind == SpanKind.CONSUMER]
    assert within_binomial(len(consumers), n, RATIO), len(consumers)
    assert {s.parent for s in consumers} == {None}  # some consumer spans, every one a root


def test_remote_parent_refuses_a_malformed_or_stated_traceparent() -> None:
    """``remote_parent`` (what a sampled parent's ids are read through) refuses what the
    SDK's propagator must read. A consumer takes a "not sampled" header of the right
    length unchecked, and checks it later: tests/unit/test_consumer_scope.py."""
    good = f"00-{'ab' * 16}-{'cd' * 8}-00"
    assert remote_parent({"traceparent": good}) is not None
    bad = ("", good.upper(), good + "-", "01" + good[2:], f"00-{'0' * 32}-{'cd' * 8}-00",
           f"00-{'ab' * 16}-{'0' * 16}-00", f"00-{'ab' * 16}-{'cd' * 8}-0x",
           good.replace("-", "_"))
    assert [remote_parent({"traceparent": b}) for b in bad] == [None] * 8  # all 8 refused
    parent = remote_parent({"traceparent": good})
    assert parent is not None and (parent.trace_id, parent.span_id, parent.trace_flags) == (
        int("ab" * 16, 16), int("cd" * 8, 16), 0)
    assert remote_parent({"traceparent": good, "tracestate": "a=b"}) is None


async def test_an_exception_leaving_the_consumer_span_is_recorded_as_use_span_records_it(
) -> None:
    """The consumer step starts its span without ``start_as_current_span``: an error
    that leaves the chain still ends the span with the exception event and error status
    the SDK's context manager gives, and the handler ran inside it."""
    telemetry, spans = ratio_telemetry(1.0)
    assert telemetry.tracer is not None
    app = App("test")

    @app.handler("items")
    async def handle(item: Item) -> None:
        return None

    [spec] = app.handlers
    inside: list[int] = []

    async def failing(delivery: Delivery) -> None:
        inside.append(trace.get_current_span().get_span_context().span_id)
        raise ValueError("boom")

    step = ConsumerSpans(telemetry.tracer, system="memory", group="test").wrap(spec, failing)
    parent = f"00-{'ab' * 16}-{'cd' * 8}-01"
    msg = Message("m-1", StreamId("items", "k"), b"{}", headers={"traceparent": parent})
    with pytest.raises(ValueError, match="boom"):
        await step(Delivery(msg, spec))
    [span] = spans.get_finished_spans()
    assert span.kind == SpanKind.CONSUMER and span.context.span_id == inside[0]
    assert span.parent is not None and span.parent.span_id == int("cd" * 8, 16)
    assert span.parent.is_remote and span.context.trace_id == int("ab" * 16, 16)
    assert span.status.status_code == StatusCode.ERROR
    assert span.status.description == "ValueError: boom"
    [event] = span.events
    assert event.name == "exception" and event.attributes is not None
    assert event.attributes["exception.type"] == "ValueError"
    assert trace.get_current_span() is trace.INVALID_SPAN  # the context was detached


@pytest.mark.parametrize("traced_producer", [False, True],
                         ids=["worker decides", "producer decides"])
async def test_tasks_a_handler_starts_keep_their_messages_trace(traced_producer: bool) -> None:
    """The runner reuses a dropped trace's context for the next dropped trace only when
    nothing holds it (ConsumerScope's "Reused"): a task the handler starts, still
    running while later messages are handled, sees its own message's trace id — as do
    the handler's spans kept in a list — and every message has a trace of its own."""
    telemetry, spans = ratio_telemetry(0.1)
    handled: list[int] = []
    in_call: dict[int, int] = {}
    in_task: dict[int, int] = {}
    kept: dict[int, trace.Span] = {}
    app = App("test")

    async def later(seq: int) -> None:
        await wait_until(lambda: len(handled) >= min(seq + 20, n), 20, what="later messages")
        in_task[seq] = trace.get_current_span().get_span_context().trace_id

    tasks = []

    @app.handler("items")
    async def handle(item: Item) -> None:
        span = trace.get_current_span()
        in_call[item.seq] = span.get_span_context().trace_id
        if item.seq % 7 == 0:
            tasks.append(asyncio.create_task(later(item.seq)))
        elif item.seq % 7 == 1:
            kept[item.seq] = span
        handled.append(item.seq)

    n = 300
    await publish_and_handle(app, telemetry, n, handled, traced_producer=traced_producer)
    await asyncio.wait_for(asyncio.gather(*tasks), 20)
    assert sorted(handled) == list(range(n))
    assert len(set(in_call.values())) == n  # a trace each
    assert in_task == {seq: in_call[seq] for seq in range(0, n, 7)}
    assert {seq: s.get_span_context().trace_id for seq, s in kept.items()} == {
        seq: in_call[seq] for seq in range(1, n, 7)}
    consumers = [s for s in spans.get_finished_spans() if s.kind == SpanKind.CONSUMER]
    assert 0 < len(consumers) < n  # some kept, most dropped: both paths were taken


async def test_a_bad_tracestate_on_every_message_is_warned_of_once_not_per_message(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenTelemetry's API warns each time it reads a ``tracestate`` that breaks the W3C
    rules: a producer sending one on every message got one line a message. One line of
    each kind passes per ``HEADER_WARNING_REPEAT_S``, then one saying how many more;
    every message is still handled, in its producer's trace (the bad state dropped)."""
    from conveyor.platform import telemetry as telemetry_module

    monkeypatch.setattr(telemetry_module, "HEADER_WARNING_REPEAT_S", 3600.0)
    telemetry, _ = ratio_telemetry(1.0)
    handled: list[int] = []
    traces: set[int] = set()
    app = App("test")

    @app.handler("items")
    async def handle(item: Item) -> None:
        context = trace.get_current_span().get_span_context()
        traces.add(context.trace_id)
        assert not context.trace_state  # the bad state dropped, as the API drops it
        handled.append(item.seq)

    adapter = fresh_adapter()
    d = daemon(app, adapter, telemetry=telemetry)
    client = Client(adapter, d.mapper)
    n = 300
    producer_trace = int("ab" * 16, 16)
    for i in range(n):
        await client.publish("items", f"k{i % 50}", Item(i), headers={
            "traceparent": f"00-{'ab' * 16}-{i + 1:016x}-01",
            "tracestate": f"bad key {i}=@@@"})
    with caplog.at_level("WARNING", logger="opentelemetry"):
        await d.start()
        await wait_until(lambda: len(handled) == n, 20, what="every message handled")
        first = [r.getMessage() for r in caplog.records if r.name.startswith("opentelemetry")]
        monkeypatch.setattr(telemetry_module, "HEADER_WARNING_REPEAT_S", 0.0)
        await client.publish("items", "k0", Item(n), headers={
            "traceparent": f"00-{'ab' * 16}-{n + 1:016x}-01", "tracestate": "bad key=@@@"})
        await wait_until(lambda: len(handled) == n + 1, 20, what="the last message handled")
        await d.stop()
    assert sorted(handled) == list(range(n + 1)) and traces == {producer_trace}
    assert len(first) == 1 and "w3c identifiers format" in first[0], first
    later = [r.getMessage() for r in caplog.records if r.name.startswith("opentelemetry")]
    assert len(later) == 2, later
    assert re.search(rf"@@@ \(and {n - 1} more like it in the last \d+s\)$", later[1]), later
