"""The path of a message on the embedded adapter: order, back-pressure, failures, drain."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

import msgspec
import pytest

from conveyor import App, Client, MessageContext
from conveyor.adapters.memory import (
    MemoryAdapter,
    MemoryBroker,
    MemoryDeadLetters,
    MemoryReceiver,
)
from conveyor.platform.adapter import QueueReceiver
from conveyor.platform.errors import BrokerError
from conveyor.platform.ids import SequenceToken
from conveyor.platform.message import DeadLetter, Message
from conveyor.workers.slots.fixed import FixedSlotSupplier
from tests.conftest import wait_until
from tests.integration.memory_harness import (
    Item,
    Record,
    config,
    daemon,
    fresh_adapter,
    publish_items,
    recording_app,
)


async def total_lag(adapter: MemoryAdapter, group: str = "test") -> int:
    return sum([await adapter.lag(q, group) for q in range(8)])


async def test_per_stream_order_holds_while_streams_run_concurrently() -> None:
    adapter = fresh_adapter()
    record = Record()
    d = daemon(recording_app(record, delay_s=(0.0, 0.004)), adapter,
               config(slots={"count": 32}))
    ids = await publish_items(Client(adapter, d.mapper), 2000, streams=50)
    await d.start()
    await wait_until(lambda: record.handled == 2000, 30, what="all handled")
    report = await d.stop()
    assert set(record.calls) == set(ids) and record.duplicates == 0
    for key, seqs in record.order.items():
        assert seqs == sorted(seqs), f"stream {key} out of order"
    assert record.max_active > 4, "streams should have run concurrently"
    assert report.acked == 2000 and await total_lag(adapter) == 0


async def test_a_slow_handler_keeps_the_cache_within_its_bound_and_drops_nothing() -> None:
    adapter = fresh_adapter()
    record = Record()
    cfg = config(worker={"cache_capacity": 16, "max_batch": 8}, slots={"count": 64},
                 queues={"total": 1})
    d = daemon(recording_app(record, delay_s=0.002), adapter, cfg)
    ids = await publish_items(Client(adapter, d.mapper), 400, streams=4)
    await d.start()
    await wait_until(lambda: record.handled == 400, 30, what="all handled")
    report = await d.stop()
    assert set(record.calls) == set(ids) and record.duplicates == 0
    # The bound was reached (the pulling really had to stop) and never exceeded ...
    assert d.max_cache_fill == 16
    # ... and stopping dropped nothing: every message was acked, none dead-lettered.
    assert report.acked == 400 and report.dead_lettered == 0 and report.abandoned == 0
    assert await total_lag(adapter) == 0


class CountingReceiver(QueueReceiver):
    """Wraps a memory receiver and checks every pull against the slots held."""

    def __init__(self, inner: MemoryReceiver, check: Any) -> None:
        self.inner, self.check = inner, check

    async def initialize(self) -> None:
        await self.inner.initialize()

    async def get_messages(self, max_count: int, timeout_s: float = 0.0) -> list[Message]:
        self.check(max_count)
        return await self.inner.get_messages(max_count, timeout_s)

    async def acknowledge(self, tokens: Any) -> None:
        await self.inner.acknowledge(tokens)

    async def lag(self) -> int:
        return await self.inner.lag()

    async def shutdown(self) -> None:
        await self.inner.shutdown()


async def test_prefetch_is_bounded_by_the_cache_and_execution_by_the_slots() -> None:
    # Two bounds: a pull never asks for more than its cache has room for (prefetch), and
    # no more handler calls run at once than the supplier has slots (execution) — even
    # though the caches hold far more messages than there are slots.
    adapter = fresh_adapter()
    record = Record()
    slots = FixedSlotSupplier(5)
    d = daemon(recording_app(record, delay_s=0.003), adapter,
               config(queues={"total": 2}, worker={"cache_capacity": 64, "max_batch": 32}),
               slots=slots)
    asks: list[tuple[int, int, int]] = []

    def check(max_count: int) -> None:
        for agent in d.agents.values():
            asks.append((max_count, len(agent.cache), agent.cache.capacity))

    make = adapter.create_receiver
    adapter.create_receiver = lambda q, g: CountingReceiver(make(q, g), check)  # type: ignore[method-assign,assignment,arg-type]
    await publish_items(Client(adapter, d.mapper), 300, streams=30)
    await d.start()
    await wait_until(lambda: record.handled == 300, 30, what="all handled")
    await d.stop()
    assert asks and all(n <= 32 for n, _, _ in asks), "a pull asks for at most max_batch"
    assert max(fill for _, fill, _ in asks) > 5, "the caches held more than the slots"
    assert d.max_cache_fill <= 64
    assert record.max_active == 5  # the slots were all used, never exceeded
    assert slots.in_use == 0 and slots.issued == 0  # every permit released


async def test_failing_handler_is_retried_then_dead_lettered_with_reason_and_acked() -> None:
    adapter = fresh_adapter()
    record = Record()
    d = daemon(recording_app(record), adapter)
    client = Client(adapter, d.mapper)
    ids = await publish_items(client, 30, streams=3, fail={4: -1, 7: 2})
    await d.start()
    await wait_until(lambda: record.handled == 29 and d.stats.dead_lettered == 1, 10,
                     what="29 handled and 1 dead-lettered")
    await d.stop()
    letters = await adapter.dead_letters.read("test")
    assert len(letters) == 1
    letter = letters[0]
    assert letter.message.id == ids[4]
    assert (letter.error_type, letter.error, letter.attempts) == (
        "ValueError", "item 4 failed on purpose", 3
    )
    assert letter.handler.endswith("handle")
    assert ids[7] in record.calls  # failed twice, then succeeded on the third attempt
    assert d.stats.retried == 2 + 2 and d.stats.failed_attempts == 3 + 2
    # Stream s1 holds items 1, 4, 7, ...: 4 was dead-lettered, the rest kept their order.
    assert record.order["s1"] == [i for i in range(1, 30, 3) if i != 4]
    assert await total_lag(adapter) == 0


class AckRecordingReceiver(MemoryReceiver):
    def __init__(self, adapter: FlakyDeadLetterAdapter, queue: int, group: str) -> None:
        super().__init__(adapter.broker, queue, group)
        self.acks = adapter.acks

    async def acknowledge(self, tokens: Sequence[SequenceToken]) -> None:
        self.acks.update(tokens)
        await super().acknowledge(tokens)


class FlakyDeadLetters(MemoryDeadLetters):
    """The memory dead-letter store, failing while ``broken`` is set."""

    def __init__(self, broker: MemoryBroker) -> None:
        super().__init__(broker)
        self.broken = True
        self.store_failures = 0

    async def put(self, group: str, letters: Sequence[DeadLetter]) -> int:
        if self.broken:
            self.store_failures += 1
            raise BrokerError("dead-letter store unavailable")
        return await super().put(group, letters)


class FlakyDeadLetterAdapter(MemoryAdapter):
    """A memory adapter whose dead-letter store fails while ``broken`` is set."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.flaky = self.dead_letters = FlakyDeadLetters(self.broker)
        self.acks: Counter[SequenceToken] = Counter()

    def create_receiver(self, queue: int, group: str) -> QueueReceiver:
        return AckRecordingReceiver(self, queue, group)


