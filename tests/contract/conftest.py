"""One fresh queue adapter per test, for every adapter: the contract suite's fixture.

``adapter`` is parametrized (ids ``memory``, ``redis``, ``redis-cluster``,
``redis-sentinel``, ``kafka``) the way dramatiq's tests run one suite on every broker.
Each test gets a namespace of its own: a uniquely named memory broker, a redis-server of
its own (they start in ~20 ms), a key prefix of its own on the suite's Redis Cluster (3
primaries + 3 replicas, ~2 s to start) or on the suite's Sentinel-managed primary (a
replica and 3 sentinels, ~1 s) — one each for the whole session, since no contract test
kills a node — or a fresh topic on the module's tansu broker. A
missing server skips locally and fails under ``CONVEYOR_REQUIRE_SERVERS=1``.

A new adapter joins the suite with one more entry in ``_BUILDERS``; the tests use the
port (``QueueAdapter``, ``QueueReceiver``) only.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from conveyor.adapters.memory import MemoryAdapter, reset_broker
from conveyor.platform.adapter import QueueAdapter, QueueReceiver
from conveyor.platform.config import load_config
from conveyor.platform.letters import FIELDS
from tests.servers.cluster import shared_cluster
from tests.servers.process import server_fixture
from tests.servers.sentinel import SENTINEL_SERVICE, shared_sentinel

QUEUES = 2
"""Queues (Kafka: partitions) every test may use: 0 and 1."""

Build = Callable[[pytest.FixtureRequest, Path], Awaitable[QueueAdapter]]

contract_redis_cluster = server_fixture(
    "contract_redis_cluster", shared_cluster, scope="session",
    doc="The contract suite's Redis Cluster, shared by all its tests (a prefix each).")

contract_redis_sentinel = server_fixture(
    "contract_redis_sentinel", shared_sentinel, scope="session",
    doc="The contract suite's Sentinel-managed primary, shared by all its tests.")


async def _memory(request: pytest.FixtureRequest, tmp_path: Path) -> QueueAdapter:
    name = f"contract-{uuid.uuid4().hex[:8]}"
    request.addfinalizer(lambda: reset_broker(name))
    return MemoryAdapter(name)


async def _redis(request: pytest.FixtureRequest, tmp_path: Path) -> QueueAdapter:
    from conveyor.adapters.redis import RedisAdapter, wait_ready

    server = request.getfixturevalue("redis_server")
    config = load_config(None, environ={}, overrides={
        "queues": {"adapter": "redis", "total": QUEUES},
        "redis": {"url": server.url, "prefix": "contract"},
        "balancer": {"membership": "redis"},
    })
    adapter = RedisAdapter(config.redis)
    await wait_ready(adapter)
    return adapter


async def _redis_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> QueueAdapter:
    from conveyor.adapters.redis import RedisAdapter

    cluster = request.getfixturevalue("contract_redis_cluster")  # shared: a prefix per test
    config = load_config(None, environ={}, overrides={
        "queues": {"adapter": "redis", "total": QUEUES},
        "redis": {"mode": "cluster", "url": cluster.url,
                  "prefix": f"contract-{uuid.uuid4().hex[:8]}"},
        "balancer": {"membership": "redis"},
    })
    return RedisAdapter(config.redis)


async def _redis_sentinel(request: pytest.FixtureRequest, tmp_path: Path) -> QueueAdapter:
    from conveyor.adapters.redis import RedisAdapter, wait_ready

    servers = request.getfixturevalue("contract_redis_sentinel")  # shared: a prefix per test
    config = load_config(None, environ={}, overrides={
        "queues": {"adapter": "redis", "total": QUEUES},
        "redis": {"mode": "sentinel", "url": "redis:///0", "sentinels": servers.addresses,
                  "sentinel_service": SENTINEL_SERVICE,
                  "prefix": f"contract-{uuid.uuid4().hex[:8]}"},
        "balancer": {"membership": "redis"},
    })
    adapter = RedisAdapter(config.redis)
    await wait_ready(adapter)
    return adapter


async def _kafka(request: pytest.FixtureRequest, tmp_path: Path) -> QueueAdapter:
    from conveyor.adapters.kafka import KafkaAdapter

    broker = request.getfixturevalue("tansu")
    config = load_config(None, environ={}, overrides={
        "queues": {"adapter": "kafka", "total": QUEUES},
        "kafka": {"bootstrap": broker.bootstrap, "topic": f"contract-{uuid.uuid4().hex[:10]}",
                  "session_timeout_ms": 6000, "heartbeat_interval_ms": 500},
    })
    adapter = KafkaAdapter(config.kafka, QUEUES)
    await adapter.ensure_topic()
    return adapter


_BUILDERS: dict[str, Build] = {"memory": _memory, "redis": _redis,
                               "redis-cluster": _redis_cluster,
                               "redis-sentinel": _redis_sentinel, "kafka": _kafka}


SERVER_ADAPTERS = [
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis-cluster", marks=[pytest.mark.redis, pytest.mark.redis_cluster]),
    pytest.param("redis-sentinel", marks=[pytest.mark.redis, pytest.mark.redis_sentinel]),
    pytest.param("kafka", marks=pytest.mark.kafka),
]
"""The adapters of a server (every one but memory): ``@pytest.mark.parametrize("adapter",
SERVER_ADAPTERS, indirect=True)`` runs a test on them alone."""


@pytest.fixture(params=[pytest.param("memory"), *SERVER_ADAPTERS])
async def adapter(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[QueueAdapter]:
    built = await _BUILDERS[request.param](request, tmp_path)
    try:
        yield built
    finally:
        await built.close()


Open = Callable[[int, str], Awaitable[QueueReceiver]]


@pytest.fixture
async def open_receiver(adapter: QueueAdapter) -> AsyncIterator[Open]:
    """``await open_receiver(queue, group)``: an initialized receiver; whatever a test
    leaves open is shut down after it (shutdown is idempotent)."""
    opened: list[QueueReceiver] = []

    async def open_(queue: int, group: str) -> QueueReceiver:
        receiver = adapter.create_receiver(queue, group)
        opened.append(receiver)
        await receiver.initialize()
        return receiver

    try:
        yield open_
    finally:
        for receiver in opened:
            with contextlib.suppress(Exception):
                await receiver.shutdown()


PutNonLetters = Callable[[str, int], Awaitable[None]]


def _non_letter(group: str, n: int) -> list[tuple[str, bytes]]:
    """The ``n``-th entry that is no letter, as (name, value) pairs, of three kinds in
    turn: another tool's fields; a 0.1 letter's field holding no letter; this layout's
    fields naming ``group`` with a ``cv-dl-token`` that is no token (corrupt)."""
    if n % 3 == 0:
        return [("written-by", b"another tool"), ("n", str(n).encode())]
    if n % 3 == 1:
        return [("letter", b"not msgpack, not json")]
    values = [b"2", group.encode(), b"h", b"E", b"e", b"1", b"0", b"zz", b"full", b""]
    return [(name, value) for name, value in zip(FIELDS, values, strict=True)]


async def _redis_non_letters(adapter: QueueAdapter, group: str, count: int) -> None:
    """Entries another tool XADDs to the app's dead-letter stream."""
    key = adapter.keys.dead_letters(group)  # type: ignore[attr-defined]
    for n in range(count):
        await adapter.redis.xadd(key, dict(_non_letter(group, n)))  # type: ignore[attr-defined]


