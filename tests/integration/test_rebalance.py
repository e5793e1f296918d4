"""Several daemons in one process share queues through the dynamic balancer."""

from __future__ import annotations

import asyncio

import pytest

from conveyor import Client
from conveyor.platform.balancing.balancer import DynamicBalancer, best_fit
from conveyor.platform.balancing.leases import Lease, MemoryLeaseStore
from conveyor.platform.balancing.membership import MemberInfo, MemoryMembership
from tests.conftest import wait_until
from tests.integration.memory_harness import (
    Record,
    config,
    daemon,
    fresh_adapter,
    publish_items,
    recording_app,
)


def test_best_fit_is_even_and_deterministic() -> None:
    split = best_fit(["c", "a", "b"], 8)
    assert split == {"a": [0, 3, 6], "b": [1, 4, 7], "c": [2, 5]}
    assert best_fit(["b", "c", "a"], 8) == split
    assert best_fit([], 8) == {}


def balancer(membership: MemoryMembership, leases: MemoryLeaseStore,
             ttl_s: float = 5.0) -> DynamicBalancer:
    return DynamicBalancer(membership, leases, 8, lease_ttl_s=ttl_s, rebalance_interval_s=0.05)


async def test_daemons_joining_and_leaving_mid_run_lose_and_double_nothing() -> None:
    adapter = fresh_adapter()
    membership, leases = MemoryMembership(), MemoryLeaseStore()
    record = Record()
    app = recording_app(record, delay_s=0.001)
    cfg = config(slots={"count": 16})
    a = daemon(app, adapter, cfg, balancer=balancer(membership, leases),
               member=MemberInfo("a", "h", 1, 0.0))
    b = daemon(app, adapter, cfg, balancer=balancer(membership, leases),
               member=MemberInfo("b", "h", 2, 0.0))
    ids = await publish_items(Client(adapter, a.mapper), 3000, streams=100)
    await a.start()
    assert a.balancer.owned() == list(range(8))
    await wait_until(lambda: record.handled > 300, 10, what="a makes progress")
    await b.start()  # joins: a hands over half its queues, drained first
    await wait_until(lambda: len(a.balancer.owned()) == 4 and len(b.balancer.owned()) == 4,
                     10, what="even split")
    assert sorted(a.balancer.owned() + b.balancer.owned()) == list(range(8))
    await wait_until(lambda: record.handled > 1500, 20, what="both make progress")
    await a.stop()  # leaves gracefully: b takes everything
    await wait_until(lambda: b.balancer.owned() == list(range(8)), 10, what="b owns all")
    await wait_until(lambda: record.handled == 3000, 30, what="all handled")
    await b.stop()
    assert set(record.calls) == set(ids)
    assert record.duplicates == 0  # graceful hand-offs replay nothing
    for seqs in record.order.values():
        assert seqs == sorted(seqs)


class Partitioned(MemoryLeaseStore, MemoryMembership):
    """One daemon's view of the shared stores, which can be cut off like a partition."""

    def __init__(self, leases: MemoryLeaseStore, membership: MemoryMembership) -> None:
        self.leases, self.membership, self.cut = leases, membership, False

    def _check(self) -> None:
        if self.cut:
            raise ConnectionError("store unreachable from this daemon")

    async def acquire(self, queue: int, owner: str, ttl_s: float) -> Lease | None:
        self._check()
        return await self.leases.acquire(queue, owner, ttl_s)

    async def renew(self, lease: Lease, ttl_s: float) -> Lease | None:
        self._check()
        return await self.leases.renew(lease, ttl_s)

    async def release(self, lease: Lease) -> bool:
        self._check()
        return await self.leases.release(lease)

    async def owners(self) -> dict[int, str]:
        return await self.leases.owners()

    async def wait_released(self, timeout_s: float) -> None:
        await self.leases.wait_released(timeout_s)

    async def generation(self) -> int:
        self._check()
        return await self.leases.generation()

    async def join(self, member: MemberInfo) -> None:
        self._check()
        await self.membership.join(member)

    async def leave(self, member_id: str) -> None:
        self._check()
        await self.membership.leave(member_id)

    async def heartbeat(self, member: MemberInfo) -> None:
        self._check()
        await self.membership.heartbeat(member)

    async def members(self) -> list[MemberInfo]:
        self._check()
        return await self.membership.members()

    async def member_ids(self) -> list[str]:
        self._check()
        return await self.membership.member_ids()

    async def version(self) -> int:
        self._check()
        return await self.membership.version()

    async def wait_changed(self, timeout_s: float) -> bool:
        return await self.membership.wait_changed(timeout_s)


