"""Pauseable and user-written suppliers: pause semantics, contained user exceptions."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import pytest

from conveyor import App, Config, WorkerDaemon, load_config
from conveyor.examples.custom_slots import PacedSlotSupplier
from conveyor.platform.errors import ConfigError, InvalidArgumentError
from conveyor.platform.slots import (
    SlotInfo,
    SlotPermit,
    SlotReleaseReason,
    SlotReservationContext,
    SlotSupplier,
)
from conveyor.workers.slots.build import supplier_from_config
from conveyor.workers.slots.fixed import FixedSlotSupplier
from conveyor.workers.slots.wrappers import GuardedSlotSupplier, PauseableSlotSupplier
from tests.conftest import wait_until
from tests.slot_context import CTX


async def test_paused_supplier_makes_reservations_wait_until_resumed() -> None:
    supplier = PauseableSlotSupplier(FixedSlotSupplier(2))
    supplier.pause()
    assert supplier.try_reserve_slot(CTX) is None and supplier.available == 0
    waiter = asyncio.create_task(supplier.reserve_slot(CTX))
    await asyncio.sleep(0.02)  # a window in which nothing may be granted, not a wait
    assert not waiter.done() and supplier.inner.issued == 0
    supplier.resume()
    permit = await asyncio.wait_for(waiter, 1)
    assert supplier.issued == 1 and supplier.inner.issued == 1
    permit.release()
    assert supplier.issued == 0 and supplier.inner.issued == 0 and supplier.inner.available == 2


async def test_a_slot_obtained_while_paused_goes_back_to_the_inner_supplier() -> None:
    inner = FixedSlotSupplier(1)
    supplier = PauseableSlotSupplier(inner)
    held = await supplier.reserve_slot(CTX)
    waiter = asyncio.create_task(supplier.reserve_slot(CTX))  # waits on the inner supplier
    await wait_until(lambda: len(inner._waiters) == 1, 1, what="the inner wait")
    supplier.pause()
    held.release()  # the inner supplier now grants the waiter its slot, while paused
    await wait_until(lambda: inner.available == 1, 1, what="the slot to be handed back")
    assert not waiter.done() and inner.issued == 0
    supplier.resume()
    permit = await asyncio.wait_for(waiter, 1)
    assert inner.issued == 1 and inner.available == 0
    permit.release()
    assert inner.available == 1


async def test_pause_leaves_slots_already_handed_out_alone() -> None:
    supplier = PauseableSlotSupplier(FixedSlotSupplier(2))
    async with await supplier.reserve_slot(CTX) as permit:
        permit.mark_used(0, "h", "m1", "k")
        supplier.pause()
        assert supplier.in_use == 1 and supplier.inner.in_use == 1
    assert supplier.in_use == 0 and supplier.inner.in_use == 0 and supplier.inner.available == 2


class Buggy(SlotSupplier):
    """Fails every other reservation and in every hook."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    async def reserve_slot(self, ctx: SlotReservationContext) -> SlotPermit:
        self.calls += 1
        if self.calls % 2:
            raise RuntimeError("flaky reserve")
        return self.new_permit()

    def try_reserve_slot(self, ctx: SlotReservationContext) -> SlotPermit | None:
        raise RuntimeError("broken try")

    def mark_slot_used(self, info: SlotInfo, permit: SlotPermit) -> None:
        raise RuntimeError("broken mark")

    def release_slot(self, reason: SlotReleaseReason, permit: SlotPermit) -> None:
        raise RuntimeError("broken release")


async def test_user_supplier_exceptions_are_contained_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, "conveyor.slots")
    supplier = GuardedSlotSupplier(Buggy())
    permit = await asyncio.wait_for(supplier.reserve_slot(CTX), 2)  # first call raised
    assert supplier.try_reserve_slot(CTX) is None
    permit.mark_used(0, "h", "m", "k")
    permit.release()
    assert supplier.errors == 2
    assert supplier.issued == 0 and supplier.inner.issued == 0 and supplier.inner.in_use == 0
    messages = caplog.text
    assert "flaky reserve" in messages and "broken mark" in messages
    assert "broken release" in messages


async def test_a_guarded_reservation_stays_cancellable() -> None:
    class Never(Buggy):
        async def reserve_slot(self, ctx: SlotReservationContext) -> SlotPermit:
            raise RuntimeError("always")

    supplier = GuardedSlotSupplier(Never(), max_backoff_s=0.01)
    task = asyncio.create_task(supplier.reserve_slot(CTX))
    await wait_until(lambda: supplier.errors >= 3, 2, what="a few retries")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_permit_of_the_wrong_supplier_is_refused() -> None:
    other = FixedSlotSupplier(1)

    class Liar(Buggy):
        def try_reserve_slot(self, ctx: SlotReservationContext) -> SlotPermit | None:
            return other.new_permit()

    supplier = GuardedSlotSupplier(Liar())
    assert supplier.try_reserve_slot(CTX) is None and supplier.errors == 1


