"""The Redis adapter and stores against a real redis-server: wire format, fencing,
claims, retention, lag, rewind, membership, leases, security, CLI."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

from conveyor.adapters.redis import RedisAdapter
from conveyor.adapters.redis import receiver as receiver_module
from conveyor.adapters.redis.codec import MAX_HEADERS
from conveyor.adapters.redis.connections import connect
from conveyor.adapters.redis.coordination import redis_coordination
from conveyor.adapters.redis.keys import Keys
from conveyor.adapters.redis.urls import redact_url
from conveyor.cli import main
from conveyor.client import Client, Publish
from conveyor.platform.balancing.membership import MemberInfo
from conveyor.platform.config import Config, load_config
from conveyor.platform.errors import (
    ConfigError,
    InvalidArgumentError,
    LeaseLostError,
    MessageTooLargeError,
    QueueOwnedError,
)
from conveyor.platform.ids import SequenceToken
from conveyor.platform.mapper import HashRingQueueMapper
from tests.conftest import wait_until
from tests.integration.redis.conftest import REPO, RedisServer, write_config

pytestmark = pytest.mark.redis


def config_for(server: RedisServer, **redis: object) -> Config:
    return load_config(None, environ={}, overrides={
        "queues": {"adapter": "redis"},
        "redis": {"url": server.url, "prefix": "t", **redis},
        "balancer": {"membership": "redis"},
    })


@pytest.fixture
async def adapter(redis_server: RedisServer) -> AsyncIterator[RedisAdapter]:
    a = RedisAdapter(config_for(redis_server).redis)
    try:
        yield a
    finally:
        await a.close()


@dataclass
class Shop:
    """An adapter and app ``shop``'s leases on one server, for the fencing tests."""

    adapter: RedisAdapter
    leases: Any

    async def leased(self, queue: int, owner: str, ttl_s: float) -> Any:
        """A receiver of ``queue`` started under a lease granted to ``owner``."""
        lease = await self.leases.acquire(queue, owner, ttl_s)
        assert lease is not None
        receiver = self.adapter.create_receiver(queue, "shop")
        receiver.set_lease(lease)
        await receiver.initialize()
        return receiver

    async def lease_expired(self, queue: int) -> None:
        async def gone() -> bool:
            return not await self.adapter.redis.exists(Keys("t").lease("shop", queue))

        await wait_until(gone, 5, what=f"the lease of queue {queue} to expire in the store")


@pytest.fixture
async def shop(redis_server: RedisServer) -> AsyncIterator[Shop]:
    config = config_for(redis_server)
    a = RedisAdapter(config.redis)
    leases = redis_coordination(config, "shop")[1]
    try:
        yield Shop(a, leases)
    finally:
        await leases.close()
        await a.close()


async def test_an_entry_written_by_redis_cli_is_delivered(adapter: RedisAdapter) -> None:
    await adapter.redis.execute_command(
        "XADD", "t:q:3", "*", "cv-ns", "orders", "cv-key", "42", "body", '{"total": 3}',
        "traceparent", "00-abc-def-01",
    )
    receiver = adapter.create_receiver(3, "shop")
    await receiver.initialize()
    [msg] = await receiver.get_messages(10, 0.5)
    assert (msg.stream.namespace, msg.stream.key, msg.body) == ("orders", "42", b'{"total": 3}')
    assert msg.headers == {"traceparent": "00-abc-def-01"}
    assert msg.token is not None and msg.enqueued_at_ms == msg.token.major
    assert await receiver.lag() == 1
    await receiver.acknowledge([msg.token])
    assert await receiver.lag() == 0


async def test_a_batch_with_a_reserved_header_is_refused_whole(adapter: RedisAdapter) -> None:
    client = Client(adapter, HashRingQueueMapper(1))
    good = client.build("orders", "k", {"a": 1})
    # Client.build refuses reserved names; a message built by hand reaches the adapter.
    spoof = msgspec.structs.replace(good, id="m2", headers={"cv-ns": "admin"})
    with pytest.raises(InvalidArgumentError, match="'cv-ns' is reserved"):
        await adapter.enqueue(0, [good, spoof])
    assert await adapter.redis.xlen(adapter.keys.queue(0)) == 0  # not half a batch


async def test_a_message_with_more_headers_than_a_script_can_write_is_refused_naming_them(
    adapter: RedisAdapter,
) -> None:
    # Every entry is written by a Lua script, whose unpack() hands XADD at most ~8,000
    # values: 4,000 headers failed as "BrokerError: ... user_script:10: too many results
    # to unpack", a message that said nothing of headers.
    client = Client(adapter, HashRingQueueMapper(1))
    most = {f"h{i}": "v" for i in range(MAX_HEADERS)}
    await client.publish("orders", "k", {"a": 1}, headers=most)
    with pytest.raises(MessageTooLargeError) as refused:
        await client.publish("orders", "k", {"a": 2}, headers={**most, "one-more": "v"})
    assert str(refused.value) == (
        f"message to stream orders/k: its {MAX_HEADERS + 1:,} headers are more than the "
        f"redis adapter writes ({MAX_HEADERS:,} at most); nothing was sent")
    receiver = adapter.create_receiver(0, "shop")
    await receiver.initialize()
    [stored] = await receiver.get_messages(10, 0.5)
    assert stored.body == b'{"a":1}' and stored.headers == most


async def test_a_stale_lease_holder_cannot_acknowledge(shop: Shop) -> None:
    adapter, leases = shop.adapter, shop.leases
    await Client(adapter, HashRingQueueMapper(8)).publish("orders", "k", {})
    queue = HashRingQueueMapper(8).queue_for_key("orders", "k")
    old = await leases.acquire(queue, "old", 0.2)
    assert old is not None
    stale = adapter.create_receiver(queue, "shop")
    stale.set_lease(old)
    await stale.initialize()
    [msg] = await stale.get_messages(1, 0.5)

    await shop.lease_expired(queue)
    new = await leases.acquire(queue, "new", 5)
    assert new is not None and new.token > old.token
    assert msg.token is not None
    with pytest.raises(LeaseLostError):
        await stale.acknowledge([msg.token])
    # The new owner claims the entry and gets it first, then acknowledges it.
    fresh = adapter.create_receiver(queue, "shop")
    fresh.set_lease(new)
    await fresh.initialize()
    again = await fresh.get_messages(10, 0.1)
    assert [m.id for m in again] == [msg.id]
    await fresh.acknowledge([msg.token])
    assert await adapter.lag(queue, "shop") == 0
    refused = await adapter.redis.hgetall(Keys("t").fenced_acks("shop", 0))
    assert refused == {f"{old.token} old".encode(): b"1"}


