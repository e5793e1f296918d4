"""Suppliers that wrap another supplier: the pauseable one, and the guard for user code.

A wrapper issues its *own* permit for every permit of the inner supplier (the inner
one rides in ``user_data``), so the counts the agents and metrics read are the
wrapper's, and releasing the outer permit releases the inner one with the same reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from conveyor.platform.backoff import Backoff
from conveyor.platform.errors import SlotSupplierError
from conveyor.platform.slots import (
    SlotInfo,
    SlotPermit,
    SlotReleaseReason,
    SlotReservationContext,
    SlotSupplier,
    require_supplier,
)

log = logging.getLogger("conveyor.slots")

BLOCKED_WARN_S = 0.1
"""A user supplier's ``mark_slot_used``/``release_slot`` taking this long is reported."""
BLOCKED_LOG_INTERVAL_S = 60.0
"""At most one line this often per hook that blocks or fails (the rest are counted)."""


class DelegatingSlotSupplier(SlotSupplier):
    """Forwards every hook to ``inner``; subclasses change what they need."""

    def __init__(self, inner: SlotSupplier) -> None:
        super().__init__()
        self.inner = require_supplier(inner, f"{type(self).__name__}(inner)")

    @property
    def available(self) -> int | None:
        return self.inner.available

    async def close(self) -> None:
        """Stop the inner supplier's background work, if it has any (e.g. sampling)."""
        close = getattr(self.inner, "close", None)
        if close is not None:
            await close()

    def _wrap(self, inner_permit: SlotPermit) -> SlotPermit:
        return self.new_permit(inner_permit)

    async def reserve_slot(self, ctx: SlotReservationContext) -> SlotPermit:
        return self._wrap(await self.inner.reserve_slot(ctx))

    def try_reserve_slot(self, ctx: SlotReservationContext) -> SlotPermit | None:
        permit = self.inner.try_reserve_slot(ctx)
        return None if permit is None else self._wrap(permit)

    def mark_slot_used(self, info: SlotInfo, permit: SlotPermit) -> None:
        inner: SlotPermit = permit.user_data
        inner.mark_used(info.queue, info.handlers[0], info.message_id, info.stream_key)

    def release_slot(self, reason: SlotReleaseReason, permit: SlotPermit) -> None:
        inner: SlotPermit = permit.user_data
        inner.release(reason)

    def keep_slot(self, permit: SlotPermit) -> bool:
        """What the inner supplier says of the inner permit (without this, a wrapped
        fixed supplier reserved every call anew: a wake-up a call under I/O load)."""
        return self.inner.keep_slot(permit.user_data)


class PauseableSlotSupplier(DelegatingSlotSupplier):
    """Wraps any supplier; while paused no new slot is handed out.

    ``pause()`` makes ``reserve_slot`` wait until ``resume()`` and ``try_reserve_slot``
    return ``None``. A reservation already waiting on the inner supplier when the pause
    came, and granted while still paused, goes back to the inner supplier (released as
    ``NEVER_USED``) and the caller keeps waiting: a paused daemon starts no new work.
    Slots already handed out are untouched; their messages finish normally.
    """

    def __init__(self, inner: SlotSupplier) -> None:
        super().__init__(inner)
        self._running = asyncio.Event()
        self._running.set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    @property
    def available(self) -> int | None:
        return 0 if self.paused else self.inner.available

    async def reserve_slot(self, ctx: SlotReservationContext) -> SlotPermit:
        while True:
            await self._running.wait()
            permit = await self.inner.reserve_slot(ctx)
            if not self.paused:
                return self._wrap(permit)
            permit.release(SlotReleaseReason.NEVER_USED)  # obtained while paused: give back

    def try_reserve_slot(self, ctx: SlotReservationContext) -> SlotPermit | None:
        if self.paused:
            return None
        return super().try_reserve_slot(ctx)

    def keep_slot(self, permit: SlotPermit) -> bool:
        """Never while paused: a kept slot would start the next call."""
        return not self.paused and super().keep_slot(permit)


