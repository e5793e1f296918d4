"""Reading a server's own settings (its eviction policy, its persistence) on every
server the data lives on: the shared part of :mod:`~conveyor.adapters.redis.eviction`
and :mod:`~conveyor.adapters.redis.persistence`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio as aioredis
import redis.exceptions as rex

from conveyor.adapters.redis.connections import ClusterClient
from conveyor.adapters.redis.errors import CLUSTER_ERRORS, Caller

T = TypeVar("T")


def text(value: Any) -> str | None:
    """A reply's value as text (None stays None)."""
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


async def config_value(client: aioredis.Redis, name: str) -> str | None:
    """``CONFIG GET name`` (raises ``ResponseError`` where ``CONFIG`` is refused)."""
    reply: dict[Any, Any] = await client.config_get(name)
    return text(reply.get(name.encode(), reply.get(name)))


async def per_server(caller: Caller, what: str,
                     read_one: Callable[[aioredis.Redis], Awaitable[T]],
                     *, retry: bool, unreachable: dict[str, str] | None = None
                     ) -> dict[str, T]:
    """``read_one`` of each server the data lives on, by name: the caller's URL for one
    server (the primary Sentinel names), every primary's ``host:port`` on a cluster.
    Through ``caller``: retried for ``[redis] retry_max_s`` if ``retry``, else once.

    With ``unreachable`` (a dict to fill), a cluster's primary that does not answer is
    left out and named there with why, as long as another answers: a cluster with
    ``cluster-require-full-coverage no`` serves the other primaries' slots meanwhile."""

    async def read() -> dict[str, T]:
        redis = caller.redis
        if not isinstance(redis, ClusterClient):
            return {caller.url: await read_one(redis)}
        failed: dict[str, str] = {}
        out: dict[str, T] = {}
        try:
            clients = await redis.primary_clients()
            for name, client in sorted(clients.items()):
                try:
                    out[name] = await read_one(client)
                except (rex.ConnectionError, rex.TimeoutError, OSError, *CLUSTER_ERRORS) as exc:
                    if unreachable is None:
                        raise
                    failed[name] = str(exc) or type(exc).__name__
            if failed and not out:
                raise rex.ConnectionError("; ".join(failed.values()))
        except (rex.ConnectionError, rex.TimeoutError, OSError, *CLUSTER_ERRORS):
            redis.topology_changed()  # a primary failed over: the retry reads the new ones
            raise
        if failed and unreachable is not None:
            redis.topology_changed()
            unreachable.clear()
            unreachable.update(failed)
        return out

    if retry:
        return await caller.retrying(what, read)
    return await caller.once(what, read)


def summary(readings: dict[str, str]) -> str:
    """The reading, or each server's when they differ (``conveyor status``)."""
    values = set(readings.values())
    if len(values) == 1:
        return values.pop()
    return ", ".join(f"{server}={reading}" for server, reading in readings.items())
