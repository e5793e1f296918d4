"""An agent's acknowledgements: the done prefix, one acknowledgement in flight at a time,
and the last ones of a drain.

A message is done when every handler it was routed to has finished with it. The cache
keeps messages in queue order; when the oldest are done, that *done prefix* goes to the
receiver in one call. One call is in flight at a time, and everything that finished
meanwhile goes with the next: acknowledgements stay in queue order and coalesce by
themselves under load. A message done behind an unfinished one waits for it, except on
backends that record done offsets above their watermark (Kafka), which hear of it at
once.

Acknowledgements are fenced like handler starts: while the queue is not ours (a lease
renewal is overdue) they are held, and once the store refuses them (the lease moved on)
they are dropped, never sent late. A confirmed acknowledgement frees room in the cache
(taking the done prefix out does not: until the broker has the acknowledgement, those
messages are pulled and not acknowledged, and count against ``cache_capacity``); the
pull loop waits on :attr:`Acknowledger.room` when the cache is full.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec

from conveyor.platform.adapter import QueueReceiver
from conveyor.platform.backoff import BROKER_WRITE
from conveyor.platform.errors import ConveyorError, LeaseLostError, error_text
from conveyor.platform.ids import SequenceToken
from conveyor.platform.ownership import Ownership
from conveyor.platform.queue_cache import Entry, QueueCache
from conveyor.platform.watchdog import stall_note

log = logging.getLogger("conveyor.agent")


class Acknowledger:
    def __init__(self, queue: int, receiver: QueueReceiver, cache: QueueCache,
                 ownership: Ownership) -> None:
        self.queue = queue
        self._receiver = receiver
        self._cache = cache
        self._own = ownership
        self.to_ack: list[SequenceToken] = []
        """Done and not acknowledged yet, in queue order."""
        self.acked = 0
        self.refused = 0
        """Acknowledgements the store refused (the lease moved) and those dropped with
        them: the next owner runs those messages again."""
        self.fenced = False
        """The store refused an acknowledgement (a newer owner has the queue), or the agent
        was aborted: nothing more is acknowledged."""
        self.stopping = False
        """A drain began: acknowledgements wait for :meth:`last` instead of a task."""
        self.room = asyncio.Event()
        self.wants_room = False
        """The pull loop waits on :attr:`room`: set it once an acknowledgement frees room."""
        self.task: asyncio.Task[None] | None = None
        self.settling = False
        """A :meth:`settle` is scheduled (see :meth:`head_done`)."""
        # Backends that persist done offsets above the watermark (Kafka) hear about
        # each message finished out of order; the others cost one None check.
        self.note_out_of_order = (
            receiver.message_done_out_of_order if receiver.records_done_out_of_order else None
        )

    def entry_done(self, entry: Entry) -> None:
        """``entry`` is done for every handler: acknowledge the done prefix if it grew."""
        if self._cache.entries[0] is not entry:
            # An earlier message is still running: nothing new to acknowledge.
            if self.note_out_of_order is not None and entry.msg.token is not None:
                self.note_out_of_order(entry.msg.token)
            return
        self.settle()

    def head_done(self) -> None:
        """The cache's first entry is done: acknowledge the done prefix — once the
        loop's running step is over (:attr:`settling`), so that a runner finishing a
        whole pull in one step pops the prefix and wakes the flusher once, not once a
        message. At once on backends told of messages done out of order
        (:attr:`note_out_of_order`): the runner tells them of every message done behind
        the first, so the first must never be a done one waiting to be popped."""
        if self.note_out_of_order is not None:
            self.settle()
        elif not self.settling:
            self.settling = True
            asyncio.get_running_loop().call_soon(self.settle)

    def settle(self) -> None:
        """Move the done prefix of the cache to :attr:`to_ack` and start sending it."""
        self.settling = False
        cache = self._cache
        if not cache.entries or cache.entries[0].pending:
            return
        before = len(self.to_ack)
        cache.pop_done_prefix(self.to_ack)
        # Counted even when fenced (the store refused an acknowledgement: the queue has a
        # newer owner), though never sent: the pull loop then stops at the capacity
        # instead of starting more work the next owner runs too, until the balancer,
        # whose renewal fails the same way, aborts this agent.
        cache.unconfirmed += len(self.to_ack) - before
        if self.task is None and not self.stopping:
            self.task = asyncio.create_task(self._loop())
        # A flag, not Event.is_set(): this runs about once a message. Taking the prefix
        # out frees room only for messages with nothing to acknowledge (no token); the
        # others free it once their acknowledgement is confirmed (flush).
        if self.wants_room and cache.room > 0:
            self.wants_room = False
            self.room.set()

    def batch_done(self, entries: list[Entry]) -> None:
        """A batch's messages are done for its handler: acknowledge what is now done."""
        note = self.note_out_of_order
        if note is not None:  # recorded above the watermark; pruned once acknowledged
            for entry in entries:
                if entry.done and entry.msg.token is not None:
                    note(entry.msg.token)
        entries_now = self._cache.entries
        if entries_now and entries_now[0].done:
            self.entry_done(entries_now[0])  # acknowledges the whole done prefix

    async def alone_done(self, entry: Entry) -> None:
        """``entry``, a redelivered message that ran alone (see
        :meth:`PullingAgent._count_start`), is done: wait until its acknowledgement is
        sent, so that a crash the next redelivered message causes is not blamed on it.

        The done prefix alone would not do: behind an unfinished message (another
        redelivered one still waiting for its turn) the entry stays in the cache, and
        each crash of a poison message counted one more delivery against every message
        that had run alone before it, to its end — until those became ``DeliveryLimit``
        dead letters beside the poison. So such an entry is acknowledged by id, out of
        queue order, and leaves the cache with the prefix later without being
        acknowledged twice. Backends that record done offsets above the watermark
        (Kafka) were told of it as it finished (:attr:`note_out_of_order`)."""
        cache = self._cache
        token = entry.msg.token
        if (self.note_out_of_order is None and token is not None and not entry.pending
                and cache.entries and cache.entries[0] is not entry):
            # Fenced and retried as every acknowledgement. The token leaves the entry so
            # that the prefix does not send it again; its bytes count until it leaves.
            entry.msg = msgspec.structs.replace(entry.msg, token=None)
            self.to_ack.append(token)
            cache.unconfirmed += 1
            if self.task is None and not self.stopping:
                self.task = asyncio.create_task(self._loop())
        else:
            self.settle()
        await self.sent()

    async def sent(self) -> None:
        """Until the acknowledgements under way (and those they gathered) are sent."""
        while (task := self.task) is not None:
            await asyncio.wait([task])

    async def _loop(self) -> None:
        try:
            await self.flush()
        finally:
            self.task = None

    async def flush(self) -> None:
        failures = 0
        receiver = self._receiver
        while self.to_ack and not self.fenced:
            if not self._own.may_act():
                # Lease renewal is overdue: hold the acks until it succeeds or the
                # queue is declared lost (then they are dropped, never sent late).
                await BROKER_WRITE.sleep(failures + 1)
                continue
            batch, self.to_ack = self.to_ack, []
            try:
                await receiver.acknowledge(batch)
            except LeaseLostError as exc:
                # The store fenced us off: a newer owner has the queue. Never retry.
                log.warning("queue %d: ack refused (%s); dropping %d ack(s)",
                            self.queue, exc, len(batch))
                self.fenced = True
                self.refused += len(batch) + len(self.to_ack)
                self._forget(len(batch))
                return
            except Exception as exc:
                self.to_ack[:0] = batch
                failures += 1
                delay_s = BROKER_WRITE.delay(failures)
                log.warning("queue %d: ack failed (%s)%s; retrying in %.2fs",
                            self.queue, error_text(exc), stall_note(), delay_s)
                await asyncio.sleep(delay_s)
                continue
            self.acked += len(batch)
            self._cache.unconfirmed -= len(batch)
            self._wake_puller()

    def _forget(self, in_flight: int) -> None:
        """Drop the acknowledgements not sent (and ``in_flight`` of a refused call): the
        queue's next owner has those messages; they hold no room here any more."""
        self._cache.unconfirmed -= in_flight + len(self.to_ack)
        self.to_ack.clear()
        self._wake_puller()

    def _wake_puller(self) -> None:
        """Room was freed: wake the pull loop if it waits for it."""
        if self.wants_room:
            self.wants_room = False
            self.room.set()

    async def last(self) -> None:
        """A drain's last acknowledgements: the done prefix, then what finished behind an
        unfinished message (by id; or, with done offsets above a watermark, persisted for
        the next owner to skip)."""
        self.settle()  # a prefix whose settle is still scheduled goes first, in order
        flushing = self.task
        if flushing is not None:  # one flusher at a time keeps acks in order
            # Waited for, not awaited: an abort (the lease lost meanwhile) cancels it,
            # which must end this drain, not raise CancelledError into the re-balance
            # that called it (that ended the balancer's loop for good).
            await asyncio.wait([flushing])
            if not flushing.cancelled() and (exc := flushing.exception()) is not None:
                raise exc
        await self.flush()
        if self.fenced or not self._own.may_act():
            return
        receiver = self._receiver
        try:
            beyond = [e.msg.token for e in self._cache.entries if e.done and e.msg.token]
            if self.note_out_of_order is not None:
                # Recorded above the watermark (the commit's metadata, the hand-off
                # record): the next owner skips them, so they count as acknowledged —
                # else the drain line's pulled exceeded acked + released + abandoned.
                await receiver.acknowledge([])
                self.acked += len(beyond)
                return
            if beyond:  # finished behind an unfinished one: acknowledged by id
                await receiver.acknowledge(beyond)
                self.acked += len(beyond)
        except ConveyorError as exc:
            log.warning("queue %d: could not acknowledge the finished messages: %s",
                        self.queue, exc)

    def abort(self) -> asyncio.Task[None] | None:
        """Acknowledge nothing more; the flush under way (returned) is to be cancelled."""
        self.stopping = True
        self.fenced = True
        self._forget(0)
        return self.task
