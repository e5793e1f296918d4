"""A handler that blocks the event loop does not make Redis look down.

A read whose reply arrives while the loop is blocked past ``socket_timeout_s`` used to
fail as the loop resumed — asyncio ran the deadline's callback before the task that
would have read the waiting reply — and its connection was dropped and opened again:
"redis unreachable", reconnects and "ack failed; retrying" in a worker whose Redis was
fine. The clients of :func:`connect` put such a deadline off
(:class:`~conveyor.platform.deadlines.StallTolerantTimeout`); a server that really does
not answer still fails the call once the loop has run.

Each test blocks the loop with ``time.sleep`` from a callback, as a blocking handler
would, and compares the client of :func:`connect` with a plain redis-py client under the
same stall: the plain one failing shows the stall did hide the deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
import redis.exceptions as rex

from conveyor.adapters.redis.connections import close, connect
from conveyor.platform.config import RedisConfig
from conveyor.platform.deadlines import GRACE_S
from tests.servers import SENTINEL_SERVICE, RedisServer

TIMEOUT_S = 0.5
STALL_S = 1.5  # three deadlines long


@pytest.fixture
async def pair(redis_server: RedisServer) -> AsyncIterator[tuple[Any, aioredis.Redis]]:
    """Conveyor's client and a plain redis-py one, both with a 0.5 s read deadline."""
    ours = connect(RedisConfig(url=redis_server.url, socket_timeout_s=TIMEOUT_S,
                               connect_timeout_s=TIMEOUT_S))
    plain = aioredis.Redis.from_url(redis_server.url, socket_timeout=TIMEOUT_S,
                                    socket_connect_timeout=TIMEOUT_S)
    yield ours, plain
    await close(ours)
    await plain.aclose()


async def during_stall(call: Callable[[], Awaitable[Any]], *, after_s: float = 0.05,
                       first: Callable[[], None] | None = None,
                       ) -> tuple[str, Any, float]:
    """Run ``call`` while the loop is blocked for ``STALL_S`` from ``after_s`` on (the
    blocker calls ``first`` before it sleeps): its outcome ("ok" or the error's class
    name), its result or error, and its seconds."""
    loop = asyncio.get_running_loop()

    def block() -> None:
        if first is not None:
            first()
        time.sleep(STALL_S)

    loop.call_later(after_s, block)
    started = time.monotonic()
    try:
        result = await call()
    except (rex.RedisError, OSError) as exc:
        return type(exc).__name__, exc, time.monotonic() - started
    return "ok", result, time.monotonic() - started


async def test_a_blocking_read_whose_reply_came_during_a_stall_returns_it_on_its_connection(
    pair: tuple[Any, aioredis.Redis],
) -> None:
    """``XREADGROUP BLOCK 200`` on an empty stream: the server answers (nothing) 0.2 s
    in, while the loop is blocked for 1.5 s; the deadline is 0.5 s."""
    ours, plain = pair
    await ours.xgroup_create("calm", "g", "0", mkstream=True)

    def read(client: Any) -> Callable[[], Awaitable[Any]]:
        return lambda: client.xreadgroup("g", "c", {"calm": ">"}, count=10, block=200)

    before = await ours.client_id()
    outcome, result, took_s = await during_stall(read(ours))
    after = await ours.client_id()
    plain_outcome, _, _ = await during_stall(read(plain))

    assert (outcome, result) == ("ok", []), (outcome, result)
    assert after == before, "the connection was dropped and opened again"
    assert took_s < STALL_S + GRACE_S + 0.5
    assert plain_outcome == "TimeoutError", (
        f"redis-py alone got {plain_outcome}: the stall no longer hides a deadline there")


