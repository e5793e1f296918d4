"""The Redis adapter on a local Redis Cluster, beyond the contract suite (tests/contract)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from conveyor.adapters.redis import RedisAdapter
from conveyor.platform.config import load_config
from tests.servers import RedisClusterServers

pytestmark = [pytest.mark.redis, pytest.mark.redis_cluster]


async def test_a_daemon_reads_more_queues_at_once_than_redis_pys_cluster_pool_allows(
    redis_cluster: RedisClusterServers,
) -> None:
    """Each queue being read holds a connection (a blocking XREADGROUP): 400 queues put
    ~130 on each primary, past the 100 connections redis-py's cluster client allows a
    node by default, which fails the surplus calls at once (MaxConnectionsError)."""
    total = 400
    config = load_config(None, environ={}, overrides={
        "queues": {"adapter": "redis", "total": total},
        "redis": {"mode": "cluster", "url": redis_cluster.url,
                  "prefix": f"wide-{uuid.uuid4().hex[:8]}"},
        "balancer": {"membership": "redis"},
    })
    adapter = RedisAdapter(config.redis)
    try:
        receivers = [adapter.create_receiver(q, "wide") for q in range(total)]
        await asyncio.gather(*(r.initialize() for r in receivers))
        for r in receivers:
            assert await r.get_messages(10) == []  # the pending list: empty
        got = await asyncio.gather(*(r.get_messages(10, timeout_s=0.3) for r in receivers))
        assert got == [[]] * total
    finally:
        await adapter.close()


def cluster_adapter(cluster: RedisClusterServers, prefix: str, *, total: int) -> RedisAdapter:
    return RedisAdapter(load_config(None, environ={}, overrides={
        "queues": {"adapter": "redis", "total": total},
        "redis": {"mode": "cluster", "url": cluster.url, "prefix": prefix},
        "balancer": {"membership": "redis"},
    }).redis)


async def test_keys_of_another_type_are_named_and_read_as_empty_on_a_cluster(
    redis_cluster: RedisClusterServers,
) -> None:
    """As on one server (tests/integration/redis/test_redis_status.py): the keys, in
    different slots, are found in one pipeline split by node."""
    prefix = f"odd-{uuid.uuid4().hex[:8]}"
    adapter = cluster_adapter(redis_cluster, prefix, total=4)
    try:
        for q in (0, 1):
            await adapter.ensure_group(q, "app")
        admin = redis_cluster.client()
        admin.set(f"{prefix}:q:2", "x")
        admin.rpush(f"{prefix}:dlq:app", "y")
        problems = await adapter.store_problems(range(4), ["app", "other"])
        assert [(p.store, p.holds, p.found) for p in problems] == [
            (f"{prefix}:q:2", "queue 2", "string"),
            (f"{prefix}:dlq:app", "app 'app''s dead letters", "list")]
        assert [(g.group, g.queue) for g in await adapter.groups.on(range(4))] == [
            ("app", 0), ("app", 1)]
        assert [await adapter.lag(q, "app") for q in range(4)] == [0, 0, 0, 0]
        assert (await adapter.dead_letters.count("app"),
                await adapter.dead_letters.page("app")) == (0, [])
    finally:
        await adapter.close()


async def test_every_queue_past_the_total_is_counted_on_a_cluster(
    redis_cluster: RedisClusterServers,
) -> None:
    """The streams past ``[queues] total``, in every slot up to the largest total, are
    read in one pipeline split by node; a key of another type among them counts 0."""
    prefix = f"past-{uuid.uuid4().hex[:8]}"
    adapter = cluster_adapter(redis_cluster, prefix, total=4)
    try:
        admin = redis_cluster.client()
        for q in (3, 4, 100, 2000, 4095):
            admin.xadd(f"{prefix}:q:{q}", {"n": "1"})
        admin.xadd(f"{prefix}:q:4095", {"n": "2"})
        admin.set(f"{prefix}:q:50", "x")
        assert await adapter.entries_beyond(4) == {4: 1, 100: 1, 2000: 1, 4095: 2}
    finally:
        await adapter.close()
