"""A user-written slot supplier, as shown in docs/workers.md (and exercised by a test).

At most ``max_slots`` messages in flight, and new ones started at most ``per_second``
a second, evenly paced — e.g. to stay under a downstream API's rate limit. (The
built-in ``[slots.rate]``, :class:`~conveyor.workers.slots.rate.RateLimitedSlotSupplier`,
does this for any supplier and can share the rate across daemons; this one shows how
a supplier is written.) Configure it with::

    [slots]
    kind = "custom"
    path = "conveyor.examples.custom_slots:PacedSlotSupplier"
    options = { max_slots = 32, per_second = 100.0 }
"""

from __future__ import annotations

import asyncio
import time

from conveyor import (
    SlotPermit,
    SlotReleaseReason,
    SlotReservationContext,
    SlotSupplier,
)


class PacedSlotSupplier(SlotSupplier):
    def __init__(self, max_slots: int = 32, per_second: float = 100.0) -> None:
        super().__init__()
        self.max_slots = max_slots
        self.interval_s = 1.0 / per_second
        self._next_at = 0.0  # monotonic time at which the next slot may be issued
        self._freed = asyncio.Event()

    def try_reserve_slot(self, ctx: SlotReservationContext) -> SlotPermit | None:
        now = time.monotonic()
        if self.issued >= self.max_slots or now < self._next_at:
            return None
        self._next_at = max(now, self._next_at) + self.interval_s
        return self.new_permit()

    async def reserve_slot(self, ctx: SlotReservationContext) -> SlotPermit:
        while True:  # cancellable: a cancelled wait has taken nothing
            permit = self.try_reserve_slot(ctx)
            if permit is not None:
                return permit
            if self.issued >= self.max_slots:
                self._freed.clear()
                await self._freed.wait()
            else:
                await asyncio.sleep(self._next_at - time.monotonic())

    def release_slot(self, reason: SlotReleaseReason, permit: SlotPermit) -> None:
        self._freed.set()  # must not block: just wake a waiter
