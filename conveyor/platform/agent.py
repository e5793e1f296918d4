"""The pulling agent: one per owned queue.

Loop, top to bottom:

1. wait until the cache has room (back-pressure: a full cache stops pulling);
2. reserve slots — one blocking, then as many more as the supplier grants at once, up
   to the room and ``max_batch``; an agent never asks for more messages than it holds
   slots for;
3. pull that many messages (an idle queue is waited on with a single slot held, so idle
   agents do not sit on slots busy ones could use);
4. put them in the cache; runners take ready lanes and run handlers;
5. when the done prefix of the cache grows, acknowledge it (one ack in flight at a
   time, coalescing everything that finished meanwhile).

Runners are long-lived coroutines, started on demand up to the cache capacity and
parked on a future when idle, so a message costs no task of its own. A runner that
takes a lane wakes one more runner if other lanes are waiting: with handlers that
finish without suspending, one runner drains a whole batch in a single step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from conveyor.platform.adapter import QueueReceiver
from conveyor.platform.backoff import BROKER_WRITE
from conveyor.platform.delivery.chain import Delivery
from conveyor.platform.delivery.orphans import Orphans
from conveyor.platform.errors import ConveyorError, LeaseLostError
from conveyor.platform.ids import SequenceToken
from conveyor.platform.message import Message
from conveyor.platform.queue_cache import Entry, Lane, QueueCache, Route
from conveyor.platform.slots import SlotPermit, SlotReleaseReason, SlotSupplier

log = logging.getLogger("conveyor.agent")

ACK_GRACE_S = 1.0
"""A drain whose time is up still gets this long to send the acks of what finished."""

Subscriptions = dict[str, tuple[Route, ...]]
"""Namespace -> the routes (handlers and their delivery chains) subscribed to it."""


@dataclass(frozen=True, slots=True)
class AgentSettings:
    cache_capacity: int = 1024
    max_batch: int = 256
    poll_timeout_s: float = 0.5


class _Context:
    """The live :class:`~conveyor.platform.slots.SlotReservationContext` of one agent."""

    __slots__ = ("_supplier", "queue")
    handler = "*"

    def __init__(self, queue: int, supplier: SlotSupplier) -> None:
        self.queue = queue
        self._supplier = supplier

    @property
    def slots_issued(self) -> int:
        return self._supplier.issued

    @property
    def slots_in_use(self) -> int:
        return self._supplier.in_use


class PullingAgent:
    def __init__(
        self,
        queue: int,
        receiver: QueueReceiver,
        subscriptions: Subscriptions,
        orphans: Orphans,
        slots: SlotSupplier,
        settings: AgentSettings,
        may_act: Callable[[], bool] | None = None,
    ) -> None:
        self.queue = queue
        self.receiver = receiver
        self.cache = QueueCache(settings.cache_capacity)
        self.settings = settings
        self._subs = subscriptions
        self._orphans = orphans
        self._slots = slots
        self._ctx = _Context(queue, slots)
        self._room = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._idle: deque[asyncio.Future[None]] = deque()
        self._runners: set[asyncio.Task[None]] = set()
        self._to_ack: list[SequenceToken] = []
        self._waking = False
        self._ack_task: asyncio.Task[None] | None = None
        self._pull_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._fenced = False
        self._aborted = False
        # Fencing: consulted before every pull and every ack; False once the lease
        # is (about to be) lost, so a stale owner neither pulls nor acknowledges.
        self._may_act = may_act or (lambda: True)
        # Backends that persist done offsets above the watermark (Kafka) hear about
        # each message finished out of order; the others cost one None check.
        self._note_out_of_order = (
            receiver.message_done_out_of_order if receiver.records_done_out_of_order else None
        )
        self.pulled = 0
        self.acked = 0
        self.max_cache_fill = 0

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        self._pull_task = asyncio.create_task(self._pull_loop(), name=f"agent-{self.queue}-pull")

    async def drain(self, timeout_s: float) -> bool:
        """Stop pulling, let in-flight messages finish, ack them, shut the receiver down.

        All within ``timeout_s`` (plus at most :data:`ACK_GRACE_S` for the last acks):
        a pull in flight is cancelled at once — whatever the broker had handed it stays
        unacknowledged and goes to the queue's next owner, so nothing is lost and nothing
        was handled twice. Returns False when time ran out: what was unfinished (or done
        but not acknowledged) is abandoned, to be redelivered to the next owner.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self._stopping = True
        finished = True
        if self._pull_task is not None:
            self._pull_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._pull_task
        try:
            async with asyncio.timeout_at(deadline):  # not wait_for: it can lose a cancel
                await self._drained.wait()
        except TimeoutError:
            finished = False
            unfinished = sum(1 for e in self.cache.entries if not e.done)
            log.warning(
                "queue %d: drain timed out with %d message(s) unfinished; %d unacknowledged "
                "message(s) will be redelivered to the next owner",
                self.queue, unfinished, len(self.cache),
            )
        await self._stop_runners()
        grace = max(deadline - loop.time(), ACK_GRACE_S)
        try:
            async with asyncio.timeout(grace):
                await self._last_acks()
        except TimeoutError:
            finished = False
            log.warning("queue %d: the last acknowledgements did not go through in %.1fs; "
                        "those messages will be redelivered to the next owner",
                        self.queue, grace)
        self._release_cached_permits()
        await self.receiver.shutdown()
        return finished

    async def _last_acks(self) -> None:
        if self._ack_task is not None:  # one flusher at a time keeps acks in order
            await self._ack_task
        await self._flush_acks()
        if self._note_out_of_order is not None and not self._fenced and self._may_act():
            # Persist the done offsets still recorded above the watermark (a drain
            # that timed out leaves some), so the next owner skips them.
            try:
                await self.receiver.messages_delivered([])
            except ConveyorError as exc:
                log.warning("queue %d: could not record done offsets: %s", self.queue, exc)

    @property
    def aborted(self) -> bool:
        """Stopped by :meth:`abort`: nothing it held is acknowledged any more."""
        return self._aborted

    async def abort(self) -> None:
        """Stop at once without acknowledging anything more (the lease is lost, or a
        second stop signal): what it held goes unacknowledged to the next owner."""
        self._aborted = True
        self._stopping = True
        self._fenced = True
        self._to_ack.clear()
        self._drained.set()
        tasks = [t for t in (self._pull_task, self._ack_task) if t is not None]
        for task in tasks:
            task.cancel()
        await self._stop_runners()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._release_cached_permits()
        with contextlib.suppress(Exception):
            await self.receiver.shutdown()

    async def _stop_runners(self) -> None:
        for task in self._runners:
            task.cancel()
        for task in list(self._runners):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._runners.clear()
        self._idle.clear()

    def _release_cached_permits(self) -> None:
        for entry in self.cache.entries:
            if entry.permit is not None:
                entry.permit.release(SlotReleaseReason.NEVER_USED)

    # -- pulling -----------------------------------------------------------------------
    async def _pull_loop(self) -> None:
        settings = self.settings
        slots = self._slots
        ctx = self._ctx
        while not self._stopping:
            if not self._may_act():
                await asyncio.sleep(settings.poll_timeout_s / 5)
                continue
            room = self.cache.room
            if room <= 0:
                self._room.clear()
                await self._room.wait()
                continue
            permits = [await slots.reserve_slot(ctx)]
            if self._stopping:
                permits[0].release(SlotReleaseReason.NEVER_USED)
                break
            want = min(room, settings.max_batch)
            while len(permits) < want:
                permit = slots.try_reserve_slot(ctx)
                if permit is None:
                    break
                permits.append(permit)
            try:
                messages = await self.receiver.get_messages(
                    len(permits), settings.poll_timeout_s if len(permits) == 1 else 0.0
                )
                if not messages and len(permits) > 1:
                    # Idle queue: wait for the next message holding one slot, not many.
                    for permit in permits[1:]:
                        permit.release(SlotReleaseReason.NEVER_USED)
                    del permits[1:]
                    messages = await self.receiver.get_messages(1, settings.poll_timeout_s)
            except Exception as exc:  # adapters raise ConveyorErrors; anything else is a bug
                for permit in permits:
                    permit.release(SlotReleaseReason.NEVER_USED)
                log.log(
                    logging.WARNING if isinstance(exc, ConveyorError) else logging.ERROR,
                    "queue %d: pull failed (%s: %s); retrying in %.1fs",
                    self.queue, type(exc).__name__, exc, settings.poll_timeout_s,
                )
                await asyncio.sleep(settings.poll_timeout_s)
                continue
            except BaseException:
                for permit in permits:
                    permit.release(SlotReleaseReason.NEVER_USED)
                raise
            for permit in permits[len(messages) :]:
                permit.release(SlotReleaseReason.NEVER_USED)
            if messages:
                self._accept(messages, permits)

    def _accept(self, messages: list[Message], permits: list[SlotPermit]) -> None:
        cache = self.cache
        subs = self._subs
        self._drained.clear()
        orphans: list[Entry] = []
        for msg, permit in zip(messages, permits, strict=False):
            routes = subs.get(msg.stream.namespace)
            if routes is None:  # undecodable, or no handler of this app subscribes
                entry = Entry(msg, permit, 1)
                cache.entries.append(entry)
                orphans.append(entry)
                continue
            cache.add(Entry(msg, permit, len(routes)), routes)
        self.pulled += len(messages)
        if len(cache) > self.max_cache_fill:
            self.max_cache_fill = len(cache)
        for entry in orphans:
            pending = self._orphans.take(entry.msg)
            if pending is None:
                self._finish_orphan(entry)
            else:
                self._spawn(self._await_orphan(entry, pending))
        self._wake()

    # -- running -----------------------------------------------------------------------
    def _wake(self) -> None:
        """Make sure one more runner will look at the ready lanes.

        At most one runner is being woken at a time: the woken one wakes the next only
        once it has taken a lane itself, so handlers that never suspend do not cause a
        wake-up (or a new runner) per message.
        """
        if self._waking or not self.cache.ready:
            return
        self._waking = True
        while self._idle:
            waiter = self._idle.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        if len(self._runners) < self.cache.capacity:
            self._spawn(self._runner())
        else:
            self._waking = False

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._runners.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._runners.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("queue %d: runner crashed", self.queue, exc_info=task.exception())

    async def _runner(self) -> None:
        cache = self.cache
        ready = cache.ready
        loop = asyncio.get_running_loop()
        while True:
            self._waking = False  # this runner is awake: another may be woken now
            while ready:
                lane: Lane = ready.popleft()
                if ready:
                    self._wake()  # others can start on the next lane while this one runs
                entry = lane.entries[0]
                route = lane.route
                permit = entry.permit
                if permit is not None:
                    msg = entry.msg
                    permit.mark_used(self.queue, route.handler.name, msg.id, msg.stream.key)
                await route.chain(Delivery(entry.msg, route.handler))
                entry = cache.finish_head(lane)
                if entry.done:
                    self._entry_done(entry)
            waiter: asyncio.Future[None] = loop.create_future()
            self._idle.append(waiter)
            await waiter

    def _entry_done(self, entry: Entry) -> None:
        if entry.permit is not None:
            entry.permit.release(SlotReleaseReason.TASK_COMPLETE)
        if self.cache.entries[0] is not entry:
            # An earlier message is still running: nothing new to acknowledge.
            if self._note_out_of_order is not None and entry.msg.token is not None:
                self._note_out_of_order(entry.msg.token)
            return
        tokens = self.cache.pop_done_prefix()
        self._to_ack.extend(tokens)
        if self._ack_task is None and not self._stopping:
            self._ack_task = asyncio.create_task(self._ack_loop())
        if not self._room.is_set():
            self._room.set()
        if not self.cache.entries:
            self._drained.set()

    async def _await_orphan(self, entry: Entry, pending: Awaitable[None]) -> None:
        await pending
        self._finish_orphan(entry)

    def _finish_orphan(self, entry: Entry) -> None:
        entry.pending = 0
        entry.done = True
        self._entry_done(entry)

    # -- acknowledging -----------------------------------------------------------------
    async def _ack_loop(self) -> None:
        try:
            await self._flush_acks()
        finally:
            self._ack_task = None

    async def _flush_acks(self) -> None:
        failures = 0
        while self._to_ack and not self._fenced:
            if not self._may_act():
                # Lease renewal is overdue: hold the acks until it succeeds or the
                # queue is declared lost (then they are dropped, never sent late).
                await BROKER_WRITE.sleep(failures + 1)
                continue
            batch, self._to_ack = self._to_ack, []
            try:
                await self.receiver.messages_delivered(batch)
            except LeaseLostError as exc:
                # The store fenced us off: a newer owner has the queue. Never retry.
                log.warning("queue %d: ack refused (%s); dropping %d ack(s)",
                            self.queue, exc, len(batch))
                self._fenced = True
                self._to_ack.clear()
                return
            except Exception as exc:
                self._to_ack[:0] = batch
                failures += 1
                delay_s = BROKER_WRITE.delay(failures)
                log.warning("queue %d: ack failed (%s: %s); retrying in %.2fs",
                            self.queue, type(exc).__name__, exc, delay_s)
                await asyncio.sleep(delay_s)
                continue
            self.acked += len(batch)

    # -- introspection -----------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return len(self.cache)

    def snapshot(self) -> dict[str, float]:
        return {
            "queue": self.queue,
            "cache_fill": len(self.cache),
            "cache_capacity": self.cache.capacity,
            "pulled": self.pulled,
            "acked": self.acked,
            "at": time.time(),
        }
