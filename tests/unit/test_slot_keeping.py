"""A fixed supplier's slot stays with the queue's runners while only they wait for one:
handing it from one runner of a queue to another changed nothing but cost a wake-up a
call, and under I/O-bound load left about 8 of 100 slots idle between a release and the
waiter's start. Another queue's agent or a batch handler waiting gets the next slot
released, before the releaser's own runners."""

from __future__ import annotations

import asyncio

from conveyor import App, Client, Publish
from conveyor.adapters.memory import MemoryAdapter, reset_broker
from conveyor.platform.agent import PullingAgent
from conveyor.platform.config import load_config
from conveyor.platform.mapper import HashRingQueueMapper
from conveyor.platform.slots import SlotPermit, SlotReleaseReason
from conveyor.workers.daemon.build import build_parts
from conveyor.workers.slots.fixed import FixedSlotSupplier
from conveyor.workers.slots.wrappers import GuardedSlotSupplier, PauseableSlotSupplier
from tests.conftest import wait_until
from tests.slot_context import Ctx


class Counting(FixedSlotSupplier):
    """Counts releases and the most slots in use at once."""

    def __init__(self, count: int) -> None:
        super().__init__(count)
        self.releases = 0

    def release_slot(self, reason: SlotReleaseReason, permit: SlotPermit) -> None:
        self.releases += 1
        super().release_slot(reason, permit)


async def test_kept_while_only_the_holders_context_waits() -> None:
    mine, other = Ctx(), Ctx()
    supplier = FixedSlotSupplier(1)
    permit = supplier.try_reserve_slot(mine)
    assert permit is not None and supplier.keep_slot(permit)  # nobody waits
    same = asyncio.create_task(supplier.reserve_slot(mine))
    await asyncio.sleep(0)
    assert supplier.keep_slot(permit)  # only its own context waits
    foreign = asyncio.create_task(supplier.reserve_slot(other))
    await asyncio.sleep(0)
    assert not supplier.keep_slot(permit)  # another context waits: it goes round
    permit.release()  # to the other context first, though it queued second
    theirs = await asyncio.wait_for(foreign, 1)
    assert not same.done() and not supplier.keep_slot(theirs)
    theirs.release()
    kept = await asyncio.wait_for(same, 1)
    assert supplier.keep_slot(kept) and supplier.issued == 1


async def test_a_cancelled_waiter_no_longer_counts() -> None:
    mine, other = Ctx(), Ctx()
    supplier = FixedSlotSupplier(1)
    permit = await supplier.reserve_slot(mine)
    foreign = asyncio.create_task(supplier.reserve_slot(other))
    await asyncio.sleep(0)
    assert not supplier.keep_slot(permit)
    foreign.cancel()
    await asyncio.gather(foreign, return_exceptions=True)
    assert supplier.keep_slot(permit)
    permit.release()
    assert supplier.available == 1 and supplier.issued == 0


