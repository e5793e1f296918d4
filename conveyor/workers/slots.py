"""Slot suppliers: who may run how much, decided by pluggable policies.

A *slot* is the right to hold one message in flight, from the moment a pulling agent
asks its queue for it until every handler of it is done and it can be acknowledged.
Agents reserve slots *before* they pull, so an agent never asks the broker for more
messages than it holds slots for, and a message never arrives with nowhere to run.

The interface follows Temporal's worker-tuning proposal:

``reserve_slot(ctx)``
    Waits until a slot is free and returns a :class:`SlotPermit`. May block; is
    cancellable (a cancelled wait takes no slot).
``try_reserve_slot(ctx)``
    Never blocks; returns a permit or ``None``.
``mark_slot_used(info, permit)``
    The permit now carries a message. Must not block.
``release_slot(reason, permit)``
    The slot is free again; always called exactly once per permit, with
    ``TASK_COMPLETE``, ``NEVER_USED`` (pulled nothing for it, or shutting down) or
    ``ERROR``. Must not block.

Users do not call ``release_slot`` themselves: permits are released through
:meth:`SlotPermit.release` (idempotent) or by using the permit as an async context
manager, so a permit cannot leak.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

log = logging.getLogger("conveyor.slots")


class SlotReleaseReason(enum.Enum):
    TASK_COMPLETE = "task-complete"
    NEVER_USED = "never-used"
    ERROR = "error"


class SlotReservationContext(Protocol):
    """What a supplier may look at when deciding; values are live, not snapshots."""

    @property
    def queue(self) -> int: ...

    @property
    def handler(self) -> str:
        """The handler the slot is for, or ``"*"`` when reserved before pulling (any)."""
        ...

    @property
    def slots_issued(self) -> int: ...

    @property
    def slots_in_use(self) -> int: ...


@dataclass(frozen=True, slots=True)
class SlotInfo:
    """Handed to ``mark_slot_used``: what the slot is now used for."""

    queue: int
    handlers: tuple[str, ...]
    message_id: str
    stream_key: str


_permit_ids = itertools.count(1)


class SlotPermit:
    """The right to one slot. Release it exactly once; later releases are ignored."""

    __slots__ = ("_released", "_supplier", "_used", "id", "user_data")

    def __init__(self, supplier: SlotSupplier, user_data: Any = None) -> None:
        self.id = next(_permit_ids)
        self.user_data = user_data
        self._supplier = supplier
        self._used = False
        self._released = False

    @property
    def released(self) -> bool:
        return self._released

    @property
    def used(self) -> bool:
        return self._used

    def mark_used(self, queue: int, handler: str, message_id: str, stream_key: str) -> None:
        """The permit now carries a message; builds the SlotInfo only if someone reads it."""
        if self._used:
            return
        self._used = True
        supplier = self._supplier
        supplier.in_use += 1
        if supplier._wants_info:
            supplier._mark_used(SlotInfo(queue, (handler,), message_id, stream_key), self)

    def release(self, reason: SlotReleaseReason | None = None) -> None:
        if self._released:
            return
        self._released = True
        if reason is None:
            reason = SlotReleaseReason.TASK_COMPLETE if self._used else SlotReleaseReason.NEVER_USED
        self._supplier._release(reason, self)

    async def __aenter__(self) -> SlotPermit:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None and not issubclass(exc_type, asyncio.CancelledError):
            self.release(SlotReleaseReason.ERROR)
        else:
            self.release()


class SlotSupplier(ABC):
    """Base of every slot supplier; subclass it to write your own.

    Subclasses implement the four hooks. The base class keeps the counts the
    reservation context and the metrics show, and shields the daemon from exceptions in
    ``mark_slot_used``/``release_slot`` (they are logged, never raised into an agent).
    """

    def __init__(self) -> None:
        self.issued = 0
        self.in_use = 0
        # Skip building a SlotInfo per message for suppliers that do not look at it.
        self._wants_info = type(self).mark_slot_used is not SlotSupplier.mark_slot_used

    # -- the hooks a supplier implements ----------------------------------------
    @abstractmethod
    async def reserve_slot(self, ctx: SlotReservationContext) -> SlotPermit: ...

    @abstractmethod
    def try_reserve_slot(self, ctx: SlotReservationContext) -> SlotPermit | None: ...

    def mark_slot_used(self, info: SlotInfo, permit: SlotPermit) -> None:  # noqa: B027
        """Called once when a permit starts carrying a message. Must not block."""

    @abstractmethod
    def release_slot(self, reason: SlotReleaseReason, permit: SlotPermit) -> None: ...

    @property
    def available(self) -> int | None:
        """Slots that could be issued right now, when the supplier knows (metrics)."""
        return None

    # -- what agents call ------------------------------------------------------------
    def new_permit(self, user_data: Any = None) -> SlotPermit:
        """Create a permit; suppliers call this when they grant a slot."""
        self.issued += 1
        return SlotPermit(self, user_data)

    def _mark_used(self, info: SlotInfo, permit: SlotPermit) -> None:
        try:
            self.mark_slot_used(info, permit)
        except Exception:
            log.exception("slot supplier %s failed in mark_slot_used", type(self).__name__)

    def _release(self, reason: SlotReleaseReason, permit: SlotPermit) -> None:
        self.issued -= 1
        if permit.used:
            self.in_use -= 1
        try:
            self.release_slot(reason, permit)
        except Exception:
            log.exception("slot supplier %s failed in release_slot", type(self).__name__)


class FixedSlotSupplier(SlotSupplier):
    """A fixed number of slots, handed out first come, first served."""

    def __init__(self, count: int) -> None:
        if count < 1:
            raise ValueError(f"a fixed slot supplier needs at least 1 slot, got {count}")
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
            else:
                self._waiters.remove(waiter)
            raise
        return self.new_permit()

    def release_slot(self, reason: SlotReleaseReason, permit: SlotPermit) -> None:
        self._hand_back()

    def _hand_back(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1


def supplier_from_config(config: Any) -> SlotSupplier:
    """The slot supplier a ``[slots]`` config section describes.

    ``custom`` suppliers are user code: they are wrapped in a
    :class:`~conveyor.workers.pauseable.GuardedSlotSupplier` so their exceptions are
    contained. ``pauseable = true`` wraps any kind in a
    :class:`~conveyor.workers.pauseable.PauseableSlotSupplier`.
    """
    from conveyor.workers import pauseable

    supplier: SlotSupplier
    if config.kind == "fixed":
        supplier = FixedSlotSupplier(config.count)
    elif config.kind == "resource-based":
        from conveyor.workers.resource_slots import ResourceBasedSlotSupplier

        supplier = ResourceBasedSlotSupplier.from_config(config.resource)
    elif config.kind == "custom":
        supplier = pauseable.GuardedSlotSupplier(
            load_custom_supplier(config.path, getattr(config, "options", {}) or {})
        )
    else:
        raise ValueError(f"unknown slot supplier kind {config.kind!r} at $.slots.kind")
    if getattr(config, "pauseable", False):
        supplier = pauseable.PauseableSlotSupplier(supplier)
    return supplier


def load_custom_supplier(path: str, options: dict[str, Any]) -> SlotSupplier:
    """Build a user-written supplier from ``"package.module:Factory"`` and its options."""
    from conveyor.platform.errors import ConfigError
    from conveyor.platform.importing import load_attr

    factory = load_attr(path, "$.slots.path", form='"package.module:Factory"')
    try:
        supplier = factory(**options)
    except Exception as exc:
        raise ConfigError(f"$.slots.options: {path}(**options) failed: {exc!r}") from None
    if not isinstance(supplier, SlotSupplier):
        raise ConfigError(
            f"$.slots.path: {path} built {type(supplier).__name__}, not a SlotSupplier "
            "(subclass conveyor.workers.slots.SlotSupplier)"
        )
    return supplier
