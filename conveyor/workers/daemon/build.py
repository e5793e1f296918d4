"""Building a worker daemon from config: adapter, slots, balancer, telemetry and chains.

:func:`build_parts` makes what a :class:`~conveyor.workers.daemon.WorkerDaemon` runs
with, in one place. A part handed to it is used as given and left open by
:meth:`DaemonParts.close`; a part it built is closed there. What comes from a broker
(the adapter, leases, a broker's own balancer, the idempotency store, the shared rate
bucket) comes from the config's :class:`~conveyor.platform.backend.Backend`
(``conveyor.backends.for_config``, or one handed in).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from opentelemetry.trace import Tracer

from conveyor.backends import for_config
from conveyor.client import Client, coalesce_linger_for
from conveyor.platform.adapter import DeadLetters, QueueAdapter
from conveyor.platform.agent import AgentSettings, Subscriptions
from conveyor.platform.app import App
from conveyor.platform.backend import Backend
from conveyor.platform.balancing.balancer import (
    BestFitPlacement,
    DynamicBalancer,
    Placement,
    QueueBalancer,
    ResourcePlacement,
    StaticBalancer,
)
from conveyor.platform.balancing.leases import MemoryLeaseStore
from conveyor.platform.balancing.membership import MemberInfo
from conveyor.platform.balancing.placement import PlacementWeights
from conveyor.platform.config import Config
from conveyor.platform.delivery import (
    DeadLetterStore,
    DeliveryStats,
    Interceptor,
    InThread,
    PutLetter,
    build_chain,
    chain_interceptors,
)
from conveyor.platform.delivery.batch import batch_step
from conveyor.platform.delivery.dead_letter import direct_call
from conveyor.platform.delivery.idempotency import (
    IdempotencyInterceptor,
)
from conveyor.platform.delivery.orphans import Orphans
from conveyor.platform.errors import ConfigError, ConveyorError
from conveyor.platform.handlers import HandlerSpec
from conveyor.platform.mapper import HashRingQueueMapper
from conveyor.platform.message import DeadLetter
from conveyor.platform.options import IdempotencyOptions
from conveyor.platform.queue_cache import PrefetchBudget, Route
from conveyor.platform.slots import SlotSupplier
from conveyor.platform.telemetry import Telemetry
from conveyor.platform.watchdog import LoopWatchdog
from conveyor.workers.cells.interceptor import CellInterceptor
from conveyor.workers.pools.interceptor import PoolInterceptor
from conveyor.workers.resources import PlacementResources, ResourceSampler
from conveyor.workers.slots.build import SharedBucket, supplier_from_config
from conveyor.workers.threads import HandlerThreads

_LetterStore = Callable[[Sequence[DeadLetter]], Awaitable[int]]

log = logging.getLogger("conveyor.daemon")


def build_balancer(
    config: Config, app_name: str, adapter: QueueAdapter,
    watchdog: LoopWatchdog | None = None, backend: Backend | None = None,
) -> QueueBalancer:
    """The balancer ``[balancer] kind`` names: one the backend brings (``kafka-group``),
    or the platform's ``static`` or ``dynamic`` with the backend's leases."""
    backend = backend or for_config(config)
    kind = backend.balancer(config.balancer.kind)
    if kind is not None:
        return kind.build(config, app_name, adapter)
    if config.balancer.kind == "static":
        return StaticBalancer(config.balancer.queues or range(config.queues.total))
    coordination = backend.coordination
    if coordination is None:
        raise ConfigError(f"$.balancer.membership: the {backend.name!r} backend keeps no "
                          "leases")
    membership, leases = coordination(config, app_name)
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
        # Renewals and heartbeats on a thread of their own, with stores of their own, so
        # a handler blocking the loop does not cost the leases (an in-process store lives
        # in this process's loop: nothing to gain there).
        keeper_stores=None if isinstance(leases, MemoryLeaseStore)
        else lambda: coordination(config, app_name),
        watchdog=watchdog,
    )


@dataclass(eq=False, slots=True)
class DaemonParts:
    """What one daemon runs with; ``owns_*`` say which parts :meth:`close` closes."""

    app: App
    config: Config
    adapter: QueueAdapter
    mapper: HashRingQueueMapper
    slots: SlotSupplier
    balancer: QueueBalancer
    member: MemberInfo
    telemetry: Telemetry
    client: Client
    stats: DeliveryStats
    dead_letters: DeadLetterStore
    orphans: Orphans
    pool_step: PoolInterceptor
    cell_step: CellInterceptor
    threads: HandlerThreads
    """Where plain ``def`` handlers run, bounded by the slots out (conveyor.workers.threads)."""
    interceptors: list[Interceptor]
    """Every chain's interceptors, outermost first (see conveyor.platform.delivery)."""
    subscriptions: Subscriptions
    settings: AgentSettings
    resources: PlacementResources
    owns_adapter: bool
    owns_slots: bool
    owns_telemetry: bool
    watchdog: LoopWatchdog
    """Notices handlers that block the event loop (started and stopped by the daemon)."""
    once_step: IdempotencyInterceptor | None = None
    """Present when a handler is ``idempotent=True``."""

    async def close(self) -> None:
        """Close the pools and cells, and the parts built here (not those handed in)."""
        await self.pool_step.close()
        await self.cell_step.close()
        self.threads.close()  # after the drain; waits for no abandoned call
        if self.once_step is not None:
            await self.once_step.close()
        await self.client.close()  # sends what publish calls left waiting; owns nothing
        close_slots = getattr(self.slots, "close", None)
        if self.owns_slots and close_slots is not None:
            await close_slots()  # e.g. the resource-based supplier's sampling task
        if self.owns_adapter:
            await self.adapter.close()
        if self.owns_telemetry:
            await shutdown_telemetry(self.telemetry)