class GuardedSlotSupplier(DelegatingSlotSupplier):
    """Wraps a user-written supplier so its bugs cannot kill the daemon.

    * ``reserve_slot`` raising is logged and retried with back-off (up to
      ``max_backoff_s``); ``CancelledError`` always propagates.
    * ``try_reserve_slot`` raising counts as "no slot".
    * Each hook's failures are logged with a traceback at most once a minute (with
      the count of those not logged); ``errors`` counts every one.
    * A hook returning something that is not a permit of that supplier is an error
      treated the same way.
    * A permit handed out twice (one still out, or one already released) is an error
      treated the same way: a supplier that grants more than it was asked for would
      otherwise run more handler calls than it counts.
    * ``mark_slot_used`` / ``release_slot`` are already shielded by
      :class:`SlotSupplier`: their exceptions are logged, and the slot is still freed.
    * ``mark_slot_used`` / ``release_slot`` taking ``BLOCKED_WARN_S`` or more is
      logged naming the supplier and the hook (at most once a minute; ``blocked``
      counts them).
    * A reservation still waiting after ``stuck_warn_s`` while the supplier has no slot
      out is logged once (a warning) until the supplier grants again: with nothing
      running, nothing will ever release a slot, and the daemon would sit silent.

    ``errors`` counts every contained exception (a metric worth alerting on).
    """

    def __init__(self, inner: SlotSupplier, max_backoff_s: float = 1.0,
                 stuck_warn_s: float = 10.0) -> None:
        super().__init__(inner)
        self.max_backoff_s = max_backoff_s
        self.stuck_warn_s = stuck_warn_s
        self._backoff = Backoff(first_s=0.01, cap_s=max_backoff_s)
        self._out: set[SlotPermit] = set()
        self._stuck_logged = False
        self.errors = 0
        self.stuck_warnings = 0
        self.blocked = 0
        self._next_blocked_log = 0.0
        self._next_failure_log: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    @property
    def available(self) -> int | None:
        try:
            return self.inner.available
        except Exception:
            self.errors += 1
            return None

    def _check(self, permit: Any, hook: str) -> SlotPermit:
        if not isinstance(permit, SlotPermit) or permit._supplier is not self.inner:
            raise SlotSupplierError(
                f"{type(self.inner).__name__}.{hook} returned {permit!r}; "
                "return self.new_permit() (or None from try_reserve_slot)"
            )
        if permit.released or permit in self._out:
            raise SlotSupplierError(
                f"{type(self.inner).__name__}.{hook} returned a permit it had already "
                "handed out; return a new self.new_permit() for every slot"
            )
        return permit

    def _wrap(self, inner_permit: SlotPermit) -> SlotPermit:
        self._out.add(inner_permit)
        self._stuck_logged = False
        return self.new_permit(inner_permit)

    def mark_slot_used(self, info: SlotInfo, permit: SlotPermit) -> None:
        began = time.perf_counter()
        super().mark_slot_used(info, permit)
        self._timed("mark_slot_used", began)

    def release_slot(self, reason: SlotReleaseReason, permit: SlotPermit) -> None:
        self._out.discard(permit.user_data)
        began = time.perf_counter()
        super().release_slot(reason, permit)
        self._timed("release_slot", began)

    def _timed(self, hook: str, began: float) -> None:
        """Name a hook that blocked the event loop (the loop watchdog would blame the
        handler whose call it ran after); one line per ``BLOCKED_LOG_INTERVAL_S``."""
        took_s = time.perf_counter() - began
        if took_s < BLOCKED_WARN_S:
            return
        self.blocked += 1
        now = time.monotonic()
        if now >= self._next_blocked_log:
            self._next_blocked_log = now + BLOCKED_LOG_INTERVAL_S
            log.warning(
                "slot supplier %s.%s blocked the event loop for %.2fs: it must not block "
                "(hand slow work to reserve_slot); %d such call(s) so far",
                type(self.inner).__name__, hook, took_s, self.blocked,
            )

    def _waited_long(self, ctx: SlotReservationContext) -> None:
        """A reservation has waited ``stuck_warn_s``: say so once if nothing is out."""
        if self.issued or self._stuck_logged:
            return
        self._stuck_logged = True
        self.stuck_warnings += 1
        log.warning(
            "slot supplier %s has granted no slot for %gs (queue %s waiting, none in use, "
            "%d error(s)): no handler starts until its reserve_slot returns a permit",
            type(self.inner).__name__, self.stuck_warn_s, ctx.queue, self.errors,
        )

    async def reserve_slot(self, ctx: SlotReservationContext) -> SlotPermit:
        timer = asyncio.get_running_loop().call_later(self.stuck_warn_s, self._waited_long, ctx)
        try:
            return await self._reserve(ctx)
        finally:
            timer.cancel()

    async def _reserve(self, ctx: SlotReservationContext) -> SlotPermit:
        failures = 0
        while True:
            try:
                permit = self._check(await self.inner.reserve_slot(ctx), "reserve_slot")
            except asyncio.CancelledError:
                raise
            except Exception:
                failures += 1
                delay_s = self._backoff.delay(failures)
                self._failed("reserve_slot", f"; retrying in {delay_s:.2f}s")
                await asyncio.sleep(delay_s)
                continue
            return self._wrap(permit)

    def keep_slot(self, permit: SlotPermit) -> bool:
        """The inner supplier's answer; raising counts as no."""
        try:
            return bool(self.inner.keep_slot(permit.user_data))
        except Exception:
            self._failed("keep_slot")
            return False

    def try_reserve_slot(self, ctx: SlotReservationContext) -> SlotPermit | None:
        try:
            permit = self.inner.try_reserve_slot(ctx)
            return None if permit is None else self._wrap(self._check(permit, "try_reserve_slot"))
        except Exception:
            self._failed("try_reserve_slot")
            return None

    def _failed(self, hook: str, then: str = "") -> None:
        """Count a contained exception; log it with its traceback, at most once per
        ``BLOCKED_LOG_INTERVAL_S`` a hook (a broken hook fails on every message, from
        every queue), saying how many went unlogged meanwhile."""
        self.errors += 1
        self._unlogged[hook] = self._unlogged.get(hook, 0) + 1
        now = time.monotonic()
        if now < self._next_failure_log.get(hook, 0.0):
            return
        self._next_failure_log[hook] = now + BLOCKED_LOG_INTERVAL_S
        more = self._unlogged.pop(hook) - 1
        log.exception(
            "slot supplier %s failed in %s%s%s", type(self.inner).__name__, hook, then,
            f" ({more} more failure(s) of it in the last {BLOCKED_LOG_INTERVAL_S:.0f}s; "
            f"{self.errors} in all)" if more else "",
        )
