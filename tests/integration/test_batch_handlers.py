"""Batch handlers on the embedded adapter: order per stream, acks, dead letters, drain."""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter, defaultdict

import msgspec
import pytest

from conveyor import App, Client
from conveyor.platform.message import Message
from tests.conftest import wait_until
from tests.integration.memory_harness import config, daemon, fresh_adapter


class Click(msgspec.Struct):
    stream: str
    seq: int
    poison: bool = False


class Seen:
    """What a batch handler saw: each call's batch, every click's handling count."""

    def __init__(self) -> None:
        self.batches: list[list[Click]] = []
        self.handled: Counter[tuple[str, int]] = Counter()
        self.order: dict[str, list[int]] = defaultdict(list)
        self.running = 0
        self.max_running = 0

    def ok(self, batch: list[Click]) -> None:
        for c in batch:
            self.handled[c.stream, c.seq] += 1
            self.order[c.stream].append(c.seq)


def clicks(n: int, streams: int, poison: frozenset[int] = frozenset()) -> list[Click]:
    return [Click(f"s{i % streams}", i, i in poison) for i in range(n)]


async def publish(client: Client, items: list[Click]) -> list[Message]:
    msgs = [client.build("clicks", c.stream, c) for c in items]
    for m in msgs:
        await client.adapter.enqueue(client.mapper.queue_for(m.stream), [m])
    return msgs


def batch_app(seen: Seen, *, size: int, wait_ms: float = 20, delay_s: float = 0.0,
              attempts: int = 1) -> App:
    app = App("test")

    @app.handler("clicks", batch_size=size, batch_wait_ms=wait_ms, retry_attempts=attempts,
                 retry_delay_s=0.001)
    async def on_clicks(batch: list[Click]) -> None:
        seen.batches.append(batch)
        if any(c.poison for c in batch):
            raise ValueError(f"poison in {[c.seq for c in batch if c.poison]}")
        seen.running += 1
        seen.max_running = max(seen.max_running, seen.running)
        try:
            if delay_s:  # random, so batches run at once would finish out of order
                await asyncio.sleep(random.uniform(0, delay_s))
        finally:
            seen.running -= 1
        seen.ok(batch)

    return app


async def test_batches_keep_each_streams_order_and_every_message_is_handled_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="conveyor")
    adapter = fresh_adapter()
    seen = Seen()
    d = daemon(batch_app(seen, size=50, delay_s=0.004), adapter, config(slots={"count": 4}))
    items = clicks(3000, streams=40)
    await publish(Client(adapter, d.mapper), items)
    await d.start()
    await wait_until(lambda: len(seen.handled) == 3000, 30, what="all handled")
    report = await d.stop()
    # Exactly once each: no failure, no crash, so no duplicate is allowed.
    assert seen.handled == Counter({(c.stream, c.seq): 1 for c in items})
    for stream, seqs in seen.order.items():  # across batches, and within each
        assert seqs == sorted(seqs), f"stream {stream} out of order"
    for batch in seen.batches:
        assert len(batch) <= 50
        for stream in {c.stream for c in batch}:
            seqs = [c.seq for c in batch if c.stream == stream]
            assert seqs == sorted(seqs), f"stream {stream} out of order within a batch"
    assert sum(map(len, seen.batches)) == 3000
    assert len(seen.batches) < 3000 / 10, "messages should have been batched"
    assert report.acked == 3000 and report.dead_lettered == 0
    assert sum([await adapter.lag(q, "test") for q in range(8)]) == 0
    assert not caplog.records, "a runner or batcher crashed"


async def test_only_the_poison_messages_are_dead_lettered_with_their_own_reason() -> None:
    adapter = fresh_adapter()
    seen = Seen()
    poison = frozenset({7, 150, 151, 398})
    d = daemon(batch_app(seen, size=100, attempts=2), adapter, config(queues={"total": 1}))
    items = clicks(400, streams=5, poison=poison)
    msgs = await publish(Client(adapter, d.mapper), items)
    await d.start()
    await wait_until(lambda: len(seen.handled) == 396 and d.stats.dead_lettered == 4, 30,
                     what="396 handled, 4 dead-lettered")
    report = await d.stop()
    # Each good click in exactly one successful call (bisection never re-runs a half
    # that succeeded): no duplicate allowed.
    assert seen.handled == Counter({(c.stream, c.seq): 1 for c in items if not c.poison})
    for stream, seqs in seen.order.items():
        assert seqs == sorted(seqs), f"stream {stream} out of order"
    letters = await adapter.dead_letters.read("test")
    by_id = {m.id: c.seq for m, c in zip(msgs, items, strict=True)}
    assert sorted(by_id[letter.message.id] for letter in letters) == sorted(poison)
    for letter in letters:  # its own reason, after the retry policy's 2 calls on it alone
        assert letter.error_type == "ValueError"
        assert letter.error == f"poison in [{by_id[letter.message.id]}]"
        assert letter.attempts == 2
    assert report.acked == 400 and report.dead_lettered == 4
    assert await adapter.lag(0, "test") == 0