async def test_a_failing_dead_letter_store_holds_back_the_ack_until_it_succeeds() -> None:
    fresh_adapter()
    adapter = FlakyDeadLetterAdapter("it")
    record = Record()
    d = daemon(recording_app(record), adapter, config(queues={"total": 1}))
    # Item 0 heads the only queue and always fails; the other 19 succeed. Its stream
    # (items 0, 4, 8, ...) waits for it in order; the 15 of the other streams do not.
    ids = await publish_items(Client(adapter, d.mapper), 20, streams=4, fail={0: -1})
    await d.start()
    await wait_until(lambda: record.handled == 15 and adapter.flaky.store_failures >= 3, 10,
                     what="the other streams handled and the dead-letter store failing")
    # The failed message is not acked while its dead letter is not stored, and neither
    # is anything behind it (acks cover the contiguous done prefix only).
    assert d.stats.dead_lettered == 0 and not adapter.acks
    assert await adapter.lag(0, "test") == 20
    adapter.flaky.broken = False
    await wait_until(lambda: d.stats.dead_lettered == 1, 10, what="the dead letter stored")
    await wait_until(lambda: sum(adapter.acks.values()) == 20, 10, what="all acked")
    report = await d.stop()
    [letter] = await adapter.dead_letters.read("test")
    assert letter.message.id == ids[0] and letter.attempts == 3
    assert set(record.calls) == set(ids[1:]) and record.duplicates == 0  # nothing lost
    assert letter.message.token is not None and adapter.acks[letter.message.token] == 1
    assert set(adapter.acks.values()) == {1}, "every message acked exactly once"
    assert report.acked == 20 and await adapter.lag(0, "test") == 0


