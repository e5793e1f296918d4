"""The slot-supplier port: who may run how much, decided by pluggable policies.

A *slot* is the right to run one handler call: a pulling agent's runner reserves one
before it takes a message's next handler call and releases it when the call returns,
so the supplier bounds how much work runs at once. (What is pulled ahead is bounded by
each agent's cache, not by slots: an idle queue holds none.)

The interface follows Temporal's worker-tuning proposal:

``reserve_slot(ctx)``
    Waits until a slot is free and returns a :class:`SlotPermit`. May block; is
    cancellable (a cancelled wait takes no slot).
``try_reserve_slot(ctx)``
    Never blocks; returns a permit or ``None``.
``mark_slot_used(info, permit)``
    The permit now carries a handler call. Must not block.
``release_slot(reason, permit)``
    The slot is free again; always called exactly once per permit, with
    ``TASK_COMPLETE``, ``NEVER_USED`` (reserved, then not needed, or shutting down) or
    ``ERROR``. Must not block.

Users do not call ``release_slot`` themselves: permits are released through
:meth:`SlotPermit.release` (idempotent) or by using the permit as an async context
manager, so a permit cannot leak.

This module is the port: what agents' runners hold (:class:`SlotPermit`) and
what every supplier implements (:class:`SlotSupplier`). The suppliers themselves live in
``conveyor.workers.slots``: ``fixed``, ``resource``, ``wrappers`` (pauseable, guarded),
``rate``, and ``build`` makes the one a ``[slots]`` section describes.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

from conveyor.platform.errors import InvalidArgumentError

log = logging.getLogger("conveyor.slots")


class SlotReleaseReason(enum.Enum):
    """Why a slot was given back: its message was handled, it never carried one (nothing
    was pulled for it, or the daemon is stopping), or handling it failed."""

    TASK_COMPLETE = "task-complete"
    NEVER_USED = "never-used"
    ERROR = "error"


class SlotReservationContext(Protocol):
    """What a supplier may look at when deciding; values are live, not snapshots."""

    @property
    def queue(self) -> int: ...

    @property
    def handler(self) -> str:
        """The handler the slot is for, or ``"*"`` when not yet known (a runner reserves its
        slot before it takes a lane, so the built-in agents always pass ``"*"``)."""
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
        """The permit now carries a handler call; builds the SlotInfo only if someone reads it."""
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

    def keep_slot(self, permit: SlotPermit) -> bool:
        """May a runner that just finished a call on ``permit`` start its next call on it
        at once, rather than release it and reserve again? Must not block.

        Default no: every call is reserved anew, which is what rate limits and resource
        checks rely on. The fixed supplier says yes while nobody waits for a slot: the
        number of calls running at once is the same, and a permit per call is saved.
        """
        return False

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
        if permit._used:
            self.in_use -= 1
        try:
            self.release_slot(reason, permit)
        except Exception:
            log.exception("slot supplier %s failed in release_slot", type(self).__name__)


class TokenSource(Protocol):
    """A rate limiter's tokens for ``[slots.rate]``: in the daemon, or a bucket a backend
    shares between daemons. ``take(want)`` returns how many were granted (0..want) and,
    when fewer than wanted, how long until the next one is due."""

    async def take(self, want: int) -> tuple[int, float]: ...

    async def close(self) -> None: ...


def require_supplier(value: object, where: str) -> SlotSupplier:
    """``value``, refused (:class:`InvalidArgumentError`, naming ``where``) unless it is a
    slot supplier whose ``__init__`` ran the base class's: anything else failed at the
    first message, inside a queue's runner."""
    if not isinstance(value, SlotSupplier):
        raise InvalidArgumentError(
            f"{where}: expected a conveyor.SlotSupplier, got {type(value).__name__} "
            f"{value!r:.80}")
    if not hasattr(value, "issued"):
        raise InvalidArgumentError(
            f"{where}: {type(value).__name__}.__init__ did not call super().__init__() "
            "(the base class keeps the counts the daemon reads)")
    return value
