"""A ``publish_batch`` that Redis refuses in part says what landed; retrying the rest
doubles nothing. And a body over ``[queues] max_body_bytes`` is refused before anything
is sent.

The refusals are the server's own: a queue's stream key holding a string (``WRONGTYPE``,
one queue refused, deterministically), and ``maxmemory`` with ``noeviction`` (the
script calls of one queue's pipeline written until memory runs out, the rest refused).
Every test compares what the streams hold with what the error says; no duplicate is
allowed anywhere.
"""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from conveyor.adapters.redis import RedisAdapter
from conveyor.adapters.redis.codec import PUBLISH_CHUNK_BYTES
from conveyor.client import Client, Publish
from conveyor.platform.errors import BrokerError, MessageTooLargeError, PartialPublishError
from conveyor.platform.ids import SequenceToken
from tests.integration.redis.conftest import RedisServer
from tests.integration.redis.test_redis_publish import (
    QUEUES,
    assert_written_once,
    config_for,
    stream_contents,
)

pytestmark = pytest.mark.redis


def spread(n: int, body_bytes: int = 0) -> list[Publish]:
    """``n`` messages over 64 streams (so over every queue), ``pad`` making bodies big."""
    return [Publish("orders", f"k{i % 64}", {"seq": i, "pad": "x" * body_bytes})
            for i in range(n)]


async def stored_ids(adapter: RedisAdapter, *, but: int | None = None) -> list[str]:
    """The ids every queue's stream holds (but queue ``but``'s, which holds no stream)."""
    ids = []
    for q in range(QUEUES):
        if q != but:
            flat = await adapter.redis.xrange(adapter.keys.queue(q), "-", "+")
            ids += [dict(zip(f[0::2], f[1::2], strict=True))[b"cv-id"].decode()
                    for _, f in flat]
    return ids


async def publish_when_full(client: Client, batch: list[Publish], room_bytes: int
                            ) -> BrokerError:
    """``publish_batch(batch)`` into a Redis with ``room_bytes`` left under ``maxmemory``
    and ``noeviction``; the error it raised (then the room is lifted)."""
    redis = client.adapter.redis  # type: ignore[attr-defined]
    used = int((await redis.info("memory"))["used_memory"])
    await redis.config_set("maxmemory-policy", "noeviction")
    await redis.config_set("maxmemory", used + room_bytes)
    try:
        with pytest.raises(BrokerError) as caught:
            await client.publish_batch(batch)
    finally:
        await redis.config_set("maxmemory", 0)
    return caught.value


async def test_a_batch_with_one_queue_refused_names_what_landed_and_the_rest_goes_once(
    redis_server: RedisServer,
) -> None:
    config = config_for(redis_server.url)
    async with Client.from_config(config) as client:
        adapter = client.adapter
        assert isinstance(adapter, RedisAdapter)
        batch = spread(400)
        broken = client.queue_for("orders", "k0")
        await adapter.redis.set(adapter.keys.queue(broken), "not a stream")
        with pytest.raises(PartialPublishError) as caught:
            await client.publish_batch(batch)
        err = caught.value
        on_broken = [i for i, p in enumerate(batch) if client.queue_for("orders", p.key) == broken]
        assert {err.ids[i] for i in on_broken} == set(err.failed)  # that queue, and only it
        assert all("WRONGTYPE" in str(cause) for cause in err.failed.values())
        assert not err.uncertain
        assert len(err.published) == len(batch) - len(on_broken) > 0
        assert "were stored" in str(err) and "\n" not in str(err)
        stored = await stored_ids(adapter, but=broken)
        assert sorted(stored) == sorted(err.published)  # the error is right
        for ident, token in err.published.items():  # and so are its tokens
            assert token.queue != broken and ident in err.ids

        await adapter.redis.delete(adapter.keys.queue(broken))
        rest = err.not_published(batch)
        assert rest == [batch[i] for i in on_broken]
        await client.publish_batch(rest)
        entries = await stream_contents(adapter)
        seqs = sorted(msgspec.json.decode(f[b"body"])["seq"] for _, _, f in entries)
        assert seqs == list(range(len(batch)))  # each message once: none lost, none doubled


