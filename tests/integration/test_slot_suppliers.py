"""Slot suppliers inside a daemon: pause, a user-written supplier, the pull invariant."""

from __future__ import annotations

import asyncio
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from conveyor import Client, MessageContext
from conveyor.adapters.memory import MemoryReceiver
from conveyor.platform.message import Message
from conveyor.platform.telemetry import Telemetry
from conveyor.workers.pauseable import PauseableSlotSupplier
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


async def test_the_documented_custom_supplier_runs_a_daemon_and_never_overpulls(
    monkeypatch: Any,
) -> None:
    asked: list[tuple[int, int]] = []  # (max_count, slots issued) at every pull
    original = MemoryReceiver.get_messages
    adapter = fresh_adapter()
    record = Record()
    d = daemon(recording_app(record, delay_s=0.001), adapter, config(slots={
        "kind": "custom", "path": "conveyor.examples.custom_slots:RateLimitedSlotSupplier",
        "options": {"max_slots": 6, "per_second": 2000.0},
    }, queues={"total": 2}))

    async def spy(self: MemoryReceiver, max_count: int, timeout_s: float = 0.0) -> list[Message]:
        asked.append((max_count, d.slots.issued))
        return await original(self, max_count, timeout_s)

    monkeypatch.setattr(MemoryReceiver, "get_messages", spy)
    await publish_items(Client(adapter, d.mapper), 300, streams=30)
    await d.start()
    await wait_until(lambda: record.handled == 300, 20, what="all handled")
    metrics = d.slot_metrics()
    await d.stop()
    assert record.duplicates == 0
    assert asked and all(n <= 6 for n, _ in asked), "asked for more than max_slots"
    assert all(issued <= 6 for _, issued in asked)
    assert set(metrics) == {"*", "tests.integration.memory_harness.recording_app.<locals>.handle"}
    assert metrics["*"]["available"] == -1  # a custom supplier that does not say


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
    # The fast handler finishes its share of the ten pulled messages; the slow one
    # still holds all ten.
    await wait_until(lambda: in_use_by_handler(reader).get(name) == 0
                     and in_use_by_handler(reader).get(slow) == 10, 5,
                     what="per-handler gauges to diverge")
    exported = in_use_by_handler(reader)
    assert exported["*"] == d.slots.in_use == 10
    await wait_until(lambda: first.handled == 50 and second.handled == 50, 30,
                     what="all handled by both")
    await d.stop()
    assert in_use_by_handler(reader) == {"*": 0, name: 0, slow: 0}
