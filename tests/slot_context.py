"""The reservation context slot-supplier tests pass: queue 0, handler not yet known."""

from __future__ import annotations

from conveyor.platform.slots import SlotReservationContext


class Ctx:
    queue = 0
    handler = "*"
    slots_issued = 0
    slots_in_use = 0


CTX: SlotReservationContext = Ctx()
