"""Replicated durability, ``[redis] min_replicas``, against a real primary and replica."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from conveyor import Client, Publish, PublishNotReplicated
from conveyor.platform.config import Config, load_config
from conveyor.platform.errors import ConfigError
from tests.conftest import free_port
from tests.integration.redis.conftest import RedisServer
from tests.servers.process import wait_answering
from tests.servers.redis import RedisProcess


@pytest.fixture
def replica(redis_server: RedisServer, tmp_path: Path) -> Iterator[RedisProcess]:
    """A redis-server replicating ``redis_server``, online before the test starts."""
    node = RedisProcess(free_port(), tmp_path / "replica", "--save", "",
                        "--replicaof", "127.0.0.1", str(redis_server.port))
    primary = redis_server.client()

    def online() -> bool:
        info = primary.info("replication")
        return bool(info.get("connected_slaves")) and info.get("slave0", {}).get(
            "state") == "online"

    try:
        # Redis waits 5 s for more replicas before a diskless full sync (the default
        # repl-diskless-sync-delay); there is one: sync at once, as tests/servers/ does.
        primary.config_set("repl-diskless-sync-delay", 0)
        node.start()
        wait_answering(online, 15, "the replica online", processes=[node])
        yield node
    finally:
        node.kill()
        primary.close()


def replicated_config(server: RedisServer, replicas: int = 1) -> Config:
    return load_config(None, environ={}, overrides={
        "queues": {"adapter": "redis", "total": 2},
        "redis": {"url": server.url, "prefix": "rep", "min_replicas": replicas,
                  "replica_timeout_ms": 2000},
        "balancer": {"membership": "redis"},
    })


async def test_a_publish_returns_once_the_replica_has_it_and_raises_when_none_can(
    redis_server: RedisServer, replica: RedisProcess,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = replicated_config(redis_server)
    async with Client.from_config(config) as client:
        await client.publish_batch(Publish("items", f"k{i}", {"i": i}) for i in range(100))
        on_replica = redis.Redis(port=replica.port)
        # Returned only after WAIT: the replica already holds every entry.
        assert sum(on_replica.xlen(f"rep:q:{q}") for q in range(2)) == 100

        adapter = client.adapter
        receiver = adapter.create_receiver(0, "app")
        await receiver.initialize()
        got = await receiver.get_messages(100, 0.1)
        assert got

        replica.kill()
        with pytest.raises(PublishNotReplicated) as raised:
            await client.publish_batch(Publish("items", "late", {"i": n}) for n in range(10))
        assert len(raised.value.message_ids) == 10
        assert "0 of the 1 replicas" in str(raised.value)
        assert "$.redis.min_replicas" in str(raised.value)
        # Written on the primary all the same (not retried, not lost there).
        assert sum(redis_server.client().xlen(f"rep:q:{q}") for q in range(2)) == 110
        # Single publishes to both queues, one round (one pipeline, one WAIT): each
        # call is told.
        keys = [f"one{n}" for n in range(8)]
        assert {client.queue_for("items", k) for k in keys} == {0, 1}
        outcomes = await asyncio.gather(
            *(client.publish("items", k, {"i": n}) for n, k in enumerate(keys)),
            return_exceptions=True)
        assert all(isinstance(o, PublishNotReplicated) for o in outcomes), outcomes
        assert all("0 of the 1 replicas" in str(o) for o in outcomes)
        assert sum(redis_server.client().xlen(f"rep:q:{q}") for q in range(2)) == 118

        # An acknowledgement no replica confirmed is kept, and said so once.
        with caplog.at_level(logging.WARNING):
            await receiver.acknowledge([m.token for m in got if m.token])
        assert "reached 0 of 1 replicas" in caplog.text
        await receiver.shutdown()


def test_a_replica_wait_longer_than_the_socket_timeout_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"\$\.redis\.replica_timeout_ms"):
        load_config(None, environ={}, overrides={
            "redis": {"min_replicas": 1, "replica_timeout_ms": 6000, "socket_timeout_s": 5}})


async def test_a_lease_the_replicas_did_not_confirm_is_not_taken_nor_extended(
    redis_server: RedisServer, replica: RedisProcess,
) -> None:
    """A lease (or its fencing counter) lost in a failover could let two daemons own a
    queue: with ``min_replicas`` a lease is taken only once replicated, and a renewal
    that was not replicated leaves the old deadline in place."""
    from conveyor.adapters.redis.coordination import redis_coordination

    membership, leases = redis_coordination(replicated_config(redis_server), "app")
    try:
        # A TTL far beyond the two replica waits below (2 s each), so a loaded machine
        # cannot let the lease expire before its renewal.
        lease = await leases.acquire(0, "me", 60.0)
        assert lease is not None
        replica.kill()
        started = time.monotonic()
        assert await leases.acquire(1, "me", 5.0) is None
        # One wait on the replicas, not two: the give-back is not waited on.
        assert time.monotonic() - started < 3.5
        assert redis_server.client().get("rep:app:app:lease:1") is None  # given back
        renewed = await leases.renew(lease, 60.0)
        assert renewed == lease  # kept, with its old deadline
    finally:
        await membership.close()
        await leases.close()


async def test_a_claim_the_replicas_did_not_confirm_does_not_start_the_queue(
    redis_server: RedisServer, replica: RedisProcess,
) -> None:
    """A new owner claims the previous owner's pending entries. Lost in a failover, the
    claim would leave them pending for the previous owner, who reads the queue no more:
    seen in the Sentinel failover test, 6 confirmed messages never handled. With
    ``min_replicas`` a queue starts only once its claim is replicated."""
    from conveyor.adapters.redis import RedisAdapter
    from conveyor.platform.errors import BrokerConnectionError

    adapter = RedisAdapter(replicated_config(redis_server).redis)
    try:
        receiver = adapter.create_receiver(0, "app")
        await receiver.initialize()  # the replica confirms it
        await receiver.shutdown()
        replica.kill()
        with pytest.raises(BrokerConnectionError, match=r"queue 0: the claim of the previous "
                                                        r"owner's pending entries reached 0 of 1"):
            await adapter.create_receiver(0, "app").initialize()
    finally:
        await adapter.close()