async def test_a_body_that_does_not_decode_is_dead_lettered_before_the_batch() -> None:
    adapter = fresh_adapter()
    seen = Seen()
    d = daemon(batch_app(seen, size=10), adapter, config(queues={"total": 1}))
    client = Client(adapter, d.mapper)
    bad = client.build("clicks", "s0", b'{"stream": "s0", "seq": "NaN"}')
    good = [client.build("clicks", "s0", c) for c in clicks(3, streams=1)]
    await adapter.enqueue(0, [good[0], bad, *good[1:]])
    await d.start()
    await wait_until(lambda: len(seen.handled) == 3 and d.stats.dead_lettered == 1, 10,
                     what="3 handled, 1 dead-lettered")
    await d.stop()
    assert [[c.seq for c in b] for b in seen.batches] == [[0, 1, 2]]  # never saw it
    [letter] = await adapter.dead_letters.read("test")
    assert letter.message.id == bad.id and letter.attempts == 0
    assert letter.error_type == "DecodeError" and "Click" in letter.error
    assert await adapter.lag(0, "test") == 0


async def test_a_failing_batch_is_retried_whole_before_any_bisection() -> None:
    adapter = fresh_adapter()
    calls: list[list[int]] = []
    app = App("test")

    @app.handler("clicks", batch_size=20, batch_wait_ms=20, retry_attempts=3,
                 retry_delay_s=0.001)
    async def flaky(batch: list[Click]) -> None:
        calls.append([c.seq for c in batch])
        if len(calls) < 3:
            raise ConnectionError("database busy")

    d = daemon(app, adapter, config(queues={"total": 1}))
    await publish(Client(adapter, d.mapper), clicks(20, streams=2))
    await d.start()
    await wait_until(lambda: d.stats.handled == 20, 10, what="20 handled")
    await d.stop()
    assert len(calls) == 3 and calls[0] == calls[1] == calls[2]  # the same batch, 3 times
    assert sorted(calls[0]) == list(range(20))
    assert d.stats.dead_lettered == 0 and d.stats.retried == 2
    assert await adapter.lag(0, "test") == 0


async def test_a_batch_is_acknowledged_only_when_done_and_a_drain_finishes_it() -> None:
    adapter = fresh_adapter()
    release = asyncio.Event()
    batches: list[list[int]] = []
    app = App("test")

    @app.handler("clicks", batch_size=10, batch_wait_ms=10_000)
    async def slow(batch: list[Click]) -> None:
        batches.append([c.seq for c in batch])
        await release.wait()

    d = daemon(app, adapter, config(queues={"total": 1}, worker={"max_batch": 10}))
    items = clicks(30, streams=1)
    await publish(Client(adapter, d.mapper), items)
    await d.start()
    await wait_until(lambda: len(batches) == 1, 10, what="the first batch started")
    # Full at 10 (the wait of 10 s never ran out); nothing acknowledged while it runs.
    assert batches == [list(range(10))]
    assert await adapter.lag(0, "test") == 30
    slots = d.slot_metrics()  # one slot for the whole batch
    assert slots["*"]["in_use"] == 1 and slots[app.handlers[0].name]["in_use"] == 1
    stopping = asyncio.create_task(d.stop())
    await wait_until(lambda: d.draining, 5, what="the drain to start")
    assert not stopping.done()  # it waits on the batch under way
    release.set()
    report = await stopping
    # The batch under way was finished and acknowledged; the 20 messages no batch had
    # started were handed back unacknowledged, never started here.
    assert batches == [list(range(10))]
    assert report.acked == 10 and await adapter.lag(0, "test") == 20
    # The next owner runs them, in order, once each.
    d2 = daemon(app, adapter, config(queues={"total": 1}, worker={"max_batch": 10}))
    await d2.start()
    await wait_until(lambda: len(batches) == 3, 10, what="the rest handled")
    await d2.stop()
    assert batches == [list(range(10)), list(range(10, 20)), list(range(20, 30))]
    assert await adapter.lag(0, "test") == 0


