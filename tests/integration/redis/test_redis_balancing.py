"""In-process daemons on a real Redis: what the balancer does when starting a queue fails."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import msgspec
import pytest

from conveyor import Client, Publish, WorkerDaemon
from conveyor.adapters.redis import RedisAdapter
from conveyor.adapters.redis.coordination import redis_coordination
from conveyor.adapters.redis.keys import Keys
from conveyor.adapters.redis.receiver import RedisReceiver
from conveyor.platform.adapter import QueueReceiver
from conveyor.platform.balancing.balancer import DynamicBalancer
from conveyor.platform.balancing.membership import MemberInfo
from conveyor.platform.config import Config, load_config
from conveyor.platform.errors import BrokerConnectionError
from tests.conftest import wait_until
from tests.integration.memory_harness import Item, Record, recording_app
from tests.integration.redis.conftest import RedisServer
from tests.servers.process import require

TOTAL_QUEUES = 8
FLAKY_QUEUE = 5  # one of the second daemon's share
REBALANCE_S = 0.1


def balancing_config(server: RedisServer) -> Config:
    return load_config(None, environ={}, overrides={
        "queues": {"adapter": "redis", "total": TOTAL_QUEUES},
        "redis": {"url": server.url, "prefix": "t", "member_ttl_s": 1.0,
                  "heartbeat_interval_s": 0.2},
        "balancer": {"kind": "dynamic", "membership": "redis", "lease_ttl_s": 2.0,
                     "rebalance_interval_s": REBALANCE_S},
        "slots": {"count": 16},
    })


class FlakyStarts(RedisAdapter):
    """A real Redis adapter whose receivers of one queue fail to start, twice.

    First a real ``LeaseLostError``: another holder writes the lease key (for 0.2 s)
    between the grant and the claim of the previous owner's entries, so the claim
    script refuses. Then a ``BrokerConnectionError``, what ``initialize`` raises once
    Redis stayed unreachable for ``retry_max_s`` (injected: a real outage that long
    would take the lease store down with it). The third start succeeds.
    """

    def __init__(self, config: Config) -> None:
        super().__init__(config.redis)
        self.starts: list[float] = []

    def create_receiver(self, queue: int, group: str) -> QueueReceiver:
        if queue != FLAKY_QUEUE:
            return super().create_receiver(queue, group)
        adapter = self

        class Flaky(RedisReceiver):
            async def initialize(self) -> None:
                adapter.starts.append(time.monotonic())
                if len(adapter.starts) == 1:
                    await adapter.redis.set(adapter.keys.lease(group, queue),
                                            "999999 intruder", px=200)
                elif len(adapter.starts) == 2:
                    raise BrokerConnectionError("redis unreachable (injected)")
                await super().initialize()

        return Flaky(self, queue, group)


async def publish(client: Client, first: int, n: int) -> None:
    await client.publish_batch(
        Publish("items", f"s{i % 97}", Item(i)) for i in range(first, first + n)
    )


async def test_a_queue_whose_start_fails_is_released_and_retried_not_orphaned(
    redis_server: RedisServer,
) -> None:
    config = balancing_config(redis_server)
    record = Record()
    app = recording_app(record, delay_s=0.001)
    steady = RedisAdapter(config.redis)
    flaky = FlakyStarts(config)
    # Best-fit deals sorted member ids round-robin: "b" gets the odd queues.
    a = WorkerDaemon(app, config, adapter=steady, member=MemberInfo("a", "h", 1, 0.0))
    b = WorkerDaemon(app, config, adapter=flaky, member=MemberInfo("b", "h", 1, 0.0))
    client = Client(steady, a.mapper)
    try:
        await publish(client, 0, 1000)
        await a.start()
        await wait_until(lambda: len(a.balancer.owned()) == TOTAL_QUEUES, 10,
                         what="the first daemon to own every queue")
        await b.start()  # takes half the queues; the flaky one fails to start twice
        await wait_until(lambda: FLAKY_QUEUE in b.agents, 20,
                         what="the flaky queue to be started on its third try")
        await publish(client, 1000, 1000)
        assert any(a.mapper.queue_for_key("items", f"s{i}") == FLAKY_QUEUE for i in range(97))
        await wait_until(lambda: record.handled == 2000, 30, what="every message handled")
        assert sorted(a.balancer.owned() + b.balancer.owned()) == list(range(TOTAL_QUEUES))
        assert FLAKY_QUEUE in b.balancer.owned()
    finally:
        await b.stop()
        await a.stop()
        await flaky.close()
        await steady.close()
    assert record.handled == 2000 and record.duplicates == 0
    handled_seqs = sorted(seq for seqs in record.order.values() for seq in seqs)
    assert handled_seqs == list(range(2000))
    # Exactly three starts (no spinning), the retry after the second failure backed
    # off twice as long as the first.
    assert len(flaky.starts) == 3
    assert flaky.starts[2] - flaky.starts[1] >= 2 * REBALANCE_S


async def test_a_daemon_started_while_redis_is_down_joins_when_it_comes_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The store is down for the whole start: the daemon starts owning nothing, joins
    in the background once Redis answers, takes every queue and loses nothing."""
    require("redis-server", "redis-server")
    caplog.set_level(logging.WARNING, logger="conveyor.balancer")
    server = RedisServer(tmp_path)  # a port of its own, nothing listening yet
    base = balancing_config(server)
    config = msgspec.structs.replace(
        base, redis=msgspec.structs.replace(base.redis, retry_max_s=0.5)
    )
    record = Record()
    daemon = WorkerDaemon(recording_app(record), config, member=MemberInfo("a", "h", 1, 0.0))
    try:
        await daemon.start()  # raised BrokerConnectionError out of start() before
        assert daemon.balancer.owned() == []
        assert "membership store unreachable at start" in caplog.text
        server.start()
        await wait_until(lambda: len(daemon.balancer.owned()) == TOTAL_QUEUES, 20,
                         what="the daemon to join and take every queue once Redis is up")
        adapter = RedisAdapter(config.redis)
        try:
            await publish(Client(adapter, daemon.mapper), 0, 500)
        finally:
            await adapter.close()
        await wait_until(lambda: record.handled == 500, 20, what="every message handled")
    finally:
        await daemon.stop()
        server.stop()
    assert record.duplicates == 0
    assert sorted(seq for seqs in record.order.values() for seq in seqs) == list(range(500))


