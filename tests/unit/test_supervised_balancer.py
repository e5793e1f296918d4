"""A supervised child's balancer: the supervisor hands it queues one by one."""

from __future__ import annotations

import asyncio

import pytest

from conveyor.platform.balancing.leases import Lease, MemoryLeaseStore
from conveyor.platform.balancing.membership import MemberInfo, MemoryMembership
from conveyor.platform.errors import BrokerConnectionError, BrokerError
from conveyor.workers.supervisor.child import LeasedSupervisedBalancer


class FailingStarts:
    """A daemon whose queue starts fail (its broker is down)."""

    def __init__(self) -> None:
        self.starts = 0
        self.lost: list[int] = []

    async def queue_acquired(self, queue: int, lease: Lease | None) -> None:
        self.starts += 1
        raise BrokerConnectionError("redis unreachable (injected)")

    async def queue_released(self, queue: int) -> None:
        """Nothing was started, so nothing to drain."""

    async def queue_lost(self, queue: int) -> None:
        self.lost.append(queue)


async def test_an_acquire_whose_start_fails_reports_it_instead_of_waiting_forever() -> None:
    # The supervisor waits on acquire (no timeout of its own): an acquire that kept
    # retrying a failing start would hold up every later inspection.
    leases = MemoryLeaseStore()
    balancer = LeasedSupervisedBalancer(MemoryMembership(), leases, 4, lease_ttl_s=3,
                                        rebalance_interval_s=0.2)
    daemon = FailingStarts()
    await balancer.start(MemberInfo.for_this_process("x-"), daemon)
    try:
        with pytest.raises(BrokerError, match="queue 0: starting it failed"):
            await asyncio.wait_for(balancer.acquire(0), 3)
        assert daemon.starts == 1 and daemon.lost == [0]
        assert balancer.owned() == []
        assert 0 not in await leases.owners()  # released for another process to take
    finally:
        await balancer.stop()
