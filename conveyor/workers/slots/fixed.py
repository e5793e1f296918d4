"""The fixed slot supplier: a set number of slots, first come, first served."""

from __future__ import annotations

import asyncio
from collections import deque

from conveyor.platform.errors import InvalidArgumentError
from conveyor.platform.slots import (
    SlotPermit,
    SlotReleaseReason,
    SlotReservationContext,
    SlotSupplier,
)


class FixedSlotSupplier(SlotSupplier):
    """A fixed number of slots, handed out first come, first served."""

    def __init__(self, count: int) -> None:
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise InvalidArgumentError("a fixed slot supplier needs a whole number of slots, "
                                       f"at least 1, got {count!r:.80}")
        super().__init__()
        self.count = count
        self._free = count
        # Reservations waiting, first come first served, each with the id of its context;
        # and how many wait per context (see keep_slot).
        self._waiters: deque[tuple[asyncio.Future[None], int]] = deque()
        self._waiting: dict[int, int] = {}

    @property
    def available(self) -> int:
        return self._free

    def try_reserve_slot(self, ctx: SlotReservationContext) -> SlotPermit | None:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return self.new_permit(ctx)
        return None

    async def reserve_slot(self, ctx: SlotReservationContext) -> SlotPermit:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return self.new_permit(ctx)
        waiter = asyncio.get_running_loop().create_future()
        entry = (waiter, id(ctx))
        self._waiters.append(entry)
        self._waiting[entry[1]] = self._waiting.get(entry[1], 0) + 1
        try:
            await waiter  # resolved by release_slot, which hands its slot over directly
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._hand_back()  # granted and cancelled in the same tick: give it back
            elif entry in self._waiters:  # a release may have popped it (cancelled) already
                self._waiters.remove(entry)
                self._left(entry[1])
            raise
        return self.new_permit(ctx)

    def keep_slot(self, permit: SlotPermit) -> bool:
        """Yes while nobody waits — keeping it takes nothing from anyone — and while
        everyone waiting reserves with the context the permit was granted to (an agent's
        runners share one): handing the slot from one of them to another would change
        nothing but add a wake-up, which under I/O-bound load left about 8 of 100 slots
        idle between a release and the waiter's start (docs/kafka.md, "Benchmarks").
        Anyone else waiting (another queue's agent, a batch handler) gets the slot at
        the holder's next call, first come first served."""
        return not self._waiters or (  # (the common case first: one attribute load)
            self._waiting.get(id(permit.user_data), 0) == len(self._waiters))

    def release_slot(self, reason: SlotReleaseReason, permit: SlotPermit) -> None:
        if self._waiters:
            self._hand_back(id(permit.user_data))
        else:  # the common case, once per handler call: nobody waits
            self._free += 1

    def _hand_back(self, releaser: int | None = None) -> None:
        """The slot to the first waiter — of another context than ``releaser``'s if one
        waits: the releaser's own waiter would run what the releaser gave the slot up
        from, and the others' share would follow the order they queued in rather than
        what they hold (two queues' agents then split 4 slots about 3 to 1)."""
        waiters = self._waiters
        if releaser is not None and len(self._waiting) > 1 and releaser in self._waiting:
            for at, (waiter, holder) in enumerate(waiters):
                if holder != releaser and not waiter.done():
                    del waiters[at]
                    self._left(holder)
                    waiter.set_result(None)
                    return
        while waiters:
            waiter, holder = waiters.popleft()
            self._left(holder)
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1

    def _left(self, holder: int) -> None:
        count = self._waiting[holder] - 1
        if count:
            self._waiting[holder] = count
        else:
            del self._waiting[holder]
