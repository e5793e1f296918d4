"""Producer spans: Conveyor's (lean spans with a recorder, as ``[telemetry] exporter =
"otlp"`` builds it; the sampling shortcuts with or without one) and the plain SDK's
(a provider with the same sampler, no shortcut) record the same spans — names, kinds,
parents, flags, attributes, statuses, events — and write the same ``traceparent``, in
every context a publish can happen in: a new trace kept or dropped, under a local or a
remote sampled parent (with or without a ``tracestate``), under a dropped parent (with
or without the random-trace-id flag, with a ``tracestate``), and a publish that
fails."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.context import attach, detach
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from conveyor import Client
from conveyor.adapters.memory import MemoryAdapter, reset_broker
from conveyor.platform.ids import StreamId
from conveyor.platform.mapper import HashRingQueueMapper
from conveyor.platform.message import Message
from conveyor.platform.spans import LeanSpan
from conveyor.platform.telemetry import Telemetry
from tests.unit.test_consumer_scope import Traced, _summary

TRACE_ID, PARENT_ID = 0x4B * (2**120 // 0x80), 0xF0F0F0F0F0F0F0F0


def remote(flags: int, state: TraceState | None = None) -> NonRecordingSpan:
    return NonRecordingSpan(SpanContext(TRACE_ID, PARENT_ID, True, TraceFlags(flags), state))


@contextmanager
def under(parent: Any, traced: Traced) -> Iterator[None]:
    """``parent``: None (no current span), "local" (a sampled span of the provider's,
    ended after), or a span to make current."""
    if parent is None:
        yield
        return
    if parent == "local":
        with traced.tracer.start_as_current_span("handler's own"):
            yield
        return
    token = attach(trace.set_span_in_context(parent))
    try:
        yield
    finally:
        detach(token)


PARENTS = {
    "new trace": None,
    "local sampled parent": "local",
    "remote sampled parent": remote(0x03),
    "remote parent with tracestate": remote(0x01, TraceState([("k", "v")])),
    "dropped parent": remote(0x00),
    "dropped parent, random trace id": remote(0x02),
    "dropped parent with tracestate": remote(0x02, TraceState([("k", "v")])),
}


class PlainSdk(Traced):
    """The reference: the SDK's own provider, same sampler, no Conveyor shortcut."""

    def __init__(self, ratio: float) -> None:
        self.sdk = InMemorySpanExporter()
        self.posts = []
        self.recorder = None
        self.provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
        self.provider.add_span_processor(SimpleSpanProcessor(self.sdk))
        self.tracer = self.provider.get_tracer("conveyor")


WAYS = {"plain sdk": lambda ratio: PlainSdk(ratio),
        "shortcuts": lambda ratio: Traced(ratio),
        "lean": lambda ratio: Traced(ratio, lean=True)}


def publish(way: str, ratio: float, parent: Any) -> tuple[list[Any], dict[str, str], Any]:
    traced = WAYS[way](ratio)
    telemetry = Telemetry(traced.provider, recorder=traced.recorder)
    assert (telemetry.roots is None) == (way == "plain sdk")
    msg = Message("m1", StreamId("orders", "customer-1"), b"{}", headers={})
    with under(parent, traced):
        span = telemetry.publish_span(msg, "redis", 3)
        span.end()
    return _summary(traced.spans()), msg.headers, span


@pytest.mark.parametrize("way", ["shortcuts", "lean"])
@pytest.mark.parametrize("parent", list(PARENTS), ids=list(PARENTS))
def test_producer_spans_record_what_the_sdk_records_and_write_the_same_traceparent(
    parent: str, way: str
) -> None:
    sdk_spans, sdk_headers, sdk_span = publish("plain sdk", 1.0, PARENTS[parent])
    spans, headers, span = publish(way, 1.0, PARENTS[parent])
    assert spans == sdk_spans
    assert sorted(headers) == sorted(sdk_headers)
    version, trace_id, span_id, flags = headers["traceparent"].split("-")
    assert (version, flags) == ("00", sdk_headers["traceparent"].split("-")[3])
    assert headers.get("tracestate") == sdk_headers.get("tracestate")
    context, sdk_context = span.get_span_context(), sdk_span.get_span_context()
    assert (int(trace_id, 16), int(span_id, 16)) == (context.trace_id, context.span_id)
    assert (context.trace_flags, context.is_remote, context.trace_state) == (
        sdk_context.trace_flags, sdk_context.is_remote, sdk_context.trace_state)
    assert span.is_recording() == sdk_span.is_recording()
    if parent.startswith("remote") or parent.startswith("dropped"):
        assert context.trace_id == sdk_context.trace_id == TRACE_ID  # the parent's trace
    if parent.startswith("dropped"):  # the sampler drops the child: no span recorded
        assert not sdk_spans and not span.is_recording()
        assert not isinstance(span, LeanSpan)
    else:  # kept: a lean span where there is a recorder
        assert len(sdk_spans) == 1 + (parent == "local sampled parent")
        assert isinstance(span, LeanSpan) == (way == "lean")
        assert dict(span.attributes) == dict(sdk_span.attributes) == {
            "messaging.system": "redis", "messaging.destination.name": "orders",
            "messaging.operation.type": "send", "messaging.operation.name": "publish",
            "messaging.destination.partition.id": "3", "messaging.message.id": "m1",
            "conveyor.stream.key": "customer-1"}


def test_a_new_trace_the_ratio_drops_is_only_a_traceparent_every_way() -> None:
    for way in WAYS:
        spans, headers, span = publish(way, 0.0, None)
        assert spans == [] and not span.is_recording()
        assert headers["traceparent"].endswith("-02")  # not sampled, random trace id
        assert int(headers["traceparent"].split("-")[1], 16) == (
            span.get_span_context().trace_id)


async def test_a_publish_that_fails_records_the_exception_on_its_lean_span_as_on_the_sdks(
) -> None:
    """Through ``Client.publish``: the adapter's error is recorded on the span, which
    ends in error, and the caller gets the error."""

    class Refusing(MemoryAdapter):
        async def enqueue(self, queue: int, messages: list[Message]) -> Any:
            raise ConnectionError("broker gone")

    summaries = []
    for way in ("plain sdk", "lean"):
        reset_broker()
        traced = WAYS[way](1.0)
        client = Client(Refusing(), HashRingQueueMapper(8),
                        telemetry=Telemetry(traced.provider, recorder=traced.recorder))
        with pytest.raises(ConnectionError, match="broker gone"):
            await client.publish("orders", "customer-1", {"n": 1})
        summaries.append([(*span[:6], [a for a in span[6] if a[0] != "messaging.message.id"],
                           *span[7:]) for span in _summary(traced.spans())])
    sdk, lean_summary = summaries
    assert lean_summary == sdk
    [(name, _kind, code, message, parent, _flags, _attributes, events)] = sdk
    assert (name, code, message, parent, events) == (
        "publish orders", 2, "broker gone", None, ["exception"])
