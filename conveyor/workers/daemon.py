"""The worker daemon: one process's share of an app's queues, pulled and handled.

It joins the balancer, starts a :class:`PullingAgent` for every queue it is given,
drains the ones it gives back, aborts the ones whose lease is lost, and on
:meth:`stop` drains everything: stops pulling, lets in-flight messages finish within
``drain_timeout_s``, acknowledges them and releases its queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import psutil

from conveyor.platform.adapter import QueueAdapter, create_adapter
from conveyor.platform.agent import AgentSettings, PullingAgent, Subscriptions
from conveyor.platform.app import App
from conveyor.platform.balancer import (
    BestFitPlacement,
    DynamicBalancer,
    Placement,
    QueueBalancer,
    ResourcePlacement,
    StaticBalancer,
)
from conveyor.platform.client import Client
from conveyor.platform.config import Config
from conveyor.platform.coordination import coordination_from_config
from conveyor.platform.delivery import (
    DeadLetterStore,
    DeliveryStats,
    PutLetter,
    build_chain,
    chain_interceptors,
)
from conveyor.platform.delivery.orphans import Orphans
from conveyor.platform.importing import load_attr
from conveyor.platform.leases import Lease
from conveyor.platform.mapper import HashRingQueueMapper
from conveyor.platform.membership import MemberInfo
from conveyor.platform.message import DeadLetter
from conveyor.platform.placement import PlacementWeights, ResourcePlacer
from conveyor.platform.queue_cache import Route
from conveyor.platform.status import AckRates
from conveyor.platform.telemetry import Telemetry, stats_observations
from conveyor.workers.cell_interceptor import CellInterceptor
from conveyor.workers.cells import CellRouter
from conveyor.workers.pool import StatelessWorkerPool
from conveyor.workers.pool_interceptor import PoolInterceptor
from conveyor.workers.slots import SlotSupplier, supplier_from_config

log = logging.getLogger("conveyor.daemon")


# Balancers that live beside a driver, imported by name (like adapters) so that this
# module imports no driver. Factories take (config, app_name, adapter).
_BALANCERS = {
    "kafka-group": "conveyor.adapters.kafka_group:from_config",
}


def build_balancer(
    config: Config, app_name: str, adapter: QueueAdapter | None = None
) -> QueueBalancer:
    target = _BALANCERS.get(config.balancer.kind)
    if target is not None:
        factory = load_attr(target, f"$.balancer.kind = {config.balancer.kind!r}")
        balancer: QueueBalancer = factory(config, app_name, adapter)
        return balancer
    if config.balancer.kind == "static":
        return StaticBalancer(config.balancer.queues or range(config.queues.total))
    membership, leases = coordination_from_config(config, app_name)
    placement: Placement = BestFitPlacement()
    if config.balancer.placement == "resource":
        w = config.balancer.weights
        placement = ResourcePlacement(
            PlacementWeights(w.cpu_usage, w.memory_usage, w.available_memory, w.local_margin)
        )
    return DynamicBalancer(
        membership,
        leases,
        config.queues.total,
        lease_ttl_s=config.balancer.lease_ttl_s,
        rebalance_interval_s=config.balancer.rebalance_interval_s,
        placement=placement,
    )


class HostResources:
    """This host's CPU and memory, CDM-KF-filtered where sampled (for placement).

    Filtering at the source means every daemon scores from the same published numbers.
    """

    def __init__(self, member_id: str) -> None:
        self._placer = ResourcePlacer()
        self._member_id = member_id
        psutil.cpu_percent(None)  # primes the counter: the first reading covers since now

    def sample(self) -> dict[str, float]:
        memory = psutil.virtual_memory()
        raw = {
            "cpu_percent": psutil.cpu_percent(None),
            "memory_used_bytes": float(memory.used),
            "memory_available_bytes": float(memory.available),
            "memory_total_bytes": float(memory.total),
        }
        return dict(self._placer.observe(self._member_id, raw))


@dataclass(frozen=True, slots=True)
class DrainReport:
    """What a daemon's stop did; printed by ``conveyor worker`` as its last line."""

    pulled: int
    acked: int
    handled: int
    dead_lettered: int
    abandoned: int
    skipped: int = 0

    def __str__(self) -> str:
        return (
            f"pulled={self.pulled} acked={self.acked} handled={self.handled} "
            f"dead_lettered={self.dead_lettered} abandoned={self.abandoned} "
            f"skipped={self.skipped}"
        )