TELEMETRY_STOP_S = 2.0
"""How long a stopping daemon waits for its exporters' last flush."""


async def shutdown_telemetry(telemetry: Telemetry, timeout_s: float = TELEMETRY_STOP_S) -> None:
    """Flush and stop the exporters, waiting at most ``timeout_s``.

    The SDK's shutdown blocks its caller for up to 30 s while an OTLP exporter retries
    an unreachable collector: run on the event loop, it kept a stopped worker alive that
    long (past any drain deadline). It runs in a daemon thread instead, which the
    process does not wait for at exit; what it had not sent by then is dropped.
    """
    done = threading.Event()

    def run() -> None:
        try:
            telemetry.shutdown()
        finally:
            done.set()

    threading.Thread(target=run, name="telemetry-shutdown", daemon=True).start()
    if not await asyncio.to_thread(done.wait, timeout_s):
        log.warning("telemetry exporters still flushing after %.0fs (collector "
                    "unreachable?); leaving without them", timeout_s)


def build_parts(
    app: App,
    config: Config | None = None,
    *,
    adapter: QueueAdapter | None = None,
    balancer: QueueBalancer | None = None,
    slots: SlotSupplier | None = None,
    member: MemberInfo | None = None,
    telemetry: Telemetry | None = None,
    resource_sampler: ResourceSampler | None = None,
    backend: Backend | None = None,
) -> DaemonParts:
    """A daemon's parts from ``config``; any part given is used instead of building it.
    ``backend`` is what the broker's parts are built from (default: the config's)."""
    config = config or Config()
    backend = backend or for_config(config)
    owns_adapter, owns_slots, owns_telemetry = adapter is None, slots is None, telemetry is None
    adapter = adapter or backend.adapter(config)
    mapper = HashRingQueueMapper(config.queues.total)
    slots = slots or supplier_from_config(config.slots,
                                          shared_bucket=_shared_bucket(config, app, backend))
    watchdog = LoopWatchdog(config.worker.stall_warn_ms / 1000,
                            config.worker.stall_log_interval_s)
    balancer = balancer or build_balancer(config, app.name, adapter, watchdog, backend)
    member = member or MemberInfo.for_this_process(f"{app.name}-")
    stats = DeliveryStats()
    telemetry = telemetry or Telemetry.from_config(
        config.telemetry, member.id, prometheus=config.http.port is not None
    )
    dead_letters = DeadLetterStore(_store_in(adapter.dead_letters, app.name), stats)
    pool_step = PoolInterceptor()
    once_step = _idempotency(app, config, stats, backend)
    cell_step = CellInterceptor(config.cells.sizes, config.cells.default_size)
    # Plain-def calls on threads are bounded by the slots out now (each call holds one);
    # at least 1, so a chain called without a slot (a test harness) cannot wait forever.
    issued = slots
    threads = HandlerThreads(lambda: max(1, issued.issued))
    put_letter = _put_letter(dead_letters, telemetry)
    interceptors = chain_interceptors(
        put_letter,
        stats,
        tracer=telemetry.tracer,
        recorder=telemetry.recorder,
        metrics=telemetry.local,
        system=adapter.name,
        group=app.name,
        app=app.interceptors,
        hosting=(pool_step, cell_step),
        idempotency=once_step,
    )
    subscriptions = subscribe(app, interceptors, batch_steps=BatchSteps(
        put_letter, stats, telemetry.tracer, adapter.name, threads.run), in_thread=threads.run)
    cell_step.check_sizes(config.slots.count if owns_slots and config.slots.kind == "fixed"
                          else None)  # a supplier handed in: its bound is not known here
    return DaemonParts(
        app=app, config=config, adapter=adapter, mapper=mapper, slots=slots,
        balancer=balancer, member=member, telemetry=telemetry,
        client=Client(adapter, mapper, telemetry=telemetry,
                      coalesce_linger_s=coalesce_linger_for(config.publish, adapter),
                      max_body_bytes=config.queues.max_body_bytes),
        stats=stats, dead_letters=dead_letters,
        orphans=Orphans(put_letter, stats, app.name, config.dead_letters.unroutable),
        pool_step=pool_step, cell_step=cell_step, threads=threads, interceptors=interceptors,
        subscriptions=subscriptions,
        settings=AgentSettings(
            cache_capacity=config.worker.cache_capacity,
            max_batch=_pull_size(app, config),
            poll_timeout_s=config.worker.poll_timeout_ms / 1000,
            prefetch=PrefetchBudget(config.worker.prefetch_bytes),
        ),
        resources=PlacementResources(member.id, resource_sampler),
        owns_adapter=owns_adapter, owns_slots=owns_slots, owns_telemetry=owns_telemetry,
        watchdog=watchdog, once_step=once_step,
    )


