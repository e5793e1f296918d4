"""Slot suppliers inside a daemon: pause, a user-written supplier, the pull invariant."""

from __future__ import annotations

import asyncio
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from conveyor import Client, MessageContext
from conveyor.adapters.memory import MemoryReceiver
from conveyor.platform.message import Message
from conveyor.platform.slots import SlotPermit, SlotReservationContext
from conveyor.platform.telemetry import Telemetry
from conveyor.workers.daemon import WorkerDaemon
from conveyor.workers.slot_wrappers import PauseableSlotSupplier
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


def spy_on_pulls(monkeypatch: Any, d: WorkerDaemon) -> list[tuple[int, int, int]]:
    """At every pull: (max_count asked, permits the agent holds for it, slots issued).

    Permits are followed from the supplier: those an agent reserved, not yet released
    and not yet carrying a cached message, are what it may pull for.
    """
    asked: list[tuple[int, int, int]] = []
    reserved: dict[int, list[SlotPermit]] = {}
    slots = d.slots
    reserve, try_reserve, original = (
        slots.reserve_slot, slots.try_reserve_slot, MemoryReceiver.get_messages
    )

    async def reserve_spy(ctx: SlotReservationContext) -> SlotPermit:
        permit = await reserve(ctx)
        reserved.setdefault(ctx.queue, []).append(permit)
        return permit

    def try_reserve_spy(ctx: SlotReservationContext) -> SlotPermit | None:
        permit = try_reserve(ctx)
        if permit is not None:
            reserved.setdefault(ctx.queue, []).append(permit)
        return permit

    def held_for_pull(queue: int) -> int:
        carrying = {id(e.permit) for e in d.agents[queue].cache.entries}
        live = reserved[queue] = [p for p in reserved.get(queue, []) if not p.released]
        return sum(1 for p in live if id(p) not in carrying)

    async def spy(self: MemoryReceiver, max_count: int, timeout_s: float = 0.0) -> list[Message]:
        asked.append((max_count, held_for_pull(self._queue), slots.issued))
        return await original(self, max_count, timeout_s)

    monkeypatch.setattr(slots, "reserve_slot", reserve_spy)
    monkeypatch.setattr(slots, "try_reserve_slot", try_reserve_spy)
    monkeypatch.setattr(MemoryReceiver, "get_messages", spy)
    return asked


async def test_the_documented_custom_supplier_runs_a_daemon_and_never_overpulls(
    monkeypatch: Any,
) -> None:
    adapter = fresh_adapter()
    record = Record()
    d = daemon(recording_app(record, delay_s=0.001), adapter, config(slots={
        "kind": "custom", "path": "conveyor.examples.custom_slots:RateLimitedSlotSupplier",
        "options": {"max_slots": 6, "per_second": 2000.0},
    }, queues={"total": 2}))
    asked = spy_on_pulls(monkeypatch, d)
    await publish_items(Client(adapter, d.mapper), 300, streams=30)
    await d.start()
    await wait_until(lambda: record.handled == 300, 20, what="all handled")
    metrics = d.slot_metrics()
    await d.stop()
    assert record.duplicates == 0
    assert asked and all(n <= held for n, held, _ in asked), "pulled more than it held"
    assert all(issued <= 6 for _, _, issued in asked), "issued more than max_slots"
    assert set(metrics) == {"*", "tests.integration.memory_harness.recording_app.<locals>.handle"}
    assert metrics["*"]["available"] == -1  # a custom supplier that does not say


async def test_a_batch_pull_never_asks_for_more_than_the_permits_held(
    monkeypatch: Any,
) -> None:
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
    assert any(n > 1 for n, _, _ in asked), "the fixed supplier should allow batches"
    assert all(n <= held for n, held, _ in asked), "pulled more than it held"


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
