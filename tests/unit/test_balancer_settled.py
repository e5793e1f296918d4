"""A settled dynamic balancer skips re-balances while the membership version and the
lease generation stay put, and still re-balances in full every 30-60 intervals.

Run on the lab's virtual clock against its counting store, so a minute of daemons takes
milliseconds and nothing depends on the machine's speed."""

from __future__ import annotations

import asyncio

from conveyor.lab.balancer_store import SimLeaseStore, SimMembership, SimStore
from conveyor.lab.virtual_time import run_virtual
from conveyor.platform.balancing.balancer import FULL_RECHECK_INTERVALS, DynamicBalancer
from conveyor.platform.balancing.leases import Lease
from conveyor.platform.balancing.membership import MemberInfo


class Holdings:
    """A listener per daemon, recording what each holds."""

    def __init__(self) -> None:
        self.held: dict[str, set[int]] = {}

    def listener(self, daemon: str) -> _Listener:
        return _Listener(self.held.setdefault(daemon, set()))


class _Listener:
    def __init__(self, held: set[int]) -> None:
        self.held = held

    async def queue_acquired(self, queue: int, lease: Lease | None) -> None:
        self.held.add(queue)

    async def queue_released(self, queue: int) -> None:
        self.held.discard(queue)

    async def queue_lost(self, queue: int) -> None:
        self.held.discard(queue)

    def balancer_failed(self, error: BaseException) -> None:
        raise AssertionError(error)


class CountersThatNeverMove(SimMembership):
    """What a daemon sees when its peers run scripts that bump no version (an older
    Conveyor mid-upgrade): the version never moves."""

    async def version(self) -> int:
        await super().version()
        return 0


class GenerationThatNeverMoves(SimLeaseStore):
    async def generation(self) -> int:
        await super().generation()
        return 0


def member(name: str) -> MemberInfo:
    return MemberInfo(id=name, host="h", pid=1, started_at=0.0)


async def start(store: SimStore, holdings: Holdings, name: str, frozen: bool) -> DynamicBalancer:
    membership = CountersThatNeverMove(store) if frozen else SimMembership(store)
    leases = GenerationThatNeverMoves(store) if frozen else SimLeaseStore(store)
    balancer = DynamicBalancer(membership, leases, 8, lease_ttl_s=5.0,
                               rebalance_interval_s=1.0,
                               clock=asyncio.get_running_loop().time)
    await balancer.start(member(name), holdings.listener(name))
    return balancer


def shares(holdings: Holdings) -> list[int]:
    return sorted(len(h) for h in holdings.held.values())


def test_counters_that_miss_a_join_delay_the_move_to_the_full_recheck_never_for_good() -> None:
    async def scenario() -> tuple[list[int], list[int], int]:
        store, holdings = SimStore(8, rtt_s=0.0), Holdings()
        daemons = [await start(store, holdings, name, frozen=True) for name in ("a", "b")]
        await asyncio.sleep(10.0)
        assert shares(holdings) == [4, 4]
        daemons.append(await start(store, holdings, "c", frozen=True))
        # a and b hold exactly what they aimed at and their counters did not move:
        # they do not look at the membership again before their full re-check.
        await asyncio.sleep(FULL_RECHECK_INTERVALS - 5.0)
        early = shares(holdings)
        await asyncio.sleep(2 * FULL_RECHECK_INTERVALS)
        late = shares(holdings)
        owned = len(set().union(*holdings.held.values()))
        for daemon in daemons:
            await daemon.stop()
        return early, late, owned

    early, late, owned = run_virtual(scenario())
    assert early == [0, 4, 4]
    assert late == [2, 3, 3] and owned == 8


def test_with_moving_counters_a_join_is_settled_within_a_second() -> None:
    async def scenario() -> list[int]:
        store, holdings = SimStore(8, rtt_s=0.0), Holdings()
        daemons = [await start(store, holdings, name, frozen=False) for name in ("a", "b")]
        await asyncio.sleep(10.0)
        daemons.append(await start(store, holdings, "c", frozen=False))
        await asyncio.sleep(1.0)
        settled = shares(holdings)
        for daemon in daemons:
            await daemon.stop()
        return settled

    assert run_virtual(scenario()) == [2, 3, 3]
