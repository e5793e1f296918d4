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
        if count < 1:
            raise InvalidArgumentError(f"a fixed slot supplier needs at least 1 slot, got {count}")
        super().__init__()
        self.count = count
        self._free = count
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def available(self) -> int:
        return self._free

    def try_reserve_slot(self, ctx: SlotReservationContext) -> SlotPermit | None:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return self.new_permit()
        return None

    async def reserve_slot(self, ctx: SlotReservationContext) -> SlotPermit:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return self.new_permit()
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # resolved by release_slot, which hands its slot over directly
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._hand_back()  # granted and cancelled in the same tick: give it back
            elif waiter in self._waiters:  # a release may have popped it (cancelled) already
                self._waiters.remove(waiter)
            raise
        return self.new_permit()

    def keep_slot(self, permit: SlotPermit) -> bool:
        return not self._waiters  # keeping it takes nothing from anyone

    def release_slot(self, reason: SlotReleaseReason, permit: SlotPermit) -> None:
        if self._waiters:
            self._hand_back()
        else:  # the common case, once per handler call: nobody waits
            self._free += 1

    def _hand_back(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1
