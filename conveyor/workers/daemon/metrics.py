"""What a daemon exports: metric instruments, lag samples, slot gauges and the stats
snapshot its balancer publishes with its membership record.

Instruments read their values when metrics are collected, off the hot path; queue lag
needs broker calls, which those callbacks cannot make, so a task samples it every
``[telemetry] metrics_interval_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence

from conveyor.platform.delivery import DeadLetterStore, DeliveryStats
from conveyor.platform.delivery.metrics import duration_histogram
from conveyor.platform.handlers import HandlerSpec
from conveyor.platform.histograms import FOLD_EVERY_S, LocalMetrics, RecentPercentiles
from conveyor.platform.operations.status import AckRates
from conveyor.platform.slots import SlotSupplier
from conveyor.platform.tasks import cancel_and_wait
from conveyor.platform.telemetry import Telemetry, stats_observations
from conveyor.platform.watchdog import LoopWatchdog
from conveyor.workers.cells.cells import CellRouter
from conveyor.workers.daemon.queues import QueueOwner
from conveyor.workers.pools.pool import StatelessWorkerPool
from conveyor.workers.resources import PlacementResources
from conveyor.workers.slots.rate import RateLimitedSlotSupplier
from conveyor.workers.slots.wrappers import DelegatingSlotSupplier

LATENCY_QUANTILES = {0.5: "latency.p50_s", 0.95: "latency.p95_s", 0.99: "latency.p99_s"}
"""Handler latency published with each heartbeat: quantile -> stats key (seconds)."""


class DaemonMetrics:
    """Reads a daemon's parts for exporters, ``conveyor status`` and placement."""

    def __init__(
        self,
        telemetry: Telemetry,
        stats: DeliveryStats,
        slots: SlotSupplier,
        queues: QueueOwner,
        handlers: Sequence[HandlerSpec],
        pools: Mapping[str, StatelessWorkerPool],
        cells: Mapping[str, CellRouter],
        dead_letters: DeadLetterStore,
        resources: PlacementResources,
        *,
        lag_interval_s: float,
        watchdog: LoopWatchdog | None = None,
    ) -> None:
        self._watchdog = watchdog
        self._telemetry = telemetry
        self._stats = stats
        self._slots = slots
        self._queues = queues
        self._handlers = handlers
        self._pools = pools
        self._cells = cells
        self._dead_letters = dead_letters
        self._resources = resources
        self._lag_interval_s = lag_interval_s
        self._ack_rates = AckRates()
        # Handler latency between heartbeats, from the histogram the delivery chain
        # counts anyway; a daemon without a meter counts none and publishes none.
        self._latency = (None if telemetry.local is None else
                         RecentPercentiles(duration_histogram(telemetry.local),
                                           tuple(LATENCY_QUANTILES)))
        self._rate = _rate_limiter(slots)
        self.lag: dict[int, int] = {}
        """Messages not yet finished, per owned queue, as last sampled."""
        self._lag_task: asyncio.Task[None] | None = None
        self._fold_task: asyncio.Task[None] | None = None

    def register(self) -> None:
        """Register the instruments and start sampling lag (nothing without a meter)."""
        t, slots, agents = self._telemetry, self._slots, self._queues.agents
        if t.meter is None:
            return
        for name, read in stats_observations(self._stats).items():
            t.observe(f"conveyor.messages.{name}", "{message}", f"Messages {name}", read,
                      counter=True)
        t.observe("conveyor.slots.in_use", "{slot}",
                  'Slots carrying a message: handler="*" is the daemon\'s total',
                  lambda: [(m["in_use"], {"handler": h}) for h, m in self.slot_metrics().items()])
        t.observe("conveyor.slots.available", "{slot}", "Slots that could be issued now",
                  lambda: [(slots.available, {})] if slots.available is not None else [])
        t.observe("conveyor.queues.owned", "{queue}", "Queues this daemon pulls",
                  lambda: [(len(agents), {})])
        t.observe("conveyor.cache.fill", "{message}", "Messages held by a pulling agent",
                  lambda: [(len(a.cache), {"queue": str(q)}) for q, a in agents.items()])
        t.observe("conveyor.queue.lag", "{message}", "Messages not yet finished, per queue",
                  lambda: [(lag, {"queue": str(q)}) for q, lag in self.lag.items()])
        t.observe("conveyor.pool.workers", "{worker}", "Workers of a stateless-worker pool",
                  lambda: [(p.size, {"handler": h}) for h, p in self._pools.items()])
        t.observe("conveyor.pool.waiting", "{message}", "Calls assigned to a pool, unfinished",
                  lambda: [(p.waiting, {"handler": h}) for h, p in self._pools.items()])
        t.observe("conveyor.cell.workers", "{worker}", "Workers of a cell",
                  lambda: self._cell_observations("size"))
        t.observe("conveyor.cell.queue_length", "{message}", "Jobs waiting in a cell",
                  lambda: self._cell_observations("queue_length"))
        if self._watchdog is not None:
            watchdog = self._watchdog
            t.observe("conveyor.loop.stalls", "{stall}",
                      "Times the event loop was blocked past [worker] stall_warn_ms",
                      lambda: [(watchdog.stalls, {})], counter=True)
        self._lag_task = asyncio.create_task(self._sample_lag())
        if t.local is not None:
            self._fold_task = asyncio.create_task(self._fold(t.local))

    @staticmethod
    async def _fold(local: LocalMetrics) -> None:
        """Count what the histograms recorded, every ``FOLD_EVERY_S``: bounds the values
        they hold (readers fold too, so what they report is never behind)."""
        while True:
            await asyncio.sleep(FOLD_EVERY_S)
            local.fold()

    def _cell_observations(self, field: str) -> list[tuple[float, dict[str, str]]]:
        return [
            (values[field], {"handler": h, "cell": cell})
            for h, router in self._cells.items()
            for cell, values in router.snapshot().items()
        ]

    async def _sample_lag(self) -> None:
        """Lag needs broker calls, which metric callbacks cannot make: sample it here."""
        agents = self._queues.agents
        while True:
            for queue, agent in list(agents.items()):
                with contextlib.suppress(Exception):
                    self.lag[queue] = await agent.receiver.lag()
            for queue in set(self.lag) - set(agents):
                del self.lag[queue]
            await asyncio.sleep(self._lag_interval_s)

    async def close(self) -> None:
        """Stop sampling lag and folding."""
        tasks = [t for t in (self._lag_task, self._fold_task) if t is not None]
        if tasks:
            await cancel_and_wait(*tasks)
        if self._telemetry.local is not None:
            self._telemetry.local.fold()

    def stats_snapshot(self) -> dict[str, float]:
        """Flat stats published with the membership record; read by ``conveyor status``
        and by resource placement (the ``cpu_percent`` and ``memory_*`` keys)."""
        slots, stats, agents = self._slots, self._stats, self._queues.agents
        snapshot: dict[str, float] = {
            "slots.issued": slots.issued,
            "slots.in_use": slots.in_use,
            "handled": stats.handled,
            "dead_lettered": stats.dead_lettered,
            "skipped": stats.skipped,
            "dead_letters_evicted": stats.dead_letters_evicted,
            "dead_letters.waiting": self._dead_letters.waiting,
        }
        down_since = self._dead_letters.down_since
        if down_since is not None:  # published as an age: heartbeats cross machines
            snapshot["dead_letters.down_s"] = time.monotonic() - down_since
        if slots.available is not None:
            snapshot["slots.available"] = slots.available
        snapshot.update(self._resources.sample())
        for handler, pool in self._pools.items():
            snapshot[f"pool.{handler}.workers"] = pool.size
        for handler, router in self._cells.items():
            for cell, values in router.snapshot().items():
                snapshot[f"cell.{handler}/{cell}.workers"] = values["size"]
        for queue, agent in agents.items():
            snapshot[f"queue.{queue}.cache_fill"] = len(agent.cache)
            snapshot[f"queue.{queue}.acked"] = agent.acked
            if lost := agent.receiver.records_lost:  # deleted by the broker unhandled
                snapshot[f"queue.{queue}.lost"] = lost
        snapshot["at"] = now = time.time()  # when the counts were taken: status rates use it
        acked = {queue: agent.acked for queue, agent in agents.items()}
        for queue, rate in self._ack_rates.sample(acked, now).items():
            snapshot[f"queue.{queue}.acks_per_s"] = rate
        self._add_health(snapshot, now)
        return snapshot

    def _add_health(self, snapshot: dict[str, float], now: float) -> None:
        """What the console's daemons page shows beside the counts: loop stalls, the
        handler latency since the last heartbeat (absent without a meter or without a
        call), the rate limit in force and the calls waiting for it. A few keys: the
        record is rewritten every heartbeat."""
        if self._watchdog is not None:
            snapshot["loop.stalls"] = self._watchdog.stalls
        if self._latency is not None:
            for quantile, value in self._latency.sample(now).items():
                snapshot[LATENCY_QUANTILES[quantile]] = round(value, 5)  # 10 µs: bytes
        if self._rate is not None:
            snapshot["rate.limit_per_s"] = self._rate.per_second
            snapshot["rate.waiting"] = self._rate.waiting

    def slot_metrics(self) -> dict[str, dict[str, int]]:
        """Gauges for exporters: slots in use and available, per handler and in total.

        ``"*"`` is the daemon's supplier: ``in_use`` slots carrying a handler call,
        ``issued`` slots handed out (in use, or reserved by a runner about to start one),
        ``available`` what it could issue now (-1 when the supplier cannot tell). Per
        handler, ``in_use`` is that handler's calls running now, one slot each;
        ``available`` is the shared supplier's. Computed on demand, off the hot path.
        """
        slots = self._slots
        available = slots.available
        free = -1 if available is None else available
        per_handler = {spec.name: 0 for spec in self._handlers}
        # Exporters call this from their own thread while the loop adds and drops lanes:
        # copy each dict in one step (atomic under the GIL) before walking it.
        for agent in self._queues.holding():
            for by_key in list(agent.cache.lanes.values()):
                for lane in list(by_key.values()):
                    if lane.running:
                        name = lane.route.handler.name
                        per_handler[name] = per_handler.get(name, 0) + 1
            for batcher in agent.batchers:  # a running batch holds one slot
                if batcher.running:
                    name = batcher.handler
                    per_handler[name] = per_handler.get(name, 0) + 1
        metrics = {name: {"in_use": n, "available": free} for name, n in per_handler.items()}
        metrics["*"] = {"in_use": slots.in_use, "issued": slots.issued, "available": free}
        return metrics


def _rate_limiter(slots: SlotSupplier) -> RateLimitedSlotSupplier | None:
    """The rate limit among ``slots`` and the suppliers it wraps, if any."""
    supplier: SlotSupplier | None = slots
    while supplier is not None:
        if isinstance(supplier, RateLimitedSlotSupplier):
            return supplier
        supplier = supplier.inner if isinstance(supplier, DelegatingSlotSupplier) else None
    return None
