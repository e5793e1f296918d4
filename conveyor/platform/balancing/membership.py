"""Who is alive: the daemons of one app, as every daemon sees them.

A membership store keeps one record per live daemon. Every daemon reads the same
ordered view, which is all a deterministic balancer needs. The memory form serves
daemons inside one process; the Redis form (heartbeats, TTLs) spans machines.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import time
import uuid
from abc import ABC, abstractmethod

import msgspec

from conveyor.version import version


class MemberInfo(msgspec.Struct, frozen=True):
    """A daemon as its membership record says, rewritten with fresh ``stats`` every
    heartbeat.

    Fields added later have defaults, so a record written by an older daemon still
    decodes (as ``""``: version unknown). What changes while a daemon runs is a number
    in ``stats`` (see ``DaemonMetrics.stats_snapshot``); only what is fixed for its life
    is a field of its own.
    """

    id: str
    host: str
    pid: int
    started_at: float
    stats: dict[str, float] = {}
    version: str = ""
    """Conveyor's version the daemon runs; ``""`` from a daemon that predates the field."""

    @classmethod
    def for_this_process(cls, prefix: str = "") -> MemberInfo:
        host = socket.gethostname()
        suffix = uuid.uuid4().hex[:8]
        return cls(
            id=f"{prefix}{host}-{os.getpid()}-{suffix}",
            host=host,
            pid=os.getpid(),
            started_at=time.time(),
            version=version(),
        )


def timer_phase(member_id: str) -> float:
    """Where in their periods a member's timers start, as a fraction in [0, 1).

    Drawn from the id (``random.Random`` hashes a ``str`` seed with SHA-512, never with
    the salted ``hash()``), so a simulation replays it; different for every member, so
    a thousand daemons started together do not heartbeat, renew and poll in step.
    """
    return random.Random(member_id).random()


class Membership(ABC):
    """A view of live members, plus a way to wait for it to change."""

    @abstractmethod
    async def join(self, member: MemberInfo) -> None: ...

    @abstractmethod
    async def leave(self, member_id: str) -> None: ...

    @abstractmethod
    async def heartbeat(self, member: MemberInfo) -> None:
        """Prove this member is still alive (and publish its latest stats)."""

    @abstractmethod
    async def members(self) -> list[MemberInfo]:
        """Live members ordered by id: every caller sees the same order."""

    @abstractmethod
    async def wait_changed(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a join or leave; True if one happened."""

    async def version(self) -> int | None:
        """A number that changes whenever a member joins, leaves or lapses — never on a
        heartbeat — and costs next to nothing to read; None if this store cannot tell
        (then a balancer re-reads the whole view every interval)."""
        return None

    async def member_ids(self) -> list[str]:
        """The live members' ids, sorted: the view without the records (cheaper where
        records are large and the caller needs no statistics)."""
        return [m.id for m in await self.members()]

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and background tasks (idempotent)."""


class MemoryMembership(Membership):
    """In-process membership: daemons in one process share one instance."""

    def __init__(self) -> None:
        self._members: dict[str, MemberInfo] = {}
        self._changed = asyncio.Event()
        self._version = 0

    async def join(self, member: MemberInfo) -> None:
        self._members[member.id] = member
        self._bump()

    async def leave(self, member_id: str) -> None:
        if self._members.pop(member_id, None) is not None:
            self._bump()

    async def heartbeat(self, member: MemberInfo) -> None:
        if member.id in self._members:
            self._members[member.id] = member

    async def members(self) -> list[MemberInfo]:
        return [self._members[k] for k in sorted(self._members)]

    async def member_ids(self) -> list[str]:
        return sorted(self._members)

    async def version(self) -> int:
        return self._version

    def _bump(self) -> None:
        self._version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_changed(self, timeout_s: float) -> bool:
        event = self._changed
        try:
            async with asyncio.timeout(timeout_s):  # wait_for can lose a cancel (3.11)
                await event.wait()
        except TimeoutError:
            return False
        return True