async def _io_bound(name: str, supplier: FixedSlotSupplier, messages: int, queues: int = 1
                    ) -> tuple[list[PullingAgent], list[str], list[int]]:
    """``messages`` on as many streams over ``queues`` queues (agents sharing
    ``supplier``), a handler that sleeps 2 ms. Returns the agents, the ids handled (each
    names its queue) and each queue's count of handled messages when the first queue had
    handled all of its own."""
    reset_broker(name)
    adapter = MemoryAdapter(name)
    app = App(name)
    mapper = HashRingQueueMapper(queues)
    keys = [f"k{i}" for i in range(messages)]
    ids = [f"q{mapper.queue_for_key('items', key)}-{key}" for key in keys]
    totals = [sum(1 for i in ids if i.startswith(f"q{q}-")) for q in range(queues)]
    handled = [0] * queues
    seen: list[str] = []
    first_done: list[int] = []

    @app.handler("items")
    async def handle(item: dict[str, str]) -> None:
        await asyncio.sleep(0.002)
        seen.append(item["id"])
        queue = int(item["id"][1:].split("-")[0])
        handled[queue] += 1
        if handled[queue] == totals[queue] and not first_done:
            first_done.extend(handled)

    config = load_config(None, environ={}, overrides={
        "memory": {"broker": name}, "queues": {"total": queues}})
    parts = build_parts(app, config, adapter=adapter)
    await Client(adapter, mapper).publish_batch(
        [Publish("items", key, {"id": id_}) for key, id_ in zip(keys, ids, strict=True)])
    agents = []
    for queue in range(queues):
        receiver = adapter.create_receiver(queue, app.name)
        await receiver.initialize()
        agents.append(PullingAgent(queue, receiver, parts.subscriptions, parts.orphans,
                                   supplier, parts.settings))
    for agent in agents:  # the first takes every slot before the next starts
        agent.start()
        await wait_until(lambda: supplier.available == 0, 5, what="every slot taken")
    await wait_until(lambda: sum(a.acked for a in agents) == messages, 20,
                     what="every message acknowledged")
    for agent in agents:
        await agent.drain(5.0)
    return agents, seen, first_done


async def test_an_io_bound_queue_keeps_its_slots_and_runs_no_spare_runners() -> None:
    supplier = Counting(10)
    [agent], seen, _ = await _io_bound("slot-keeping", supplier, 400)
    assert sorted(seen) == sorted(f"q0-k{i}" for i in range(400))  # each once, none lost
    # Without keeping, every call past the first ten handed its slot to a parked runner:
    # some 390 releases, and a runner per message pulled up to the cache's capacity.
    assert supplier.releases <= 2 * 10, supplier.releases
    assert agent.runners <= 10 + 2, agent.runners


async def test_queues_sharing_the_slots_take_turns() -> None:
    """Two queues' agents on 4 slots, the second started once the first holds all 4: a
    released slot goes to the other queue's waiting runner, so both progress together —
    when one has handled all its messages the other has handled most of its own. Kept
    whoever waits, the second got 0 of its 178 by then; handed out in the order the
    runners queued (before), 78: about 1 slot in 4."""
    supplier = Counting(4)
    agents, seen, first_done = await _io_bound("slot-turns", supplier, 400, queues=2)
    totals = [agent.acked for agent in agents]
    assert sum(totals) == 400 and len(seen) == len(set(seen)) == 400
    assert min(totals) > 100, totals  # both queues hold a fair part of the streams
    slower = min(range(2), key=lambda q: first_done[q] / totals[q])
    assert first_done[slower] / totals[slower] > 0.6, (first_done, totals)


async def test_the_wrappers_pass_keep_slot_through_and_a_pause_stops_it() -> None:
    mine, other = Ctx(), Ctx()
    pauseable = PauseableSlotSupplier(FixedSlotSupplier(1))
    permit = pauseable.try_reserve_slot(mine)
    assert permit is not None and pauseable.keep_slot(permit)  # the fixed rule, wrapped
    pauseable.pause()
    assert not pauseable.keep_slot(permit)  # paused: the next call reserves anew, and waits
    pauseable.resume()
    waiter = asyncio.create_task(pauseable.reserve_slot(other))
    await asyncio.sleep(0)
    assert not pauseable.keep_slot(permit)  # another context waits
    permit.release()
    (await asyncio.wait_for(waiter, 1)).release()

    class Broken(FixedSlotSupplier):
        def keep_slot(self, permit: SlotPermit) -> bool:
            raise RuntimeError("a user's bug")

    guarded = GuardedSlotSupplier(FixedSlotSupplier(1))
    kept = guarded.try_reserve_slot(mine)
    assert kept is not None and guarded.keep_slot(kept)
    broken = GuardedSlotSupplier(Broken(1))
    held = broken.try_reserve_slot(mine)
    assert held is not None and not broken.keep_slot(held) and broken.errors == 1