async def test_an_owner_cut_off_from_the_store_stops_acking_and_its_queues_are_taken_over() -> None:
    adapter = fresh_adapter()
    membership, leases = MemoryMembership(), MemoryLeaseStore()
    a_view = Partitioned(leases, membership)
    record = Record()
    app = recording_app(record, delay_s=0.002)
    cfg = config(slots={"count": 8})
    ttl_s = 0.6
    a_balancer = DynamicBalancer(a_view, a_view, 8, lease_ttl_s=ttl_s, rebalance_interval_s=0.05)
    a = daemon(app, adapter, cfg, balancer=a_balancer, member=MemberInfo("a", "h", 1, 0.0))
    b = daemon(app, adapter, cfg, balancer=balancer(membership, leases, ttl_s),
               member=MemberInfo("b", "h", 2, 0.0))
    ids = await publish_items(Client(adapter, a.mapper), 2000, streams=50)
    await a.start()
    await b.start()
    await wait_until(lambda: len(a.balancer.owned()) == 4, 10, what="split")
    await wait_until(lambda: record.handled > 200, 10, what="progress")
    a_view.cut = True
    await membership.leave("a")  # as a membership TTL would lapse
    # a notices before its leases can expire and stops; b takes the queues over.
    await wait_until(lambda: a.balancer.owned() == [], 10, what="a drops its queues")
    acked_at_drop = a.report().acked
    await wait_until(lambda: b.balancer.owned() == list(range(8)), 10, what="b owns all")
    await wait_until(lambda: record.handled == 2000, 30, what="all handled")
    assert a.report().acked == acked_at_drop, "a fenced owner must not ack"
    await b.stop()
    a_view.cut = False
    report = await a.stop()
    assert set(record.calls) == set(ids)
    # Only what a held (at most its 4 caches) may run twice.
    assert record.duplicates <= 4 * cfg.worker.cache_capacity
    # What a held when its leases lapsed (possibly nothing: its share may have been done
    # by then) is counted as lost, not as abandoned by a drain; only that can run twice.
    assert report.abandoned == 0
    assert record.duplicates <= report.moved


class Listener:
    def __init__(self) -> None:
        self.owned: set[int] = set()

    async def queue_acquired(self, queue: int, lease: Lease | None) -> None:
        self.owned.add(queue)

    async def queue_released(self, queue: int) -> None:
        self.owned.discard(queue)

    async def queue_lost(self, queue: int) -> None:
        self.owned.discard(queue)

    def balancer_failed(self, error: BaseException) -> None:
        raise AssertionError(f"the balancer failed: {error}")


async def test_resource_placement_gives_the_busier_daemon_fewer_queues() -> None:
    from conveyor.platform.balancing.balancer import ResourcePlacement

    membership, leases = MemoryMembership(), MemoryLeaseStore()
    listeners = {"busy": Listener(), "idle": Listener()}
    cpu = {"busy": 95.0, "idle": 5.0}
    balancers = {}
    for name in ("busy", "idle"):
        b = DynamicBalancer(membership, leases, 16, lease_ttl_s=0.3,
                            rebalance_interval_s=0.05, placement=ResourcePlacement())
        b.set_stats_provider(lambda name=name: {  # type: ignore[misc]
            "cpu_percent": cpu[name], "memory_used_bytes": 1.0,
            "memory_available_bytes": 3.0, "memory_total_bytes": 4.0})
        balancers[name] = b
        await b.start(MemberInfo(name, "h", 1, 0.0), listeners[name])
    # Heartbeats publish the stats; the split converges to favour the idle daemon.
    await wait_until(
        lambda: len(listeners["idle"].owned) > len(listeners["busy"].owned) >= 1
        and len(listeners["idle"].owned | listeners["busy"].owned) == 16
        and not listeners["idle"].owned & listeners["busy"].owned,
        10, what="a resource-weighted split",
    )
    cpu["busy"], cpu["idle"] = 5.0, 95.0  # the load flips: queues follow
    await wait_until(lambda: len(listeners["busy"].owned) > len(listeners["idle"].owned),
                     10, what="queues to follow the load")
    for b in balancers.values():
        await b.stop()
    assert listeners["busy"].owned == listeners["idle"].owned == set()