class Listener:
    """A daemon's side of the balancer that starts and drains nothing: it notes what it
    is told."""

    def __init__(self) -> None:
        self.told: list[tuple[str, int]] = []

    async def queue_acquired(self, queue: int, lease: object) -> None:
        self.told.append(("acquired", queue))

    async def queue_released(self, queue: int) -> None:
        self.told.append(("released", queue))

    async def queue_lost(self, queue: int) -> None:
        self.told.append(("lost", queue))

    def balancer_failed(self, error: BaseException) -> None:
        raise AssertionError(error)


def lone_balancer(config: Config) -> DynamicBalancer:
    membership, leases = redis_coordination(config, "shop")
    return DynamicBalancer(membership, leases, TOTAL_QUEUES, lease_ttl_s=5.0,
                           rebalance_interval_s=REBALANCE_S)


def released_lines(caplog: pytest.LogCaptureFixture) -> dict[int, str]:
    """Per queue, the balancer's line on giving it up ("released queue N" or why not)."""
    given_up = re.compile(r"^(?:released queue (\d+)$|queue (\d+): given up)")
    lines: dict[int, str] = {}
    for r in caplog.records:
        m = given_up.match(r.getMessage()) if r.name == "conveyor.balancer" else None
        if m is not None:
            lines[int(m.group(1) or m.group(2))] = r.getMessage()
    return lines


async def test_a_lease_taken_over_before_the_give_up_is_not_logged_as_released(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The lease of queue 3 changed hands behind the daemon's back (it lapsed and another
    daemon took it): the stop's release removes nothing, and the log says so."""
    caplog.set_level(logging.INFO, logger="conveyor.balancer")
    config = balancing_config(redis_server)
    balancer, listener = lone_balancer(config), Listener()
    await balancer.start(MemberInfo("a", "h", 1, 0.0), listener)
    try:
        await wait_until(lambda: len(balancer.owned()) == TOTAL_QUEUES, 10,
                         what="the balancer to take every queue")
        token = balancer._held[3].token
        admin = redis_server.client()
        admin.set(Keys("t").lease("shop", 3), f"{token + 1} b", px=60_000)
    finally:
        await balancer.stop()
    lines = released_lines(caplog)
    assert lines[2] == "released queue 2"
    assert lines[3] == (f"queue 3: given up; its lease (token {token}) was no longer this "
                        "daemon's (it lapsed or another daemon took it): nothing to release")
    assert admin.get(Keys("t").lease("shop", 3)) == f"{token + 1} b".encode()  # kept
    admin.close()
    assert sorted(q for what, q in listener.told if what == "released") == list(
        range(TOTAL_QUEUES))  # the daemon gives every queue up, its lease kept or not


async def test_a_release_that_fails_says_so_and_when_the_lease_lapses(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis goes away just before the stop: the queues are given up, their leases stay
    in the store until they lapse, and the log says that rather than "released"."""
    caplog.set_level(logging.INFO, logger="conveyor.balancer")
    base = balancing_config(redis_server)
    config = msgspec.structs.replace(
        base, redis=msgspec.structs.replace(base.redis, retry_max_s=0.3))
    balancer, listener = lone_balancer(config), Listener()
    await balancer.start(MemberInfo("a", "h", 1, 0.0), listener)
    await wait_until(lambda: len(balancer.owned()) == TOTAL_QUEUES, 10,
                     what="the balancer to take every queue")
    redis_server.stop()
    try:
        await balancer.stop()  # raised BrokerConnectionError out of stop() before
    finally:
        redis_server.start()
    admin = redis_server.client()
    left = [admin.pttl(Keys("t").lease("shop", q)) for q in range(TOTAL_QUEUES)]
    admin.close()
    assert all(0 < ms <= 5_000 for ms in left), left  # still held: they lapse, as logged
    lines = released_lines(caplog)
    assert sorted(lines) == list(range(TOTAL_QUEUES))
    assert sorted(q for what, q in listener.told if what == "released") == list(
        range(TOTAL_QUEUES))  # given up, whatever the store said
    for queue, line in lines.items():
        assert line.startswith(f"queue {queue}: given up, but releasing its lease failed "
                               "(BrokerConnectionError: "), line
        assert line.endswith("; it lapses within 5.0s ([balancer] lease_ttl_s), then "
                             "another daemon may take the queue"), line