async def _kafka_non_letters(adapter: QueueAdapter, group: str, count: int) -> None:
    """Records another tool produces to the dead-letter topic, the corrupt ones keyed by
    the app (as 0.1 keyed its letters); the topic is created by a letter of another app
    first, as a worker would."""
    from tests.contract.test_dead_letters import letter

    await adapter.dead_letters.put(f"not-{group}", [letter(0)])
    cluster = adapter.cluster  # type: ignore[attr-defined]
    producer = await cluster.producer(cluster.dlq_topic)
    for n in range(count):
        pairs = _non_letter(group, n)
        value = pairs[-1][1] if len(pairs) == 1 else b"junk"
        headers = [] if len(pairs) == 1 else pairs
        key = None if n % 3 == 0 else group.encode()  # no app's; keyed as 0.1 keyed
        await producer.send_and_wait(cluster.dlq_topic, value, key=key, partition=0,
                                     headers=headers)


_NON_LETTERS: dict[str, Callable[[QueueAdapter, str, int], Awaitable[None]]] = {
    "redis": _redis_non_letters, "redis-cluster": _redis_non_letters,
    "redis-sentinel": _redis_non_letters, "kafka": _kafka_non_letters}


@pytest.fixture
def put_non_letters(request: pytest.FixtureRequest, adapter: QueueAdapter) -> PutNonLetters:
    """``await put_non_letters(group, count)``: ``count`` entries that are no letters
    where ``group``'s letters are stored, written past the port as another tool would:
    for a test on :data:`SERVER_ADAPTERS` (the memory adapter's store holds nothing but
    letters)."""
    write = _NON_LETTERS[request.node.callspec.params["adapter"]]
    return lambda group, count: write(adapter, group, count)
