"""The Redis Cluster fixtures themselves: a real cluster that serves keys, and a
failover that promotes the replica without losing an acknowledged write."""

from __future__ import annotations

import pytest
import redis

from tests.servers import RedisClusterServers

pytestmark = pytest.mark.redis_cluster


def test_the_cluster_serves_every_slot_from_three_primaries_with_a_replica_each(
    redis_cluster: RedisClusterServers,
) -> None:
    slots = redis_cluster.slots()
    assert sum(r.end - r.start + 1 for r in slots) == 16384
    assert len(redis_cluster.primaries()) == 3
    for primary in redis_cluster.primaries():
        assert redis_cluster.replica_of(primary) not in redis_cluster.primaries()
    assert redis_cluster.startup_s is not None
    print(f"cluster start-up: {redis_cluster.startup_s:.2f} s")


def test_a_key_written_through_the_client_is_read_back_from_its_primary(
    redis_cluster: RedisClusterServers,
) -> None:
    client = redis_cluster.client()
    try:
        for i in range(20):  # keys in several slots, so on several primaries
            client.set(f"fixture:read:{i}", i)
        got = [client.get(f"fixture:read:{i}") for i in range(20)]
        assert got == [str(i).encode() for i in range(20)]
    finally:
        client.close()
    host, port = redis_cluster.primary_for_key("fixture:read:0")
    assert redis.Redis(host=host, port=port).get("fixture:read:0") == b"0"


def test_the_shared_cluster_refuses_to_lose_a_node(redis_cluster: RedisClusterServers) -> None:
    with pytest.raises(AssertionError, match="fresh_redis_cluster"):
        redis_cluster.kill(redis_cluster.primaries()[0][1])


def test_killing_a_primary_promotes_its_replica_with_the_replicated_key(
    fresh_redis_cluster: RedisClusterServers,
) -> None:
    cluster = fresh_redis_cluster
    key = "fixture:failover"
    primary = cluster.primary_for_key(key)
    replica = cluster.replica_of(primary)
    direct = redis.Redis(host=primary[0], port=primary[1])
    # SET and WAIT on one connection: WAIT counts replicas that have this client's writes.
    with direct.pipeline(transaction=False) as pipe:
        pipe.set(key, "kept")
        pipe.execute_command("WAIT", 1, 1000)
        _, acked = pipe.execute()
    direct.close()
    assert acked == 1

    cluster.kill(primary[1])
    took_s = cluster.wait_failover(primary[1], timeout_s=15)
    print(f"failover: {took_s:.2f} s")

    assert took_s < 15
    assert cluster.primary_for_key(key) == replica
    assert primary not in cluster.primaries() and len(cluster.primaries()) == 3
    client = cluster.client()
    try:
        assert client.get(key) == b"kept"
    finally:
        client.close()
