"""The dynamic balancer at scale, simulated: ``conveyor sim balancer``.

Runs the real :class:`~conveyor.platform.balancing.balancer.DynamicBalancer` (sticky best-fit
placement, leases, membership, its renew / heartbeat / balance loops) for every one of
``daemons`` simulated daemons in one process, on a virtual clock
(:mod:`conveyor.lab.virtual_time`), against an in-memory store that counts what Redis
would be asked (:mod:`conveyor.lab.balancer_store`). The scenario:

1. start the daemons spread over ``ramp_s`` and wait until the queues are settled;
2. measure the store's steady load over ``steady_s``: operations, keys and bytes per
   second, per category (heartbeats, lease renewals, membership polls, re-balance reads);
3. a daemon joins, then one leaves gracefully, then one crashes (its tasks are killed,
   as by SIGKILL); each time, how long until the queues are settled again and how many
   queues moved.

*Settled*: every queue is held by exactly one live daemon and every daemon holds
``floor(q/n)`` or ``ceil(q/n)`` queues. A queue is held from ``queue_acquired`` until its
``queue_released`` (a drain of ``drain_s``) or ``queue_lost`` returns, so a hand-off that
let two daemons act on one queue at once is seen (``double_owned``) — it should never be.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from conveyor.lab.balancer_store import CATEGORIES, SimLeaseStore, SimMembership, SimStore
from conveyor.lab.virtual_time import VirtualTimeLoop, close_loop, owner_var
from conveyor.platform.balancing.balancer import DynamicBalancer
from conveyor.platform.balancing.leases import Lease
from conveyor.platform.balancing.membership import MemberInfo
from conveyor.platform.errors import ConveyorError
from conveyor.platform.tasks import cancel_and_wait

SAMPLE_S = 0.02  # how often settlement is checked (the settle times' resolution)


@dataclass(frozen=True)
class BalancerSimConfig:
    daemons: int = 1000
    queues: int = 4096
    seed: int = 0
    lease_ttl_s: float = 5.0  # [balancer] defaults
    rebalance_interval_s: float = 1.0
    member_ttl_s: float = 3.0  # [redis] defaults
    heartbeat_s: float = 1.0
    rtt_s: float = 0.0005
    drain_s: float = 0.05
    ramp_s: float = 2.0
    steady_s: float = 60.0
    gap_s: float = 2.0
    settle_limit_s: float = 60.0


@dataclass(frozen=True)
class Load:
    category: str
    ops_per_s: float
    keys_per_s: float
    bytes_per_s: float


@dataclass(frozen=True)
class Settle:
    event: str
    settle_s: float | None
    """From the event to settled; None if not within ``settle_limit_s``."""
    moved: int
    """Queues acquired by a daemon that did not hold them before the event."""
    handed_off: int
    """Queues drained and released by their owner (graceful moves)."""
    double_owned: int
    """Acquisitions of a queue another live daemon still held (must be 0)."""


@dataclass
class BalancerSimResult:
    config: BalancerSimConfig
    startup: Settle
    load: list[Load]
    peak_ops_per_s: float
    """The busiest 0.1 s of the steady window, as a rate."""
    events: list[Settle]
    wall_s: float
    timeline: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    """``total`` and ``bytes`` -> (time, store ops/s and bytes/s) per second;
    ``unsettled`` -> (time, queues not held by exactly one live daemon)."""
    markers: list[tuple[float, str]] = field(default_factory=list)


class _World:
    """Who holds what, as the daemons' listeners report it."""

    def __init__(self, queues: int) -> None:
        self.holders: list[set[str]] = [set() for _ in range(queues)]
        self.held: dict[str, set[int]] = {}
        self.acquired = 0
        self.released = 0
        self.double_owned = 0

    def take(self, daemon: str, queue: int) -> None:
        if self.holders[queue]:
            self.double_owned += 1
        self.holders[queue].add(daemon)
        self.held.setdefault(daemon, set()).add(queue)
        self.acquired += 1

    def drop(self, daemon: str, queue: int) -> None:
        self.holders[queue].discard(daemon)
        self.held.get(daemon, set()).discard(queue)

    def died(self, daemon: str) -> None:
        for queue in self.held.pop(daemon, set()):
            self.holders[queue].discard(daemon)

    def unsettled(self, live: set[str]) -> int:
        """Queues not held by exactly one of ``live``."""
        return sum(1 for h in self.holders if len(h) != 1 or not h <= live)

    def settled(self, live: set[str]) -> bool:
        if not live:
            return False
        base, extra = divmod(len(self.holders), len(live))
        counts = [len(self.held.get(d, ())) for d in live]
        if any(c not in (base, base + (extra > 0)) for c in counts):
            return False
        return self.unsettled(live) == 0


