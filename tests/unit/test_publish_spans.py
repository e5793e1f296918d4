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
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status as PbStatus
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from conveyor import Client, Publish
from conveyor.adapters.memory import MemoryAdapter, reset_broker
from conveyor.platform import telemetry as telemetry_module
from conveyor.platform.errors import BrokerConnectionError, PartialPublishError
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


def bare(traced: Traced) -> list[Any]:
    """The OTLP spans as an endpoint gets them, but their ids and times (and an exception
    event's stack trace, whose frames differ): everything else compared as bytes."""
    out = []
    for span in traced.spans():
        for field in ("trace_id", "span_id", "parent_span_id", "start_time_unix_nano",
                      "end_time_unix_nano"):
            span.ClearField(field)
        for event in span.events:
            event.ClearField("time_unix_nano")
            kept = [a for a in event.attributes if a.key != "exception.stacktrace"]
            del event.attributes[:]
            event.attributes.extend(kept)
        for attribute in span.attributes:  # ids differ from run to run
            if attribute.key == "messaging.message.id":
                attribute.value.string_value = "id"
        out.append(span.SerializeToString())
    return sorted(out)


def publish(way: str, ratio: float, parent: Any) -> tuple[list[Any], dict[str, str], Any]:
    traced = WAYS[way](ratio)
    telemetry = Telemetry(traced.provider, recorder=traced.recorder)
    assert (telemetry.roots is None) == (way == "plain sdk")
    msg = Message("m1", StreamId("orders", "customer-1"), b"{}", headers={})
    with under(parent, traced):
        span = telemetry.publish_span(msg, "redis", 3)
        span.end()
    return _summary(traced.spans()) + bare(traced), msg.headers, span


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
        assert len(sdk_spans) == 2 * (1 + (parent == "local sampled parent"))  # both forms
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


class Refusing(MemoryAdapter):
    """Refuses every enqueue to the queues in ``refused`` (all: None)."""

    refused: frozenset[int] | None = None

    async def enqueue(self, queue: int, messages: Any) -> Any:
        if self.refused is None or queue in self.refused:
            raise BrokerConnectionError("broker gone")
        return await super().enqueue(queue, messages)


def client(way: str, adapter: MemoryAdapter) -> tuple[Client, Traced]:
    reset_broker()
    traced = WAYS[way](1.0)
    return Client(adapter, HashRingQueueMapper(8),
                  telemetry=Telemetry(traced.provider, recorder=traced.recorder)), traced


async def test_a_publish_that_fails_records_the_exception_on_its_lean_span_as_on_the_sdks(
) -> None:
    """Through ``Client.publish``: the adapter's error is recorded on the span, which
    ends in error, and the caller gets the error."""
    seen = []
    for way in ("plain sdk", "lean"):
        publisher, traced = client(way, Refusing())
        with pytest.raises(BrokerConnectionError, match="broker gone"):
            await publisher.publish("orders", "customer-1", {"n": 1})
        seen.append(bare(traced))
    sdk, lean = seen
    assert lean == sdk and len(sdk) == 1
    [span] = [PbSpan.FromString(data) for data in sdk]
    assert (span.name, span.status.code, span.status.message) == (
        "publish orders", PbStatus.STATUS_CODE_ERROR, "broker gone")
    assert [e.name for e in span.events] == ["exception"]


ITEMS = [Publish("orders", f"customer-{i}", {"n": i}) for i in range(12)]


async def test_publish_batch_records_a_span_a_message_the_sdks_way() -> None:
    seen = []
    for way in ("plain sdk", "lean"):
        publisher, traced = client(way, MemoryAdapter())
        await publisher.publish_batch(ITEMS)
        seen.append(bare(traced))
    sdk, lean = seen
    assert lean == sdk and len(sdk) == len(ITEMS)
    assert {PbSpan.FromString(d).status.code for d in sdk} == {PbStatus.STATUS_CODE_UNSET}


