"""The queues a daemon owns: one pulling agent each, started, drained or aborted as its
balancer says.

The daemon is the balancer's :class:`~conveyor.platform.balancing.balancer.BalanceListener` and
hands each call to :class:`QueueOwner`. A released queue is drained (pulling stops,
in-flight messages finish within ``[worker] drain_timeout_s`` and are acknowledged); a
lost one is aborted at once (its lease is gone: nothing more is started or acknowledged,
what it held counts as lost). What gone agents pulled and acknowledged is kept for
the :class:`DrainReport`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from conveyor.platform.adapter import QueueAdapter
from conveyor.platform.agent import AgentSettings, PullingAgent, Subscriptions
from conveyor.platform.balancing.balancer import QueueBalancer
from conveyor.platform.balancing.leases import Lease
from conveyor.platform.config import WorkerConfig
from conveyor.platform.delivery.orphans import Orphans
from conveyor.platform.slots import SlotSupplier
from conveyor.platform.watchdog import LoopWatchdog

log = logging.getLogger("conveyor.daemon")


@dataclass(frozen=True, slots=True)
class DrainReport:
    """What a daemon's stop did; printed by ``conveyor worker`` as its last line."""

    pulled: int
    acked: int
    handled: int
    dead_lettered: int
    abandoned: int
    skipped: int = 0
    released: int = 0
    """Pulled, never started, handed back unacknowledged (the next owner runs them)."""
    moved: int = 0
    """Held unacknowledged when their queue moved to another owner (this daemon's lease,
    or its Kafka group session, lapsed), or acknowledged after it moved and refused by
    the fence: the next owner gets them again, so none is lost; those a handler had
    started may run twice."""

    @property
    def lost(self) -> int:
        """:attr:`moved`'s former name: it counted no lost message."""
        return self.moved

    def __str__(self) -> str:
        return (
            f"pulled={self.pulled} acked={self.acked} handled={self.handled} "
            f"dead_lettered={self.dead_lettered} abandoned={self.abandoned} "
            f"skipped={self.skipped} released={self.released} moved={self.moved}"
        )