class _Listener:
    def __init__(self, daemon: str, world: _World, drain_s: float) -> None:
        self.daemon = daemon
        self.world = world
        self.drain_s = drain_s

    async def queue_acquired(self, queue: int, lease: Lease | None) -> None:
        self.world.take(self.daemon, queue)

    async def queue_released(self, queue: int) -> None:
        await asyncio.sleep(self.drain_s)  # finish and acknowledge in-flight messages
        self.world.drop(self.daemon, queue)
        self.world.released += 1

    async def queue_lost(self, queue: int) -> None:
        self.world.drop(self.daemon, queue)

    def balancer_failed(self, error: BaseException) -> None:
        raise ConveyorError(f"{self.daemon}: balancer failed: {error}")


def _stats_like_a_daemon(balancer: DynamicBalancer, clock: Callable[[], float],
                         rng: random.Random) -> Callable[[], dict[str, float]]:
    """Stats shaped like ``DaemonMetrics.stats_snapshot``: what a real daemon publishes
    with every heartbeat (counters, slots, resources, three figures per owned queue, the
    time they were taken), so membership records weigh what they weigh in production."""
    base = {"slots.issued": 8.0, "slots.in_use": 5.0, "handled": 1_000_000.0 * rng.random(),
            "dead_lettered": 17.0, "skipped": 0.0, "dead_letters_evicted": 0.0,
            "dead_letters.waiting": 0.0, "slots.available": 3.0,
            "cpu_percent": 41.25, "memory_used_bytes": 1_843_920_896.0,
            "memory_available_bytes": 6_120_337_408.0, "memory_total_bytes": 8_264_220_672.0}

    def snapshot() -> dict[str, float]:
        stats = dict(base)
        for queue in balancer.owned():
            stats[f"queue.{queue}.cache_fill"] = 12.0
            stats[f"queue.{queue}.acked"] = 3_456_789.0
            stats[f"queue.{queue}.acks_per_s"] = 812.4
        stats["at"] = 1.7e9 + clock()
        return stats

    return snapshot


