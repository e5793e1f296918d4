"""Consumer groups on Redis streams (the adapter's ``groups`` facet): listing them and
removing one.

Every app is a consumer group on every stream of the prefix. The trim script
(:data:`~conveyor.adapters.redis.scripts.TRIM_ACKED`) keeps every entry from the oldest
one any group still needs — its oldest pending entry, or the entry after its last
delivered one — so a group nobody reads stops trimming for good; :meth:`RedisGroups.on`
names it (``holds_retention``) and :meth:`RedisGroups.delete` removes it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis.exceptions as rex

from conveyor.adapters.redis.errors import Caller, wrong_type
from conveyor.adapters.redis.keys import Keys, check_name, stream_id, token_of
from conveyor.platform.adapter import ConsumerGroups
from conveyor.platform.operations.groups import GroupInfo, with_retention_holders

CountAfter = Callable[[str, bytes | str, bytes | str], Awaitable[int]]
"""Entries of a stream in ``(first, last]``, counted on the server (the adapter's)."""
StreamTail = Callable[[str], Awaitable[bytes | None]]
"""The id of a stream's last entry, None where no stream is (the adapter's)."""


def undelivered(group: Any, tail: bytes) -> int | None:
    """Entries after ``group``'s position (an ``XINFO GROUPS`` entry) on a stream whose
    last entry is ``tail``: Redis's lag, but none when the position is at or past every
    entry — a rewind forward past the end (``--allow-forward``) sets it there, and
    entries published before the ids pass it are never delivered, yet Redis counts each
    as lag (entries added since the rewind). None when Redis cannot tell."""
    if stream_id(group["last-delivered-id"]) >= stream_id(tail):
        return 0
    lag = group.get("lag")
    return None if lag is None else int(lag)


class RedisGroups(ConsumerGroups):
    """Every app's consumer groups on one Redis prefix."""

    def __init__(self, redis: Any, caller: Caller, keys: Keys, count_after: CountAfter,
                 stream_tail: StreamTail) -> None:
        self._redis = redis
        self._caller = caller
        self._keys = keys
        self._count_after = count_after
        self._stream_tail = stream_tail

    async def on(self, queues: Sequence[int]) -> list[GroupInfo]:
        """``XINFO GROUPS`` / ``XINFO CONSUMERS`` of every stream of ``queues``; a key
        of another type where a stream belongs has none
        (:meth:`~conveyor.adapters.redis.adapter.RedisAdapter.store_problems` names it)."""
        out: list[GroupInfo] = []
        for queue in queues:

            async def read(queue: int = queue) -> list[GroupInfo]:
                return await self._queue_groups(queue)

            out += await self._caller.retrying(f"reading the groups of queue {queue}", read)
        return out

    async def _queue_groups(self, queue: int) -> list[GroupInfo]:
        redis = self._redis
        stream = self._keys.queue(queue)
        tail = await self._stream_tail(stream)
        if tail is None:  # no stream (or a key of another type: store_problems names it)
            return []
        try:
            groups = await redis.xinfo_groups(stream)
        except rex.ResponseError as exc:
            if wrong_type(exc):  # no stream: no group (store_problems names the key)
                return []
            raise
        infos = []
        for g in groups:
            name = g["name"].decode()
            pending = int(g["pending"])
            last: bytes = g["last-delivered-id"]
            appended = _appended(g.get("entries-read"), g.get("lag"), last)
            unread = undelivered(g, tail)
            if unread is None:  # Redis cannot tell (after deletions): count
                unread = await self._count_after(stream, last, "+")
            consumers = await redis.xinfo_consumers(stream, name)
            idle_s = min(int(c["idle"]) for c in consumers) / 1000 if consumers else None
            if pending:
                first = (await redis.xpending(stream, name))["min"]
            else:
                after = await redis.xrange(stream, b"(" + last, "+", count=1)
                first = after[0][0] if after else None
            needed = token_of(first, queue) if first else None
            infos.append(GroupInfo(
                name, queue, pending + unread, idle_s=idle_s, oldest_needed=needed,
                oldest_needed_ms=needed.major if needed else None, appended=appended,
            ))
        return with_retention_holders(infos)

    async def delete(self, group: str, queues: Sequence[int], *,
                     dead_letters: bool = False) -> list[int]:
        """``XGROUP DESTROY`` on every stream, then the app's own keys
        (``{prefix}:app:{app}:*``: leases, fencing counters, membership, fenced-ack
        counts) and, if asked, its dead letters. Each step is idempotent: re-running a
        delete that failed half-way finishes it.
        """
        check_name(group, "app name")
        redis = self._redis
        removed = []
        for queue in queues:
            stream = self._keys.queue(queue)

            async def destroy(stream: str = stream) -> bool:
                return bool(await redis.exists(stream)) and bool(
                    await redis.xgroup_destroy(stream, group)
                )

            if await self._caller.retrying(f"deleting group {group!r} on queue {queue}",
                                           destroy):
                removed.append(queue)

        async def delete_keys() -> None:
            # The app name and prefix hold no glob characters (check_name), so the pattern
            # matches this app's keys only.
            keys = [k async for k in redis.scan_iter(match=f"{self._keys.app(group)}:*",
                                                       count=1000)]
            if dead_letters:
                keys.append(self._keys.dead_letters(group))
            if keys:
                await redis.delete(*keys)

        await self._caller.retrying(f"deleting the keys of app {group!r}", delete_keys)
        return removed


def _appended(read: Any, undelivered: Any, last: bytes) -> int | None:
    """Entries ever added to the stream, from ``XINFO GROUPS`` alone (Redis 7: lag =
    entries-added - entries-read); a group that never read has no entries-read, and
    then its lag is all of them. None when Redis cannot tell."""
    if undelivered is None:
        return None
    if read is None:
        return int(undelivered) if last in (b"0-0", "0-0") else None
    return int(read) + int(undelivered)
