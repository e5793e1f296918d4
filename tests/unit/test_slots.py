import asyncio

import pytest

from conveyor.platform.slots import (
    SlotInfo,
    SlotPermit,
    SlotReleaseReason,
    SlotReservationContext,
    SlotSupplier,
)
from conveyor.workers.slots.fixed import FixedSlotSupplier
from tests.slot_context import CTX


async def test_fixed_supplier_grants_up_to_its_count_then_blocks() -> None:
    supplier = FixedSlotSupplier(2)
    a = supplier.try_reserve_slot(CTX)
    b = await supplier.reserve_slot(CTX)
    assert a is not None and supplier.try_reserve_slot(CTX) is None
    waiter = asyncio.create_task(supplier.reserve_slot(CTX))
    await asyncio.sleep(0)
    assert not waiter.done()
    a.release()
    c = await asyncio.wait_for(waiter, 1)
    assert supplier.issued == 2 and supplier.available == 0
    b.release()
    c.release()
    assert supplier.issued == 0 and supplier.available == 2


async def test_cancelled_reservation_takes_no_slot() -> None:
    supplier = FixedSlotSupplier(1)
    held = await supplier.reserve_slot(CTX)
    waiter = asyncio.create_task(supplier.reserve_slot(CTX))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    held.release()
    assert supplier.available == 1 and supplier.issued == 0


async def test_slot_granted_to_a_waiter_cancelled_in_the_same_tick_is_handed_back() -> None:
    supplier = FixedSlotSupplier(1)
    held = await supplier.reserve_slot(CTX)
    waiter = asyncio.create_task(supplier.reserve_slot(CTX))
    await asyncio.sleep(0)
    held.release()  # resolves the waiter's future ...
    waiter.cancel()  # ... and cancels it before it runs
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert supplier.available == 1 and supplier.issued == 0


async def test_permit_releases_once_and_reports_reason() -> None:
    reasons: list[SlotReleaseReason] = []
    used: list[SlotInfo] = []

    class Recording(FixedSlotSupplier):
        def mark_slot_used(self, info: SlotInfo, permit: SlotPermit) -> None:
            used.append(info)

        def release_slot(self, reason: SlotReleaseReason, permit: SlotPermit) -> None:
            reasons.append(reason)
            super().release_slot(reason, permit)

    supplier = Recording(3)
    async with await supplier.reserve_slot(CTX):
        assert supplier.issued == 1 and supplier.in_use == 0  # reserved, never marked used
    async with await supplier.reserve_slot(CTX) as permit:
        permit.mark_used(1, "h", "m1", "k")
        assert supplier.in_use == 1
    with pytest.raises(RuntimeError):
        async with await supplier.reserve_slot(CTX) as permit:
            raise RuntimeError("boom")
    permit.release()  # a second release is ignored
    assert reasons == [
        SlotReleaseReason.NEVER_USED, SlotReleaseReason.TASK_COMPLETE, SlotReleaseReason.ERROR
    ]
    assert used == [SlotInfo(1, ("h",), "m1", "k")]
    assert supplier.issued == 0 and supplier.in_use == 0 and supplier.available == 3


async def test_user_supplier_exceptions_in_hooks_do_not_escape() -> None:
    class Broken(SlotSupplier):
        async def reserve_slot(self, ctx: SlotReservationContext) -> SlotPermit:
            return self.new_permit()

        def try_reserve_slot(self, ctx: SlotReservationContext) -> SlotPermit | None:
            return self.new_permit()

        def mark_slot_used(self, info: SlotInfo, permit: SlotPermit) -> None:
            raise ValueError("user bug")

        def release_slot(self, reason: SlotReleaseReason, permit: SlotPermit) -> None:
            raise ValueError("user bug")

    supplier = Broken()
    permit = await supplier.reserve_slot(CTX)
    permit.mark_used(0, "h", "m", "k")
    permit.release()
    assert supplier.issued == 0 and supplier.in_use == 0


def test_fixed_supplier_needs_a_slot() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        FixedSlotSupplier(0)


async def test_a_wait_cancelled_as_a_release_passes_it_over_takes_nothing() -> None:
    supplier = FixedSlotSupplier(1)
    held = await supplier.reserve_slot(CTX)
    waiting = asyncio.create_task(supplier.reserve_slot(CTX))
    await asyncio.sleep(0)  # one loop step: it is now waiting for the slot
    waiting.cancel()  # its wait is cancelled; the task has not resumed yet ...
    held.release()  # ... when the release passes over it and frees the slot
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert supplier.available == 1 and supplier.issued == 0