class Counting(Listener):
    """A listener that also counts the queues it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.acquired = 0

    async def queue_acquired(self, queue: int, lease: Lease | None) -> None:
        self.acquired += 1
        await super().queue_acquired(queue, lease)


async def test_a_join_and_a_leave_move_only_the_surplus_between_in_process_daemons() -> None:
    membership, leases = MemoryMembership(), MemoryLeaseStore()
    listeners = {name: Counting() for name in "abcd"}
    balancers = {name: balancer(membership, leases) for name in "abcd"}

    def shares(names: str) -> list[int]:
        return sorted(len(listeners[n].owned) for n in names)

    def moves() -> int:
        return sum(listener.acquired for listener in listeners.values())

    for name in "abc":
        await balancers[name].start(MemberInfo(name, "h", 1, 0.0), listeners[name])
    await wait_until(lambda: shares("abc") == [2, 3, 3], 10, what="three shares")
    settled = moves()
    await balancers["d"].start(MemberInfo("d", "h", 1, 0.0), listeners["d"])
    await wait_until(lambda: shares("abcd") == [2, 2, 2, 2], 10, what="four shares")
    assert moves() - settled == 2
    took = set(listeners["d"].owned)
    await balancers["d"].stop()
    await wait_until(lambda: shares("abc") == [2, 3, 3], 10, what="three shares again")
    assert moves() - settled == 4
    assert took <= set().union(*(listeners[n].owned for n in "abc"))
    for name in "abc":
        await balancers[name].stop()


async def test_a_balancer_loop_that_swallows_its_cancel_does_not_hang_the_stop(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """A loop task that ignores its cancellation (as Python 3.11's asyncio.timeout can
    make one do) is logged and left behind: the daemon still hands its queues over and
    its stop returns."""
    import asyncio
    import contextlib

    from conveyor.platform.balancing import balancer as balancer_module

    monkeypatch.setattr(balancer_module, "TASKS_STOP_S", 0.2)
    adapter = fresh_adapter()
    membership, leases = MemoryMembership(), MemoryLeaseStore()
    b = balancer(membership, leases)
    d = daemon(recording_app(Record()), adapter, config(), balancer=b,
               member=MemberInfo("a", "h", 1, 0.0))
    await d.start()
    await wait_until(lambda: len(b.owned()) == 8, what="all queues owned")

    swallow = [True]

    async def stubborn() -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if not swallow[0]:
                    raise
                # the bug this guards against: the cancellation is lost

    stuck = asyncio.create_task(stubborn(), name="stubborn")
    b._tasks.append(stuck)
    try:
        await asyncio.wait_for(d.stop(), 10)
        assert b.owned() == []
        assert "['stubborn'] did not stop" in caplog.text
    finally:
        swallow[0] = False
        stuck.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stuck


class CancelledOnce(MemoryLeaseStore):
    """The second attempt at queue 3 lets a stray ``CancelledError`` escape, as a callee
    that awaited a task someone else cancelled does (the first is refused: a ghost
    holds the queue at start, so the attempt that escapes comes from the balance loop)."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts = 0

    async def acquire(self, queue: int, owner: str, ttl_s: float) -> Lease | None:
        if queue == 3 and owner != "ghost":
            self.attempts += 1
            if self.attempts == 2:
                raise asyncio.CancelledError()
        return await super().acquire(queue, owner, ttl_s)


async def test_a_cancellation_escaping_a_rebalance_does_not_end_the_balancer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    leases, listener = CancelledOnce(), Listener()
    assert await leases.acquire(3, "ghost", 0.3) is not None  # lapses: never renewed
    b = balancer(MemoryMembership(), leases)
    await b.start(MemberInfo("only", "h", 1, 0.0), listener)
    try:
        await wait_until(lambda: len(listener.owned) == 8, 10,
                         what="every queue, queue 3 after the stray cancellation")
    finally:
        await b.stop()
    assert leases.attempts >= 3
    assert "a cancellation escaped" in caplog.text


class SlowStart(Listener):
    """Starting queue 7 takes longer than a lease lives (its messages stall the loop, or
    its claim is slow): the other queues, taken before it, must not lapse meanwhile."""

    def __init__(self, hold_s: float) -> None:
        super().__init__()
        self.hold_s = hold_s
        self.lost: list[int] = []

    async def queue_acquired(self, queue: int, lease: Lease | None) -> None:
        await super().queue_acquired(queue, lease)
        if queue == 7:
            await asyncio.sleep(self.hold_s)

    async def queue_lost(self, queue: int) -> None:
        self.lost.append(queue)
        await super().queue_lost(queue)


async def test_leases_are_renewed_while_the_first_rebalance_is_still_starting_queues() -> None:
    membership, leases = MemoryMembership(), MemoryLeaseStore()
    ttl_s = 0.3
    listener = SlowStart(hold_s=ttl_s * 4)
    b = DynamicBalancer(membership, leases, 8, lease_ttl_s=ttl_s, rebalance_interval_s=0.05)
    await b.start(MemberInfo("only", "h", 1, 0.0), listener)  # returns after the slow start
    try:
        assert listener.lost == [], "a lease lapsed while another queue was starting"
        assert all(b.lease_valid(q) for q in range(8))
    finally:
        await b.stop()