async def test_a_queue_out_of_memory_mid_pipeline_keeps_what_it_wrote_and_says_so(
    redis_server: RedisServer,
) -> None:
    """One queue's messages in three script calls (bodies of PUBLISH_CHUNK_BYTES each):
    with ``maxmemory`` above what the first needs and below what all three need, under
    ``noeviction``, the first calls are written and the last refused whole (OOM) — the
    shape of the reported loss, where a plain BrokerError hid 371-524 stored messages.
    (Each call also holds about its size in the server's buffers while it runs: 3.5
    chunks of room lets one or two through.)"""
    config = config_for(redis_server.url)
    async with Client.from_config(config) as client:
        adapter = client.adapter
        assert isinstance(adapter, RedisAdapter)
        await client.publish("orders", "k", {"seq": -1})  # the script loaded, stream made
        await adapter.redis.delete(adapter.keys.queue(client.queue_for("orders", "k")))
        batch = [Publish("orders", "k", {"seq": i, "pad": "x" * PUBLISH_CHUNK_BYTES})
                 for i in range(3)]  # one stream: one queue, one chunk each
        err = await publish_when_full(client, batch, room_bytes=PUBLISH_CHUNK_BYTES * 7 // 2)
        assert isinstance(err, PartialPublishError)
        landed = len(err.published)
        assert 0 < landed < len(batch)
        assert list(err.published) == list(err.ids[:landed])  # the stream's first ones
        assert list(err.failed) == list(err.ids[landed:])
        assert all("maxmemory" in str(cause) for cause in err.failed.values())
        assert await stored_ids(adapter) == list(err.ids[:landed])

        await client.publish_batch(err.not_published(batch))
        await assert_written_once(adapter, batch)  # once each, in the stream's order


async def test_concurrent_publishes_sent_together_each_learn_their_own_messages_fate(
    redis_server: RedisServer,
) -> None:
    """Single ``publish`` calls made at once go in one send ([publish] coalesce); when
    Redis stores that send in part, each call gets its own message's fate: its token,
    or the refusal — never the whole send's error for a message that was stored."""
    config = config_for(redis_server.url)
    async with Client.from_config(config) as client:
        adapter = client.adapter
        assert isinstance(adapter, RedisAdapter)
        await client.publish("orders", "k", {"seq": -1})
        await adapter.redis.delete(adapter.keys.queue(client.queue_for("orders", "k")))
        bodies = [{"seq": i, "pad": "x" * PUBLISH_CHUNK_BYTES} for i in range(3)]
        redis = adapter.redis
        used = int((await redis.info("memory"))["used_memory"])
        await redis.config_set("maxmemory-policy", "noeviction")
        await redis.config_set("maxmemory", used + PUBLISH_CHUNK_BYTES * 7 // 2)
        try:
            outcomes = await asyncio.gather(
                *(client.publish("orders", "k", body) for body in bodies),
                return_exceptions=True)
        finally:
            await redis.config_set("maxmemory", 0)
        stored = [o for o in outcomes if isinstance(o, SequenceToken)]
        refused = [o for o in outcomes if not isinstance(o, SequenceToken)]
        assert stored and refused, outcomes  # one send, stored in part
        assert all(isinstance(e, BrokerError) and "maxmemory" in str(e) for e in refused)
        entries = await stream_contents(adapter)
        assert [(q, eid) for q, eid, _ in entries] == [
            (t.queue, b"%d-%d" % (t.major, t.minor)) for t in stored]
        assert [msgspec.json.decode(f[b"body"])["seq"] for *_, f in entries] == [
            i for i, o in enumerate(outcomes) if isinstance(o, SequenceToken)]


async def test_a_full_redis_under_a_spread_batch_never_hides_what_landed(
    redis_server: RedisServer,
) -> None:
    """The reported case: a batch over every queue into a Redis at ``maxmemory`` under
    ``noeviction``. Which queues' calls get in before memory runs out depends on the
    server's order; whatever it is, the error names exactly what the streams hold, and
    publishing the rest again gives each message once."""
    config = config_for(redis_server.url)
    async with Client.from_config(config) as client:
        adapter = client.adapter
        assert isinstance(adapter, RedisAdapter)
        await client.publish_batch(spread(QUEUES * 8))  # scripts loaded, streams made
        for q in range(QUEUES):
            await adapter.redis.delete(adapter.keys.queue(q))
        batch = spread(QUEUES * 8, body_bytes=64 << 10)  # 4 MiB over 8 queues
        err = await publish_when_full(client, batch, room_bytes=2 << 20)
        stored = await stored_ids(adapter)
        if isinstance(err, PartialPublishError):
            assert sorted(stored) == sorted(err.published)
            assert len(err.published) + len(err.failed) == len(batch)
            rest = err.not_published(batch)
        else:  # refused whole: nothing may have landed
            assert "maxmemory" in str(err)
            assert stored == []
            rest = batch
        await client.publish_batch(rest)
        stored_bodies = [f[b"body"] for _, _, f in await stream_contents(adapter)]
        seqs = sorted(msgspec.json.decode(b)["seq"] for b in stored_bodies)
        assert seqs == list(range(len(batch)))


async def test_a_body_over_max_body_bytes_is_refused_before_anything_is_sent(
    redis_server: RedisServer,
) -> None:
    limit = 10_000
    config = config_for(redis_server.url)
    config.queues.max_body_bytes = limit
    async with Client.from_config(config) as client:
        adapter = client.adapter
        assert isinstance(adapter, RedisAdapter)
        with pytest.raises(MessageTooLargeError) as caught:
            await client.publish("orders", "k", b"x" * (limit + 1))
        text = str(caught.value)
        assert "$.queues.max_body_bytes" in text and str(limit) in text
        assert "nothing was sent" in text and "\n" not in text
        batch = [Publish("orders", f"k{i}", b"x" * 10) for i in range(50)]
        batch.insert(25, Publish("orders", "big", b"x" * (limit + 1)))
        with pytest.raises(MessageTooLargeError):
            await client.publish_batch(batch)  # the whole batch: its other 50 too
        assert await stored_ids(adapter) == []
        token = await client.publish("orders", "k", b"x" * limit)  # the limit itself goes
        assert await stored_ids(adapter) != [] and token.queue == client.queue_for("orders", "k")