async def test_undecodable_body_goes_to_dead_letter_at_once() -> None:
    adapter = fresh_adapter()
    record = Record()
    d = daemon(recording_app(record), adapter)
    client = Client(adapter, d.mapper)
    bad = client.build("items", "k", b'{"seq": "not a number"}')
    good = client.build("items", "k", Item(1))
    await adapter.enqueue(d.mapper.queue_for(bad.stream), [bad, good])
    await d.start()
    await wait_until(lambda: record.handled == 1 and d.stats.dead_lettered == 1, 10,
                     what="good handled, bad dead-lettered")
    await d.stop()
    [letter] = await adapter.dead_letters.read("test")
    assert letter.message.id == bad.id and letter.attempts == 0
    assert letter.error_type == "DecodeError" and "Item" in letter.error
    assert await total_lag(adapter) == 0


async def test_another_apps_namespace_is_skipped_and_counted_by_default() -> None:
    adapter = fresh_adapter()
    record = Record()
    d = daemon(recording_app(record), adapter)
    client = Client(adapter, d.mapper)
    other = client.build("nobody", "k", {"x": 1})
    await adapter.enqueue(d.mapper.queue_for(other.stream), [other])
    await publish_items(client, 3, streams=3)
    await d.start()
    await wait_until(lambda: d.stats.skipped == 1 and record.handled == 3, 10,
                     what="one skipped, three handled")
    await d.stop()
    assert await adapter.dead_letters.read("test") == []
    assert d.stats.dead_lettered == 0
    assert await total_lag(adapter) == 0


async def test_unroutable_messages_are_dead_lettered_when_configured() -> None:
    adapter = fresh_adapter()
    d = daemon(recording_app(Record()), adapter, config(dead_letters={"unroutable": "dead-letter"}))
    msg = Client(adapter, d.mapper).build("nobody", "k", {"x": 1})
    await adapter.enqueue(d.mapper.queue_for(msg.stream), [msg])
    await d.start()
    await wait_until(lambda: d.stats.dead_lettered == 1, 10, what="dead letter")
    await d.stop()
    [letter] = await adapter.dead_letters.read("test")
    assert letter.error_type == "Unroutable"
    assert "no handler" in letter.error and letter.message.id == msg.id
    assert await total_lag(adapter) == 0


class Tick(msgspec.Struct):
    seq: int


async def test_each_handler_of_a_namespace_gets_every_message_at_its_own_pace() -> None:
    adapter = fresh_adapter()
    app = App("test")
    fast: list[int] = []
    slow: list[int] = []
    gate = asyncio.Event()

    @app.handler("ticks", name="fast")
    async def on_fast(t: Tick) -> None:
        fast.append(t.seq)

    @app.handler("ticks", name="slow")
    async def on_slow(t: Tick, ctx: MessageContext) -> None:
        await gate.wait()
        slow.append(t.seq)

    cfg = config(worker={"cache_capacity": 50}, queues={"total": 1}, slots={"count": 200})
    d = daemon(app, adapter, cfg)
    client = Client(adapter, d.mapper)
    for i in range(120):
        await client.publish("ticks", f"k{i % 5}", Tick(i))
    await d.start()
    # The fast handler runs ahead until the cache bound (50) stops the pulling ...
    await wait_until(lambda: len(fast) == 50, 10, what="fast handler reaches the cache bound")
    assert slow == [] and await adapter.lag(0, "test") == 120  # ... and nothing is acked
    gate.set()
    await wait_until(lambda: len(slow) == 120 and len(fast) == 120, 10, what="both done")
    await d.stop()
    assert sorted(fast) == sorted(slow) == list(range(120))
    assert await adapter.lag(0, "test") == 0


