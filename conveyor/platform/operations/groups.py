"""Consumer groups on the queues: what each holds, who holds retention back, removing one.

Queues are shared by every app of one Redis prefix or Kafka topic, and each app is a
consumer group on them. A group nobody runs any more (an app retired, or a typo given
to ``conveyor rewind``) still has a position, and on backends whose retention keeps
what any group has not finished (Redis, memory) it stops trimming for good.
``conveyor status`` and ``conveyor groups list`` show every group; ``conveyor groups
delete`` removes one, refusing while its daemons look alive.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from conveyor.platform.errors import AppAliveError, UnknownGroupError
from conveyor.platform.ids import SequenceToken

if TYPE_CHECKING:
    from conveyor.platform.adapter import QueueAdapter
    from conveyor.platform.balancing.leases import LeaseStore
    from conveyor.platform.balancing.membership import Membership

RECENT_READ_S = 10.0
"""A group read this recently is taken to have a live daemon: one not in the membership
store (a ``static`` balancer on the memory store) still polls every poll timeout."""


@dataclass(frozen=True)
class GroupInfo:
    """One consumer group on one queue, as the backend reports it."""

    group: str
    queue: int
    lag: int
    """Messages of the queue the group has not finished (undelivered + unacknowledged)."""
    idle_s: float | None = None
    """Seconds since a consumer of the group last read the queue; None if none ever
    did or the backend cannot tell (Redis tells; Kafka and memory do not)."""
    members: int | None = None
    """Live members the backend itself tracks for the group (Kafka's group membership);
    None where it keeps none (Redis, memory: see the membership store)."""
    oldest_needed: SequenceToken | None = None
    """The oldest message the group still needs (pending, or the next to deliver);
    None when it needs nothing kept or the backend's retention ignores groups."""
    oldest_needed_ms: int | None = None
    """When ``oldest_needed`` was enqueued (ms since the epoch)."""
    holds_retention: bool = False
    """Trimming of this queue waits for this group: its ``oldest_needed`` is the
    queue's oldest needed by any group."""
    appended: int | None = None
    """Messages ever appended to the queue — its end position, the same for every group
    (Redis: entries-added; Kafka: the high watermark); read twice, it gives the rate
    messages arrive at. None where the backend cannot tell."""


def with_retention_holders(infos: Sequence[GroupInfo]) -> list[GroupInfo]:
    """``infos`` of one queue, with ``holds_retention`` set on the group(s) needing the
    oldest message (for backends whose retention keeps what any group needs)."""
    needed = [i.oldest_needed for i in infos if i.oldest_needed is not None]
    if not needed:
        return list(infos)
    oldest = min(needed)
    return [dataclasses.replace(i, holds_retention=i.oldest_needed == oldest) for i in infos]


@dataclass(frozen=True)
class GroupStatus:
    """One group over all the queues: a row of ``conveyor status`` and ``groups list``."""

    group: str
    queues: list[int]
    """Queues it has a position on."""
    lag: int
    """Summed over ``queues``."""
    idle_s: float | None
    """Since a consumer of it last read any queue (None: never, or unknown)."""
    members: int | None
    """Live members in the broker's own group (Kafka), else None."""
    holds_retention: list[int] = field(default_factory=list)
    """Queues whose trimming waits for this group."""
    oldest_needed_ms: int | None = None
    """Enqueue time of the oldest message it still needs on any queue (ms)."""


def summarise(infos: Iterable[GroupInfo]) -> list[GroupStatus]:
    """Per-queue infos folded into one :class:`GroupStatus` per group, by name."""
    by_group: dict[str, list[GroupInfo]] = {}
    for info in infos:
        by_group.setdefault(info.group, []).append(info)
    out = []
    for name in sorted(by_group):
        rows = by_group[name]
        idle = [r.idle_s for r in rows if r.idle_s is not None]
        members = [r.members for r in rows if r.members is not None]
        needed = [r.oldest_needed_ms for r in rows if r.oldest_needed_ms is not None]
        out.append(GroupStatus(
            group=name,
            queues=sorted(r.queue for r in rows),
            lag=sum(r.lag for r in rows),
            idle_s=min(idle) if idle else None,
            members=max(members) if members else None,
            holds_retention=sorted(r.queue for r in rows if r.holds_retention),
            oldest_needed_ms=min(needed) if needed else None,
        ))
    return out


def queue_ranges(queues: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5``: queue lists stay short in one-line messages."""
    spans: list[list[int]] = []
    for q in sorted(set(queues)):
        if spans and q == spans[-1][1] + 1:
            spans[-1][1] = q
        else:
            spans.append([q, q])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def no_group_error(group: str, queues: Sequence[int], fix: str) -> UnknownGroupError:
    return UnknownGroupError(
        f"app {group!r} has no consumer group on queue(s) {queue_ranges(queues)} (a typo, "
        f"or an app that never ran; `conveyor groups list` shows the groups there): {fix}"
    )


async def live_signs(group: str, infos: Sequence[GroupInfo], membership: Membership,
                     leases: LeaseStore) -> list[str]:
    """Why app ``group`` looks alive, one phrase per sign; empty when nothing says so.

    Signs: daemons in the membership store, queue leases held, members of the broker's
    own group (Kafka), or a queue read within :data:`RECENT_READ_S` (Redis).
    """
    signs: list[str] = []
    members = await membership.members()
    if members:
        signs.append(f"daemon(s) {', '.join(m.id for m in members)} registered")
    owners = await leases.owners()
    if owners:
        signs.append(f"leases held on queue(s) {queue_ranges(owners)}")
    mine = [i for i in infos if i.group == group]
    in_group = max((i.members or 0 for i in mine), default=0)
    if in_group:
        signs.append(f"{in_group} member(s) in the broker's consumer group")
    idle = [i.idle_s for i in mine if i.idle_s is not None and i.idle_s < RECENT_READ_S]
    if idle:
        signs.append(f"a queue read {min(idle):.1f}s ago")
    return signs


async def delete_app_group(adapter: QueueAdapter, membership: Membership, leases: LeaseStore,
                           group: str, queues: Sequence[int], *, force: bool = False,
                           dead_letters: bool = False) -> list[int]:
    """Remove app ``group``'s consumer group from ``queues``; the queues it was on.

    Refused with :class:`UnknownGroupError` when the group is on none of them, and with
    :class:`AppAliveError` while the app looks alive (:func:`live_signs`) unless
    ``force``: a daemon still running would recreate its group at the start of each
    queue it reads and handle every retained message again. Both checks come before
    anything is removed. Dead letters are kept unless ``dead_letters``.
    """
    infos = await adapter.groups.on(queues)
    if not any(i.group == group for i in infos):
        raise no_group_error(group, queues, "nothing was deleted")
    if not force:
        signs = await live_signs(group, infos, membership, leases)
        if signs:
            raise AppAliveError(  # the way past it is the caller's to name (force=True,
                # the CLI's --force; the console has none)
                f"app {group!r} looks alive ({'; '.join(signs)}): stop its workers first"
            )
    return await adapter.groups.delete(group, queues, dead_letters=dead_letters)
