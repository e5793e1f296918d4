"""The consumer span, however the chain is called: the shipped chain's one step awaited,
the agent's runner calling it in parts (DirectCall, which enters the span's scope
itself), and the interceptors composed one around the other all record the same spans
— same names, kinds, parents, attributes and statuses — and leave the context as they
found it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.context import get_current
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status as PbStatus
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Tracer

from conveyor import App, Client
from conveyor.adapters.memory import MemoryAdapter, reset_broker
from conveyor.platform.config import Config, WorkerConfig
from conveyor.platform.delivery import (
    Delivery,
    DeliveryStats,
    Interceptor,
    Step,
    build_chain,
    chain_interceptors,
)
from conveyor.platform.delivery.chain import call_handler, compose
from conveyor.platform.delivery.dead_letter import direct_call
from conveyor.platform.delivery.tracing import ConsumerSpans, traced_dead_letters
from conveyor.platform.handlers import HandlerSpec
from conveyor.platform.ids import StreamId
from conveyor.platform.message import DeadLetter, Message
from conveyor.platform.sampling import ratio_tracer_provider
from conveyor.platform.spans import LeanRecorder
from conveyor.platform.telemetry import PROPAGATOR, Telemetry
from conveyor.workers.daemon import WorkerDaemon
from tests.unit.test_chain_shortcut import CASES, _app, _message

SAMPLED = f"00-{'ab' * 16}-{'cd' * 8}-01"
DROPPED = f"00-{'ef' * 16}-{'12' * 8}-00"
STATED = {"traceparent": SAMPLED, "tracestate": "k=v"}  # the SDK's way


def _composed(spec: HandlerSpec, interceptors: list[Interceptor]) -> Step:
    return compose(spec, interceptors, call_handler(spec))


def _direct(spec: HandlerSpec, interceptors: list[Interceptor]) -> Step:
    direct = direct_call(build_chain(spec, interceptors))
    assert direct is not None and direct.scope is not None

    async def run(delivery: Delivery) -> None:
        await direct.run(delivery.message)

    return run


class Traced:
    """A ratio provider, its SDK spans kept in memory; with ``lean``, consumer spans go
    to a :class:`LeanRecorder` whose posts are kept. :meth:`spans` gives them all as the
    OTLP protobuf spans an endpoint gets."""

    def __init__(self, ratio: float, lean: bool = False) -> None:
        self.sdk = InMemorySpanExporter()
        self.posts: list[bytes] = []
        self.provider = ratio_tracer_provider(ratio)
        self.recorder = None
        if lean:
            self.recorder = LeanRecorder(self._post, Resource.create({}),
                                         InstrumentationScope("conveyor"))
            self.provider.add_span_processor(self.recorder)
        self.provider.add_span_processor(SimpleSpanProcessor(self.sdk))
        self.tracer = self.provider.get_tracer("conveyor")

    def _post(self, data: bytes) -> bool:
        self.posts.append(data)
        return True

    def spans(self) -> list[Any]:
        self.provider.force_flush()
        requests = [ExportTraceServiceRequest.FromString(p) for p in self.posts]
        requests.append(encode_spans(self.sdk.get_finished_spans()))
        return [span for request in requests for rs in request.resource_spans
                for ss in rs.scope_spans for span in ss.spans]


def _summary(spans: list[Any]) -> list[tuple[Any, ...]]:
    """What each span says, but its ids and times: its parent by name (or the remote
    parent's span id), its flags and its W3C tracestate."""
    by_id = {s.span_id: s for s in spans}
    out = []
    for s in spans:
        parent = s.parent_span_id
        parent_name = (None if not parent else by_id[parent].name if parent in by_id
                       else f"remote {parent.hex()}")
        attributes = sorted((a.key, str(a.value).strip()) for a in s.attributes)
        out.append((s.name, s.kind, s.status.code, s.status.message, parent_name, s.flags,
                    attributes, [e.name for e in s.events], s.trace_state))
    return sorted(out, key=repr)


async def _run(build: Any, tracer: Tracer, recorder: LeanRecorder | None,
               headers: dict[str, str]) -> tuple[DeliveryStats, list[tuple[str, str, int]]]:
    app, _ = _app()
    stats = DeliveryStats()
    letters: list[DeadLetter] = []

    async def put(letter: DeadLetter) -> None:
        letters.append(letter)

    interceptors = chain_interceptors(traced_dead_letters(put, tracer), stats,
                                      tracer=tracer, recorder=recorder, system="memory",
                                      group="g")
    chains = {spec.namespace: (spec, build(spec, interceptors)) for spec in app.handlers}
    before = get_current()
    for namespace, body, deliveries in CASES:
        spec, chain = chains[namespace]
        msg = _message(namespace, body, deliveries)
        msg.headers.update(headers)
        await chain(Delivery(msg, spec))
        assert get_current() is before  # the scope restored the context it found
    return stats, [(x.handler, x.error_type, x.attempts) for x in letters]


@pytest.mark.parametrize("lean", [False, True], ids=["sdk spans", "lean spans"])
@pytest.mark.parametrize("headers", [{}, {"traceparent": SAMPLED},
                                     {"traceparent": DROPPED}, STATED],
                         ids=["new trace", "sampled parent", "dropped parent", "tracestate"])
def test_every_way_of_calling_the_chain_records_the_same_spans(
        headers: dict[str, str], lean: bool) -> None:
    """The composed interceptors with SDK spans are the reference: the shipped step and
    the runner's direct call, with SDK or lean consumer spans, record what it does."""
    reference = Traced(1.0)
    expected = asyncio.run(_run(_composed, reference.tracer, None, headers)), _summary(
        reference.spans())
    for build in (build_chain, _direct):
        traced = Traced(1.0, lean)
        outcome = asyncio.run(_run(build, traced.tracer, traced.recorder, headers))
        assert (outcome, _summary(traced.spans())) == expected, build.__name__
        # Lean spans where the scope decides (no tracestate) and the trace is kept.
        assert bool(traced.posts) == (lean and headers.get("traceparent", SAMPLED) == SAMPLED
                                      and "tracestate" not in headers)
    (_, letters), summary = expected
    assert len(letters) == 8
    consumers = [s for s in summary if s[1] == PbSpan.SPAN_KIND_CONSUMER]
    if headers.get("traceparent") == DROPPED:  # the producer's decision is followed
        assert summary == []
    else:
        assert len(consumers) == len(CASES)
        errors = [s for s in consumers if s[2] == PbStatus.STATUS_CODE_ERROR]
        assert len(errors) == 8  # each dead-lettered message's consumer span
        assert sum(1 for s in summary if s[0].startswith("retry ")) > 0


def _in_handler(traced: Traced, look: Callable[[], list[Any]],
                headers: dict[str, str]) -> list[Any]:
    """What ``look`` sees, called in a handler run through the runner's direct call
    with a message carrying ``headers``."""
    app, _ = _app()
    seen: list[Any] = []

    @app.handler("peek")
    async def peek(body: bytes) -> None:
        seen.extend(look())

    spec = next(s for s in app.handlers if s.namespace == "peek")
    step = _direct(spec, chain_interceptors(traced_dead_letters(_discard, traced.tracer),
                                            DeliveryStats(), tracer=traced.tracer))
    msg = _message("peek", b"x")
    msg.headers.update(headers)
    asyncio.run(step(Delivery(msg, spec)))
    return seen


def test_a_dropped_trace_is_the_handlers_context_and_records_nothing() -> None:
    traced = Traced(0.0, lean=True)

    def look() -> list[Any]:
        context = trace.get_current_span().get_span_context()
        with traced.tracer.start_as_current_span("child") as child:
            return [context, child.is_recording()]

    context, child_recording = _in_handler(traced, look, {"traceparent": DROPPED})
    assert (context.trace_id, context.span_id) == (int("ef" * 16, 16), int("12" * 8, 16))
    assert not context.trace_flags.sampled and child_recording is False
    assert traced.spans() == []


async def _discard(letter: DeadLetter) -> None:
    return None


async def test_a_stop_that_cancels_a_call_ends_its_consumer_span_as_the_step_did() -> None:
    """The runner enters the span itself (the shipped chain: no app interceptor): a call
    a stop cancels still ends its span (no error status: a cancel is no failure), as
    the chain's step ended it."""
    app = App("scope-stop")
    started = asyncio.Event()

    @app.handler("items")
    async def handle(item: dict[str, int]) -> None:
        started.set()
        await asyncio.sleep(30)

    traced = Traced(1.0, lean=True)
    reset_broker("scope-stop")
    adapter = MemoryAdapter("scope-stop")
    config = Config(worker=WorkerConfig(drain_timeout_s=0.2))
    daemon = WorkerDaemon(app, config, adapter=adapter,
                          telemetry=Telemetry(traced.provider, recorder=traced.recorder))
    client = Client(adapter, daemon.mapper)
    await daemon.start()
    await client.publish("items", "k", {"seq": 0})
    await asyncio.wait_for(started.wait(), 5)
    async with asyncio.timeout(10):
        await daemon.stop()
    consumers = [s for s in traced.spans() if s.kind == PbSpan.SPAN_KIND_CONSUMER]
    assert [(s.name, s.status.code) for s in consumers] == [
        ("process items", PbStatus.STATUS_CODE_UNSET)]
    assert consumers[0].end_time_unix_nano >= consumers[0].start_time_unix_nano > 0


def test_a_new_trace_the_ratio_drops_is_a_root_drawn_once_as_the_sdk_draws_it() -> None:
    """No ``traceparent``, dropped at the ratio: the handler runs in a non-recording
    root span whose context — built when first asked for — is valid, says "not sampled,
    random trace id" (0x02) as the SDK's would, and stays the same when asked again."""
    traced = Traced(0.0, lean=True)

    def look() -> list[Any]:
        span = trace.get_current_span()
        return [span.is_recording(), span.get_span_context(), span.get_span_context()]

    recording, first, again = _in_handler(traced, look, {})
    assert recording is False and first is again and first.is_valid
    assert first.trace_flags == 0x02 and not first.is_remote
    assert traced.spans() == []


UNCHECKED = [  # 55 characters, last digit even: taken as a dropped parent before a check
    DROPPED.upper(), "01" + DROPPED[2:], "ff" + DROPPED[2:], f"00-{'0' * 32}-{'12' * 8}-00",
    f"00-{'ef' * 16}-{'0' * 16}-00", DROPPED.replace("-", "_"), f"00-{'eg' * 16}-{'12' * 8}-00",
]


@pytest.mark.parametrize("header", UNCHECKED)
def test_a_header_taken_unchecked_gives_the_context_the_sdks_propagator_reads(
        header: str) -> None:
    """The decision written in ``conveyor.platform.sampling``: a ``traceparent`` of the
    right length whose flags say "not sampled" is the producer's decision, checked only
    when something asks for the context. Then the handler sees what the SDK's
    propagator reads from it — the same ids for a future version it accepts, the
    invalid context for a header it refuses (so the handler's spans and publishes start
    new traces) — and no consumer span is recorded for it."""
    traced = Traced(1.0, lean=True)
    telemetry = Telemetry(traced.provider, recorder=traced.recorder)

    def look() -> list[Any]:
        onward = Message("m-2", StreamId("next", "k"), b"{}", headers={})
        telemetry.publish_span(onward, "memory", 0).end()  # the handler publishes
        return [trace.get_current_span().get_span_context(), onward.headers["traceparent"]]

    seen, onward = _in_handler(traced, look, {"traceparent": header})
    expected = trace.get_current_span(
        PROPAGATOR.extract({"traceparent": header})).get_span_context()
    assert seen == expected
    assert seen.is_valid == (header[:2] == "01")  # of these, the SDK reads only version 01
    published = trace.get_current_span(
        PROPAGATOR.extract({"traceparent": onward})).get_span_context()
    if seen.is_valid:  # the publish continues the producer's dropped trace
        assert (published.trace_id, published.trace_flags.sampled) == (seen.trace_id, False)
    else:  # a new trace, kept at this ratio (1.0): its producer span is the only span
        assert published.is_valid and published.trace_flags.sampled
        [producer] = traced.spans()
        assert int.from_bytes(producer.trace_id, "big") == published.trace_id
        assert not producer.parent_span_id and producer.kind == PbSpan.SPAN_KIND_PRODUCER
    if seen.is_valid:
        assert traced.spans() == []  # no consumer span, and the publish's was dropped


def test_a_malformed_header_of_another_shape_is_still_the_sdks_to_read() -> None:
    """Only the right length with an even last digit is taken unchecked: a header the
    SDK refuses otherwise (here too long, sampled but malformed, or ending in a character
    no flags end in) makes the consumer span a new trace, as the SDK makes it."""
    for header in (DROPPED + "0", SAMPLED.upper(), DROPPED[:-1] + "g", DROPPED[:-1] + "A"):
        traced = Traced(1.0, lean=True)

        def look() -> list[Any]:
            return [trace.get_current_span().get_span_context()]

        [seen] = _in_handler(traced, look, {"traceparent": header})
        [span] = [s for s in traced.spans() if s.kind == PbSpan.SPAN_KIND_CONSUMER]
        assert seen.is_valid and seen.trace_flags.sampled, header
        assert int.from_bytes(span.trace_id, "big") == seen.trace_id
        assert not span.parent_span_id, header  # a root: the header was refused


def test_a_dropped_parent_with_a_tracestate_is_the_sdks_and_keeps_its_state() -> None:
    """A ``tracestate`` beside a "not sampled" header sends both to the SDK's
    propagator, which carries the state: the handler's context has it, and so has what
    the handler publishes."""
    traced = Traced(1.0, lean=True)
    telemetry = Telemetry(traced.provider, recorder=traced.recorder)

    def look() -> list[Any]:
        onward = Message("m-2", StreamId("next", "k"), b"{}", headers={})
        telemetry.publish_span(onward, "memory", 0).end()
        return [trace.get_current_span().get_span_context(), onward.headers]

    seen, onward = _in_handler(traced, look, {"traceparent": DROPPED, "tracestate": "k=v"})
    assert seen.trace_id == int("ef" * 16, 16) and not seen.trace_flags.sampled
    assert list(seen.trace_state.items()) == [("k", "v")]
    assert onward["tracestate"] == "k=v" and onward["traceparent"][3:35] == "ef" * 16
    assert traced.spans() == []


def _scope(traced: Traced) -> Any:
    app = App("spares")

    @app.handler("orders")
    async def orders(body: bytes) -> None:
        """Never called: the scope is entered and left by the test."""

    [spec] = app.handlers
    return ConsumerSpans(traced.tracer, system="memory", group="g",
                         recorder=traced.recorder).scope(spec)


def _dropped_message(i: int, parent: bool) -> tuple[Message, int]:
    """A message whose trace is dropped (with ``parent``, by its producer: its trace id
    is the header's; else by the ratio, 0 in these tests) and that trace id, or 0."""
    if not parent:
        return Message(f"m-{i}", StreamId("orders", f"k{i}"), b"{}", headers={}), 0
    trace_id = 0x1000 + i
    header = f"00-{trace_id:032x}-{i + 1:016x}-00"
    return Message(f"m-{i}", StreamId("orders", f"k{i}"), b"{}",
                   headers={"traceparent": header}), trace_id


def _fail(span: Any, i: int) -> None:
    """A handler's failure: its frame, kept by the exception, holds ``span``."""
    raise RuntimeError(f"message {i} with {span!r}")


@pytest.mark.parametrize("parent", [False, True], ids=["new trace", "dropped parent"])
async def test_a_dropped_traces_context_is_reused_only_when_nothing_else_holds_it(
        parent: bool) -> None:
    """ConsumerScope's "Reused": a dropped trace's context serves the next dropped
    trace when nothing holds it after its message — and whatever does hold it (a task
    the handler started, a span or context kept, an exception's frames) goes on seeing
    its own message's ids while later messages are handled."""
    traced = Traced(0.0, lean=True)
    scope = _scope(traced)
    kept: list[tuple[int, Any]] = []  # (the trace id seen in the call, what was kept)
    late: list[tuple[int, int]] = []  # (seen in the call, seen by its task afterwards)
    release = asyncio.Event()
    tasks = []

    async def afterwards(seen: int) -> None:
        await release.wait()
        late.append((seen, trace.get_current_span().get_span_context().trace_id))

    ids: list[int] = []  # each call's span, by id (a reference would hold it)
    seen_ids: list[int] = []
    for i in range(12):
        msg, header_id = _dropped_message(i, parent)
        entered = scope.enter(msg)
        span = trace.get_current_span()
        context = span.get_span_context()
        assert context.is_valid and not context.trace_flags.sampled
        assert context.trace_id == (header_id or context.trace_id)
        ids.append(id(span))
        seen_ids.append(context.trace_id)
        how = i % 6
        if how == 1:  # the handler starts a task that outlives its call
            tasks.append(asyncio.create_task(afterwards(context.trace_id)))
        elif how == 2:  # it keeps its span
            kept.append((context.trace_id, span))
        elif how == 3:  # it keeps its context
            kept.append((context.trace_id, get_current()))
        elif how == 4:  # it fails, and the failure (its frames) is kept
            try:
                _fail(span, i)
            except RuntimeError as exc:
                kept.append((context.trace_id, exc))
        del span
        scope.leave(entered)
    # Reused after each message that let go of it (0 and 5 lend theirs to the next)...
    assert ids[1] == ids[0] and ids[6] == ids[5]
    # ...and never after one that held it.
    for i in range(11):
        if i % 6 in (1, 2, 3, 4):
            assert ids[i] not in ids[i + 1:], i
    release.set()
    await asyncio.gather(*tasks)
    assert len(late) == 2 and all(then == now for then, now in late)
    assert len(kept) == 6
    for seen, thing in kept:
        if isinstance(thing, BaseException):
            assert thing.__traceback__ is not None and thing.__traceback__.tb_next is not None
            thing = thing.__traceback__.tb_next.tb_frame.f_locals["span"]
        elif isinstance(thing, dict):
            thing = trace.get_current_span(thing)  # type: ignore[arg-type]
        assert thing.get_span_context().trace_id == seen
    assert len(set(seen_ids)) == 12  # every message its own trace id
    assert traced.spans() == []