async def test_the_documented_custom_supplier_loads_from_config_and_limits_rate() -> None:
    config = load_config(environ={}, overrides={"slots": {
        "kind": "custom", "pauseable": True,
        "path": "conveyor.examples.custom_slots:PacedSlotSupplier",
        "options": {"max_slots": 3, "per_second": 50.0},
    }})
    supplier = supplier_from_config(config.slots)
    assert isinstance(supplier, PauseableSlotSupplier)
    guarded = supplier.inner
    assert isinstance(guarded, GuardedSlotSupplier)
    assert isinstance(guarded.inner, PacedSlotSupplier)
    started = time.monotonic()
    permits = [await supplier.reserve_slot(CTX) for _ in range(3)]
    assert time.monotonic() - started >= 0.035  # 3 slots at 50/s: two 20 ms gaps
    assert supplier.try_reserve_slot(CTX) is None  # max_slots reached
    waiter = asyncio.create_task(supplier.reserve_slot(CTX))
    await asyncio.sleep(0.03)  # a window in which nothing may be granted, not a wait
    assert not waiter.done()
    permits[0].release()
    permits.append(await asyncio.wait_for(waiter, 1))
    for p in permits:
        p.release()
    assert supplier.issued == 0 and guarded.inner.issued == 0


def test_a_bad_custom_supplier_path_is_a_config_error_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"\$\.slots\.path"):
        load_config(environ={}, overrides={"slots": {"kind": "custom", "path": "nocolon"}})
    config = load_config(environ={}, overrides={"slots": {"kind": "custom", "path": "no.such:X"}})
    with pytest.raises(ConfigError, match="cannot load"):
        supplier_from_config(config.slots)
    config = load_config(environ={}, overrides={"slots": {"kind": "custom", "path": "time:time"}})
    with pytest.raises(ConfigError, match="not a SlotSupplier"):
        supplier_from_config(config.slots)
    # Blamed $.slots.options: `math:pi(**options) failed: TypeError(...)`.
    config = load_config(environ={}, overrides={"slots": {"kind": "custom",
                                                          "path": "math:pi"}})
    with pytest.raises(ConfigError) as raised:
        supplier_from_config(config.slots)
    assert str(raised.value) == ("$.slots.path: math:pi is float, not a factory to call (a "
                                 "SlotSupplier subclass, or a function that returns one)")


class SamePermit(Buggy):
    """Grants more than asked: the one permit it made, every time it is asked."""

    def __init__(self) -> None:
        super().__init__()
        self.permit: SlotPermit | None = None
        self.released: list[SlotReleaseReason] = []

    def try_reserve_slot(self, ctx: SlotReservationContext) -> SlotPermit | None:
        if self.permit is None:
            self.permit = self.new_permit()
        return self.permit

    def mark_slot_used(self, info: SlotInfo, permit: SlotPermit) -> None:
        raise AssertionError("no slot is used in this test")

    def release_slot(self, reason: SlotReleaseReason, permit: SlotPermit) -> None:
        self.released.append(reason)


async def test_a_permit_handed_out_twice_is_refused_while_out_and_after_release(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inner = SamePermit()
    supplier = GuardedSlotSupplier(inner)
    first = supplier.try_reserve_slot(CTX)
    assert first is not None
    assert supplier.try_reserve_slot(CTX) is None and supplier.errors == 1  # still out
    first.release()
    assert len(inner.released) == 1  # handed back to the user's supplier, once
    assert supplier.try_reserve_slot(CTX) is None and supplier.errors == 2  # released
    assert supplier.issued == 0
    assert "already handed out" in caplog.text


class NeverGrants(Buggy):
    async def reserve_slot(self, ctx: SlotReservationContext) -> SlotPermit:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_supplier_that_never_grants_with_nothing_out_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "conveyor.slots")
    supplier = GuardedSlotSupplier(NeverGrants(), stuck_warn_s=0.05)
    waiters = [asyncio.create_task(supplier.reserve_slot(CTX)) for _ in range(3)]
    await wait_until(lambda: supplier.stuck_warnings == 1, 2, what="the warning")
    await asyncio.sleep(0.1)  # a window in which no second line may come, not a wait
    for w in waiters:
        w.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    lines = [r.getMessage() for r in caplog.records if "granted no slot" in r.getMessage()]
    assert len(lines) == 1 and "NeverGrants" in lines[0] and "none in use" in lines[0]


async def test_a_slow_wait_while_slots_are_out_is_not_called_stuck() -> None:
    supplier = GuardedSlotSupplier(PacedSlotSupplier(max_slots=1), stuck_warn_s=0.05)
    held = await supplier.reserve_slot(CTX)
    waiter = asyncio.create_task(supplier.reserve_slot(CTX))
    await asyncio.sleep(0.1)  # past stuck_warn_s with one slot out: an ordinary wait
    assert supplier.stuck_warnings == 0 and not waiter.done()
    held.release()
    (await asyncio.wait_for(waiter, 1)).release()


