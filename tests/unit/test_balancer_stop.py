"""A stop that comes while a re-balance hands a queue over lets the hand-over finish.

Seen under load in tests/integration/redis/test_redis_blocking_handlers.py: the stop
cancelled the re-balance halfway through a queue's drain (its acknowledgements waiting
for a retry), its own give-up then found no agent left to drain and released the lease,
and the next owner ran the 30 finished messages again.

Run on the lab's virtual clock against its store, so nothing depends on the machine."""

from __future__ import annotations

import asyncio

from conveyor.lab.balancer_store import SimLeaseStore, SimMembership, SimStore
from conveyor.lab.virtual_time import run_virtual
from conveyor.platform.balancing.balancer import DynamicBalancer
from conveyor.platform.balancing.leases import Lease
from conveyor.platform.balancing.membership import MemberInfo

DRAIN_S = 2.0
"""How long a drain takes (the acknowledgements of what finished, sent after a retry)."""


class SlowDrains:
    """A daemon whose drains take :data:`DRAIN_S`; records how each one ended and who
    held the queue's lease when it did."""

    def __init__(self, store: SimStore) -> None:
        self.store = store
        self.held: set[int] = set()
        self.draining: set[int] = set()
        self.drained: list[tuple[int, str | None]] = []
        self.cut_short: list[int] = []

    async def queue_acquired(self, queue: int, lease: Lease | None) -> None:
        self.held.add(queue)

    async def queue_released(self, queue: int) -> None:
        if queue not in self.held:
            return  # nothing left to drain: what a daemon does once its agent is gone
        self.draining.add(queue)
        try:
            await asyncio.sleep(DRAIN_S)
        except asyncio.CancelledError:
            self.cut_short.append(queue)
            self.held.discard(queue)  # the daemon forgets a drain cut short
            raise
        finally:
            self.draining.discard(queue)
        owner = (await SimLeaseStore(self.store).owners()).get(queue)
        self.drained.append((queue, owner))
        self.held.discard(queue)

    async def queue_lost(self, queue: int) -> None:
        self.held.discard(queue)

    def balancer_failed(self, error: BaseException) -> None:
        raise AssertionError(error)


class Plain(SlowDrains):
    async def queue_released(self, queue: int) -> None:
        self.held.discard(queue)


def balancer(store: SimStore) -> DynamicBalancer:
    return DynamicBalancer(SimMembership(store), SimLeaseStore(store), 4, lease_ttl_s=5.0,
                           rebalance_interval_s=1.0, clock=asyncio.get_running_loop().time)


def member(name: str) -> MemberInfo:
    return MemberInfo(id=name, host="h", pid=1, started_at=0.0)


def test_a_stop_during_a_hand_over_waits_for_its_drain_before_releasing_the_lease() -> None:
    async def scenario() -> SlowDrains:
        store = SimStore(4, rtt_s=0.0)
        a, first = balancer(store), SlowDrains(store)
        await a.start(member("a"), first)
        await asyncio.sleep(5.0)
        assert first.held == {0, 1, 2, 3}
        b = balancer(store)
        await b.start(member("b"), Plain(store))
        for _ in range(100):  # a's next re-balance gives b half: drains under way
            if first.draining:
                break
            await asyncio.sleep(0.1)
        assert first.draining, "a started no hand-over"
        handing = set(first.draining)
        await a.stop()
        await b.stop()
        assert handing <= {q for q, _ in first.drained}
        return first

    first = run_virtual(scenario())
    assert first.cut_short == []
    # Every drain ended while a still held the lease: released only after it.
    assert sorted(q for q, _ in first.drained) == [0, 1, 2, 3]
    assert {owner for _, owner in first.drained} == {"a"}