async def test_stop_drains_in_flight_messages_and_leaves_the_rest_queued() -> None:
    adapter = fresh_adapter()
    record = Record()
    d = daemon(recording_app(record, delay_s=0.05), adapter, config(slots={"count": 8}))
    ids = await publish_items(Client(adapter, d.mapper), 200, streams=20)
    await d.start()
    await wait_until(lambda: record.handled >= 8, 10, what="some handled")
    report = await d.stop()
    # Calls under way finished and were acknowledged; what no handler had started went
    # back unacknowledged (released), for the next owner to run: nothing is run twice.
    assert report.abandoned == 0 and report.acked == record.handled
    assert report.released > 0 and report.pulled == report.acked + report.released
    assert record.duplicates == 0
    assert await total_lag(adapter) == 200 - record.handled
    # A second daemon finishes the rest: together, exactly what was published.
    d2 = daemon(recording_app(record), adapter)
    await d2.start()
    await wait_until(lambda: record.handled == 200, 10, what="rest handled")
    await d2.stop()
    assert set(record.calls) == set(ids) and record.duplicates == 0


async def test_a_drain_timeout_abandons_only_the_stuck_message() -> None:
    adapter = fresh_adapter()
    stuck = asyncio.Event()
    app = App("test")
    seen: list[int] = []

    @app.handler("items")
    async def handle(item: Item) -> None:
        if item.seq == 0 and not stuck.is_set():
            stuck.set()
            await asyncio.Event().wait()  # never finishes
        seen.append(item.seq)

    d = daemon(app, adapter, config(worker={"drain_timeout_s": 0.2}, queues={"total": 1}))
    await publish_items(Client(adapter, d.mapper), 10, streams=10)
    await d.start()
    await wait_until(lambda: len(seen) == 9, 10, what="the other nine")
    report = await d.stop()
    # The stuck one is abandoned unacknowledged; the nine finished behind it are
    # acknowledged by id when the drain ends (a backend that commits a watermark records
    # them for the next owner instead), so none of them runs twice.
    assert report.abandoned == 1 and report.acked == 9
    assert await adapter.lag(0, "test") == 1
    d2 = daemon(app, adapter)
    await d2.start()
    await wait_until(lambda: len(seen) == 10, 10, what="redelivery of the stuck one")
    await d2.stop()
    assert sorted(seen) == list(range(10))  # nothing lost, nothing twice
    assert await adapter.lag(0, "test") == 0


async def test_a_timed_out_drain_on_the_embedded_adapter_says_its_messages_are_abandoned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Embedded, nothing outlives the process: the drain's warning must not promise a
    redelivery to a next owner (the issue's slip)."""
    app = App("abandon")
    release = asyncio.Event()

    @app.handler("jobs")
    async def stuck(body: dict[str, int]) -> None:
        await release.wait()

    adapter = fresh_adapter()
    d = daemon(app, adapter, config(worker={"drain_timeout_s": 0.2}))
    await d.start()
    await Client(adapter, d.mapper).publish("jobs", "k", {"n": 1})
    await wait_until(lambda: any(a.unfinished for a in d.agents.values()), 5,
                     what="the handler to start")
    with caplog.at_level(logging.WARNING, logger="conveyor.agent"):
        report = await d.stop()
    release.set()
    assert report.abandoned == 1
    assert "abandoned: the embedded adapter keeps them only while this process runs" in caplog.text
    assert "redelivered to the next owner" not in caplog.text