@pytest.mark.parametrize("mode", ["cluster", "sentinel"])
async def test_a_cluster_or_sentinel_clients_blocking_read_during_a_stall_returns_its_reply(
    mode: str, request: pytest.FixtureRequest,
) -> None:
    """The same read through the other two kinds of client :func:`connect` builds (their
    connections are the same hiredis-packed kind), the stall starting 0.1 s in (these
    clients take a few more loop turns to send the command). As the stall starts, the
    servers are asked whether the read is blocked there, i.e. was sent before it."""
    timeouts = {"socket_timeout_s": TIMEOUT_S, "connect_timeout_s": TIMEOUT_S}
    if mode == "cluster":
        cluster = request.getfixturevalue("redis_cluster")
        nodes = cluster.nodes
        cfg = RedisConfig(url=cluster.url, mode="cluster", **timeouts)
    else:
        sentinel = request.getfixturevalue("redis_sentinel")
        nodes = sentinel.data
        cfg = RedisConfig(url="redis:///0", mode="sentinel", sentinels=sentinel.addresses,
                          sentinel_service=SENTINEL_SERVICE, **timeouts)
    sent_before_stall: list[bool] = []

    def read_is_blocked() -> None:
        sent_before_stall.append(any(
            c["cmd"] == "xreadgroup" and "b" in c["flags"]
            for node in nodes for c in node.admin().client_list()))

    client = connect(cfg)
    try:
        key = f"stall-{mode}"
        await client.xgroup_create(key, "g", "0", mkstream=True)
        outcome, result, _ = await during_stall(
            lambda: client.xreadgroup("g", "c", {key: ">"}, count=10, block=300),
            after_s=0.1, first=read_is_blocked)
    finally:
        await close(client)
    assert sent_before_stall == [True]
    assert (outcome, result) == ("ok", []), (outcome, result)


async def test_a_pipeline_whose_replies_came_during_a_stall_gets_them(
    pair: tuple[Any, aioredis.Redis],
) -> None:
    """A publish-like pipeline of 200 ``XADD`` answered within the stall: sent on an
    open connection before the stall starts, its replies held back 0.2 s by a ``BLPOP``
    ahead of them (200 ``XADD`` alone are answered before a stall could start)."""
    ours, plain = pair

    def publish(client: Any) -> Callable[[], Awaitable[Any]]:
        async def call() -> Any:
            pipe = client.pipeline(transaction=False)
            pipe.blpop(["nothing"], 0.2)
            for n in range(200):
                pipe.xadd("out", {"n": n})
            return await pipe.execute()
        return call

    await ours.ping()
    await plain.ping()  # the connects are not what this tests
    outcome, result, _ = await during_stall(publish(ours))
    plain_outcome, _, _ = await during_stall(publish(plain))
    assert outcome == "ok", result
    assert len(result) == 201
    assert await ours.xlen("out") == 400  # the plain client's pipeline ran too
    assert plain_outcome == "TimeoutError", (
        f"redis-py alone got {plain_outcome}: the stall no longer hides a deadline there")


async def test_a_connect_that_completed_during_a_stall_is_used(
    pair: tuple[Any, aioredis.Redis],
) -> None:
    """A new client's first command: its connect and handshake fall in a 1.5 s stall
    that starts as they begin; the connect deadline is 0.5 s."""
    ours, plain = pair
    outcome, result, _ = await during_stall(ours.ping, after_s=0.0)
    plain_outcome, plain_error, _ = await during_stall(plain.ping, after_s=0.0)
    assert (outcome, result) == ("ok", True), (outcome, result)
    assert plain_outcome == "TimeoutError", (
        f"redis-py alone got {plain_outcome} ({plain_error}): the stall no longer hides "
        "a deadline there")


async def test_a_server_that_does_not_answer_still_times_out_after_a_stall(
    pair: tuple[Any, aioredis.Redis], redis_server: RedisServer,
) -> None:
    """The server paused (``CLIENT PAUSE``) for longer than the stall and the deadline
    together: the read fails with redis-py's TimeoutError, once the loop has run
    ``GRACE_S`` after the stall — and without a stall, at its deadline (there, on a new
    connection, the read that times out is that of its first setup command)."""
    ours, _ = pair
    await ours.set("k", "v")
    pauser = aioredis.Redis.from_url(redis_server.url)
    try:
        await pauser.execute_command("CLIENT", "PAUSE", 6000, "ALL")
        outcome, error, took_s = await during_stall(lambda: ours.get("k"))
        await ours.connection_pool.disconnect()
        started = time.monotonic()
        with pytest.raises(rex.TimeoutError):
            await ours.get("k")
        unstalled_s = time.monotonic() - started
    finally:
        await pauser.execute_command("CLIENT", "UNPAUSE")
        await pauser.aclose()
    assert outcome == "TimeoutError", (outcome, error)
    assert "Timeout reading" in str(error)
    assert STALL_S + GRACE_S - 0.1 < took_s < STALL_S + GRACE_S + 1.0, took_s
    assert TIMEOUT_S - 0.1 < unstalled_s < TIMEOUT_S + 1.0, unstalled_s
    assert await ours.get("k") == b"v"  # and the client goes on once the server does