async def test_entries_a_stalled_daemon_read_after_the_takeover_reach_the_owner(
    shop: Shop, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A daemon stalled between checking its lease and its read reaching the server reads
    # after the new owner's one claim: the entries land in its own pending list, and
    # only the owner's look for strays gets them run (before: never, until the queue
    # moved again). Each is delivered exactly once to the owner; none is lost.
    monkeypatch.setattr(receiver_module, "STRAY_SWEEP_S", 0.3)
    adapter = shop.adapter
    client = Client(adapter, HashRingQueueMapper(8))
    queue = HashRingQueueMapper(8).queue_for_key("orders", "k")
    stale = await shop.leased(queue, "old", 0.2)

    await shop.lease_expired(queue)
    owner = await shop.leased(queue, "new", 30)
    assert await owner.get_messages(10, 0.05) == []
    for i in range(5):
        await client.publish("orders", "k", {"i": i})
    # The stalled daemon's read, as its receiver sends it, reaching the server late.
    stream = Keys("t").queue(queue)
    late = await adapter.redis.execute_command(
        "XREADGROUP", "GROUP", "shop", "old", "COUNT", 3, "STREAMS", stream, ">")
    assert late, "the late read took nothing"
    got = []
    deadline = time.monotonic() + 5
    while len(got) < 5 and time.monotonic() < deadline:
        batch = await owner.get_messages(10, 0.05)
        got.extend(batch)
        await owner.acknowledge([m.token for m in batch if m.token is not None])
    # The two the stalled daemon did not read come first; the strays after them,
    # in order, as redelivered (its read counted one delivery).
    assert [m.body for m in got] == [f'{{"i":{i}}}'.encode() for i in (3, 4, 0, 1, 2)]
    assert [m.deliveries for m in got] == [1, 1, 2, 2, 2]
    assert await owner.get_messages(10, 0.4) == []  # acknowledged: not found again
    assert (await adapter.redis.xpending(stream, "shop"))["pending"] == 0
    with pytest.raises(LeaseLostError):  # the stalled daemon, at its next look
        await stale.get_messages(10, 0.05)


async def test_strays_are_returned_once_while_unacknowledged(
    shop: Shop, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(receiver_module, "STRAY_SWEEP_S", 0.0)  # look at every read
    adapter = shop.adapter
    client = Client(adapter, HashRingQueueMapper(1))
    owner = await shop.leased(0, "owner", 30)
    for i in range(5):
        await client.publish("n", "k", {"i": i})
    other = adapter.create_receiver(0, "shop")  # another consumer, unleased: a stray reader
    await other.initialize()
    read = await other.get_messages(5, 0.1)
    assert len(read) == 5 and read[4].token is not None
    t = read[4].token
    await adapter.redis.xdel(Keys("t").queue(0), f"{t.major}-{t.minor}")  # gone: no run
    first = await owner.get_messages(2, 0.05)  # room for 2: the first two strays
    second = await owner.get_messages(10, 0.05)  # the rest at once, not a look later
    assert [m.body for m in first + second] == [
        f'{{"i":{i}}}'.encode() for i in range(4)]
    # Still pending for the other consumer (unacknowledged): not returned again.
    assert await owner.get_messages(10, 0.05) == []
    await owner.acknowledge([m.token for m in first + second if m.token is not None])
    assert (await adapter.redis.xpending(Keys("t").queue(0), "shop"))["pending"] == 0
    # The stream deleted under the owner: the look finds nothing, the read goes on.
    await adapter.redis.delete(Keys("t").queue(0))
    assert await owner.get_messages(10, 0.05) == []
    await client.publish("n", "k", {"i": 5})
    assert [m.body for m in await owner.get_messages(10, 0.5)] == [b'{"i":5}']


async def test_pending_entries_another_client_deleted_are_reported_lost(
    shop: Shop, caplog: pytest.LogCaptureFixture,
) -> None:
    """Entries read and not acknowledged, then deleted by another client (``XDEL``, an
    ``XTRIM``): Redis drops them from the pending list as the next owner claims it, or
    returns them without fields when their reader re-reads its list. Nothing is left to
    run; each way, an error names how many were lost, and the rest run."""
    adapter = shop.adapter
    client = Client(adapter, HashRingQueueMapper(1))
    stream = Keys("t").queue(0)
    for i in range(6):
        await client.publish("n", "k", {"i": i})
    first = await shop.leased(0, "first", 0.5)
    read = await first.get_messages(6, 0.1)
    ids = [f"{m.token.major}-{m.token.minor}" for m in read if m.token is not None]
    assert len(ids) == 6
    await adapter.redis.xdel(stream, ids[1], ids[2])  # pending for "first"
    await shop.lease_expired(0)
    caplog.set_level(logging.ERROR, logger="conveyor.redis")
    second = await shop.leased(0, "second", 30)  # claims what "first" held
    await adapter.redis.xdel(stream, ids[4])  # pending for "second" now, before its read
    got = await second.get_messages(10, 0.1)
    assert [m.body for m in got] == [f'{{"i":{i}}}'.encode() for i in (0, 3, 5)]
    lost = [r.getMessage() for r in caplog.records if "messages are lost" in r.getMessage()]
    assert lost == [
        f"queue 0: 2 pending entries of the previous owner had been deleted from {stream} "
        "by another client (XDEL or XTRIM) before being handled: those messages are lost",
        f"queue 0: 1 pending entry of this daemon had been deleted from {stream} by "
        "another client (XDEL or XTRIM) before being handled: those messages are lost"]
    await second.acknowledge([m.token for m in got if m.token is not None])
    assert (await adapter.redis.xpending(stream, "shop"))["pending"] == 0


async def test_unread_entries_another_client_trimmed_are_reported_lost_once(
    shop: Shop, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An ``XTRIM`` by another client that reaches entries the group has not read yet:
    they were never delivered, so no pending list names them, and the worker ran on
    without a word (Redis' lag of the group even kept counting them). The owner's sweep
    compares Redis' lag with what the stream holds: an error names how many were lost,
    once, and the group's lag is set right."""
    monkeypatch.setattr(receiver_module, "STRAY_SWEEP_S", 1000.0)  # no look until asked
    adapter = shop.adapter
    client = Client(adapter, HashRingQueueMapper(1))
    stream = Keys("t").queue(0)
    owner = await shop.leased(0, "owner", 30)
    owner._next_sweep = 1e18
    for i in range(3):
        await client.publish("n", "k", {"i": i})
    read = await owner.get_messages(10, 0.1)
    assert len(read) == 3
    await owner.acknowledge([m.token for m in read if m.token is not None])
    for i in range(3, 8):
        await client.publish("n", "k", {"i": i})
    caplog.set_level(logging.ERROR, logger="conveyor.redis")
    # Keeps the last two: deletes the three handled and three (3, 4, 5) never read.
    assert await adapter.redis.xtrim(stream, maxlen=2, approximate=False) == 6
    # Read and handled before the owner looks (it looks every 5 s): the stream holds
    # as many entries again as were lost, all read.
    for i in range(8, 12):
        await client.publish("n", "k", {"i": i})
    got = await owner.get_messages(10, 0.1)
    assert [m.body for m in got] == [f'{{"i":{i}}}'.encode() for i in (6, 7, 8, 9, 10, 11)]
    await owner.acknowledge([m.token for m in got if m.token is not None])
    monkeypatch.setattr(receiver_module, "STRAY_SWEEP_S", 0.0)  # a look at every read
    owner._next_sweep = 0.0
    assert await owner.get_messages(10, 0.1) == []
    assert await owner.get_messages(10, 0.1) == []  # another look: nothing said twice
    lost = [r.getMessage() for r in caplog.records if "messages are lost" in r.getMessage()]
    assert lost == [
        f"queue 0: 3 entries of {stream} not yet read by group 'shop' had been deleted by "
        "another client (XTRIM) before being read: those messages are lost"]
    [group] = await adapter.redis.xinfo_groups(stream)
    assert group["lag"] == 0 and group["pending"] == 0


async def test_unstarted_messages_handed_back_count_as_first_deliveries_under_the_fence(
    shop: Shop,
) -> None:
    adapter = shop.adapter
    client = Client(adapter, HashRingQueueMapper(1))
    stream = Keys("t").queue(0)

    async def holders() -> dict[str, int]:
        rows = await adapter.redis.xpending_range(stream, "shop", "-", "+", 10)
        return {r["message_id"].decode(): (r["consumer"].decode(), r["times_delivered"])
                for r in rows}

    for i in range(3):
        await client.publish("n", "k", {"i": i})
    a = await shop.leased(0, "a", 0.3)
    pulled = await a.get_messages(3, 0.1)
    tokens = [m.token for m in pulled if m.token is not None]
    await a.handed_back(tokens[:2])  # two unstarted, handed back: counted as never read
    assert sorted(n for _, n in (await holders()).values()) == [0, 0, 1]

    await shop.lease_expired(0)
    b = await shop.leased(0, "b", 30)
    again = await b.get_messages(10, 0.1)
    assert [m.deliveries for m in again] == [1, 1, 2]
    # The first holder, stalled past its lease, hands back late: refused, and the
    # entries stay with the new owner (else only its look for strays would find
    # them, and run again what it holds already).
    with pytest.raises(LeaseLostError):
        await a.handed_back(tokens)
    assert {who for who, _ in (await holders()).values()} == {"b"}


async def test_pending_entries_come_first_in_order_after_a_takeover(
    adapter: RedisAdapter,
) -> None:
    client = Client(adapter, HashRingQueueMapper(1))
    for i in range(10):
        await client.publish("n", "k", {"i": i})
    first = adapter.create_receiver(0, "g")
    await first.initialize()
    taken = await first.get_messages(4, 0.1)
    await first.acknowledge([taken[0].token])  # type: ignore[list-item]
    # The owner dies with three unacknowledged; the next one sees them first, in order.
    second = adapter.create_receiver(0, "g")
    await second.initialize()
    got = []
    while batch := await second.get_messages(2, 0.05):
        got.extend(batch)
    assert [m.body for m in got] == [f'{{"i":{i}}}'.encode() for i in range(1, 10)]


async def test_a_redelivered_start_is_counted_in_one_round_trip(
    redis_server: RedisServer,
) -> None:
    """Recovery runs redelivered messages one at a time, each after ``count_start``: the
    count, its expiry and the recorded stall are one script call, not three commands."""
    config = config_for(redis_server)
    adapter = RedisAdapter(config.redis)
    _, leases = redis_coordination(config, "g")
    try:
        await Client(adapter, HashRingQueueMapper(1)).publish("n", "k", {})
        receiver = adapter.create_receiver(0, "g")
        await receiver.initialize()
        [msg] = await receiver.get_messages(1, 0.5)
        await leases.note_stall(0, msg.id, "handler h blocked the event loop")  # type: ignore[attr-defined]
        first = await receiver.count_start(msg)  # loads the script
        await adapter.redis.execute_command("CONFIG", "RESETSTAT")
        second = await receiver.count_start(msg)
        third = await receiver.count_start(msg)
        assert (first.deliveries, second.deliveries, third.deliveries) == (2, 3, 4)
        assert third.last_cause == "handler h blocked the event loop"
        stats = await adapter.redis.info("commandstats")
        calls = {name.removeprefix("cmdstat_"): v["calls"] for name, v in stats.items()}
        # Redis counts the commands a script runs too: two calls, each one EVALSHA that
        # ran the three commands (three round trips apiece would show no EVALSHA).
        assert calls["evalsha"] == 2
        assert (calls["hincrby"], calls["expire"], calls["hget"]) == (2, 2, 2)
        ttl = await adapter.redis.ttl(adapter.keys.starts(0))
        assert ttl > 0
    finally:
        await leases.close()  # type: ignore[attr-defined]
        await adapter.close()


async def test_retention_trims_only_what_every_group_acknowledged(
    redis_server: RedisServer,
) -> None:
    # Every acknowledgement trims (the interval is as good as zero).
    adapter = RedisAdapter(config_for(redis_server, retention_s=0, trim_interval_s=1e-6).redis)
    try:
        client = Client(adapter, HashRingQueueMapper(1))
        for i in range(20):
            await client.publish("n", "k", {"i": i})
        fast, slow = adapter.create_receiver(0, "fast"), adapter.create_receiver(0, "slow")
        await fast.initialize()
        await slow.initialize()
        done = await fast.get_messages(20, 0.1)
        part = await slow.get_messages(5, 0.1)
        await slow.acknowledge([m.token for m in part[:3]])  # type: ignore[misc]
        assert await adapter.redis.xlen("t:q:0") == 20  # "fast" holds all 20 pending
        await fast.acknowledge([m.token for m in done])  # type: ignore[misc]
        # "slow" acknowledged 3 and still holds 2 pending: only the first 3 may go.
        assert await adapter.redis.xlen("t:q:0") == 17
        assert await adapter.lag(0, "slow") == 17 and await adapter.lag(0, "fast") == 0
        rest = await slow.get_messages(100, 0.1)
        await slow.acknowledge([m.token for m in part[3:] + rest])  # type: ignore[misc]
        assert await adapter.redis.xlen("t:q:0") == 0
    finally:
        await adapter.close()


async def test_retention_trims_below_a_group_rewound_to_a_point_in_time(
    redis_server: RedisServer,
) -> None:
    adapter = RedisAdapter(config_for(redis_server, retention_s=0, trim_interval_s=1e-6).redis)
    stream = "t:q:0"
    try:
        for eid in ["1000-0", "1000-1", "2000-0", "3000-0", "4000-0"]:
            await adapter.redis.execute_command("XADD", stream, eid, "cv-ns", "items",
                                                "cv-key", "k", "body", "{}")
        # One app replays from t = 2.5 s: its group sits at the last id of ms 2499.
        await adapter.rewind(0, "replaying", 2.5)
        [group] = await adapter.redis.xinfo_groups(stream)
        assert group["last-delivered-id"] == b"2499-18446744073709551615"
        # Another app reads and acknowledges everything; its owner trims the stream.
        active = adapter.create_receiver(0, "active")
        await active.initialize()
        done = await active.get_messages(10, 0.1)
        assert len(done) == 5
        await active.acknowledge([m.token for m in done])  # type: ignore[misc]
        # Below the rewound group's floor (2500-0) everyone is done: trimmed.
        kept = [eid for eid, _ in await adapter.redis.xrange(stream)]
        assert kept == [b"3000-0", b"4000-0"]
        assert await adapter.lag(0, "replaying") == 2
    finally:
        await adapter.close()


async def test_lag_after_a_rewind_is_known_and_counted_without_shipping_entries(
    adapter: RedisAdapter,
) -> None:
    stream = "t:q:0"
    pipe = adapter.redis.pipeline(transaction=False)
    for ms in range(1, 2001):  # ids 1-0 .. 2000-0, 1 KB bodies
        pipe.xadd(stream, {"cv-ns": "items", "cv-key": "k", "body": "x" * 1000}, id=f"{ms}-0")
    await pipe.execute()
    reader = adapter.create_receiver(0, "g")
    await reader.initialize()
    while batch := await reader.get_messages(1000, 0.05):
        await reader.acknowledge([m.token for m in batch])  # type: ignore[misc]
    assert await adapter.lag(0, "g") == 0

    async def redis_lag() -> int | None:
        [group] = await adapter.redis.xinfo_groups(stream)
        return group["lag"]  # type: ignore[no-any-return]

    # Back into the middle: Redis itself still knows the lag (ENTRIESREAD was given).
    await adapter.rewind(0, "g", 1.5)
    assert await redis_lag() == 501
    assert await adapter.lag(0, "g") == 501
    replay = adapter.create_receiver(0, "g")
    await replay.initialize()
    part = await replay.get_messages(100, 0.05)
    assert [m.token.major for m in part] == list(range(1500, 1600))  # type: ignore[union-attr]
    await replay.acknowledge([m.token for m in part])  # type: ignore[misc]
    assert await redis_lag() == 401 and await adapter.lag(0, "g") == 401
    # A deletion ahead of the group: Redis cannot tell any more; the adapter counts on
    # the server, so the ~400 KB of entries left do not cross the wire.
    await adapter.redis.xdel(stream, "1700-0")
    assert await redis_lag() is None

    async def bytes_sent() -> int:
        return int((await adapter.redis.info("stats"))["total_net_output_bytes"])

    before = await bytes_sent()
    assert await adapter.lag(0, "g") == 400
    assert await bytes_sent() - before < 50_000


async def test_reading_the_members_of_an_app_nobody_runs_writes_nothing(
    redis_server: RedisServer,
) -> None:
    """``conveyor status --app TYPO`` read the membership through scripts that seeded
    its version counter, leaving a key behind for an app that never ran. Reads now
    write nothing there; the first join seeds it, and a reader that saw 0 sees it move."""
    config = config_for(redis_server)
    reader, _ = redis_coordination(config, "typo")
    client = redis_server.client()
    assert (await reader.members(), await reader.member_ids(), await reader.version()) == (
        [], [], 0)
    assert client.keys("*") == []
    joiner, _ = redis_coordination(config, "typo")
    await joiner.join(MemberInfo(id="m-1", host="h", pid=1, started_at=0.0))
    assert await reader.version() > 0
    assert [m.id for m in await reader.members()] == ["m-1"]
    assert sorted(client.keys("*")) == [b"t:app:typo:member-info", b"t:app:typo:members",
                                        b"t:app:typo:members-version"]


async def test_membership_is_one_ordered_view_and_dead_members_lapse(
    redis_server: RedisServer,
) -> None:
    config = config_for(redis_server, member_ttl_s=0.5, heartbeat_interval_s=0.1)
    a, _ = redis_coordination(config, "shop")
    b, _ = redis_coordination(config, "shop")
    alive = MemberInfo(id="m-b", host="h", pid=1, started_at=0.0)
    silent = MemberInfo(id="m-a", host="h", pid=2, started_at=0.0)
    await a.join(alive)
    # "m-a" is written once and never heartbeats: it vanishes after its TTL.
    await b.heartbeat(silent)
    assert [m.id for m in await a.members()] == ["m-a", "m-b"]
    assert [m.id for m in await b.members()] == ["m-a", "m-b"]
    assert await a.wait_changed(3.0)
    assert [m.id for m in await b.members()] == ["m-b"]
    await a.leave("m-b")
    assert await b.members() == []


async def test_the_membership_version_moves_on_joins_leaves_and_lapses_never_on_heartbeats(
    redis_server: RedisServer,
) -> None:
    config = config_for(redis_server, member_ttl_s=0.5, heartbeat_interval_s=0.1)
    a, _ = redis_coordination(config, "shop")
    b, _ = redis_coordination(config, "shop")
    assert await a.version() == 0  # nobody joined yet: nothing stored, nothing seeded
    await a.join(MemberInfo(id="m-b", host="h", pid=1, started_at=0.0))
    joined = await b.version()
    assert joined > time.time() * 1000 - 60_000  # seeded from the server's clock, moved
    await a.join(MemberInfo(id="m-b", host="h", pid=1, started_at=0.0))
    assert await b.version() == joined  # the same id again: the view did not change
    await b.heartbeat(MemberInfo(id="m-a", host="h", pid=2, started_at=0.0, stats={"x": 1.0}))
    assert await a.version() == joined + 1  # a new id, written once
    await a.heartbeat(MemberInfo(id="m-b", host="h", pid=1, started_at=0.0, stats={"x": 2.0}))

    async def new_stats_out() -> bool:
        return [m.stats for m in await b.members() if m.id == "m-b"] == [{"x": 2.0}]

    # m-b's own beats (every 0.1 s) carry its new stats: a beat went out...
    await wait_until(new_stats_out, 5, what="m-b's next beat to carry its new stats")
    assert await a.version() == joined + 1  # ...and the version did not move
    assert await b.member_ids() == ["m-a", "m-b"]
    assert await a.wait_changed(3.0)  # m-a lapses: the reader that sees it counts it
    assert await b.member_ids() == ["m-b"]
    assert await b.version() == joined + 2
    await a.leave("m-b")
    assert await b.version() == joined + 3
    assert await b.member_ids() == []
    for store in (a, b):
        await store.close()


async def test_the_lease_generation_counts_grants_and_releases_not_renewals(
    redis_server: RedisServer,
) -> None:
    _, leases = redis_coordination(config_for(redis_server), "shop")
    start = await leases.generation()
    lease = await leases.acquire(4, "x", 5)
    assert lease is not None and await leases.generation() == start + 1
    assert await leases.acquire(4, "y", 5) is None  # refused: nothing moved
    assert await leases.renew(lease, 5) is not None
    assert await leases.generation() == start + 1
    assert await leases.release(lease) is True
    assert await leases.release(lease) is False  # stale: nothing moved
    assert await leases.generation() == start + 2
    await leases.close()


async def test_leases_grant_growing_tokens_to_one_holder(redis_server: RedisServer) -> None:
    _, leases = redis_coordination(config_for(redis_server), "shop")
    first = await leases.acquire(2, "x", 5)
    assert first is not None
    assert await leases.acquire(2, "y", 5) is None
    assert await leases.renew(first, 5) is not None
    assert await leases.release(first) is True
    second = await leases.acquire(2, "y", 5)
    assert second is not None and second.token > first.token
    assert await leases.renew(first, 5) is None
    assert await leases.release(first) is False  # a stale release does nothing
    assert await leases.owners() == {2: "y"}


def one_queue(redis_server: RedisServer, tmp_path: Path) -> tuple[Path, Config]:
    """A config file of one Redis queue on ``redis_server``, and the config it loads."""
    cfg_path = write_config(tmp_path / "c.toml", redis_server.url,
                            queues={"adapter": "redis", "total": 1})
    return cfg_path, load_config(cfg_path, environ={})


async def publish_ten_and_take(config: Config, n: int) -> list[SequenceToken]:
    """Publish 10 messages to queue 0, let app "shop" take and ack the first ``n``."""
    adapter = RedisAdapter(config.redis)
    try:
        client = Client(adapter, HashRingQueueMapper(1))
        tokens = [await client.publish("n", "k", {"i": i}) for i in range(10)]
        r = adapter.create_receiver(0, "shop")
        await r.initialize()
        msgs = await r.get_messages(n, 0.1)
        await r.acknowledge([m.token for m in msgs])  # type: ignore[misc]
        assert await adapter.lag(0, "shop") == 10 - n
        return tokens
    finally:
        await adapter.close()


def test_rewind_replays_a_known_range(redis_server: RedisServer, tmp_path: Path) -> None:
    cfg_path, config = one_queue(redis_server, tmp_path)
    tokens = asyncio.run(publish_ten_and_take(config, 10))
    result = CliRunner().invoke(
        main, ["rewind", "--config", str(cfg_path), "--app", "shop", "--to", str(tokens[6])]
    )
    assert result.exit_code == 0, result.output

    async def replay() -> list[bytes]:
        adapter = RedisAdapter(config.redis)
        try:
            r = adapter.create_receiver(0, "shop")
            await r.initialize()
            msgs = await r.get_messages(100, 0.1)
            msgs += await r.get_messages(100, 0.1)  # past any pending ones: nothing more
            await r.acknowledge([m.token for m in msgs])  # type: ignore[misc]
            return [m.body for m in msgs]
        finally:
            await adapter.close()

    assert asyncio.run(replay()) == [f'{{"i":{i}}}'.encode() for i in range(6, 10)]
    assert asyncio.run(replay()) == []
    # A point in time before everything replays everything.
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(tokens[0].major / 1000 - 5)) + "Z"
    result = CliRunner().invoke(
        main, ["rewind", "--config", str(cfg_path), "--app", "shop", "--to", when]
    )
    assert result.exit_code == 0, result.output
    assert len(asyncio.run(replay())) == 10


def test_a_token_before_the_first_entry_replays_all_unless_entries_after_it_were_trimmed(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    cfg_path, config = one_queue(redis_server, tmp_path)
    tokens = asyncio.run(publish_ten_and_take(config, 10))
    rewind = ["rewind", "--config", str(cfg_path), "--app", "shop", "--to", "0:1-0"]
    result = CliRunner().invoke(main, rewind)  # nothing was ever trimmed: from the start
    assert result.exit_code == 0, result.output
    assert "trimmed" not in result.output

    async def trim_three() -> int:
        adapter = RedisAdapter(config.redis)
        try:
            assert await adapter.lag(0, "shop") == 10
            await adapter.redis.xtrim(Keys("t").queue(0), maxlen=7, approximate=False)
            return int(await adapter.redis.xlen(Keys("t").queue(0)))
        finally:
            await adapter.close()

    assert asyncio.run(trim_three()) == 7
    refused = CliRunner().invoke(main, rewind)
    assert refused.exit_code == 1, refused.output
    assert (f"queue 0: 0:1-0 is older than the oldest entry kept ({tokens[3]}): 3 entries "
            f"were trimmed or deleted; rewind to {tokens[3]}") in refused.output


def test_a_forward_rewind_is_refused_unless_allowed(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    cfg_path, config = one_queue(redis_server, tmp_path)

    async def lag() -> int:
        adapter = RedisAdapter(config.redis)
        try:
            return await adapter.lag(0, "shop")
        finally:
            await adapter.close()

    tokens = asyncio.run(publish_ten_and_take(config, 3))  # the group's position moves
    rewind = ["rewind", "--config", str(cfg_path), "--app", "shop", "--to", str(tokens[8])]
    refused = CliRunner().invoke(main, rewind)
    assert refused.exit_code == 2, refused.output
    assert "queue 0: 5 message(s) skipped" in refused.output  # entries 3..7
    assert asyncio.run(lag()) == 7  # nothing moved
    assert CliRunner().invoke(main, [*rewind, "--allow-forward"]).exit_code == 0
    assert asyncio.run(lag()) == 2  # 8 and 9 left
    back = CliRunner().invoke(main, ["rewind", "--config", str(cfg_path), "--app", "shop",
                                     "--to", str(tokens[0])])
    assert back.exit_code == 0, back.output  # back is always allowed
    assert asyncio.run(lag()) == 10


def test_a_rewind_to_a_future_time_is_refused_though_the_app_has_nothing_left(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # With every message handled, no message lies between the app's position and the
    # target to count as skipped: the position moved past every message to come.
    cfg_path, config = one_queue(redis_server, tmp_path)
    asyncio.run(publish_ten_and_take(config, 10))
    later = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
    refused = CliRunner().invoke(main, ["rewind", "--config", str(cfg_path), "--app", "shop",
                                        "--to", later])
    assert refused.exit_code == 2, refused.output
    assert (f"Invalid value for --to: {later} is in the future: the app would skip every "
            "message published until then; pass --allow-forward") in refused.output

    async def publish_one_more() -> int:
        adapter = RedisAdapter(config.redis)
        try:
            await Client(adapter, HashRingQueueMapper(1)).publish("n", "k", {"i": 10})
            return await adapter.lag(0, "shop")
        finally:
            await adapter.close()

    assert asyncio.run(publish_one_more()) == 1  # it will be delivered


async def publish_and_take(config: Config, numbers: range) -> tuple[list[SequenceToken],
                                                                     list[bytes]]:
    """Publish ``{"i": n}`` for each of ``numbers`` to queue 0, then what app "shop" is
    given: every one it gets within 10 s, then nothing more for 0.5 s (acknowledged)."""
    adapter = RedisAdapter(config.redis)
    try:
        client = Client(adapter, HashRingQueueMapper(1))
        tokens = [await client.publish("n", "k", {"i": i}) for i in numbers]
        r = adapter.create_receiver(0, "shop")
        await r.initialize()
        got: list[bytes] = []
        deadline = time.monotonic() + 10
        while len(got) < len(numbers) and time.monotonic() < deadline:
            msgs = await r.get_messages(100, 0.1)
            await r.acknowledge([m.token for m in msgs])  # type: ignore[misc]
            got += [m.body for m in msgs]
        more = await r.get_messages(100, 0.5)
        await r.acknowledge([m.token for m in more])  # type: ignore[misc]
        await r.shutdown()
        return tokens, got + [m.body for m in more]
    finally:
        await adapter.close()


async def shop_lag(config: Config) -> tuple[int, list[int]]:
    """App "shop"'s lag on queue 0: the adapter's, and what the group listing says."""
    adapter = RedisAdapter(config.redis)
    try:
        listed = [g.lag for g in await adapter.groups.on([0]) if g.group == "shop"]
        return await adapter.lag(0, "shop"), listed
    finally:
        await adapter.close()


def test_a_token_past_the_stream_end_is_refused_and_allowed_skips_what_it_says(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # The app has handled everything, so no entry lies between its position and a token
    # past the stream's end: the rewind went through, and the app was given none of the
    # messages published afterwards (its last delivered id ahead of all of them).
    cfg_path, config = one_queue(redis_server, tmp_path)
    asyncio.run(publish_ten_and_take(config, 10))
    rewind = ["rewind", "--config", str(cfg_path), "--app", "shop",
              "--to", "0:99999999999999-0"]
    refused = CliRunner().invoke(main, rewind)
    assert refused.exit_code == 2, refused.output
    assert refused.output.count("\n") == 1, refused.output
    assert ("queue 0: every message published until the stream's ids reach "
            "99999999999999-0 (5138-11-16T09:46:39Z on the Redis server's clock) skipped; "
            "pass --allow-forward") in refused.output
    body = '{{"i":{}}}'.format
    _, got = asyncio.run(publish_and_take(config, range(10, 13)))
    assert got == [body(i).encode() for i in range(10, 13)]  # each once: nothing stopped

    forced = CliRunner().invoke(main, [*rewind, "--allow-forward"])
    assert forced.exit_code == 0, forced.output
    assert ("skipped on purpose (--allow-forward): queue 0: every message published until "
            "the stream's ids reach 99999999999999-0") in forced.output
    sent, got = asyncio.run(publish_and_take(config, range(13, 15)))
    assert got == [], "skipped, as the rewind said"
    # Nothing the app will be given is left: Redis's own lag counted the two skipped.
    assert asyncio.run(shop_lag(config)) == (0, [0])

    # A token past the last entry but behind the server's clock skips nothing to come.
    after = f"0:{sent[-1].major + 1}-0"
    back = CliRunner().invoke(main, ["rewind", "--config", str(cfg_path), "--app", "shop",
                                     "--to", after])
    assert back.exit_code == 0, back.output
    assert "skipped" not in back.output
    _, got = asyncio.run(publish_and_take(config, range(15, 17)))
    assert got == [body(i).encode() for i in range(15, 17)]


async def test_rewind_is_refused_while_a_daemon_elsewhere_holds_the_queues_lease(
    shop: Shop,
) -> None:
    adapter, leases = shop.adapter, shop.leases
    await leases.acquire(0, "busy-daemon", 5)
    assert await adapter.owners([0, 1], "shop") == {0: "busy-daemon"}
    with pytest.raises(QueueOwnedError, match="queue 0 by busy-daemon"):
        await adapter.rewind_queues([0, 1], "shop", time.time(), allow_forward=True)
    assert await adapter.owners([0], "other-app") == {}  # a lease is per app


def test_names_that_could_reach_other_keys_are_refused() -> None:
    with pytest.raises(ConfigError):
        Keys("conveyor:*")
    with pytest.raises(ConfigError):
        Keys("ok").lease("app}:x", 1)
    assert Keys("p").queue(3) == "p:q:3"


def test_passwords_are_redacted_and_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert redact_url("rediss://bob:s3cret@h:6380/1") == "rediss://bob:***@h:6380/1"
    assert redact_url("redis://h:6379/0") == "redis://h:6379/0"
    # redis-py also takes the password from the query string.
    assert redact_url("redis://h:6379/0?password=s3cret") == "redis://h:6379/0?password=***"
    assert (redact_url("rediss://bob:pw1@h/0?ssl_cert_reqs=none&password=pw2&db=2")
            == "rediss://bob:***@h/0?ssl_cert_reqs=none&password=***&db=2")
    monkeypatch.setenv("CONVEYOR_REDIS_PASSWORD", "from-env")
    monkeypatch.setenv("CONVEYOR_REDIS_USERNAME", "alice")
    cfg = load_config(None, environ={}, overrides={"redis": {"url": "rediss://h:1/0"}}).redis
    client = connect(cfg)
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["username"], kwargs["password"]) == ("alice", "from-env")
    assert "from-env" not in repr(client)


@pytest.mark.parametrize("command", [["publish", "items", "k", "{}"], ["status"],
                                     ["worker", "tests.apps.recorder:app"]],
                         ids=lambda c: c[0])
@pytest.mark.parametrize("userinfo", ["default:hunter2@", ":hunter2@", ""],
                         ids=["wrong-user-password", "wrong-password", "no-password"])
def test_refused_credentials_are_a_config_error_without_the_password(
    redis_server: RedisServer, tmp_path: Path, command: list[str], userinfo: str,
) -> None:
    """A wrong password (WRONGPASS) or none (NOAUTH) exited 1, as a broker's failure
    does; the URL is the config's mistake, named in one line (exit 2)."""
    redis_server.client().config_set("requirepass", "the-right-one")
    url = f"redis://{userinfo}127.0.0.1:{redis_server.port}/0"
    cfg = write_config(tmp_path / "c.toml", url, redis={"url": url, "retry_max_s": 0.5})
    proc = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", *command, "--config", str(cfg)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    [error] = proc.stderr.splitlines()
    assert error.startswith("conveyor: error: config: $.redis.url: the server refused the "
                            "credentials ("), error
    assert error.endswith("give the user and password in the URL "
                          "(redis://USER:PASSWORD@HOST/DB) or in the variables named by "
                          "[redis] username_env / password_env"), error
    assert "hunter2" not in proc.stdout + proc.stderr


def test_publish_and_status_commands_work_against_redis(
    redis_server: RedisServer, tmp_path: Path,
) -> None:
    cfg = write_config(tmp_path / "c.toml", redis_server.url)
    runner = CliRunner()
    result = runner.invoke(main, ["publish", "items", "k1", '{"seq": 1}', "--config", str(cfg)])
    assert result.exit_code == 0, result.output
    token = SequenceToken.parse(result.output.strip())
    result = runner.invoke(main, ["status", "--config", str(cfg), "--app", "rec", "--json"])
    assert result.exit_code == 0, result.output
    assert "'rec' has no consumer group" in result.stderr  # no daemon of it ran yet
    report = json.loads(result.stdout)
    assert report["members"] == []
    assert {q["queue"]: q["lag"] for q in report["queues"]}[token.queue] == 1
    result = runner.invoke(main, ["status", "--config", str(cfg), "--app", "rec"])
    assert "total" in result.output and "lag" in result.output


@pytest.mark.parametrize(("content_type", "body"), [
    (None, b'{"seq": 1, "note": "caf\xc3\xa9"}\n'),
    ("application/octet-stream", b"\x00\xff\xfe raw bytes\n"),  # not UTF-8: as they are
])
@pytest.mark.parametrize("source", ["file", "stdin"])
def test_publish_sends_the_body_of_a_file_or_stdin_byte_for_byte(
    redis_server: RedisServer, tmp_path: Path, content_type: str | None, body: bytes,
    source: str,
) -> None:
    cfg = write_config(tmp_path / "c.toml", redis_server.url)
    file = tmp_path / "body"
    file.write_bytes(body)
    args = ["publish", "items", "k1", "--body-file", str(file) if source == "file" else "-",
            "--config", str(cfg), *(("--content-type", content_type) if content_type else ())]
    proc = subprocess.run([sys.executable, "-m", "conveyor.cli", *args], cwd=REPO,
                          input=body if source == "stdin" else None, capture_output=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    token = SequenceToken.parse(proc.stdout.decode().strip())
    [(_, fields)] = redis_server.client().xrange(f"t:q:{token.queue}")
    assert fields[b"body"] == body


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["", "k1", "{}"], "NAMESPACE: must be a non-empty string"),
        (["items", "k1", "{}", "-H", "body=x"], "'body' is reserved by the wire format"),
    ],
)
def test_a_publish_the_caller_got_wrong_exits_2_in_one_line(
    redis_server: RedisServer, tmp_path: Path, args: list[str], says: str,
) -> None:
    # Both exited 1, as a broker's failure would: the first a plain ConveyorError, the
    # second a BrokerError raised by the Redis wire format (now refused as the command
    # reads its headers, as every name the wire format reserves is).
    cfg = write_config(tmp_path / "c.toml", redis_server.url)
    result = CliRunner().invoke(main, ["publish", *args, "--config", str(cfg)])
    assert result.exit_code == 2, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith("conveyor: error: ") and says in line, line
    assert redis_server.client().keys("*:q:*") == []  # nothing was sent


def test_the_redis_benchmark_reports_its_figures_next_to_the_raw_floor(
    redis_server: RedisServer,
) -> None:
    result = CliRunner().invoke(main, [
        "bench", "throughput", "--adapter", "redis", "--redis-url", redis_server.url,
        "--messages", "2000", "--streams", "50", "--repeats", "1", "--daemons", "1", "--json",
    ])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    for key in ("msgs_per_s", "cpu_us_per_msg", "floor_msgs_per_s", "ratio",
                "publish_msgs_per_s", "publish_floor_msgs_per_s", "publish_ratio"):
        assert figures[key] > 0
    assert figures["ratio"] == pytest.approx(figures["msgs_per_s"] / figures["floor_msgs_per_s"])
    assert (figures["variant"], figures["config"]) == ("shipped", "configs/redis.toml")
    assert redis_server.client().keys("bench*") == []  # the benchmark cleaned up


async def test_a_pending_entry_deleted_meanwhile_is_acked_not_delivered(
    adapter: RedisAdapter,
) -> None:
    client = Client(adapter, HashRingQueueMapper(1))
    tokens = [await client.publish("n", "k", {"i": i}) for i in range(3)]
    first = adapter.create_receiver(0, "g")  # unleased: the unfenced ack script
    await first.initialize()
    assert len(await first.get_messages(3, 0.1)) == 3
    # The owner dies with all three pending; the middle one is deleted meanwhile.
    stream = adapter.keys.queue(0)
    await adapter.redis.xdel(stream, f"{tokens[1].major}-{tokens[1].minor}")
    second = adapter.create_receiver(0, "g")
    await second.initialize()
    got = await second.get_messages(10, 0.1)
    assert [m.token for m in got] == [tokens[0], tokens[2]]
    assert (await adapter.redis.xpending(stream, "g"))["pending"] == 2  # the gone one acked
    await second.acknowledge([m.token for m in got])  # type: ignore[misc]
    assert await adapter.lag(0, "g") == 0


def test_publish_sends_a_binary_types_body_as_the_bytes_the_shell_passed(
    redis_server: RedisServer, tmp_path: Path,
) -> None:
    """Bytes that are not UTF-8 reach the command as surrogate escapes: a binary content
    type sends them back as the bytes they were; a text type refuses them (exit 2)."""
    cfg = write_config(tmp_path / "c.toml", redis_server.url)
    raw = b"\xff\xfe\x01bin"
    run = [sys.executable, "-m", "conveyor.cli", "publish", "items", "k", raw, "--config",
           str(cfg).encode()]
    done = subprocess.run([*run, b"--content-type", b"application/octet-stream"], cwd=REPO,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    [(_, fields)] = redis_server.client().xrange(
        f"t:q:{SequenceToken.parse(done.stdout.decode().strip()).queue}")
    assert (fields[b"body"], fields[b"content-type"]) == (raw, b"application/octet-stream")
    text = subprocess.run([*run, b"--content-type", b"text/plain"], cwd=REPO,
                          capture_output=True, timeout=60)
    assert text.returncode == 2 and b"cannot be encoded as UTF-8" in text.stderr, text.stderr


async def test_a_batch_with_a_message_of_too_many_headers_is_refused_whole(
    adapter: RedisAdapter,
) -> None:
    # Refused by the adapter, per queue, the other queues' messages were stored and the
    # batch raised PartialPublishError; a message that cannot be written refuses the
    # whole batch before anything is sent, as one with a reserved header does.
    client = Client(adapter, HashRingQueueMapper(8))
    many = {f"h{i}": "v" for i in range(MAX_HEADERS + 1)}
    items = [Publish("orders", f"k{i}", {"i": i}) for i in range(20)]
    with pytest.raises(MessageTooLargeError, match="headers are more than"):
        await client.publish_batch([*items, Publish("orders", "k0", {}, many)])
    lengths = [await adapter.redis.xlen(adapter.keys.queue(q)) for q in range(8)]
    assert lengths == [0] * 8
