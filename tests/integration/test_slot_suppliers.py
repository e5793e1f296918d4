"""Slot suppliers inside a daemon: pause, a user-written supplier, the pull invariant."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from conveyor import Client, MessageContext
from conveyor.adapters.memory import MemoryReceiver
from conveyor.platform.message import Message
from conveyor.platform.telemetry import Telemetry
from conveyor.workers.daemon import WorkerDaemon
from conveyor.workers.slots.wrappers import PauseableSlotSupplier
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


async def test_pausing_the_daemons_supplier_stops_new_work_and_resume_restarts_it() -> None:
    adapter = fresh_adapter()
    record = Record()
    d = daemon(recording_app(record, delay_s=0.002), adapter,
               config(slots={"count": 4, "pauseable": True}, queues={"total": 2}))
    assert isinstance(d.slots, PauseableSlotSupplier)
    await publish_items(Client(adapter, d.mapper), 400, streams=20)
    await d.start()
    await wait_until(lambda: record.handled >= 20, 10, what="some handled")
    d.slots.pause()
    await wait_until(lambda: d.slots.in_use == 0, 5, what="in-flight work to finish")
    handled = record.handled
    await asyncio.sleep(0.1)  # while paused nothing new may start
    assert record.handled == handled and d.slots.in_use == 0
    d.slots.resume()
    await wait_until(lambda: record.handled == 400, 20, what="the rest after resume")
    await d.stop()


async def test_a_stop_while_no_slot_is_granted_hands_back_at_once_and_loses_nothing() -> None:
    """Paused (or a custom supplier that grants nothing): nothing runs, so the drain has
    nothing to wait for; the messages it pulled go to the next daemon, each once."""
    adapter = fresh_adapter()
    record = Record()
    cfg = config(slots={"count": 4, "pauseable": True}, queues={"total": 2},
                 worker={"drain_timeout_s": 10.0})
    d = daemon(recording_app(record), adapter, cfg)
    assert isinstance(d.slots, PauseableSlotSupplier)
    d.slots.pause()
    await publish_items(Client(adapter, d.mapper), 40, streams=8)
    await d.start()
    await wait_until(lambda: sum(len(a.cache) for a in d.agents.values()) == 40, 5,
                     what="all 40 pulled")
    started = time.monotonic()
    report = await d.stop()
    assert time.monotonic() - started < 2.0, "the drain waited for a slot nothing would free"
    assert report.released == 40 and report.abandoned == 0 and record.handled == 0
    after = daemon(recording_app(record), adapter, cfg)
    await after.start()
    await wait_until(lambda: record.handled == 40, 10, what="the next daemon to handle all")
    await after.stop()
    assert record.duplicates == 0  # a clean drain: each message handled once


def spy_on_pulls(monkeypatch: Any, d: WorkerDaemon) -> list[tuple[int, int]]:
    """At every pull: (max_count asked, slots issued then)."""
    asked: list[tuple[int, int]] = []
    original = MemoryReceiver.get_messages

    async def spy(self: MemoryReceiver, max_count: int, timeout_s: float = 0.0) -> list[Message]:
        asked.append((max_count, d.slots.issued))
        return await original(self, max_count, timeout_s)

    monkeypatch.setattr(MemoryReceiver, "get_messages", spy)
    return asked


async def test_the_documented_custom_supplier_bounds_the_calls_running_at_once(
    monkeypatch: Any,
) -> None:
    adapter = fresh_adapter()
    record = Record()
    d = daemon(recording_app(record, delay_s=0.001), adapter, config(slots={
        "kind": "custom", "path": "conveyor.examples.custom_slots:PacedSlotSupplier",
        "options": {"max_slots": 6, "per_second": 2000.0},
    }, queues={"total": 2}))
    asked = spy_on_pulls(monkeypatch, d)
    await publish_items(Client(adapter, d.mapper), 300, streams=30)
    await d.start()
    await wait_until(lambda: record.handled == 300, 20, what="all handled")
    metrics = d.slot_metrics()
    await d.stop()
    assert record.duplicates == 0
    assert 1 < record.max_active <= 6, "the supplier decides how many calls run at once"
    assert all(issued <= 6 for _, issued in asked), "issued more than max_slots"
    assert set(metrics) == {"*", "tests.integration.memory_harness.recording_app.<locals>.handle"}
    assert metrics["*"]["available"] == -1  # a custom supplier that does not say


async def test_pulls_are_batched_by_the_cache_not_by_the_free_slots(
    monkeypatch: Any,
) -> None:
    # Six slots over two queues used to mean pulls of a handful of messages; the cache
    # bounds prefetch now, the slots only the handler calls running at once.
    adapter = fresh_adapter()
    record = Record()
    d = daemon(recording_app(record, delay_s=0.002), adapter,
               config(slots={"count": 6}, queues={"total": 2}))
    asked = spy_on_pulls(monkeypatch, d)
    await publish_items(Client(adapter, d.mapper), 300, streams=30)
    await d.start()
    await wait_until(lambda: record.handled == 300, 20, what="all handled")
    await d.stop()
    assert record.handled == 300 and record.duplicates == 0
    assert max(n for n, _ in asked) == d.config.worker.max_batch
    assert record.max_active == 6


async def test_slot_metrics_show_slots_per_handler_while_busy() -> None:
    adapter = fresh_adapter()
    record = Record()
    d = daemon(recording_app(record, delay_s=0.05), adapter,
               config(slots={"count": 10}, queues={"total": 1}))
    await publish_items(Client(adapter, d.mapper), 50, streams=50)
    await d.start()
    name = d.app.handlers[0].name
    await wait_until(lambda: d.slot_metrics()[name]["in_use"] == 10, 5, what="10 in use")
    metrics = d.slot_metrics()
    assert metrics["*"]["issued"] == 10 and metrics["*"]["available"] == 0
    assert metrics[name]["available"] == 0
    await wait_until(lambda: record.handled == 50, 20, what="all handled")
    await d.stop()
    assert d.slot_metrics()["*"] == {"in_use": 0, "issued": 0, "available": 10}


def in_use_by_handler(reader: InMemoryMetricReader) -> dict[str, float]:
    data = reader.get_metrics_data()
    assert data is not None
    return {
        str(point.attributes["handler"]): point.value  # type: ignore[union-attr,index]
        for rm in data.resource_metrics for sm in rm.scope_metrics for metric in sm.metrics
        if metric.name == "conveyor.slots.in_use"
        for point in metric.data.data_points
    }


async def test_slots_in_use_are_exported_per_handler_and_in_total() -> None:
    reader = InMemoryMetricReader()
    telemetry = Telemetry(meter_provider=MeterProvider(metric_readers=[reader]))
    adapter = fresh_adapter()
    first, second = Record(), Record()
    app = recording_app(first, delay_s=0.05)

    @app.handler("items")
    async def audit(item: Item, ctx: MessageContext) -> None:  # same messages, slower
        await asyncio.sleep(0.2)
        second.calls[ctx.message.id] += 1

    d = daemon(app, adapter, config(slots={"count": 10}, queues={"total": 1}),
               telemetry=telemetry)
    await publish_items(Client(adapter, d.mapper), 50, streams=50)
    await d.start()
    name, slow = (spec.name for spec in app.handlers)
    # Both handlers' calls share the ten slots; the fast one finishes its fifty while
    # the slow one still has calls running.
    def diverged() -> bool:
        gauges = in_use_by_handler(reader)
        return first.handled == 50 and gauges.get(name) == 0 and gauges.get(slow, 0) > 0

    await wait_until(diverged, 10, what="per-handler gauges to diverge")
    exported = in_use_by_handler(reader)
    assert exported["*"] == exported[slow] <= 10  # the total is the slow handler's alone
    await wait_until(lambda: first.handled == 50 and second.handled == 50, 30,
                     what="all handled by both")
    await d.stop()
    assert in_use_by_handler(reader) == {"*": 0, name: 0, slow: 0}