async def test_a_batch_that_is_not_full_is_handed_over_after_the_wait() -> None:
    adapter = fresh_adapter()
    handed: list[tuple[float, list[int]]] = []
    app = App("test")

    @app.handler("clicks", batch_size=1000, batch_wait_ms=150)
    async def on_clicks(batch: list[Click]) -> None:
        handed.append((asyncio.get_running_loop().time(), [c.seq for c in batch]))

    d = daemon(app, adapter, config(queues={"total": 1}))
    await d.start()
    start = asyncio.get_running_loop().time()
    await publish(Client(adapter, d.mapper), clicks(5, streams=3))
    await wait_until(lambda: len(handed) == 1, 10, what="one batch")
    await d.stop()
    at, seqs = handed[0]
    assert sorted(seqs) == [0, 1, 2, 3, 4]
    assert 0.15 <= at - start < 1.0, f"handed over after {at - start:.3f}s, not ~0.15s"


async def test_one_consumer_span_per_batch_links_every_producer_span() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind

    from conveyor.platform.telemetry import Telemetry

    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    telemetry = Telemetry(provider, None)
    adapter = fresh_adapter()
    seen = Seen()
    d = daemon(batch_app(seen, size=10, wait_ms=10_000), adapter, config(queues={"total": 1}),
               telemetry=telemetry)
    client = Client(adapter, d.mapper, telemetry=telemetry)
    for c in clicks(10, streams=3):
        await client.publish("clicks", c.stream, c)
    await d.start()
    await wait_until(lambda: len(seen.handled) == 10, 10, what="one batch of 10")
    await d.stop()
    finished = spans.get_finished_spans()
    producers = {s.context.span_id for s in finished if s.kind == SpanKind.PRODUCER}
    [batch] = [s for s in finished if s.kind == SpanKind.CONSUMER]
    assert batch.name == "process clicks" and len(producers) == 10
    assert {link.context.span_id for link in batch.links} == producers
    assert batch.attributes is not None
    assert batch.attributes["messaging.batch.message_count"] == 10


async def test_batches_are_cut_from_the_queue_in_queue_order() -> None:
    adapter = fresh_adapter()
    seen = Seen()
    d = daemon(batch_app(seen, size=6, wait_ms=10_000), adapter, config(queues={"total": 1}))
    await publish(Client(adapter, d.mapper), clicks(30, streams=3))  # s0: 0, 3, 6 ...
    await d.start()
    await wait_until(lambda: len(seen.handled) == 30, 10, what="five batches")
    await d.stop()
    # The six oldest of the queue each time (two of each stream), never six of one.
    assert [[c.seq for c in b] for b in seen.batches] == [
        list(range(i, i + 6)) for i in range(0, 30, 6)]


async def test_a_batch_goes_at_once_when_the_cache_is_full() -> None:
    adapter = fresh_adapter()
    seen = Seen()
    gate = asyncio.Event()
    app = batch_app(seen, size=10, wait_ms=10_000)

    @app.handler("clicks", name="slow")  # holds every message in the cache until the gate
    async def slow(click: Click) -> None:
        await gate.wait()

    cfg = config(queues={"total": 1}, worker={"cache_capacity": 16, "max_batch": 16})
    d = daemon(app, adapter, cfg)
    await publish(Client(adapter, d.mapper), clicks(16, streams=4))
    await d.start()
    # 10 go as a full batch; the other 6 cannot become 10 while the slow handler keeps
    # the cache full, so they go at once instead of after 10 s.
    await wait_until(lambda: len(seen.handled) == 16, 5, what="a batch of 10, then of 6")
    assert [len(b) for b in seen.batches] == [10, 6]
    gate.set()
    await d.stop()


def test_bench_batch_on_memory_handles_every_message_once_next_to_its_floor() -> None:
    from conveyor.bench.shipped import Variant
    from conveyor.bench.throughput import memory_throughput

    # time_daemon raises unless exactly 3,000 were handled once and acknowledged.
    result = memory_throughput(3000, 30, repeats=1, variant=Variant(batch=100))
    assert result.variant == "batch=100"
    assert result.floor == "for loop awaiting the handler once per 100 messages"
    assert result.figures["msgs_per_s"].median > 0