async def test_a_partly_failed_publish_batch_ends_the_failed_queues_spans_in_its_error(
) -> None:
    """The messages of the queue whose enqueue failed have spans in error (the
    exception recorded); the others' spans are plain, as the messages were stored."""
    refused = HashRingQueueMapper(8).queue_for(StreamId("orders", "customer-0"))
    failed_keys = {item.key for item in ITEMS
                   if HashRingQueueMapper(8).queue_for(StreamId("orders", item.key)) == refused}
    assert 0 < len(failed_keys) < len(ITEMS)
    seen = []
    for way in ("plain sdk", "lean"):
        adapter = Refusing()
        adapter.refused = frozenset({refused})
        publisher, traced = client(way, adapter)
        with pytest.raises(PartialPublishError):
            await publisher.publish_batch(ITEMS)
        spans = [PbSpan.FromString(d) for d in bare(traced)]
        by_key = {next(a.value.string_value for a in s.attributes
                       if a.key == "conveyor.stream.key"): s for s in spans}
        assert len(by_key) == len(ITEMS)
        for key, span in by_key.items():
            failed = key in failed_keys
            assert span.status.code == (PbStatus.STATUS_CODE_ERROR if failed
                                        else PbStatus.STATUS_CODE_UNSET), key
            assert [e.name for e in span.events] == (["exception"] if failed else [])
        seen.append(bare(traced))
    assert seen[0] == seen[1]


