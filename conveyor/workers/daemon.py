"""The worker daemon: one process's share of an app's queues, pulled and handled.

It joins the balancer, starts a :class:`PullingAgent` for every queue it is given,
drains the ones it gives back, aborts the ones whose lease is lost, and on
:meth:`stop` drains everything: stops pulling, lets in-flight messages finish within
``drain_timeout_s``, acknowledges them and releases its queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from conveyor.platform.adapter import QueueAdapter, create_adapter
from conveyor.platform.agent import AgentSettings, PullingAgent, Subscriptions
from conveyor.platform.app import App
from conveyor.platform.balancer import DynamicBalancer, QueueBalancer, StaticBalancer
from conveyor.platform.client import Client
from conveyor.platform.config import Config
from conveyor.platform.coordination import coordination_from_config
from conveyor.platform.leases import Lease
from conveyor.platform.mapper import HashRingQueueMapper
from conveyor.platform.membership import MemberInfo
from conveyor.platform.message import DeadLetter
from conveyor.platform.runtime import DeliveryStats, HandlerRuntime
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
        module_name, _, attr = target.partition(":")
        factory = getattr(importlib.import_module(module_name), attr)
        balancer: QueueBalancer = factory(config, app_name, adapter)
        return balancer
    if config.balancer.kind == "static":
        return StaticBalancer(config.balancer.queues or range(config.queues.total))
    membership, leases = coordination_from_config(config, app_name)
    return DynamicBalancer(
        membership,
        leases,
        config.queues.total,
        lease_ttl_s=config.balancer.lease_ttl_s,
        rebalance_interval_s=config.balancer.rebalance_interval_s,
    )


@dataclass(frozen=True, slots=True)
class DrainReport:
    """What a daemon's stop did; printed by ``conveyor worker`` as its last line."""

    pulled: int
    acked: int
    handled: int
    dead_lettered: int
    abandoned: int

    def __str__(self) -> str:
        return (
            f"pulled={self.pulled} acked={self.acked} handled={self.handled} "
            f"dead_lettered={self.dead_lettered} abandoned={self.abandoned}"
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
    ) -> None:
        self.app = app
        self.config = config = config or Config()
        self._owns_adapter = adapter is None
        self.adapter = adapter or create_adapter(config.queues.adapter, config)
        self.mapper = HashRingQueueMapper(config.queues.total)
        self.slots = slots or supplier_from_config(config.slots)
        self.balancer = balancer or build_balancer(config, app.name, self.adapter)
        self.member = member or MemberInfo.for_this_process(f"{app.name}-")
        self.stats = DeliveryStats()
        self.runtime = HandlerRuntime(self._store_dead_letters, self.stats)
        self.client = Client(self.adapter, self.mapper)
        self.settings = AgentSettings(
            cache_capacity=config.worker.cache_capacity,
            max_batch=config.worker.max_batch,
            poll_timeout_s=config.worker.poll_timeout_ms / 1000,
        )
        self.agents: dict[int, PullingAgent] = {}
        self._leaving: dict[int, PullingAgent] = {}
        self._subs = self._index_subscriptions(app)
        self._hooks: list[asyncio.Task[None]] = []
        self._pulled_gone = 0
        self._acked_gone = 0
        self._abandoned = 0
        self.started = False

    @staticmethod
    def _index_subscriptions(app: App) -> Subscriptions:
        index = {spec.name: i for i, spec in enumerate(app.handlers)}
        return {
            ns: tuple((index[s.name], s) for s in specs)
            for ns, specs in app.subscriptions().items()
        }

    async def _store_dead_letters(self, letters: Sequence[DeadLetter]) -> None:
        await self.adapter.dead_letter(self.app.name, letters)

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        if not self.app.handlers:
            log.warning("app %r declares no handlers: every message will be dead-lettered",
                        self.app.name)
        await self.balancer.start(self.member, self)
        self.started = True
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
        if self._owns_adapter:
            await self.adapter.close()
        return self.report()

    def report(self) -> DrainReport:
        agents = list(self.agents.values())
        return DrainReport(
            pulled=self._pulled_gone + sum(a.pulled for a in agents),
            acked=self._acked_gone + sum(a.acked for a in agents),
            handled=self.stats.handled,
            dead_lettered=self.stats.dead_lettered,
            abandoned=self._abandoned,
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
            self.runtime,
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
