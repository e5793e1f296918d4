"""The batcher: one per (queue, batch handler), it gathers lanes into batches and runs them.

A ``batch_size=N`` handler's lanes (its cursor over one stream each, see
:mod:`conveyor.platform.queue_cache`) do not run message by message. A runner that takes
such a lane from the cache's ready list hands it to the handler's batcher, holding no
slot for it; the batcher keeps it until the lane is empty. Its loop:

1. wait for a first lane; then until the lanes it holds have ``N`` messages between
   them, or the queue's cache is full (nothing more can arrive: the batch is as full as
   it can get), or ``batch_wait_ms`` has passed since the first of them was handed over;
2. reserve **one slot** for the batch (the call is one handler execution);
3. form the batch by *water-filling*: every held lane gives its head messages, up to a
   level raised as far as ``N`` allows, so a batch holds the oldest messages of every
   stream (each stream's as one run of consecutive messages, in order) and the cache's
   done prefix — acknowledgements, and room to pull — moves on by about a batch per
   batch. (Taking whole lanes in turn instead left the oldest messages of the streams
   not taken behind, the done prefix stuck, the cache full and batches waiting out
   ``batch_wait_ms`` at a third of their size: measured 120k msgs/s on the embedded
   adapter against 460k now.) A lane none of whose messages fit stays held;
4. run it through the handler's batch step (decode, call, retry, bisect: see
   :mod:`conveyor.platform.delivery.batch`), then mark every message of it done at once —
   the agent acknowledges its contiguous done prefix, as for any handler;
5. hold again the lanes that still have messages.

**Order.** A lane is in exactly one place: the ready list, a runner's hands, the batcher's
list or the running batch. While a batch runs, its lanes are in it and nowhere else, so
a stream's later messages never run before a batch that holds earlier ones is done;
and a batch holds a stream's messages as one run of consecutive messages, in order.
One batch runs at a time per (queue, handler): batches of different queues run
concurrently, each on its own slot.

**Draining and fencing.** Like any message, one that no batch has started is not
started once a drain began (it goes to the next owner unacknowledged); a batch under way
is finished. On a queue that is not ours for now (an overdue lease renewal) no batch
starts until it is again.
"""

from __future__ import annotations

import asyncio
from collections import deque
from itertools import islice
from typing import TYPE_CHECKING

from conveyor.platform.message import Message
from conveyor.platform.options import BatchOptions
from conveyor.platform.queue_cache import Entry, Lane, Route

if TYPE_CHECKING:
    from conveyor.platform.agent import PullingAgent


class Batcher:
    def __init__(self, agent: PullingAgent, route: Route, options: BatchOptions) -> None:
        assert route.batch is not None
        self._agent = agent
        self._route = route
        self._step = route.batch
        # A batch never waits for more than the cache can hold.
        self._size = min(options.size, agent.cache.capacity)
        self._wait_s = options.wait_ms / 1000
        self._lanes: deque[Lane] = deque()
        """Held lanes, in the order they were handed over."""
        self._first_at = 0.0
        """Loop time the first of the held lanes was handed over (or, for lanes kept
        from a batch, when that batch ended): the wait runs from there."""
        self._held = 0
        """Messages in the held lanes when last counted."""
        self._arrived = asyncio.Event()
        self._full = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.batches = 0

    def take(self, lane: Lane) -> None:
        """Hold ``lane`` until its messages have run in batches (called by a runner)."""
        lanes = self._lanes
        if not lanes:
            self._first_at = asyncio.get_running_loop().time()
            self._arrived.set()
        lanes.append(lane)
        self._held += len(lane.entries)
        if self._held >= self._size or self._agent.cache.room <= 0:
            self._full.set()
        if self._task is None:
            self._task = self._agent.spawn_batcher(self._loop())

    def recount(self) -> None:
        """Messages were pulled: the held lanes may have grown (called by the agent)."""
        if self._lanes:
            self._held = sum(len(lane.entries) for lane in self._lanes)
            if self._held >= self._size or self._agent.cache.room <= 0:
                self._full.set()

    async def _loop(self) -> None:
        agent = self._agent
        try:
            while True:
                await self._arrived.wait()
                while not self._complete():
                    self._full.clear()
                    try:
                        async with asyncio.timeout_at(self._first_at + self._wait_s):
                            await self._full.wait()  # set by take/recount: look again
                    except TimeoutError:
                        break
                if not await agent.may_start_batch():
                    return  # draining: what it holds goes to the next owner
                await self._run_one()
        finally:
            self._task = None

    def _complete(self) -> bool:
        """Whether the held lanes make a batch as full as it can get: ``N`` messages, or
        a full cache (nothing more can be pulled) with none of this handler's lanes still
        waiting for a runner to hand them over."""
        if self._held >= self._size:
            return True
        cache = self._agent.cache
        if cache.room > 0:
            return False
        route = self._route
        return not any(lane.route is route for lane in cache.ready)

    def _form(self) -> tuple[list[tuple[Lane, int]], list[Message]]:
        """The next batch: (lane, messages taken from its head) pairs, and the messages.

        Water-filling: every held lane gives up to ``level`` head messages, the level as
        high as the batch's room allows (the remainder from the first lanes), so a batch
        holds the *oldest* messages of each stream rather than whole streams in turn —
        the cache's done prefix (what can be acknowledged, and room to pull) then moves
        on by about a batch per batch. A lane that gave messages is the batch's until it
        ends; the others stay held.
        """
        lanes = self._lanes
        lengths = [len(lane.entries) for lane in lanes]
        room = self._size
        level = max(lengths)
        filled = sum(lengths)
        extra = 0
        if filled > room:
            level = filled = 0
            while True:  # raise the level while a whole step still fits
                step = sum(1 for n in lengths if n > level)
                if filled + step > room:
                    break
                filled += step
                level += 1
            extra = room - filled  # one more from each of the first ``extra`` longer lanes
        taken: list[tuple[Lane, int]] = []
        messages: list[Message] = []
        add = messages.append
        stay: list[Lane] = []
        for lane, n in zip(lanes, lengths, strict=True):
            count = min(n, level)
            if extra and n > level:
                count += 1
                extra -= 1
            if not count:
                stay.append(lane)
                continue
            taken.append((lane, count))
            for entry in islice(lane.entries, count):
                entry.started = True
                add(entry.msg)
        lanes.clear()
        lanes.extend(stay)
        return taken, messages

    async def _run_one(self) -> None:
        agent = self._agent
        permit = await agent.reserve_slot()
        taken, messages = self._form()
        lanes = self._lanes
        first = messages[0]
        permit.mark_used(agent.queue, self._route.handler.name, first.id, first.stream.key)
        lead = taken[0][0]
        lead.running = True  # slot metrics: one slot per batch
        agent.batch_started()
        try:
            await self._step(messages)
        except BaseException:
            permit.release()  # cancelled: the batch did not complete
            raise
        finally:
            lead.running = False
            agent.batch_ended()
        permit.release()
        self.batches += 1
        done: list[Entry] = []
        kept: list[Lane] = []
        finish = agent.cache.finish_taken
        for lane, count in taken:
            finish(lane, count, done)
            if lane.entries:
                kept.append(lane)
        if kept:
            if not lanes:
                self._first_at = asyncio.get_running_loop().time()
            lanes.extend(kept)
        self._held = sum(len(lane.entries) for lane in lanes)
        if not lanes:
            self._arrived.clear()
        if self._held < self._size:
            self._full.clear()
        agent.batch_done(done)