def test_a_telemetry_keeps_a_bounded_set_of_producer_span_shapes(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client publishing to namespaces it makes up holds at most a bounded number of
    shapes; the spans stay right after it starts over."""
    monkeypatch.setattr(telemetry_module, "_PUBLISH_SHAPES", 4)
    traced = WAYS["lean"](1.0)
    telemetry = Telemetry(traced.provider, recorder=traced.recorder)
    for i in range(10):
        msg = Message(f"m{i}", StreamId(f"tenant-{i}", "k"), b"{}", headers={})
        telemetry.publish_span(msg, "redis", 0).end()
        assert len(telemetry._publish_shapes) <= 4
    names = sorted(PbSpan.FromString(d).name for d in bare(traced))
    assert names == sorted(f"publish tenant-{i}" for i in range(10))


class Capturing(MemoryAdapter):
    """Keeps every message it is given to enqueue."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[Message] = []

    async def enqueue(self, queue: int, messages: Any) -> Any:
        self.sent += messages
        return await super().enqueue(queue, messages)


@pytest.mark.parametrize("ratio", [0.0, 1.0])
@pytest.mark.parametrize("parent", list(PARENTS), ids=list(PARENTS))
async def test_publish_batch_reads_the_parent_once_and_writes_what_the_sdk_writes(
    parent: str, ratio: float
) -> None:
    # publish_batch reads the current span once for the batch: each message's header
    # and span are still what the SDK makes of that parent, message by message.
    seen = []
    for way in ("plain sdk", "shortcuts", "lean"):
        reset_broker()
        traced = WAYS[way](ratio)
        adapter = Capturing()
        publisher = Client(adapter, HashRingQueueMapper(8),
                           telemetry=Telemetry(traced.provider, recorder=traced.recorder))
        with under(PARENTS[parent], traced):
            await publisher.publish_batch(ITEMS)
        headers = [m.headers["traceparent"].split("-") for m in adapter.sent]
        assert len(headers) == len(ITEMS)
        trace_ids = {trace_id for _, trace_id, _, _ in headers}
        # a new trace per message, else the parent's trace for all
        assert len(trace_ids) == (len(ITEMS) if PARENTS[parent] is None else 1), trace_ids
        assert len({span_id for _, _, span_id, _ in headers}) == len(ITEMS)
        seen.append(({flags for *_, flags in headers}, len(bare(traced))))
    assert seen[0] == seen[1] == seen[2], seen


GIVEN = {name: span for name, span in PARENTS.items() if isinstance(span, NonRecordingSpan)}


def carried(span: NonRecordingSpan) -> dict[str, str]:
    """``span``'s context as the propagator writes it into headers."""
    headers: dict[str, str] = {}
    telemetry_module.PROPAGATOR.inject(headers, context=trace.set_span_in_context(span))
    return headers


async def sent_under(way: str, ratio: float, ambient: Any, headers: dict[str, str]
                     ) -> tuple[list[Any], list[dict[str, str]]]:
    """What ``publish`` and ``publish_batch`` of a message with ``headers`` record (the
    publish spans: name, parent, flags, tracestate) and send (the headers but the span
    id) under the current span ``ambient``."""
    reset_broker()
    traced = WAYS[way](ratio)
    adapter = Capturing()
    publisher = Client(adapter, HashRingQueueMapper(8),
                       telemetry=Telemetry(traced.provider, recorder=traced.recorder))
    with under(ambient, traced):
        await publisher.publish("orders", "customer-1", {"n": 1}, headers)
        await publisher.publish_batch([Publish("orders", "customer-2", {"n": 2}, headers)])
    spans = [(name, parent, flags, state) for name, _, _, _, parent, flags, _, _, state
             in _summary(traced.spans()) if name == "publish orders"]
    sent = []
    for msg in adapter.sent:
        version, trace_id, _, flags = msg.headers["traceparent"].split("-")
        sent.append({**msg.headers, "traceparent": f"{version}-{trace_id}-*-{flags}"})
    return spans, sent


@pytest.mark.parametrize("ratio", [0.0, 1.0])
@pytest.mark.parametrize("way", list(WAYS))
@pytest.mark.parametrize("parent", list(GIVEN), ids=list(GIVEN))
async def test_a_traceparent_given_in_the_headers_is_the_publish_spans_parent(
    parent: str, way: str, ratio: float
) -> None:
    # The given traceparent was overwritten by the publish span's (a child of the
    # current span), while the given tracestate stayed: a pair of two traces.
    given = {"tenant": "acme", **carried(GIVEN[parent])}
    spans, sent = await sent_under(way, ratio, "local", dict(given))
    ambient_spans, ambient_sent = await sent_under(way, ratio, GIVEN[parent],
                                                   {"tenant": "acme"})
    assert (spans, sent) == (ambient_spans, ambient_sent)  # as if it were the current span
    for headers in sent:
        assert headers["traceparent"].split("-")[1] == f"{TRACE_ID:032x}"
        assert headers.get("tracestate") == given.get("tracestate")


@pytest.mark.parametrize("way", list(WAYS))
async def test_a_tracestate_without_a_valid_traceparent_is_not_sent_beside_another(
    way: str
) -> None:
    # W3C: a tracestate goes with its traceparent. Given alone, or beside a traceparent
    # that is no trace context, the publish span's traceparent is written and no
    # tracestate, as a child of the current span.
    ambient = await sent_under(way, 1.0, GIVEN["remote sampled parent"], {"tenant": "acme"})
    for bad in ({"tracestate": "k=v"}, {"traceparent": "00-nonsense", "tracestate": "k=v"}):
        assert await sent_under(way, 1.0, GIVEN["remote sampled parent"],
                                {"tenant": "acme", **bad}) == ambient


async def test_traced_off_a_given_traceparent_and_tracestate_go_as_they_are() -> None:
    reset_broker()
    adapter = Capturing()
    publisher = Client(adapter, HashRingQueueMapper(8))  # no telemetry: no tracing
    given = {"tenant": "acme", **carried(GIVEN["remote parent with tracestate"])}
    traced = WAYS["plain sdk"](1.0)
    with under("local", traced):  # a current span of another provider's
        await publisher.publish("orders", "customer-1", {"n": 1}, given)
        await publisher.publish_batch([Publish("orders", "customer-2", {"n": 2}, given)])
    assert [m.headers for m in adapter.sent] == [given, given]
    assert given["tracestate"] == "k=v"
