"""The pulling agent: one per owned queue.

Loop, top to bottom:

1. wait until the cache has room, in messages and in bytes (back-pressure: a full
   cache stops pulling);
2. pull up to ``min(room, max_batch)`` messages, waiting at most ``poll_timeout_s`` for
   the first one (an idle queue is waited on holding no slot);
3. put them in the cache; runners take ready lanes and run handlers — each handler
   execution holds a slot from the daemon's supplier while it runs;
4. when the done prefix of the cache grows, acknowledge it (one ack in flight at a
   time, coalescing everything that finished meanwhile).

**Two bounds, not one.** The cache bounds *prefetch* — messages pulled and not yet
acknowledged, per queue (``cache_capacity``), and their bodies' bytes per daemon
(``prefetch_bytes``, :class:`~conveyor.platform.queue_cache.PrefetchBudget`) — so memory
stays bounded whatever the body size and a no-op worker is never starved by round
trips. Slots bound *execution* — handler calls running
at once in the daemon (``[slots]``) — so the supplier (fixed, resource-based, pauseable,
custom) keeps deciding how much work runs. What is kept of the reference's "poll no more
than free slots" rule: a message never *starts* without a slot, and an agent never holds
more than its cache's capacity. What changed: slots no longer gate the pull, so a daemon
with 64 slots over 8 queues asks for up to ``max_batch`` messages per pull, not 8.

**No handler starts without ownership.** Before a runner starts a message it compares
the clock with the time until which the queue is this daemon's (the lease's local
deadline less its safety margin; for a Kafka group, the last heartbeat plus the session
timeout), cached from the balancer and asked again only once it has passed: one clock
read per message, no I/O. A daemon paused past its lease (SIGSTOP, a long GC, a stalled
VM) therefore starts nothing it pulled before the pause once it resumes: the messages
wait, unstarted, until the lease is renewed or the queue is declared lost, and then go to
the next owner unacknowledged.

**Batch handlers** (``batch_size=N``) take no lanes: :meth:`_accept` appends their
entries to the handler's batcher, which cuts them into batches in queue order, one at a
time, each on one slot (:mod:`conveyor.platform.batcher`). An app without batch handlers
accepts through the plain loop.

Runners are long-lived coroutines, started on demand up to the cache capacity and
parked on a future when idle, so a message costs no task of its own. A runner reserves
a slot *before* it takes a lane (waiting for one if none is free; a runner that waits
wakes no other), then wakes one more runner if other lanes are waiting: with handlers
that finish without suspending, one runner drains a whole batch in a single step. It
runs up to :data:`LANE_RUN` of a lane's entries back to back, for at most
:data:`RUN_BUDGET_S`, before it puts the lane back; the done prefix such a step leaves
is popped once, when the step is over
(:meth:`~conveyor.platform.acks.Acknowledger.head_done`).

**Per batch, not per message.** What a pull brings is resolved once: its lanes in one
call (:meth:`~conveyor.platform.queue_cache.QueueCache.add_all`), the done prefix in
bulk when all of it is done. A runner whose lane runs dry goes on to the next ready
lane in the same run, after the same stop checks its loop makes (stall, drain,
ownership, the supplier wanting the slot), keeping its permit. Per message there is
left: the slot's keep check, one clock read against the run's deadline, the entry's
flags, and the handler call — which the runner makes itself for the shipped chain
(:class:`~conveyor.platform.delivery.dead_letter.DirectCall`: no step frame, no
``Delivery`` unless the call fails).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from conveyor.platform import forks
from conveyor.platform.acks import Acknowledger
from conveyor.platform.adapter import QueueReceiver
from conveyor.platform.batcher import Batcher
from conveyor.platform.delivery.chain import (
    STOPS,
    Delivery,
    as_failure,
    check_returned,
    handler_task,
)
from conveyor.platform.delivery.orphans import Orphans
from conveyor.platform.errors import ConveyorError, error_text
from conveyor.platform.ids import shown_name
from conveyor.platform.message import Message
from conveyor.platform.ownership import Ownership
from conveyor.platform.queue_cache import Entry, Lane, PrefetchBudget, QueueCache, Route
from conveyor.platform.slots import SlotPermit, SlotReleaseReason, SlotSupplier
from conveyor.platform.tasks import cancel_and_wait, raise_swallowed_cancel, retrieve
from conveyor.platform.watchdog import (
    STALL_BREATH_S,
    STALL_BREATH_TURNS,
    LoopWatchdog,
    stall_note,
)

if TYPE_CHECKING:
    from conveyor.platform.delivery.tracing import Entered

log = logging.getLogger("conveyor.agent")

ACK_GRACE_S = 1.0
"""A drain whose time is up still gets this long to send the acks of what finished."""

ABORT_WAIT_S = 0.5
"""How long :meth:`PullingAgent.abort` waits for the handler calls it cancelled to end.
One that catches its cancellation and goes on (a bare ``except:`` in a loop) is left
running past it, its message unacknowledged for the queue's next owner: an abort is a
stop at once, and the stop that calls it still has the broker to leave."""

LANE_RUN = 16
"""Calls a runner makes on one lane before it puts the lane back behind the other ready
ones, while the run lasts less than :data:`RUN_BUDGET_S` (a run also ends when the loop
is stalled, a drain begins, the ownership deadline passes or the supplier wants the
slot). Handlers that finish in microseconds run up to 16 of a stream's messages in one
go, the lane taken and put back once; handlers slower than the budget run one call a
turn. (Runs of 16 with no time bound ran deep into one stream with 20 ms handlers while
older messages of other streams waited: the gap-free ack watermark stopped and pulls
stalled, a Redis fault test with such handlers taking 70 s instead of 20,
tests/integration/redis/test_redis_faults.py, the paused daemon.)"""

TOGETHER_FROM = 4
"""The least ``max_deliveries`` under which a redelivered message's first counted start
runs beside others, not alone (see :meth:`PullingAgent._count_start`): one start more
than alone may be blamed on it, and below 4 that start could dead-letter a message that
never failed."""

RUN_BUDGET_S = 0.001
"""How long one lane's run may take before the lane goes back (see :data:`LANE_RUN`):
the most a run delays the other ready lanes of its agent."""

Subscriptions = dict[str, tuple[Route, ...]]
"""Namespace -> the routes (handlers and their delivery chains) subscribed to it."""


@dataclass(frozen=True, slots=True)
class AgentSettings:
    cache_capacity: int = 1024
    max_batch: int = 256
    poll_timeout_s: float = 0.5
    prefetch: PrefetchBudget | None = None
    """The daemon's byte budget, shared by its agents (one object per daemon); None:
    bounded by ``cache_capacity`` alone."""


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
        owned_until: Callable[[], float] | None = None,
        watchdog: LoopWatchdog | None = None,
        redelivery: asyncio.Lock | None = None,
        crashed: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.queue = queue
        self._crashed = crashed
        """Told of an error that ended one of this agent's tasks (see :meth:`_task_done`)."""
        self.receiver = receiver
        self.cache = QueueCache(settings.cache_capacity)
        self.settings = settings
        self._subs = subscriptions
        self._orphans = orphans
        self._slots = slots
        self._ctx = _Context(queue, slots)
        # Batchers reserve apart: a fixed supplier lets runners keep a slot while only
        # their own context waits (FixedSlotSupplier.keep_slot), never past a batcher.
        self._batch_ctx = _Context(queue, slots)
        self._orphan_queue: deque[Entry] = deque()
        self._orphan_task: asyncio.Task[None] | None = None
        self._quiet = asyncio.Event()
        """Set while draining once no handler call runs and none can start any more."""
        self._running = 0
        self._idle: deque[asyncio.Future[None]] = deque()
        self._runners: set[asyncio.Task[None]] = set()
        self.batchers: list[Batcher] = []
        """One per batch handler (see conveyor.platform.batcher)."""
        self._split = self._split_batches(subscriptions)
        """With batch handlers: namespace -> (handlers, lane routes, batchers)."""
        self._waking = False
        self._pull_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._aborted = False
        self._abort_called = asyncio.Event()
        """Set by :meth:`abort`: a drain waiting for its runners stops waiting."""
        self._own = Ownership(owned_until, settings.poll_timeout_s / 5)
        """Fencing (conveyor.platform.ownership): checked before every start, pull, ack."""
        self._acks = Acknowledger(queue, receiver, self.cache, self._own)
        self._regain_task: asyncio.Task[None] | None = None
        # A handler that blocked the loop: the runner yields before its next start, so
        # the watchdog's probe (and everything else waiting) runs between two blockers.
        self._watchdog = watchdog or LoopWatchdog()
        self._careful = redelivery or asyncio.Lock()
        """Held while a redelivered message runs (see :meth:`_count_start`); one for the
        whole daemon, so that a crash is blamed on the one redelivered message running."""
        self.pulled = 0
        self.max_cache_fill = 0

    @property
    def acked(self) -> int:
        return self._acks.acked

    @property
    def refused(self) -> int:
        """Acknowledgements the store refused once the lease had moved (and those
        dropped with them): not held any more, and not acknowledged."""
        return self._acks.refused

    def _draining(self) -> bool:
        return self._stopping

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        self._pull_task = asyncio.create_task(self._pull_loop(), name=f"agent-{self.queue}-pull")
        self._pull_task.add_done_callback(self._task_done)

    async def drain(self, timeout_s: float) -> bool:
        """Stop pulling, finish the handler calls under way, ack, shut the receiver down.

        All within ``timeout_s`` (plus at most :data:`ACK_GRACE_S` for the last acks). A
        pull in flight is cancelled at once, and a message no handler has started yet is
        not started any more: both stay unacknowledged and go to the queue's next owner,
        never run here (counted in :attr:`released`). A message one of whose handlers has
        started is finished by all of them, so no handler sees it twice. Every finished
        message is acknowledged, in order or not (backends that commit a watermark
        record the ones above it, so the next owner skips them). Returns False when time
        ran out: the calls still running are abandoned, to be redelivered.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self._stopping = self._acks.stopping = True
        finished = True
        if self._pull_task is not None:
            with contextlib.suppress(Exception):
                await cancel_and_wait(self._pull_task)
        self._wake()  # an idle runner goes through the ready lanes under the drain's rule
        self._check_quiet()
        try:
            async with asyncio.timeout_at(deadline):  # not wait_for: it can lose a cancel
                await self._quiet.wait()
        except TimeoutError:
            finished = False
            log.warning(
                "queue %d: drain timed out with %d handler call(s) running; %d unacknowledged "
                "message(s) %s", self.queue, self._running, self.unfinished, self._fate())
        await self._stop_runners()
        grace = max(deadline - loop.time(), ACK_GRACE_S)
        try:
            async with asyncio.timeout(grace):
                await self._acks.last()
        except TimeoutError:
            finished = False
            log.warning("queue %d: the last acknowledgements did not go through in %.1fs; "
                        "those messages %s", self.queue, grace, self._fate())
        await self._hand_back()
        await self.receiver.shutdown()
        return finished

    def _fate(self) -> str:
        """What becomes of what this agent leaves unacknowledged."""
        if self.receiver.in_process:
            return ("are abandoned: the embedded adapter keeps them only while this "
                    "process runs (another daemon of it takes them; at exit they are gone)")
        return "will be redelivered to the next owner"

    async def _hand_back(self) -> None:
        """Tell the receiver which first deliveries go back unstarted (see
        :meth:`QueueReceiver.handed_back`); best effort, within the ack grace."""
        if self._acks.fenced or not self._own.may_act():
            return
        tokens = [e.msg.token for e in self.cache.entries
                  if not e.started and e.msg.token is not None and e.msg.deliveries == 1]
        complete = self.unfinished == 0
        if not tokens and not complete:
            return
        try:
            async with asyncio.timeout(ACK_GRACE_S):
                await self.receiver.handed_back(tokens, all_unfinished=complete)
        except Exception as exc:  # best effort: the drain goes on whatever happens
            log.info("queue %d: could not hand back %d unstarted message(s) (%s); the "
                     "next owner counts them as redelivered", self.queue, len(tokens), exc)

    def _check_quiet(self) -> None:
        """Quiet: draining, no call running, and no ready lane whose head some handler
        has started. Lanes whose head nothing started never run in a drain (their
        messages go to the next owner), so a runner waiting for a slot to skip them must
        not hold the drain: with a supplier that grants nothing it held it to its end."""
        if self._stopping and not self._running and not any(
            lane.entries and lane.entries[0].started for lane in self.cache.ready
        ):
            self._quiet.set()

    @property
    def released(self) -> int:
        """Messages pulled that no handler started: handed back unacknowledged by a drain."""
        return sum(1 for e in self.cache.entries if not e.started)

    @property
    def unfinished(self) -> int:
        """Messages some handler started and not all finished (nor acknowledged)."""
        return sum(1 for e in self.cache.entries if e.started and not e.done)

    @property
    def unacknowledged(self) -> int:
        """Messages pulled and not acknowledged: held in the cache (but for those
        acknowledged by id ahead of the done prefix, :meth:`Acknowledger.alone_done`:
        done, their token taken off), or taken out of it with their acknowledgement not
        confirmed yet (waiting, or in a call under way: ``cache.unconfirmed``)."""
        cache = self.cache
        ahead = sum(1 for e in cache.entries if e.msg.token is None and not e.pending)
        return len(cache) - ahead + cache.unconfirmed

    @property
    def aborted(self) -> bool:
        """Stopped by :meth:`abort`: nothing it held is acknowledged any more."""
        return self._aborted

    async def abort(self) -> None:
        """Stop at once without acknowledging anything more (the lease is lost, or a
        second stop signal): what it held goes unacknowledged to the next owner."""
        self._aborted = True
        self._stopping = True
        self._abort_called.set()
        flushing = self._acks.abort()
        self._quiet.set()
        tasks = [t for t in (self._pull_task, flushing) if t is not None]
        for task in tasks:
            task.cancel()
        await self._stop_runners(within_s=ABORT_WAIT_S)
        with contextlib.suppress(Exception):
            await cancel_and_wait(*tasks)  # cancelled above, before the runners: not again
        with contextlib.suppress(Exception):
            await self.receiver.shutdown()

    async def _stop_runners(self, within_s: float | None = None) -> None:
        """Cancel the runners (and the orphans' and regain tasks) and wait until they
        have ended — a drain's wait (``within_s`` None) until an :meth:`abort` at most,
        an abort's ``within_s`` at most. A handler call that catches its cancellation and
        goes on is then left running: nothing it finishes is acknowledged any more (the
        agent is aborted), its message goes to the queue's next owner."""
        extra = (self._orphan_task, self._regain_task)
        tasks = [*self._runners, *(t for t in extra if t is not None)]
        stopping = asyncio.create_task(cancel_and_wait(*tasks),
                                       name=f"agent-{self.queue}-stop-runners")
        stopping.add_done_callback(retrieve)
        waits: set[asyncio.Future[Any]] = {stopping}
        if within_s is None:
            waits.add(asyncio.ensure_future(self._abort_called.wait()))
        try:
            await asyncio.wait(waits, timeout=within_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits - {stopping}:
                waiting.cancel()
        if not stopping.done() and within_s is not None:  # the abort's: said once
            log.warning("queue %d: %d handler call(s) still running after their "
                        "cancellation (a handler that catches asyncio.CancelledError must "
                        "raise it again): left running, their messages unacknowledged for "
                        "the next owner", self.queue, sum(not t.done() for t in tasks))
        self._runners.clear()
        self._idle.clear()
        if stopping.done() and not stopping.cancelled():
            stopping.result()  # a runner's crash, raised as cancel_and_wait raised it

    # -- pulling -----------------------------------------------------------------------
    async def _pull_loop(self) -> None:
        """:meth:`_pull` holding a share of the daemon's byte budget, given back however
        the loop ends (a drain, or a cancellation when the queue is lost)."""
        if self.settings.prefetch is not None:
            self.cache.join(self.settings.prefetch)
        try:
            await self._pull()
        finally:
            self.cache.leave()

    async def _pull(self) -> None:
        settings = self.settings
        receiver = self.receiver
        cache = self.cache
        acks, own = self._acks, self._own
        while not self._stopping:
            if not own.may_act():
                await own.wait(self._draining)
                continue
            room = cache.pull_size(settings.max_batch)
            if room <= 0:  # full, in messages or in bytes: wait for acknowledgements
                acks.room.clear()
                acks.wants_room = True
                await acks.room.wait()
                continue
            try:
                messages = await receiver.get_messages(room, settings.poll_timeout_s)
            except Exception as exc:  # adapters raise ConveyorErrors; anything else is a bug
                log.log(
                    logging.WARNING if isinstance(exc, ConveyorError) else logging.ERROR,
                    "queue %d: pull failed (%s)%s; retrying in %.1fs",
                    self.queue, error_text(exc), stall_note(),
                    settings.poll_timeout_s,
                )
                await asyncio.sleep(settings.poll_timeout_s)
                continue
            if messages:
                self._accept(messages)

    def _accept(self, messages: list[Message]) -> None:
        cache = self.cache
        orphans = self._orphan_queue
        if self._split is not None:
            cache.took(messages)
            self._accept_split(messages)
        else:
            unrouted = cache.add_all(messages, self._subs)
            if unrouted is not None:  # undecodable, or no handler of this app subscribes
                orphans.extend(unrouted)
        self.pulled += len(messages)
        if len(cache) > self.max_cache_fill:
            self.max_cache_fill = len(cache)
        if orphans and self._orphan_task is None:
            self._orphan_task = asyncio.create_task(self._take_orphans(),
                                                    name=f"agent-{self.queue}-orphans")
            self._orphan_task.add_done_callback(self._task_done)
        self._wake()

    def _orphan(self, msg: Message) -> None:
        """A message no handler of this app takes: held in queue order for the orphans'
        task (see :meth:`_take_orphans`)."""
        entry = Entry(msg, 1)
        self.cache.entries.append(entry)
        self._orphan_queue.append(entry)

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

    def _spawn(self, coro: Coroutine[Any, Any, None], what: str = "runner") -> asyncio.Task[None]:
        task = handler_task(coro, name=f"agent-{self.queue}-{what}")
        self._runners.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        """A runner or the pull loop ended. An error ending one is Conveyor's own (a
        handler's are its call's failures, :func:`as_failure`): the message a runner held
        stays unfinished, the acknowledgements stop behind it and the queue with them.
        It is logged and ``crashed`` is told — the daemon then fails, so that a restart
        redelivers what this agent held (a redelivered message is counted, and
        dead-lettered after ``max_deliveries`` if it crashes every time)."""
        self._runners.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is None or isinstance(error, STOPS):  # those stop the process anyway
            return
        log.error("queue %d: task %s crashed", self.queue, task.get_name(), exc_info=error)
        if self._crashed is not None:
            self._crashed(error)

    async def _runner(self) -> None:
        cache = self.cache
        ready = cache.ready
        entries = cache.entries
        lanes = cache.lanes
        slots = self._slots
        keep = slots.keep_slot
        ctx = self._ctx
        queue = self.queue  # route, msg and queue: the watchdog reads them off this frame
        loop = asyncio.get_running_loop()
        this = asyncio.current_task()
        clock = time.monotonic
        own = self._own
        acks = self._acks
        note = acks.note_out_of_order
        watchdog = self._watchdog
        permit: SlotPermit | None = None
        marked = False  # permit.mark_used has run (it acts on a permit's first call only)
        entered: Entered | None = None  # a consumer span's scope, while its call runs
        while True:
            self._waking = False  # this runner is awake: another may be woken now
            while ready:
                if clock() < watchdog.resume_at:
                    # A call blocked the loop: start nothing before the watchdog's probe
                    # has run (blockers one after another are then separate stalls), nor
                    # before the loop has run STALL_BREATH_S past the stall's end, then
                    # STALL_BREATH_TURNS turns, for what the stall held up (a Kafka
                    # group's heartbeat, sent on this loop). From the stall's end, as
                    # this wait may run out inside another queue's stall; in turns too,
                    # as a late wake-up finds the time spent and the heartbeat's steps
                    # still queued. (A run that goes on after its handler waited through
                    # a stall checks resume_at too; and resume_at is +inf while the
                    # watchdog sees the loop stalled.)
                    await self._breathe()
                    continue
                if permit is None:
                    marked = False
                    permit = slots.try_reserve_slot(ctx)
                    if permit is None:  # every slot busy: wait here, waking no other runner
                        # meanwhile (_waking held) — this one stands for the queue's want
                        # of a slot; more would only queue behind it, for slots that the
                        # queue's busy runners keep (FixedSlotSupplier.keep_slot)
                        self._waking = True
                        try:
                            permit = await slots.reserve_slot(ctx)
                        finally:
                            self._waking = False
                        if not ready:  # the lanes went to other runners meanwhile
                            permit.release(SlotReleaseReason.NEVER_USED)
                            permit = None
                            break
                began = clock()
                fenced = began >= own.until and not own.may_act()
                if fenced and not self._stopping:
                    self._regain()  # not ours (for now): start nothing, wake no one
                    break
                lane: Lane = ready.popleft()
                if ready and not self._waking:
                    self._wake()  # others can start on the next lane while this one runs
                lane_entries = lane.entries
                if self._stopping and (fenced or not lane_entries[0].started):
                    # Draining: a message nothing has started goes to the next owner, and
                    # on a queue no longer ours nothing starts at all.
                    continue
                route = lane.route
                chain, handler, direct = route.chain, route.handler, route.direct
                if direct is not None:
                    start, finish, stats, timer, record, scope = direct
                by_key = lanes[route.index]
                if not marked:  # not per call: its arguments alone cost a cache miss or two
                    msg = lane_entries[0].msg
                    permit.mark_used(queue, handler.name, msg.id, msg.stream.key)
                    marked = True
                lane.running = True
                self._running += 1
                careful = False  # holding _careful (a redelivered message: _count_start)
                run = LANE_RUN
                # The run ends by RUN_BUDGET_S or the ownership deadline, whichever is
                # first: one comparison a call. (The deadline only moves once it has
                # passed, so the run has ended by then whatever it moves to.)
                stop_at = min(began + RUN_BUDGET_S, own.until)
                try:
                    while True:  # the lane's entries, one call each (see LANE_RUN)
                        entry = lane_entries.popleft()  # the lane is not ready meanwhile
                        entry.started = True
                        msg = entry.msg
                        if msg.deliveries > 1:
                            await self._careful.acquire()
                            careful = True
                            msg = await self._count_start(msg)
                            if (msg.deliveries == 2
                                    and handler.retry.max_deliveries >= TOGETHER_FROM):
                                careful = False  # its first counted start: runs beside
                                self._careful.release()  # the others (_count_start)
                        if direct is not None:  # DirectCall.run, inlined
                            if scope is not None:  # tracing on: its span is current
                                entered = scope.enter(msg)
                            if record is not None:
                                timed = timer()
                            failure = None
                            try:
                                try:
                                    result = await start(msg)
                                finally:
                                    if forks.copied:  # a process the handler forked
                                        forks.end_copy()  # ends here (forks.py)
                                if result is not None:
                                    check_returned(result)
                                stats.handled += 1
                            except Exception as exc:
                                failure = exc
                            except BaseException as exc:  # raised again for a
                                failure = as_failure(exc)  # stop (as_failure)
                            if failure is not None:
                                await finish(msg, failure)
                            now = clock()
                            if record is not None:  # the run's clock is the timer's, mostly
                                record((now if timer is clock else timer()) - timed)
                            if entered is not None and scope is not None:
                                scope.leave(entered)
                                entered = None
                        else:
                            await chain(Delivery(msg, handler))
                            now = clock()
                        # QueueCache.finish_head and Acknowledger.entry_done, inlined
                        entry.pending -= 1
                        if not entry.pending:  # done
                            if note is None:  # a settle already scheduled pops it too
                                if not acks.settling and entry is entries[0]:
                                    acks.head_done()
                            elif entry is entries[0]:
                                acks.head_done()
                            elif entry.msg.token is not None:
                                note(entry.msg.token)  # above the watermark: told at once
                        if careful:  # its acknowledgement is sent before the next one
                            await acks.alone_done(entry)
                            careful = False
                            self._careful.release()
                            now = clock()
                        if not lane_entries:
                            del by_key[lane.key]
                            lane.running = False
                            # On to the next ready lane in the same run, unless something
                            # asks the runner to stop (the checks of the loop above, which
                            # then decides): a pull over many streams leaves lanes of one
                            # or two entries, each taken here for a few checks.
                            if (not ready or now < watchdog.resume_at or self._stopping
                                    or now >= own.until or not keep(permit)):
                                break
                            lane = ready.popleft()
                            if ready and not self._waking:
                                self._wake()
                            lane_entries = lane.entries
                            if lane.route is not route:
                                route = lane.route
                                chain, handler, direct = route.chain, route.handler, route.direct
                                if direct is not None:
                                    start, finish, stats, timer, record, scope = direct
                                by_key = lanes[route.index]
                            lane.running = True
                            run = LANE_RUN
                            stop_at = min(now + RUN_BUDGET_S, own.until)
                            continue
                        run -= 1
                        if (not run or now >= stop_at or now < watchdog.resume_at
                                or self._stopping or not keep(permit)):
                            ready.append(lane)  # the loop above decides what comes next
                            break
                except BaseException as exc:
                    if isinstance(exc, STOPS):  # else the process ends without a word
                        log.error("handler %s raised %s on message %s of %s: the worker "
                                  "stops at once, without draining; the message comes "
                                  "back as a redelivered one (see max_deliveries)",
                                  handler.name, repr(exc), shown_name(msg.id),
                                  msg.stream.shown())
                    else:
                        self.cancelled_itself(exc, f"handler {handler.name}",
                                              f"on message {shown_name(msg.id)} of "
                                              f"{msg.stream.shown()}")
                    if entered is not None and scope is not None:  # its span ends as
                        scope.leave(entered)  # the chain's step ends it
                        entered = None
                    permit.release()  # cancelled (or a stop): the call did not complete
                    if careful:
                        self._careful.release()
                    raise
                finally:
                    lane.running = False
                    self._running -= 1
                if not (ready and keep(permit)):  # the supplier may let it carry the next
                    permit.release(SlotReleaseReason.TASK_COMPLETE)
                    permit = None
            if permit is not None:
                permit.release()  # TASK_COMPLETE, or NEVER_USED if fenced before a start
                permit = None
            self._check_quiet()
            raise_swallowed_cancel(this, self._stopping)  # a handler caught the stop's and returned
            waiter: asyncio.Future[None] = loop.create_future()
            self._idle.append(waiter)
            await waiter

    @staticmethod
    async def _breathe() -> None:
        """Let the loop run after a stall: :data:`STALL_BREATH_S`, then
        :data:`STALL_BREATH_TURNS` turns (the caller checks ``resume_at`` again)."""
        await asyncio.sleep(STALL_BREATH_S)
        for _ in range(STALL_BREATH_TURNS):
            await asyncio.sleep(0)

    async def _count_start(self, msg: Message) -> Message:
        """A redelivered message (its previous holder stopped before finishing it): its
        start counted durably first (one at a time in the daemon, under ``_careful``),
        so that a message that kills or stalls every worker is caught by its own count
        (``max_deliveries``, checked by the decode step).

        Its *first* counted start runs beside the others, as a first delivery does
        (where its handler's ``max_deliveries`` is at least :data:`TOGETHER_FROM`):
        after a crash, most of what the next owner claims was only fetched, never
        started, and one at a time a crash's 1,000 cached messages of a 300 ms handler
        took the new owner 30 minutes. If one of them kills the daemon, every one
        running beside it has that start counted; from its second counted start on, a
        message runs alone (``_careful`` held until its acknowledgement is sent), so the
        messages held beside a poison one are blamed for it once at most. Messages on
        their first delivery run as usual beside it: a crash one of them causes counts
        against the redelivered message running then (at most one start too many)."""
        try:
            return await self.receiver.count_start(msg)
        except ConveyorError as exc:
            log.warning("queue %d: could not count the start of redelivered message %s "
                        "(%s); counting its deliveries instead", self.queue,
                        shown_name(msg.id), exc)
            return msg

    # -- batches (conveyor.platform.batcher) ---------------------------------------------
    def _split_batches(
        self, subscriptions: Subscriptions
    ) -> dict[str, tuple[int, tuple[Route, ...], tuple[Batcher, ...]]] | None:
        """For an app with batch handlers, each namespace's lane routes and batchers
        (one batcher per batch handler); None without (the common path stays as is)."""
        if not any(r.batch is not None for rs in subscriptions.values() for r in rs):
            return None
        split = {}
        for ns, routes in subscriptions.items():
            batchers = []
            for route in routes:
                if route.handler.batch is not None:
                    batchers.append(Batcher(self, route, route.handler.batch))
            self.batchers.extend(batchers)
            lanes = tuple(r for r in routes if r.batch is None)
            split[ns] = (len(routes), lanes, tuple(batchers))
        return split

    def _accept_split(self, messages: list[Message]) -> None:
        """:meth:`_accept` with batch handlers: a message goes to the lanes of its
        ordinary handlers and to the end of each of its batch handlers' batchers."""
        cache = self.cache
        split = self._split
        assert split is not None
        touched: dict[Batcher, int] = {}
        for msg in messages:
            target = split.get(msg.stream.namespace)
            if target is None:
                self._orphan(msg)
                continue
            handlers, routes, batchers = target
            entry = Entry(msg, handlers)
            if routes:
                cache.add(entry, routes)
            else:
                cache.entries.append(entry)
            for batcher in batchers:
                batcher.entries.append(entry)
                touched[batcher] = touched.get(batcher, 0) + 1
        for batcher, count in touched.items():
            batcher.arrived(count)

    def spawn_batcher(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A batcher's loop, stopped with the runners."""
        return self._spawn(coro, "batcher")

    @property
    def draining(self) -> bool:
        return self._stopping

    def cancelled_itself(self, exc: BaseException, handler: str, where: str) -> None:
        """``exc`` ended a handler call of this agent's task (a runner, a batcher): a
        ``CancelledError`` though the agent is not stopping is the call's own — only a
        stop or an abort cancels those tasks, and sets ``_stopping`` first (a process's
        exit says so in the cancellation) — so its handler cancelled its own task. The
        task ends with it, leaving the message unfinished and its stream stuck behind
        it: a crash (:meth:`_task_done`), in one line."""
        if (isinstance(exc, asyncio.CancelledError) and not exc.args
                and not self._stopping and self._crashed is not None):
            self._crashed(ConveyorError(
                f"{handler} was cancelled {where} though nothing stopped its queue (a "
                "handler that cancels its own task: asyncio.current_task().cancel(), or "
                "a library that leaves it cancelled)"))

    async def may_start_batch(self) -> bool:
        """Whether a batch may start now; while the queue is not ours (for now), wait.
        After a stall it waits as a runner does (:meth:`_breathe`): batches that block
        the loop ran back to back, one stall as long as all of them."""
        while time.monotonic() < self._watchdog.resume_at:
            await self._breathe()
        return await self._own.wait(self._draining)

    async def reserve_slot(self) -> SlotPermit:
        ctx = self._batch_ctx  # its own context, not the runners' (see __init__)
        return self._slots.try_reserve_slot(ctx) or await self._slots.reserve_slot(ctx)

    def batch_started(self) -> None:
        self._running += 1

    def batch_ended(self) -> None:
        self._running -= 1

    def batch_done(self, entries: list[Entry]) -> None:
        """A batch's messages are done for its handler: acknowledge what is now done."""
        self._acks.batch_done(entries)
        self._check_quiet()

    def _regain(self) -> None:
        """The queue is not ours now (a lease renewal is overdue): wake the runners once
        it is again; if it is lost instead, :meth:`abort` cancels the wait."""
        if self._regain_task is None:
            self._regain_task = asyncio.create_task(self._wait_owned(),
                                                    name=f"agent-{self.queue}-regain")
            self._regain_task.add_done_callback(self._task_done)

    async def _wait_owned(self) -> None:
        try:
            await self._own.wait(self._draining)
        finally:
            self._regain_task = None
        self._wake()

    async def _take_orphans(self) -> None:
        """Messages no handler takes, one at a time in queue order (a dead-letter store
        is one call each: a storm of them must not open a connection per message)."""
        orphans = self._orphan_queue
        self._running += 1  # a drain waits for the one under way like for a handler call
        try:
            while orphans and not self._stopping:
                if not self._own.may_act():  # not ours now: dead-letter nothing
                    await self._own.wait(self._draining)
                    continue
                entry = orphans.popleft()
                entry.started = True
                pending = self._orphans.take(entry.msg)
                if pending is not None:
                    await pending
                self._finish_orphan(entry)
        finally:
            self._running -= 1
            self._orphan_task = None
            self._check_quiet()

    def _finish_orphan(self, entry: Entry) -> None:
        entry.pending = 0
        self._acks.entry_done(entry)

    # -- introspection -----------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return len(self.cache)

    @property
    def runners(self) -> int:
        """Tasks this agent runs handlers in (runners and batchers), parked ones too."""
        return len(self._runners)

    def snapshot(self) -> dict[str, float]:
        return {
            "queue": self.queue,
            "cache_fill": len(self.cache),
            "cache_capacity": self.cache.capacity,
            "pulled": self.pulled,
            "acked": self.acked,
            "at": time.time(),
        }
