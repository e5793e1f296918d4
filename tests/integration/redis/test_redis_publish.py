"""Publishing to Redis writes each message once, whatever point the connection is cut at.

The faults are real: ``CLIENT KILL`` on the server, and a proxy (tests/proxy.py) that
drops the server's reply after the server has acted on the request. Every test counts
what the streams hold against what was published; none allows a duplicate.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import msgspec
import pytest
from redis.crc import key_slot

from conveyor.adapters.redis import RedisAdapter
from conveyor.client import Client, Publish
from conveyor.platform.config import Config, load_config
from conveyor.platform.errors import (
    BodyEncodeError,
    BrokerConnectionError,
    BrokerError,
    PublishUncertain,
)
from conveyor.platform.ids import SequenceToken
from conveyor.platform.mapper import HashRingQueueMapper
from tests.conftest import free_port, wait_until
from tests.integration.redis.conftest import RedisServer
from tests.proxy import CuttableProxy

pytestmark = pytest.mark.redis

QUEUES = 8


def config_for(url: str, **redis: object) -> Config:
    return load_config(None, environ={}, overrides={
        "queues": {"adapter": "redis", "total": QUEUES},
        "redis": {"url": url, "prefix": "t", **redis},
        "balancer": {"kind": "static"},
    })


def items(n: int, streams: int, tag: str = "") -> list[Publish]:
    return [Publish("orders", f"k{i % streams}", {"seq": i, "tag": tag}) for i in range(n)]


async def stream_contents(adapter: RedisAdapter) -> list[tuple[int, bytes, dict[bytes, bytes]]]:
    """Every entry of every queue: (queue, entry id, fields), in stream order."""
    out = []
    for q in range(QUEUES):
        for eid, flat in await adapter.redis.xrange(adapter.keys.queue(q), "-", "+"):
            out.append((q, eid, dict(zip(flat[0::2], flat[1::2], strict=True))))
    return out


async def assert_written_once(adapter: RedisAdapter, published: list[Publish],
                              tokens: list[SequenceToken] | None = None) -> None:
    """Entries == distinct cv-ids == published, each body once, per-stream order kept
    (and, given the tokens publish returned, each token names its own entry)."""
    entries = await stream_contents(adapter)
    ids = [fields[b"cv-id"] for _, _, fields in entries]
    assert len(entries) == len(set(ids)) == len(published)
    by_key: dict[str, list[int]] = defaultdict(list)
    for _, _, fields in entries:
        by_key[fields[b"cv-key"].decode()].append(msgspec.json.decode(fields[b"body"])["seq"])
    want: dict[str, list[int]] = defaultdict(list)
    for item in published:
        want[item.key].append(item.body["seq"])
    assert by_key == want  # same messages per stream, in publishing order
    if tokens is not None:
        at = {(q, eid): fields for q, eid, fields in entries}
        for token, item in zip(tokens, published, strict=True):
            fields = at[(token.queue, b"%d-%d" % (token.major, token.minor))]
            assert msgspec.json.decode(fields[b"body"])["seq"] == item.body["seq"]


@pytest.fixture
async def proxied(redis_server: RedisServer) -> Any:
    proxy = CuttableProxy(free_port(), redis_server.port)
    await proxy.start()
    yield proxy
    await proxy.cut()


async def test_a_batch_whose_reply_was_lost_is_not_written_again_by_the_retry(
    redis_server: RedisServer, proxied: CuttableProxy
) -> None:
    config = config_for(f"redis://127.0.0.1:{proxied.port}/0")
    direct = RedisAdapter(config_for(redis_server.url).redis)
    async with Client.from_config(config) as client:
        adapter = client.adapter
        assert isinstance(adapter, RedisAdapter)
        warm = [Publish("orders", "warm", {"seq": -1})]
        warm_tokens = await client.publish_batch(warm)  # connection open, script loaded
        batch = items(3000, 50)  # several chunks per queue: one pipeline of scripts
        proxied.lose_next_reply()
        tokens = await client.publish_batch(batch)
        assert proxied.replies_lost == 1
        assert adapter.replayed_batches >= 1  # the retry found its batches written
    try:
        await assert_written_once(direct, warm + batch, warm_tokens + tokens)
    finally:
        await direct.close()


async def total_entries(adapter: RedisAdapter) -> int:
    return sum([await adapter.redis.xlen(adapter.keys.queue(q)) for q in range(QUEUES)])


async def publish_under_kills(client: Client, killer: RedisAdapter,
                              batch: list[Publish]) -> int:
    """``publish_batch(batch)`` with ``CLIENT KILL TYPE normal`` as its first entries
    land, and twice more later; returns how many connections the kills closed."""
    before = await total_entries(killer)
    publishing = asyncio.ensure_future(client.publish_batch(batch))
    kills = 0
    for landed in (1, 4_000, 10_000):

        async def grown(landed: int = landed) -> bool:
            return publishing.done() or await total_entries(killer) - before >= landed

        await wait_until(grown, timeout_s=60, interval_s=0.001, what=f"{landed} entries")
        if publishing.done():
            break
        kills += int(await killer.redis.client_kill_filter(_type="normal", skipme=True))
    assert len(await publishing) == len(batch)
    return kills


async def test_client_kill_during_large_publishes_writes_each_message_once(
    redis_server: RedisServer,
) -> None:
    """``CLIENT KILL TYPE normal`` up to three times during each 20,000-message
    ``publish_batch`` call, rounds repeated until at least 3 kills closed a connection
    (a loaded machine can finish a call before the killer sees its first entries: 0
    kills in 3 rounds once); duplicates allowed: none. (Before the publishing script,
    this wrote ~11,000 duplicates over three rounds.)"""
    config = config_for(redis_server.url)
    killer = RedisAdapter(config.redis)
    published: list[Publish] = []
    kills = 0
    async with Client.from_config(config) as client:
        for round_ in range(10):  # one order over all rounds, per stream
            if round_ >= 3 and kills >= 3:
                break
            batch = [Publish("orders", f"k{i % 500}", {"seq": round_ * 20_000 + i})
                     for i in range(20_000)]
            kills += await publish_under_kills(client, killer, batch)
            published += batch
    try:
        assert kills >= 3, f"only {kills} kills hit a connection: the fault was not injected"
        await assert_written_once(killer, published)
    finally:
        await killer.close()


async def test_retries_that_run_out_after_the_send_raise_publish_uncertain(
    redis_server: RedisServer, proxied: CuttableProxy
) -> None:
    config = config_for(f"redis://127.0.0.1:{proxied.port}/0", retry_max_s=0.3,
                        connect_timeout_s=0.2)
    async with Client.from_config(config) as client:
        await client.publish_batch([Publish("orders", "warm", {"seq": -1})])
        proxied.lose_next_reply(then_down=True)
        batch = items(10, 1)
        with pytest.raises(PublishUncertain) as caught:
            await client.publish_batch(batch)
    assert "may or may not have been written" in str(caught.value)
    assert len(caught.value.message_ids) == len(batch)
    direct = RedisAdapter(config_for(redis_server.url).redis)
    try:  # it had landed: the ids name what to look for
        entries = await stream_contents(direct)
        landed = {fields[b"cv-id"].decode() for _, _, fields in entries}
        assert set(caught.value.message_ids) <= landed
    finally:
        await direct.close()


async def test_a_publish_that_never_connected_says_nothing_was_written() -> None:
    config = config_for(f"redis://127.0.0.1:{free_port()}/0", retry_max_s=0.3,
                        connect_timeout_s=0.2)  # nothing listens there
    async with Client.from_config(config) as client:
        with pytest.raises(BrokerConnectionError) as caught:
            await client.publish_batch(items(10, 1))
    assert not isinstance(caught.value, PublishUncertain)
    assert "connecting to" in str(caught.value)


@pytest.mark.parametrize("body", [{"total": float("nan")}, {"at": object()}, "caf\udce9"],
                         ids=["nan", "object", "surrogate"])
async def test_a_body_that_cannot_be_sent_as_it_is_leaves_redis_untouched(
        redis_server: RedisServer, body: object) -> None:
    # NaN used to be stored as null; the others failed with bare Python errors.
    async with Client.from_config(config_for(redis_server.url)) as client:
        adapter = client.adapter
        assert isinstance(adapter, RedisAdapter)
        with pytest.raises(BodyEncodeError, match=r"^message to stream orders/k1: .*nothing "
                           r"was sent"):
            await client.publish_batch([*items(10, 5), Publish("orders", "k1", body)])
        with pytest.raises(BodyEncodeError, match="nothing was sent"):
            await client.publish("orders", "k1", body)
        assert await stream_contents(adapter) == []


async def test_a_batch_marker_shares_its_streams_cluster_slot(redis_server: RedisServer) -> None:
    config = config_for(redis_server.url)
    async with Client.from_config(config) as client:
        adapter = client.adapter
        assert isinstance(adapter, RedisAdapter)
        await client.publish_batch(items(100, 10))
        markers = [k async for k in adapter.redis.scan_iter(match="t:pub:*")]
        assert markers
        for marker in markers:
            stream = marker.decode().split("{", 1)[1].split("}", 1)[0]
            assert stream.startswith("t:q:")
            assert key_slot(marker) == key_slot(stream.encode())
            ttl_ms = await adapter.redis.pttl(marker)
            assert 0 < ttl_ms <= adapter.publish_window_ms


async def test_concurrent_publishes_coalesce_keep_order_and_flush_on_close(
    redis_server: RedisServer,
) -> None:
    config = config_for(redis_server.url)
    client = Client.from_config(config)
    adapter = client.adapter
    assert isinstance(adapter, RedisAdapter)
    rounds: list[int] = []  # queues a round
    enqueue_queues = adapter.enqueue_queues
    pipeline = adapter.redis.pipeline
    pipelines = 0

    def counted_pipeline(*args: Any, **kwargs: Any) -> Any:
        nonlocal pipelines
        pipelines += 1
        return pipeline(*args, **kwargs)

    async def counted(batches: Any) -> dict[int, list[SequenceToken] | Exception]:
        rounds.append(len(batches))
        return await enqueue_queues(batches)

    adapter.enqueue_queues = counted  # type: ignore[method-assign]
    adapter.redis.pipeline = counted_pipeline
    client = Client(adapter, HashRingQueueMapper(QUEUES), coalesce_linger_s=0.0,
                    owns_adapter=True)
    await client.publish("orders", "warm", {"seq": -1})  # the script loaded
    rounds.clear()
    before = (await adapter.redis.info("commandstats"))["cmdstat_evalsha"]["calls"]
    batch = items(4_000, 200)  # 200 publishers, one per stream, 20 calls each
    by_key: dict[str, list[Publish]] = defaultdict(list)
    for item in batch:
        by_key[item.key].append(item)

    async def one_stream(lane: list[Publish]) -> None:
        for item in lane:
            await client.publish(item.namespace, item.key, item.body)

    await asyncio.gather(*(one_stream(lane) for lane in by_key.values()))
    # Each publisher has one call waiting at a time and all of them join the next
    # round: 20 rounds, each one pipeline (one round trip) of a script call per queue.
    # Allow twice that.
    assert len(rounds) <= 40, f"{len(rounds)} rounds for {len(batch)} publishes"
    assert max(rounds) == QUEUES
    assert pipelines == sum(1 for queues in rounds if queues > 1)
    calls = (await adapter.redis.info("commandstats"))["cmdstat_evalsha"]["calls"] - before
    assert calls == sum(rounds)  # a queue's share of a round is one script call
    tail = [asyncio.ensure_future(client.publish("orders", "tail", {"seq": 4_000 + i}))
            for i in range(50)]
    await asyncio.sleep(0)  # the calls are queued; close must send them
    direct = RedisAdapter(config_for(redis_server.url).redis)
    await client.close()
    try:
        assert all(t.done() for t in tail)
        await assert_written_once(
            direct, [Publish("orders", "warm", {"seq": -1}), *batch,
                     *(Publish("orders", "tail", {"seq": 4_000 + i}) for i in range(50))]
        )
    finally:
        await direct.close()


async def test_a_failed_coalesced_send_reaches_every_waiting_publish(
    redis_server: RedisServer, proxied: CuttableProxy
) -> None:
    config = config_for(f"redis://127.0.0.1:{proxied.port}/0", retry_max_s=0.3,
                        connect_timeout_s=0.2)
    async with Client.from_config(config) as client:
        await client.publish("orders", "warm", {"seq": -1})
        await proxied.cut()
        keys = [f"k{i % 3}" for i in range(30)]
        calls = [client.publish("orders", key, {"seq": i}) for i, key in enumerate(keys)]
        results = await asyncio.gather(*calls, return_exceptions=True)
        # A queue whose pooled connection was open may have sent (PublishUncertain); one
        # that had to connect did not (a plain BrokerConnectionError). Either way every
        # call of a queue gets its send's error.
        assert all(isinstance(r, BrokerConnectionError) for r in results), results
        by_queue: dict[int, set[int]] = defaultdict(set)
        for key, result in zip(keys, results, strict=True):
            by_queue[client.queue_for("orders", key)].add(id(result))
        assert all(len(errors) == 1 for errors in by_queue.values())
        await proxied.start()
        token = await client.publish("orders", "after", {"seq": 99})  # starts afresh
        assert isinstance(token, SequenceToken)


@pytest.mark.parametrize(
    ("publish", "linger_s"),
    [({"coalesce": True, "linger_ms": 5}, 0.005), ({"coalesce": False}, None)],
)
async def test_a_daemons_client_takes_the_publish_section_as_a_users_client_does(
    redis_server: RedisServer, publish: dict[str, object], linger_s: float | None
) -> None:
    from conveyor import App, WorkerDaemon

    config = load_config(None, environ={}, overrides={
        "queues": {"adapter": "redis", "total": QUEUES},
        "redis": {"url": redis_server.url, "prefix": "t"},
        "balancer": {"kind": "static"},
        "publish": publish,
    })
    daemon = WorkerDaemon(App("hooks"), config)
    async with Client.from_config(config) as users:
        assert daemon.client.coalesce_linger_s == users.coalesce_linger_s == linger_s
    await daemon.stop()


async def test_a_daemons_stop_sends_what_its_clients_publish_calls_left_waiting(
    redis_server: RedisServer,
) -> None:
    from conveyor import App, WorkerDaemon

    config = load_config(None, environ={}, overrides={
        "queues": {"adapter": "redis", "total": QUEUES},
        "redis": {"url": redis_server.url, "prefix": "t"},
        "balancer": {"kind": "static"},
        "publish": {"linger_ms": 1_500},  # longer than the stop takes
    })
    app = App("hooks")
    calls: list[asyncio.Future[SequenceToken]] = []
    hooked = asyncio.Event()

    @app.startup
    async def audit(client: Client) -> None:  # publishes, and returns before they are sent
        calls.extend(asyncio.ensure_future(client.publish("audit", f"k{i}", {"seq": i}))
                     for i in range(50))
        hooked.set()

    daemon = WorkerDaemon(app, config)
    await daemon.start()
    async with asyncio.timeout(10):
        await hooked.wait()
    assert not any(call.done() for call in calls)  # still lingering
    await daemon.stop()
    assert all(call.done() and call.exception() is None for call in calls)
    direct = RedisAdapter(config.redis)
    try:
        await assert_written_once(
            direct, [Publish("audit", f"k{i}", {"seq": i}) for i in range(50)])
    finally:
        await direct.close()


async def test_dead_letters_whose_reply_was_lost_are_stored_once(
    redis_server: RedisServer, proxied: CuttableProxy
) -> None:
    """The dead-letter store is retried on a lost reply like a publish, and like a publish
    it is keyed by a batch id: the retry finds the batch stored and stores nothing.
    (Before, a pipeline of ``XADD``s retried whole stored every letter of it twice.)"""
    from tests.contract.test_dead_letters import letter

    adapter = RedisAdapter(config_for(f"redis://127.0.0.1:{proxied.port}/0").redis,
                           max_dead_letters=1000)
    try:
        await adapter.dead_letters.put("shop", [letter(0)])  # connection open, script loaded
        proxied.lose_next_reply()
        assert await adapter.dead_letters.put("shop", [letter(n) for n in range(1, 51)]) == 0
        assert proxied.replies_lost == 1
        stored = await adapter.dead_letters.page("shop", limit=1000)
    finally:
        await adapter.close()
    assert [s.letter.message.id for s in stored] == [f"m{n}" for n in range(51)]


async def test_a_connection_lost_while_loading_the_publish_script_goes_back_to_the_pool(
    redis_server: RedisServer, proxied: CuttableProxy
) -> None:
    """A pipelined publish first checks the server knows its script (``SCRIPT EXISTS``);
    a connection lost on that reply failed before redis-py's own clean-up, so it stayed
    checked out of the pool for good (one leaked per such failure, and a warning)."""
    adapter = RedisAdapter(config_for(f"redis://127.0.0.1:{proxied.port}/0").redis)
    try:
        batch = _messages(3000)
        await adapter.enqueue(0, batch[:1500])  # several chunks: the pipelined path
        proxied.lose_next_reply()  # the next reply: SCRIPT EXISTS of the next publish
        await adapter.enqueue(0, batch[1500:])  # retried on a new connection
        assert proxied.replies_lost == 1
        assert not adapter.redis.connection_pool._in_use_connections
    finally:
        await adapter.close()


def _messages(n: int) -> list[Any]:
    from conveyor.platform.ids import StreamId
    from conveyor.platform.message import Message, now_ms

    return [Message(f"m{i}", StreamId("orders", "k"), b'{"seq": %d}' % i,
                    enqueued_at_ms=now_ms()) for i in range(n)]


async def test_a_queue_refused_in_a_round_fails_alone(redis_server: RedisServer) -> None:
    """One round, one pipeline over every queue; one queue's stream is a key of another
    type (WRONGTYPE): its calls get that error, the others' are stored once each."""
    async with Client.from_config(config_for(redis_server.url)) as client:
        adapter = client.adapter
        assert isinstance(adapter, RedisAdapter)
        rounds: list[int] = []
        enqueue_queues = adapter.enqueue_queues

        async def counted(batches: Any) -> dict[int, list[SequenceToken] | Exception]:
            rounds.append(len(batches))
            return await enqueue_queues(batches)

        assert client._coalescer is not None
        client._coalescer._send = counted
        keys = [f"k{i}" for i in range(64)]
        broken = client.queue_for("orders", keys[0])
        await adapter.redis.set(adapter.keys.queue(broken), "not a stream")
        try:
            results = await asyncio.gather(
                *(client.publish("orders", k, {"seq": i}) for i, k in enumerate(keys)),
                return_exceptions=True)
        finally:
            await adapter.redis.delete(adapter.keys.queue(broken))
        assert rounds == [QUEUES]
        sent: list[Publish] = []
        for i, (key, result) in enumerate(zip(keys, results, strict=True)):
            if client.queue_for("orders", key) == broken:
                assert isinstance(result, BrokerError) and "WRONGTYPE" in str(result), result
            else:
                assert isinstance(result, SequenceToken), result
                sent.append(Publish("orders", key, {"seq": i}))
        assert len(sent) < len(keys)
        await assert_written_once(adapter, sent, [r for r in results
                                                  if isinstance(r, SequenceToken)])