class _Scenario:
    def __init__(self, config: BalancerSimConfig, loop: VirtualTimeLoop) -> None:
        self.config = config
        self.loop = loop
        self.rng = random.Random(config.seed)
        self.store = SimStore(config.queues, rtt_s=config.rtt_s,
                              member_ttl_s=config.member_ttl_s, heartbeat_s=config.heartbeat_s)
        self.world = _World(config.queues)
        self.balancers: dict[str, DynamicBalancer] = {}
        self.live: set[str] = set()
        self.started = 0
        self.unsettled: list[tuple[float, float]] = []
        self.markers: list[tuple[float, str]] = []

    def _member(self) -> MemberInfo:
        i = self.started
        self.started += 1
        return MemberInfo(id=f"host-{i:04d}-{10000 + i}-{self.rng.getrandbits(32):08x}",
                          host=f"host-{i:04d}", pid=10000 + i,
                          started_at=1.7e9 + self.rng.random())

    def _spawn(self, daemon: str, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` as (a task of) the simulated process ``daemon``."""
        context = contextvars.copy_context()
        context.run(owner_var.set, daemon)
        return self.loop.create_task(coro, context=context)

    def start_daemon(self, delay_s: float = 0.0) -> asyncio.Task[None]:
        member = self._member()
        cfg = self.config
        balancer = DynamicBalancer(
            SimMembership(self.store), SimLeaseStore(self.store), cfg.queues,
            lease_ttl_s=cfg.lease_ttl_s, rebalance_interval_s=cfg.rebalance_interval_s,
            clock=self.loop.time,
        )
        balancer.set_stats_provider(_stats_like_a_daemon(balancer, self.loop.time, self.rng))
        self.balancers[member.id] = balancer
        self.live.add(member.id)
        listener = _Listener(member.id, self.world, cfg.drain_s)

        async def run() -> None:
            await asyncio.sleep(delay_s)
            await balancer.start(member, listener)

        return self._spawn(member.id, run())

    async def _sample(self) -> None:
        while True:
            self.unsettled.append((self.loop.time(), self.world.unsettled(self.live)))
            await asyncio.sleep(0.1)

    async def settle(self, event: str, act: Callable[[], object]) -> Settle:
        """Do ``act`` and wait until settled; what it took."""
        t0 = self.loop.time()
        self.markers.append((t0, event))
        acquired, released, doubled = (self.world.acquired, self.world.released,
                                       self.world.double_owned)
        act()
        deadline = t0 + self.config.settle_limit_s
        settle_s: float | None = None
        while self.loop.time() < deadline:
            await asyncio.sleep(SAMPLE_S)
            if self.world.settled(self.live):
                settle_s = self.loop.time() - t0
                break
        return Settle(event, settle_s, self.world.acquired - acquired,
                      self.world.released - released, self.world.double_owned - doubled)

    def _victim(self) -> str:
        return self.rng.choice(sorted(self.live))

    def join(self) -> None:
        self.start_daemon()

    def leave(self) -> None:
        victim = self._victim()
        self.live.discard(victim)
        self._spawn(victim, self.balancers.pop(victim).stop())

    def crash(self) -> None:
        victim = self._victim()
        self.live.discard(victim)
        self.balancers.pop(victim)
        self.loop.kill(victim)
        self.world.died(victim)

    async def run(self) -> tuple[Settle, list[Load], float, list[Settle]]:
        cfg = self.config
        sampler = asyncio.create_task(self._sample())
        try:
            startup = await self.settle("start", lambda: [
                self.start_daemon(self.rng.uniform(0, cfg.ramp_s)) for _ in range(cfg.daemons)])
            # Refusals of the start-up scramble are remembered until those leases were
            # due to lapse (up to a TTL): past that, the load is the steady one.
            await asyncio.sleep(max(cfg.gap_s, cfg.lease_ttl_s))
            load, peak = await self._steady()
            events = []
            for name, act in (("join", self.join), ("graceful leave", self.leave),
                              ("crash", self.crash)):
                events.append(await self.settle(name, act))
                await asyncio.sleep(cfg.gap_s)
        finally:
            for daemon in self.balancers:  # the end: no leaves to re-balance after
                self.loop.kill(daemon)
            await cancel_and_wait(sampler)
        return startup, load, peak, events

    async def _steady(self) -> tuple[list[Load], float]:
        traffic = self.store.traffic
        t0 = self.loop.time()
        self.markers.append((t0, "steady"))
        ops, keys, nbytes = traffic.ops.copy(), traffic.keys.copy(), traffic.bytes.copy()
        await asyncio.sleep(self.config.steady_s)
        span = self.loop.time() - t0
        load = [Load(c, (traffic.ops[c] - ops[c]) / span, (traffic.keys[c] - keys[c]) / span,
                     (traffic.bytes[c] - nbytes[c]) / span) for c in CATEGORIES]
        first, last = int(t0 / traffic.bucket_s), int((t0 + span) / traffic.bucket_s)
        peak = max(traffic.buckets[b] for b in range(first, last)) / traffic.bucket_s
        return load, peak


def _per_second(counts: dict[int, int], bucket_s: float) -> list[tuple[float, float]]:
    seconds: dict[int, float] = {}
    for bucket, n in counts.items():
        second = int(bucket * bucket_s)
        seconds[second] = seconds.get(second, 0) + n
    return sorted((float(s), float(n)) for s, n in seconds.items())


def run(config: BalancerSimConfig) -> BalancerSimResult:
    """Run the scenario on a fresh virtual-time loop (deterministic for a seed)."""
    loop = VirtualTimeLoop()
    scenario = _Scenario(config, loop)
    started = time.perf_counter()
    try:
        startup, load, peak, events = loop.run_until_complete(scenario.run())
    finally:
        close_loop(loop)
    traffic = scenario.store.traffic
    timeline = {"total": _per_second(dict(traffic.buckets), traffic.bucket_s),
                "bytes": _per_second(dict(traffic.byte_buckets), traffic.bucket_s),
                "unsettled": scenario.unsettled}
    return BalancerSimResult(config, startup, load, peak, events,
                             time.perf_counter() - started, timeline, scenario.markers)
