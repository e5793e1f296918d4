"""Queue ownership as leases with fencing tokens.

A daemon pulls a queue only while it holds that queue's lease. A lease expires
``ttl_s`` after it was last granted or renewed unless renewed; every grant carries a
fencing token larger than any before it for that queue, so a store can refuse the
acknowledgements of an owner whose lease has moved on.

Holders keep a *local* deadline (monotonic clock, taken before the request was sent):
an owner stops acting on a lease once that deadline passes, whether or not the store
has expired it yet, so two owners never pull one queue at once as long as clocks tick
at the same rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Lease:
    queue: int
    owner: str
    token: int
    """Fencing token: strictly increasing per queue across grants."""
    deadline: float
    """Local ``time.monotonic()`` after which the holder must consider it lost."""


class LeaseStore(ABC):
    @abstractmethod
    async def acquire(self, queue: int, owner: str, ttl_s: float) -> Lease | None:
        """Grant the lease if free (or expired); None if someone else holds it."""

    @abstractmethod
    async def renew(self, lease: Lease, ttl_s: float) -> Lease | None:
        """Extend a lease still held with the same token; None if it was lost."""

    @abstractmethod
    async def release(self, lease: Lease) -> bool:
        """Give the lease up (only if still held with the same token): True if this
        removed it, False if it was no longer held with that token (it lapsed, or was
        granted to another since). Raises when the store cannot be asked; the lease then
        lapses at the end of its TTL."""

    @abstractmethod
    async def owners(self) -> dict[int, str]:
        """Current holder of every leased queue."""

    async def wait_released(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for some lease to be released (stores may ignore)."""
        await asyncio.sleep(timeout_s)

    async def note_stall(self, queue: int, message_id: str, what: str) -> None:  # noqa: B027
        """Record, where the next owner of ``queue`` reads it when the message comes back,
        that ``message_id`` stalled its worker past the lease (``what`` says how); the
        delivery limit's dead letter then names it. Stores may ignore it."""

    async def generation(self) -> int | None:
        """A number that changes whenever a lease is granted or released (not when one
        is renewed or lapses) and costs next to nothing to read; None if this store
        cannot tell (then a balancer re-reads every holder every interval)."""
        return None

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections (idempotent)."""


class MemoryLeaseStore(LeaseStore):
    """Leases for daemons inside one process."""

    def __init__(self) -> None:
        self._held: dict[int, tuple[str, int, float]] = {}  # queue -> owner, token, expiry
        self._tokens: dict[int, int] = {}
        self._released = asyncio.Event()
        self._generation = 0

    async def acquire(self, queue: int, owner: str, ttl_s: float) -> Lease | None:
        now = time.monotonic()
        held = self._held.get(queue)
        if held is not None and held[2] > now and held[0] != owner:
            return None
        token = self._tokens.get(queue, 0) + 1
        self._tokens[queue] = token
        self._held[queue] = (owner, token, now + ttl_s)
        self._generation += 1
        return Lease(queue, owner, token, now + ttl_s)

    async def renew(self, lease: Lease, ttl_s: float) -> Lease | None:
        now = time.monotonic()
        held = self._held.get(lease.queue)
        if held is None or held[1] != lease.token or held[2] <= now:
            return None
        self._held[lease.queue] = (lease.owner, lease.token, now + ttl_s)
        return Lease(lease.queue, lease.owner, lease.token, now + ttl_s)

    async def release(self, lease: Lease) -> bool:
        held = self._held.get(lease.queue)
        if held is None or held[1] != lease.token:
            return False
        del self._held[lease.queue]
        self._generation += 1
        self._released.set()
        self._released = asyncio.Event()
        return True

    async def owners(self) -> dict[int, str]:
        now = time.monotonic()
        return {q: h[0] for q, h in sorted(self._held.items()) if h[2] > now}

    async def generation(self) -> int:
        return self._generation

    async def wait_released(self, timeout_s: float) -> None:
        event = self._released
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):  # wait_for can lose a cancel (3.11)
                await event.wait()