class QueueOwner:
    """A pulling agent per owned queue, and the counts of the agents that are gone.

    ``balancer`` says until when each queue is this daemon's (agents check it before
    every handler start, pull and acknowledgement); ``worker`` is read when a drain starts
    (``drain_timeout_s``).
    """

    def __init__(
        self,
        adapter: QueueAdapter,
        group: str,
        subscriptions: Subscriptions,
        orphans: Orphans,
        slots: SlotSupplier,
        settings: AgentSettings,
        balancer: QueueBalancer,
        worker: WorkerConfig,
        watchdog: LoopWatchdog | None = None,
        crashed: Callable[[int, BaseException], None] | None = None,
    ) -> None:
        self._watchdog = watchdog
        self._crashed = crashed
        """Told of an error that ended an agent's task (:meth:`PullingAgent._task_done`)."""
        self._redelivery = asyncio.Lock()  # one redelivered message at a time (agent.py)
        self._adapter = adapter
        self._group = group
        self._subscriptions = subscriptions
        self._orphans = orphans
        self._slots = slots
        self._settings = settings
        self._balancer = balancer
        self._worker = worker
        self.agents: dict[int, PullingAgent] = {}
        self._leaving: dict[int, PullingAgent] = {}
        self._pulled_gone = 0
        self._acked_gone = 0
        self._max_cache_fill_gone = 0
        self.abandoned = 0
        """Messages started and left unacknowledged by a drain that timed out or a second
        stop signal."""
        self.released = 0
        """Messages pulled but never started, handed back unacknowledged by a drain (or a
        second stop signal)."""
        self.moved = 0
        """Messages held unacknowledged when their queue's lease was lost, or whose
        acknowledgement the fence refused."""
        self._deadline: float | None = None

    # -- what the balancer says ----------------------------------------------------------
    async def queue_acquired(self, queue: int, lease: Lease | None) -> None:
        receiver = self._adapter.create_receiver(queue, self._group)
        receiver.set_lease(lease)
        await receiver.initialize()
        balancer = self._balancer
        agent = PullingAgent(
            queue,
            receiver,
            self._subscriptions,
            self._orphans,
            self._slots,
            self._settings,
            owned_until=lambda: balancer.owned_until(queue),
            watchdog=self._watchdog,
            redelivery=self._redelivery,
            crashed=None if self._crashed is None else partial(self._crashed, queue),
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
            self._count_lost(agent)
            self._leaving[queue] = agent  # still counted while it stops
            try:
                await agent.abort()
            finally:
                self._leaving.pop(queue, None)
                self._forget(agent)
        elif (leaving := self._leaving.get(queue)) is not None:
            self._count_lost(leaving)
            await leaving.abort()  # its _drain() finishes and accounts for it

    def stop_by(self, deadline: float) -> None:
        """Every drain from now on ends by ``deadline`` (event-loop time): a stopping
        daemon's ``drain_timeout_s`` counts from the signal, not from each queue's turn."""
        self._deadline = deadline

    async def drain_all(self) -> None:
        """Drain every queue still owned (anything a stopped balancer did not hand back),
        all at once."""
        await asyncio.gather(*(self._drain(agent) for agent in list(self.agents.values())))

    async def abort_all(self) -> None:
        """Stop every queue now, acknowledging nothing more (a second stop signal): what
        each agent held is counted in :attr:`abandoned` and goes to the next owner."""
        for agent in self.holding():
            self._count_aborted(agent)
        await asyncio.gather(*(agent.abort() for agent in self.holding()))

    def _count_aborted(self, agent: PullingAgent) -> None:
        """What an agent stopped at once leaves: started messages (finished or not, none
        acknowledged any more — those whose acknowledgement was waiting or under way
        too) are abandoned, the others released."""
        if not agent.aborted:
            released = agent.released
            self.released += released
            self.abandoned += agent.unacknowledged - released

    def _count_lost(self, agent: PullingAgent) -> None:
        """Everything an agent whose lease is gone holds goes back unacknowledged."""
        if not agent.aborted:
            self.moved += agent.unacknowledged

    def _drain_timeout_s(self) -> float:
        timeout = self._worker.drain_timeout_s
        if self._deadline is not None:
            timeout = min(timeout, max(self._deadline - asyncio.get_running_loop().time(), 0.0))
        return timeout

    async def _drain(self, agent: PullingAgent) -> None:
        self.agents.pop(agent.queue, None)
        self._leaving[agent.queue] = agent
        try:
            in_flight_before = agent.in_flight
            await agent.drain(self._drain_timeout_s())
            if not agent.aborted:  # an abort counted what it left already
                self.released += agent.released
                self.abandoned += agent.unfinished
            log.debug("queue %d drained (%d in flight at start)", agent.queue, in_flight_before)
        finally:
            self._leaving.pop(agent.queue, None)
            self._forget(agent)

    def _forget(self, agent: PullingAgent) -> None:
        self._pulled_gone += agent.pulled
        self._acked_gone += agent.acked
        # Refused by the fence, so no longer held: counted nowhere else.
        self.moved += agent.refused
        self._max_cache_fill_gone = max(self._max_cache_fill_gone, agent.max_cache_fill)

    # -- counts ------------------------------------------------------------------------
    def holding(self) -> list[PullingAgent]:
        """Every agent that may still hold messages: those pulling and those draining."""
        return [*self.agents.values(), *self._leaving.values()]

    @property
    def pulled(self) -> int:
        """Every agent's, those pulling, stopping and gone (an agent is in exactly one)."""
        return self._pulled_gone + sum(a.pulled for a in self.holding())

    @property
    def acked(self) -> int:
        return self._acked_gone + sum(a.acked for a in self.holding())

    @property
    def max_cache_fill(self) -> int:
        """The most messages any agent held at once, ever."""
        live = [a.max_cache_fill for a in self.holding()]
        return max([self._max_cache_fill_gone, *live])