async def test_a_round_after_the_server_forgot_the_script_is_stored_once(
    redis_server: RedisServer,
) -> None:
    """A server restarted, flushed or failed over does not know the publishing script:
    a single call loads it on NOSCRIPT and calls again, a pipeline loads it first."""
    async with Client.from_config(config_for(redis_server.url)) as client:
        adapter = client.adapter
        assert isinstance(adapter, RedisAdapter)
        warm = Publish("orders", "warm", {"seq": -1})
        await client.publish(warm.namespace, warm.key, warm.body)
        await adapter.redis.script_flush()
        batch = items(64, 64)
        tokens = await asyncio.gather(
            *(client.publish(item.namespace, item.key, item.body) for item in batch))
        await assert_written_once(adapter, [warm, *batch])
        assert len(set(tokens)) == len(batch)
        assert len({t.queue for t in tokens}) == QUEUES  # the round spanned every queue
        # One queue's chunks go in one pipeline, the other queues' sends beside it, each
        # on its own connection: one that loads the script while the pipeline runs must
        # not let a later chunk of it be stored while an earlier one was refused (a
        # fresh-clone CI run once saw that: a PartialPublishError).
        for round_ in range(5):
            await adapter.redis.script_flush()
            more = [Publish("orders", f"long{round_}", {"seq": i}) for i in range(2_500)]
            more += items(64, 64, tag=f"beside{round_}")  # every queue
            await client.publish_batch(more)
            batch += more
        await assert_written_once(adapter, [warm, *batch])