def _pull_size(app: App, config: Config) -> int:
    """``[worker] max_batch``, raised to the largest ``batch_size`` of the app's batch
    handlers (within ``cache_capacity``): a batch of N is then one pull, not N / max_batch
    round trips in a row (conveyor.platform.batcher)."""
    sizes = [h.batch.size for h in app.handlers if h.batch is not None]
    largest = min(max(sizes, default=0), config.worker.cache_capacity)
    return max(config.worker.max_batch, largest)


def _idempotency(app: App, config: Config, stats: DeliveryStats,
                 backend: Backend) -> IdempotencyInterceptor | None:
    """The idempotency step, with the backend's store, if any handler is
    ``idempotent=True`` (the config's backend keeps the keys in-process on the embedded
    adapter, shared by the daemons of one broker, else in Redis: on Kafka too)."""
    if not any(h.option(IdempotencyOptions) is not None for h in app.handlers):
        return None
    if backend.idempotency_store is None:
        raise ConfigError(f"idempotent handlers: the {backend.name!r} backend keeps no "
                          "idempotency keys")
    return IdempotencyInterceptor(backend.idempotency_store(config, app.name), stats)


def _shared_bucket(config: Config, app: App, backend: Backend) -> SharedBucket | None:
    """``[slots.rate]``'s bucket shared by the app's daemons, from the backend."""
    bucket = backend.rate_bucket
    if bucket is None:
        return None
    return lambda per_second, burst: bucket(config, app.name, per_second, burst)


@dataclass(frozen=True, slots=True)
class BatchSteps:
    """What the batch steps of ``batch_size=N`` handlers are built from."""

    put_letter: PutLetter
    stats: DeliveryStats
    tracer: Tracer | None
    system: str
    in_thread: InThread | None = None


def subscribe(app: App, interceptors: Sequence[Interceptor],
              batch_steps: BatchSteps | None = None,
              in_thread: InThread | None = None) -> Subscriptions:
    """Every handler's delivery chain, composed once (see conveyor.platform.delivery);
    a batch handler's route runs its batches through a batch step instead (see
    conveyor.platform.delivery.batch: the app's interceptors wrap each batch call).
    Plain ``def`` handlers are called through ``in_thread``."""
    index = {spec.name: i for i, spec in enumerate(app.handlers)}

    def route(spec: HandlerSpec) -> Route:
        if spec.batch is None:
            chain = build_chain(spec, interceptors, in_thread)
            return Route(index[spec.name], spec, chain, direct=direct_call(chain))
        if batch_steps is None:
            raise ConveyorError(f"handler {spec.name!r} is a batch handler: subscribe() "
                                "needs batch_steps")
        step = batch_step(spec, batch_steps.put_letter, batch_steps.stats,
                          tracer=batch_steps.tracer, system=batch_steps.system,
                          group=app.name, in_thread=batch_steps.in_thread,
                          interceptors=app.interceptors)
        # The agent hands batch routes' messages to a batcher, never to the chain; as a
        # chain the step still runs one message (a batch of one), should anyone call it.
        return Route(index[spec.name], spec, lambda d: step([d.message]), step)

    return {ns: tuple(route(s) for s in specs) for ns, specs in app.subscriptions().items()}


def _store_in(dead_letters: DeadLetters, group: str) -> _LetterStore:
    async def store(letters: Sequence[DeadLetter]) -> int:
        return await dead_letters.put(group, letters)

    return store


def _put_letter(dead_letters: DeadLetterStore, telemetry: Telemetry) -> PutLetter:
    """How dead letters are stored: through the store, in a span when tracing."""
    tracer = telemetry.tracer
    if tracer is None:
        return dead_letters.put
    from conveyor.platform.delivery.tracing import traced_dead_letters

    return traced_dead_letters(dead_letters.put, tracer)
