"""The batcher: one per (queue, batch handler), it cuts that queue's messages into batches.

A ``batch_size=N`` handler has no lanes in the queue cache (see
:mod:`conveyor.platform.queue_cache`): when the agent accepts a pulled message for it,
the message's cache entry is appended to the handler's batcher, in queue order. The
batcher's loop:

1. wait for a first message; then until it holds ``N``, or the queue's cache is full
   (nothing more can be pulled: the batch is as full as it can get), or ``batch_wait_ms``
   has passed since the first of them arrived;
2. reserve **one slot** (a batch is one handler call);
3. take the ``N`` oldest messages it holds, in queue order, and run them through the
   handler's batch step (decode, call, retry, bisect: see
   :mod:`conveyor.platform.delivery.batch`);
4. mark them all done for this handler — the agent acknowledges its contiguous done
   prefix, as for any handler — and go round again.

**Order, and why no lanes.** One batch runs at a time per (queue, handler), and batches
are cut in queue order. So a stream's messages appear in a batch in queue order, and its
later messages are in later batches, which start only once the earlier batch is done:
per-stream order holds with no per-stream bookkeeping at all. Lanes (a cursor per
stream) exist to let *different* streams run at once; a batch already runs many streams
at once, and a second batch in flight on one queue would need them back (a batch could
then only take streams no running batch holds) for little gain to a sink that is already
bulk. Batches of different queues run concurrently, each on its own slot. Queue order
also keeps the done prefix moving by a whole batch per batch, so acknowledgements and
room to pull follow at once. (Taking whole lanes in turn, as a first version did, left
the oldest messages of the streams not taken behind: the done prefix stuck, the cache
filled, and batches waited out ``batch_wait_ms`` at a third of their size — 120k
msgs/s on the embedded adapter against 460k.)

**Draining and fencing.** As for single messages: a batch under way is finished and
acknowledged; messages the batcher holds that no batch has started are not started once
a drain began (they go to the next owner unacknowledged); on a queue that is not ours for
now (an overdue lease renewal) no batch starts until it is again.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Coroutine
from typing import Any, Protocol

from conveyor.platform.delivery.chain import STOPS
from conveyor.platform.ids import shown_name
from conveyor.platform.options import BatchOptions
from conveyor.platform.queue_cache import Entry, QueueCache, Route
from conveyor.platform.slots import SlotPermit
from conveyor.platform.tasks import raise_swallowed_cancel

log = logging.getLogger("conveyor.agent")


class BatchHost(Protocol):
    """What a batcher needs of the pulling agent that hosts it."""

    queue: int
    cache: QueueCache

    @property
    def draining(self) -> bool:
        """A drain began: no batch starts any more."""

    def spawn_batcher(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run the batcher's loop as one of the agent's tasks (stopped with them)."""

    async def may_start_batch(self) -> bool:
        """Wait while the queue is not ours (for now); False once draining."""

    async def reserve_slot(self) -> SlotPermit:
        """A slot of the daemon's supplier for one batch."""

    def batch_started(self) -> None:
        """A batch holds a slot and runs (a drain waits for it)."""

    def batch_ended(self) -> None:
        """The batch returned (or was cancelled)."""

    def batch_done(self, entries: list[Entry]) -> None:
        """The batch's messages are done for this handler: acknowledge what is done."""

    def cancelled_itself(self, exc: BaseException, handler: str, where: str) -> None:
        """What a batch raised: a ``CancelledError`` while not draining is the handler's
        own cancelling of its task, which fails the worker."""


class Batcher:
    def __init__(self, agent: BatchHost, route: Route, options: BatchOptions) -> None:
        assert route.batch is not None
        self._agent = agent
        self._route = route
        self._step = route.batch
        # A batch never waits for more than the cache can hold.
        self._size = min(options.size, agent.cache.capacity)
        self._wait_s = options.wait_ms / 1000
        self.entries: deque[Entry] = deque()
        """Accepted for this handler, not in a batch yet: queue order (the agent appends)."""
        self._arrivals: deque[list[float]] = deque()
        """[messages, loop time] per accepted pull still held: when each one's wait began."""
        self._more = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.handler = route.handler.name
        self.running = False
        """A batch is running (it holds one slot)."""
        self.batches = 0

    def arrived(self, count: int) -> None:
        """The agent appended ``count`` entries to :attr:`entries` (one pull's)."""
        self._arrivals.append([count, asyncio.get_running_loop().time()])
        self._more.set()
        if self._task is None:
            self._task = self._agent.spawn_batcher(self._loop())

    def _complete(self) -> bool:
        return len(self.entries) >= self._size or self._agent.cache.full

    async def _loop(self) -> None:
        agent = self._agent
        this = asyncio.current_task()
        try:
            while True:
                raise_swallowed_cancel(this, agent.draining)  # a batch swallowed the stop's
                while not self.entries:
                    self._more.clear()
                    await self._more.wait()
                while not self._complete():
                    self._more.clear()
                    try:
                        async with asyncio.timeout_at(self._arrivals[0][1] + self._wait_s):
                            await self._more.wait()  # set on every arrival: look again
                    except TimeoutError:
                        break
                if not await agent.may_start_batch():
                    return  # draining: what it holds goes to the next owner
                await self._run_one()
        finally:
            self._task = None

    async def _run_one(self) -> None:
        agent = self._agent
        permit = await agent.reserve_slot()
        if agent.draining:  # the drain began while this waited for a slot
            permit.release()
            return
        entries = self.entries
        count = min(len(entries), self._size)
        batch = [entries.popleft() for _ in range(count)]
        self._took(count)
        messages = []
        for entry in batch:
            entry.started = True
            messages.append(entry.msg)
        first = messages[0]
        permit.mark_used(agent.queue, self.handler, first.id, first.stream.key)
        self.running = True
        agent.batch_started()
        try:
            await self._step(messages)
        except BaseException as exc:
            if isinstance(exc, STOPS):  # else the process ends without a word
                log.error("batch handler %s raised %s on a batch of %d message(s) from %s "
                          "on: the worker stops at once, without draining; the messages "
                          "come back as redelivered ones (see max_deliveries)",
                          self.handler, repr(exc), len(messages), shown_name(first.id))
            else:
                agent.cancelled_itself(exc, f"batch handler {self.handler}",
                                       f"on a batch of {len(messages)} message(s) from "
                                       f"{shown_name(first.id)} on")
            permit.release()  # cancelled (or a stop): the batch did not complete
            raise
        finally:
            self.running = False
            agent.batch_ended()
        permit.release()
        self.batches += 1
        for entry in batch:
            entry.pending -= 1
        agent.batch_done(batch)

    def _took(self, count: int) -> None:
        """``count`` of the oldest held entries went into a batch: forget their arrivals."""
        arrivals = self._arrivals
        while count:
            first = arrivals[0]
            if first[0] > count:
                first[0] -= count
                return
            count -= int(first[0])
            arrivals.popleft()