class WorkerDaemon:
    def __init__(
        self,
        app: App,
        config: Config | None = None,
        *,
        adapter: QueueAdapter | None = None,
        balancer: QueueBalancer | None = None,
        slots: SlotSupplier | None = None,
        member: MemberInfo | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.app = app
        self.config = config = config or Config()
        self._owns_adapter = adapter is None
        self.adapter = adapter or create_adapter(config.queues.adapter, config)
        self.mapper = HashRingQueueMapper(config.queues.total)
        self._owns_slots = slots is None
        self.slots = slots or supplier_from_config(config.slots)
        self.balancer = balancer or build_balancer(config, app.name, self.adapter)
        self.member = member or MemberInfo.for_this_process(f"{app.name}-")
        self.stats = DeliveryStats()
        self._owns_telemetry = telemetry is None
        self.telemetry = telemetry or Telemetry.from_config(config.telemetry, self.member.id)
        self.dead_letters = DeadLetterStore(self._store_dead_letters, self.stats)
        self._pool_step = PoolInterceptor()
        self._cell_step = CellInterceptor(config.cells.sizes, config.cells.default_size)
        self.client = Client(self.adapter, self.mapper, telemetry=self.telemetry)
        self.lag: dict[int, int] = {}
        self._resources = HostResources(self.member.id)
        self._lag_task: asyncio.Task[None] | None = None
        self.settings = AgentSettings(
            cache_capacity=config.worker.cache_capacity,
            max_batch=config.worker.max_batch,
            poll_timeout_s=config.worker.poll_timeout_ms / 1000,
        )
        self.agents: dict[int, PullingAgent] = {}
        self._leaving: dict[int, PullingAgent] = {}
        put_letter = self._put_letter()
        self.orphans = Orphans(put_letter, self.stats, app.name, config.dead_letters.unroutable)
        self._subs = self._subscribe(app, put_letter)
        self._hooks: list[asyncio.Task[None]] = []
        self._pulled_gone = 0
        self._acked_gone = 0
        self._abandoned = 0
        self._max_cache_fill_gone = 0
        self._ack_rates = AckRates()
        self.started = False
        self.failure: BaseException | None = None
        """Why the daemon can no longer work (set with :attr:`failed`); None while fine."""
        self.failed = asyncio.Event()

    def _put_letter(self) -> PutLetter:
        """How dead letters are stored: through the store, in a span when tracing."""
        tracer = self.telemetry.tracer
        if tracer is None:
            return self.dead_letters.put
        from conveyor.platform.delivery.tracing import traced_dead_letters

        return traced_dead_letters(self.dead_letters.put, tracer)

    def _subscribe(self, app: App, put_letter: PutLetter) -> Subscriptions:
        """Every handler's delivery chain, composed once (see conveyor.platform.delivery)."""
        self.interceptors = interceptors = chain_interceptors(
            put_letter,
            self.stats,
            tracer=self.telemetry.tracer,
            meter=self.telemetry.meter,
            system=self.adapter.name,
            group=app.name,
            app=app.interceptors,
            hosting=(self._pool_step, self._cell_step),
        )
        index = {spec.name: i for i, spec in enumerate(app.handlers)}
        return {
            ns: tuple(Route(index[s.name], s, build_chain(s, interceptors)) for s in specs)
            for ns, specs in app.subscriptions().items()
        }

    @property
    def pools(self) -> dict[str, StatelessWorkerPool]:
        """Stateless-worker pools by handler name."""
        return self._pool_step.pools

    @property
    def cells(self) -> dict[str, CellRouter]:
        """Cells by handler name."""
        return self._cell_step.routers

    def _register_metrics(self) -> None:
        t, stats, slots = self.telemetry, self.stats, self.slots
        if t.meter is None:
            return
        for name, read in stats_observations(stats).items():
            t.observe(f"conveyor.messages.{name}", "{message}", f"Messages {name}", read,
                      counter=True)
        t.observe("conveyor.slots.in_use", "{slot}",
                  'Slots carrying a message: handler="*" is the daemon\'s total',
                  lambda: [(m["in_use"], {"handler": h}) for h, m in self.slot_metrics().items()])
        t.observe("conveyor.slots.available", "{slot}", "Slots that could be issued now",
                  lambda: [(slots.available, {})] if slots.available is not None else [])
        t.observe("conveyor.queues.owned", "{queue}", "Queues this daemon pulls",
                  lambda: [(len(self.agents), {})])
        t.observe("conveyor.cache.fill", "{message}", "Messages held by a pulling agent",
                  lambda: [(len(a.cache), {"queue": str(q)}) for q, a in self.agents.items()])
        t.observe("conveyor.queue.lag", "{message}", "Messages not yet finished, per queue",
                  lambda: [(lag, {"queue": str(q)}) for q, lag in self.lag.items()])
        t.observe("conveyor.pool.workers", "{worker}", "Workers of a stateless-worker pool",
                  lambda: [(p.size, {"handler": h}) for h, p in self.pools.items()])
        t.observe("conveyor.pool.waiting", "{message}", "Calls assigned to a pool, unfinished",
                  lambda: [(p.waiting, {"handler": h}) for h, p in self.pools.items()])
        t.observe("conveyor.cell.workers", "{worker}", "Workers of a cell",
                  lambda: self._cell_observations("size"))
        t.observe("conveyor.cell.queue_length", "{message}", "Jobs waiting in a cell",
                  lambda: self._cell_observations("queue_length"))
        self._lag_task = asyncio.create_task(self._sample_lag())

    def _cell_observations(self, field: str) -> list[tuple[float, dict[str, str]]]:
        return [
            (values[field], {"handler": h, "cell": cell})
            for h, router in self.cells.items()
            for cell, values in router.snapshot().items()
        ]

    async def _sample_lag(self) -> None:
        """Lag needs broker calls, which metric callbacks cannot make: sample it here."""
        while True:
            for queue, agent in list(self.agents.items()):
                with contextlib.suppress(Exception):
                    self.lag[queue] = await agent.receiver.lag()
            for queue in set(self.lag) - set(self.agents):
                del self.lag[queue]
            await asyncio.sleep(self.config.telemetry.metrics_interval_s)

    def resize_cell(self, handler: str, cell: str, size: int) -> None:
        """Change one cell's size while running (creates nothing until its first message)."""
        self.cells[handler].resize(cell, size)

    async def _store_dead_letters(self, letters: Sequence[DeadLetter]) -> int:
        return await self.adapter.dead_letter(self.app.name, letters)

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        if not self.app.handlers:
            log.warning("app %r declares no handlers: every message will be dead-lettered",
                        self.app.name)
        self.balancer.set_stats_provider(self.stats_snapshot)
        await self.balancer.start(self.member, self)
        self.started = True
        self._register_metrics()
        for hook in self.app.on_startup:
            self._hooks.append(asyncio.create_task(hook(self.client)))
        log.info("daemon %s started; owns queues %s", self.member.id, self.balancer.owned())

    async def stop(self) -> DrainReport:
        for task in self._hooks:
            task.cancel()
        for task in self._hooks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.started:
            await self.balancer.stop()
            self.started = False
        for agent in list(self.agents.values()):  # anything a balancer did not hand back
            await self._drain(agent)
        if self._lag_task is not None:
            self._lag_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._lag_task
        await self._pool_step.close()
        await self._cell_step.close()
        close_slots = getattr(self.slots, "close", None)
        if self._owns_slots and close_slots is not None:
            await close_slots()  # e.g. the resource-based supplier's sampling task
        if self._owns_adapter:
            await self.adapter.close()
        if self._owns_telemetry:
            self.telemetry.shutdown()
        return self.report()

    def stats_snapshot(self) -> dict[str, float]:
        """Flat stats published with the membership record; read by ``conveyor status``."""
        stats: dict[str, float] = {
            "slots.issued": self.slots.issued,
            "slots.in_use": self.slots.in_use,
            "handled": self.stats.handled,
            "dead_lettered": self.stats.dead_lettered,
            "skipped": self.stats.skipped,
            "dead_letters_evicted": self.stats.dead_letters_evicted,
            "dead_letters.waiting": self.dead_letters.waiting,
        }
        down_since = self.dead_letters.down_since
        if down_since is not None:  # published as an age: heartbeats cross machines
            stats["dead_letters.down_s"] = time.monotonic() - down_since
        if self.slots.available is not None:
            stats["slots.available"] = self.slots.available
        stats.update(self._resources.sample())
        for handler, pool in self.pools.items():
            stats[f"pool.{handler}.workers"] = pool.size
        for handler, router in self.cells.items():
            for cell, values in router.snapshot().items():
                stats[f"cell.{handler}/{cell}.workers"] = values["size"]
        for queue, agent in self.agents.items():
            stats[f"queue.{queue}.cache_fill"] = len(agent.cache)
            stats[f"queue.{queue}.acked"] = agent.acked
        stats["at"] = now = time.time()  # when the counts were taken: status rates use it
        acked = {queue: agent.acked for queue, agent in self.agents.items()}
        for queue, rate in self._ack_rates.sample(acked, now).items():
            stats[f"queue.{queue}.acks_per_s"] = rate
        return stats

    def report(self) -> DrainReport:
        agents = list(self.agents.values())
        return DrainReport(
            pulled=self._pulled_gone + sum(a.pulled for a in agents),
            acked=self._acked_gone + sum(a.acked for a in agents),
            handled=self.stats.handled,
            dead_lettered=self.stats.dead_lettered,
            abandoned=self._abandoned,
            skipped=self.stats.skipped,
        )

    # -- the balancer's listener -------------------------------------------------------
    async def queue_acquired(self, queue: int, lease: Lease | None) -> None:
        receiver = self.adapter.create_receiver(queue, self.app.name)
        receiver.set_lease(lease)
        await receiver.initialize()
        balancer = self.balancer
        agent = PullingAgent(
            queue,
            receiver,
            self._subs,
            self.orphans,
            self.slots,
            self.settings,
            may_act=lambda: balancer.lease_valid(queue),
        )
        self.agents[queue] = agent
        agent.start()

    async def queue_released(self, queue: int) -> None:
        agent = self.agents.get(queue)
        if agent is not None:
            await self._drain(agent)

    async def queue_lost(self, queue: int) -> None:
        agent = self.agents.pop(queue, None)
        if agent is not None:
            self._abandoned += agent.in_flight
            await agent.abort()
            self._forget(agent)
        elif (leaving := self._leaving.get(queue)) is not None:
            self._abandoned += leaving.in_flight
            await leaving.abort()  # its _drain() finishes and accounts for it

    def balancer_failed(self, error: BaseException) -> None:
        """Recorded for whoever runs the daemon (the CLI stops it and exits non-zero)."""
        self.failure = error
        self.failed.set()

    async def _drain(self, agent: PullingAgent) -> None:
        self.agents.pop(agent.queue, None)
        self._leaving[agent.queue] = agent
        try:
            in_flight_before = agent.in_flight
            if not await agent.drain(self.config.worker.drain_timeout_s):
                self._abandoned += agent.in_flight
            log.debug("queue %d drained (%d in flight at start)", agent.queue, in_flight_before)
        finally:
            self._leaving.pop(agent.queue, None)
            self._forget(agent)

    def _forget(self, agent: PullingAgent) -> None:
        self._pulled_gone += agent.pulled
        self._acked_gone += agent.acked
        self._max_cache_fill_gone = max(self._max_cache_fill_gone, agent.max_cache_fill)

    def slot_metrics(self) -> dict[str, dict[str, int]]:
        """Gauges for exporters: slots in use and available, per handler and in total.

        ``"*"`` is the daemon's supplier: ``in_use`` slots carrying a message,
        ``issued`` slots handed out (pulled or about to pull), ``available`` what it
        could issue now (-1 when the supplier cannot tell). Per handler, ``in_use`` is
        the messages still waiting for or running in that handler, each holding a slot;
        ``available`` is the shared supplier's. Computed on demand, off the hot path.
        """
        available = self.slots.available
        free = -1 if available is None else available
        per_handler = {spec.name: 0 for spec in self.app.handlers}
        # Exporters call this from their own thread while the loop adds and drops lanes:
        # copy each dict in one step (atomic under the GIL) before walking it.
        for agent in [*self.agents.values(), *self._leaving.values()]:
            for lane in list(agent.cache.lanes.values()):
                name = lane.route.handler.name
                per_handler[name] = per_handler.get(name, 0) + len(lane.entries)
        metrics = {name: {"in_use": n, "available": free} for name, n in per_handler.items()}
        metrics["*"] = {"in_use": self.slots.in_use, "issued": self.slots.issued,
                        "available": free}
        return metrics

    @property
    def max_cache_fill(self) -> int:
        """The most messages any of this daemon's agents held at once, ever."""
        live = [a.max_cache_fill for a in self.agents.values()]
        return max([self._max_cache_fill_gone, *live])


def freeze_startup_heap() -> None:
    """Exempt what a worker process built at startup from later full GC passes.

    For processes that exist to run one daemon (``conveyor worker`` and its supervised
    children), called once the daemon has started: modules, the app, config and
    connections live as long as the process, yet every full collection re-scanned them
    (~10 ms per pass for a ~25k-object heap on a 2-core VM, a pass every ~20k messages
    under load). ``gc.collect()`` first, so nothing already garbage is kept.
    """
    gc.collect()
    gc.freeze()
