"""Producer spans: lean (a telemetry with a recorder, as ``[telemetry] exporter = "otlp"``
builds it) and the SDK's record the same spans — names, kinds, parents, flags,
attributes, statuses, events — and write the same ``traceparent``, in every context a
publish can happen in: a new trace kept or dropped, under a local or a remote sampled
parent (with or without a ``tracestate``), under a dropped parent, and a publish that
fails."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.context import attach, detach
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
}


def publish(lean: bool, ratio: float, parent: Any) -> tuple[list[Any], dict[str, str], Any]:
    traced = Traced(ratio, lean=lean)
    telemetry = Telemetry(traced.provider, recorder=traced.recorder)
    msg = Message("m1", StreamId("orders", "customer-1"), b"{}", headers={})
    with under(parent, traced):
        span = telemetry.publish_span(msg, "redis", 3)
        span.end()
    return _summary(traced.spans()), msg.headers, span


@pytest.mark.parametrize("parent", list(PARENTS), ids=list(PARENTS))
def test_lean_and_sdk_producer_spans_record_the_same_and_write_the_same_traceparent(
    parent: str
) -> None:
    sdk_spans, sdk_headers, sdk_span = publish(False, 1.0, PARENTS[parent])
    lean_spans, lean_headers, lean_span = publish(True, 1.0, PARENTS[parent])
    assert lean_spans == sdk_spans
    assert sorted(lean_headers) == sorted(sdk_headers)
    version, trace_id, span_id, flags = lean_headers["traceparent"].split("-")
    assert (version, flags) == ("00", sdk_headers["traceparent"].split("-")[3])
    assert lean_headers.get("tracestate") == sdk_headers.get("tracestate")
    context = lean_span.get_span_context()
    assert (int(trace_id, 16), int(span_id, 16)) == (context.trace_id, context.span_id)
    if parent == "dropped parent":  # the SDK decides: a non-recording child, no span
        assert not sdk_spans and not isinstance(lean_span, LeanSpan)
        assert int(trace_id, 16) == TRACE_ID and flags == "00"
    else:  # a kept span, lean where there is a recorder
        assert len(sdk_spans) == 1 + (parent == "local sampled parent")
        assert isinstance(lean_span, LeanSpan) and not isinstance(sdk_span, LeanSpan)
        assert dict(lean_span.attributes) == dict(sdk_span.attributes) == {
            "messaging.system": "redis", "messaging.destination.name": "orders",
            "messaging.operation.type": "send", "messaging.operation.name": "publish",
            "messaging.destination.partition.id": "3", "messaging.message.id": "m1",
            "conveyor.stream.key": "customer-1"}
        if parent.startswith("remote"):
            assert int(trace_id, 16) == TRACE_ID  # the parent's trace


def test_a_new_trace_the_ratio_drops_is_only_a_traceparent_both_ways() -> None:
    for lean in (False, True):
        spans, headers, span = publish(lean, 0.0, None)
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
    for lean in (False, True):
        reset_broker()
        traced = Traced(1.0, lean=lean)
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