class SlowRelease(SamePermit):
    def try_reserve_slot(self, ctx: SlotReservationContext) -> SlotPermit | None:
        return self.new_permit()

    def release_slot(self, reason: SlotReleaseReason, permit: SlotPermit) -> None:
        time.sleep(0.15)  # what the docs say not to do


async def test_a_release_slot_that_blocks_is_named_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "conveyor.slots")
    supplier = GuardedSlotSupplier(SlowRelease())
    for _ in range(2):
        permit = supplier.try_reserve_slot(CTX)
        assert permit is not None
        permit.release()
    lines = [r.getMessage() for r in caplog.records if "blocked the event loop" in r.getMessage()]
    assert supplier.blocked == 2 and len(lines) == 1
    assert lines[0].startswith("slot supplier SlowRelease.release_slot blocked")


async def test_a_hook_failing_on_every_call_is_logged_once_a_minute_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, "conveyor.slots")
    supplier = GuardedSlotSupplier(Buggy(), max_backoff_s=0.01)
    for _ in range(50):
        assert supplier.try_reserve_slot(CTX) is None
    (await asyncio.wait_for(supplier.reserve_slot(CTX), 2)).release()  # first call raised
    assert supplier.errors == 51
    records = [r for r in caplog.records if "reserve_slot" in r.getMessage()]
    assert [r.getMessage().split(" failed in ")[1][:16] for r in records] == [
        "try_reserve_slot", "reserve_slot; re"]
    assert all(r.exc_info for r in records)  # each with its traceback


class ForgotItsInit(SlotSupplier):
    """A supplier whose ``__init__`` does not call ``super().__init__()``."""

    def __init__(self, count: int) -> None:
        self.count = count

    async def reserve_slot(self, ctx: SlotReservationContext) -> SlotPermit:
        return self.new_permit()

    def try_reserve_slot(self, ctx: SlotReservationContext) -> SlotPermit | None:
        return self.new_permit()

    def release_slot(self, reason: SlotReleaseReason, permit: SlotPermit) -> None:
        self.count += 1  # counted, never looked at


@pytest.mark.parametrize(("make", "says"), [
    # The daemon started, and its first message crashed the queue's runner
    # ("'int' object has no attribute 'keep_slot'"); the heartbeat failed beside it.
    (lambda: WorkerDaemon(App("a"), Config(), slots=5),  # type: ignore[arg-type]
     "WorkerDaemon(slots): expected a conveyor.SlotSupplier, got int 5"),
    (lambda: WorkerDaemon(App("a"), Config(), slots=ForgotItsInit(2)),
     "WorkerDaemon(slots): ForgotItsInit.__init__ did not call super().__init__() (the "
     "base class keeps the counts the daemon reads)"),
    # Wrapped None: the guard logged an AttributeError at every reservation, for ever,
    # and nothing ran; the pauseable one crashed the runner.
    (lambda: GuardedSlotSupplier(None),  # type: ignore[arg-type]
     "GuardedSlotSupplier(inner): expected a conveyor.SlotSupplier, got NoneType None"),
    (lambda: PauseableSlotSupplier(FixedSlotSupplier),  # type: ignore[arg-type]
     "PauseableSlotSupplier(inner): expected a conveyor.SlotSupplier, got ABCMeta "
     "<class 'conveyor.workers.slots.fixed.FixedSlotSupplier'>"),
    # "4" failed inside ('<' between str and int); 1.5 ran as if it were a count.
    (lambda: FixedSlotSupplier("4"),  # type: ignore[arg-type]
     "a fixed slot supplier needs a whole number of slots, at least 1, got '4'"),
    (lambda: FixedSlotSupplier(1.5),  # type: ignore[arg-type]
     "a fixed slot supplier needs a whole number of slots, at least 1, got 1.5"),
])
def test_a_slot_supplier_of_the_wrong_kind_is_refused_where_it_is_given(
    make: Callable[[], object], says: str,
) -> None:
    with pytest.raises(InvalidArgumentError) as refused:
        make()
    assert str(refused.value) == says


def test_a_custom_supplier_that_skips_the_base_init_is_a_config_error_naming_the_field() -> None:
    config = load_config(environ={}, overrides={"slots": {
        "kind": "custom", "path": f"{__name__}:ForgotItsInit", "options": {"count": 2}}})
    with pytest.raises(ConfigError) as refused:
        supplier_from_config(config.slots)
    assert str(refused.value) == (
        f"$.slots.path: {__name__}:ForgotItsInit: ForgotItsInit.__init__ did not call "
        "super().__init__() (the base class keeps the counts the daemon reads)")
