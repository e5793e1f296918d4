"""The console's requests against a Redis that refuses connections (its process stopped,
its port closed): each answers within a few seconds naming the broker, rather than after
the adapter's retries (``[redis] retry_max_s``, 10 s by default), and a write action says
what it did — nothing, or what it had done when the broker went away — with no letter
lost or replayed twice (the poll's own refusal: tests/unit/test_console.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from conveyor.backends import create_adapter
from conveyor.console import actions
from conveyor.console.actions import Choice
from conveyor.console.poller import Poller
from conveyor.console.probe import refused
from conveyor.platform.config import Config, load_config
from conveyor.platform.errors import BrokerConnectionError
from tests.conftest import free_port, wait_until_sync
from tests.integration.redis.conftest import write_config
from tests.proxy import CuttableProxy
from tests.servers import RedisClusterServers, RedisServer
from tests.unit.test_console import (
    APP,
    TOKEN,
    client_for,
    prepare_app,
    put_letters,
    write,
)

pytestmark = pytest.mark.redis

PROMPT_S = 4.0
"""An answer this soon is the probe's (0.5 s, and up to 2 s to stop the work), not the
adapter's retries (10 s): room for a loaded two-core machine."""


def timed(request: Callable[[], Any]) -> tuple[int, str, float]:
    """A request's status, its error line and how long it took."""
    started = time.monotonic()
    response = request()
    return response.status_code, response.json().get("error", ""), time.monotonic() - started


def test_requests_to_a_stopped_redis_answer_at_once_naming_it_and_change_nothing(
    redis_server: RedisServer, tmp_path: Path,
) -> None:
    """The dead-letter list, a letter and each write action waited the adapter's 10 s of
    retries before a 502; an operator's replay against a Redis that was down answered
    after 10 s. Each now answers within a few seconds with one line naming the broker,
    and once the Redis is back the letters and the queues are as they were."""
    config = load_config(write_config(tmp_path / "redis.toml", redis_server.url,
                                      queues={"total": 2}))
    prepare_app(config)
    where = f"BrokerConnectionError: redis at 127.0.0.1:{redis_server.port} refused the connection"
    with client_for(config, token=TOKEN) as api:
        before = api.get("/api/letters", params={"app": APP}).json()["letters"]
        first = before[0]["id"]
        redis_server.stop()
        answers = {
            "list": timed(lambda: api.get("/api/letters", params={"app": APP})),
            "letter": timed(lambda: api.get(f"/api/letters/{first}", params={"app": APP})),
            "replay one": timed(lambda: write(api, "/api/letters/replay", {"ids": [first]})),
            "replay all": timed(lambda: write(api, "/api/letters/replay", {"all": True})),
            "purge one": timed(lambda: write(api, "/api/letters/purge",
                                             {"ids": [first], "confirm": True})),
            "purge all": timed(lambda: write(api, "/api/letters/purge",
                                             {"all": True, "confirm": True})),
        }
        redis_server.start()
        wait_until_sync(lambda: api.get("/api/overview").json()["error"] is None, 30,
                        "a good poll once redis is back")
        after = api.get("/api/letters", params={"app": APP}).json()["letters"]
        lag = api.get("/api/overview").json()["status"][APP]["total_lag"]
    assert {name: (status, error) for name, (status, error, _) in answers.items()} == {
        "list": (502, where), "letter": (502, where),
        "replay one": (502, f"{where}; nothing was replayed"),
        "replay all": (502, f"{where}; nothing was replayed"),
        "purge one": (502, f"{where}; nothing was purged"),
        "purge all": (502, f"{where}; nothing was purged"),
    }
    slow = {name: took for name, (_, _, took) in answers.items() if took >= PROMPT_S}
    assert not slow, f"answered after the adapter's retries: {slow}"
    assert after == before  # no letter replayed or purged
    assert lag == 5  # the 5 messages prepare_app published, and no replayed one


LETTERS = 3000
"""Letters the cut replay works through: 30 batches of 100, a few hundred milliseconds
on a local Redis, so that the broker goes away with most of them still to do."""


def queued(server: RedisServer) -> list[str]:
    """The message ids on the two queues (prefix ``t``), read on the server itself."""
    client = server.client()
    try:
        return [fields[b"cv-id"].decode() for q in range(2)
                for _, fields in client.xrange(f"t:q:{q}")]
    finally:
        client.close()


async def replay_cut_after_first_batch(config: Config, proxy: CuttableProxy,
                                       server: RedisServer) -> tuple[str, float]:
    """Replay every letter of ``APP`` through ``proxy``; once the server has the first
    replayed message, the proxy drops the next reply, closes the connections and refuses
    new ones. The console's error and how long the replay took (:func:`cut_once`).

    The reply dropped is the next batch's first (redis-py's ``SCRIPT EXISTS`` before a
    pipeline of scripts), so that batch does not run here; a batch that ran and whose
    reply was lost is the adapter's to replay once (tests/e2e/test_dlq.py kills a replay
    there). The assertions hold either way."""
    async def replayed(direct: aioredis.Redis) -> bool:
        return sum([await direct.xlen(f"t:q:{q}") for q in range(2)]) > 0

    return await cut_once(actions.replay_letters(config, Choice(APP, every=True)),
                          replayed, proxy, server)


async def cut_once(action: Coroutine[Any, Any, Any],
                   written: Callable[[aioredis.Redis], Awaitable[bool]],
                   proxy: CuttableProxy, server: RedisServer) -> tuple[str, float]:
    """Run the console's ``action`` through ``proxy``; once ``written`` (a look at the
    server itself) says its first write is there, the proxy drops the next reply,
    closes the connections and refuses new ones. The action's error, and how long it
    took."""
    direct = aioredis.Redis(port=server.port)
    task = asyncio.ensure_future(action)
    started = time.monotonic()
    try:
        deadline = started + 30
        while not task.done() and not await written(direct):
            if time.monotonic() > deadline:
                raise TimeoutError("nothing written within 30 s")
            await asyncio.sleep(0.001)  # the next look at the server
        proxy.lose_next_reply(then_down=True)
        try:
            await task
        except BrokerConnectionError as exc:
            return str(exc), time.monotonic() - started
        return "the action ended before the broker went away", 0.0
    finally:
        await direct.aclose()


def test_a_purge_cut_short_by_the_broker_going_away_says_how_many_it_purged(
    redis_server: RedisServer, tmp_path: Path,
) -> None:
    """Redis refusing connections midway through a purge of every letter: the answer
    counts the letters of the delete calls that answered (500 ids a call), each other
    letter is deleted or still stored, and a purge run again deletes the rest."""
    direct, proxy, config = proxied_letters(redis_server, tmp_path)
    stream = f"t:dlq:{APP}"

    async def purged(redis: aioredis.Redis) -> bool:
        return int(await redis.xlen(stream)) < LETTERS

    async def cut() -> tuple[str, float]:
        await proxy.start()
        return await cut_once(actions.purge_letters(config, Choice(APP, every=True)),
                              purged, proxy, redis_server)

    error, took = asyncio.run(cut())
    left = letters_left(direct)
    again = asyncio.run(actions.purge_letters(direct, Choice(APP, every=True)))
    where = f"redis at 127.0.0.1:{proxy.port} refused the connection"
    assert error.startswith(f"{where}; "), error
    known = int(error.split("; ")[1].split(" ")[0])
    assert error == (
        f"{where}; {known} letter(s) were purged before it did; every other letter chosen "
        "is deleted or still stored: purge again to finish (purging a letter twice "
        "deletes it once)")
    assert took < PROMPT_S, f"the purge answered after {took:.1f}s"
    assert 500 <= known <= LETTERS - left <= known + 500  # the call under way: unknown
    assert again["purged"] == left
    assert letters_left(direct) == 0


def test_a_replay_cut_short_by_the_broker_going_away_says_what_it_did_and_loses_and_doubles_nothing(
    redis_server: RedisServer, tmp_path: Path,
) -> None:
    """Redis refusing connections midway through a replay of every letter (a reply lost
    as it went): the answer comes at once and counts the letters known replayed; each
    other letter is still stored or was replayed once, never both, and a replay run
    again finishes the rest. No duplicate is allowed: a letter is replayed by one script
    that appends its message and removes it."""
    direct, proxy, config = proxied_letters(redis_server, tmp_path)

    async def cut() -> tuple[str, float]:
        await proxy.start()
        return await replay_cut_after_first_batch(config, proxy, redis_server)

    error, took = asyncio.run(cut())
    on_queues, left = queued(redis_server), letters_left(direct)
    again = asyncio.run(actions.replay_letters(direct, Choice(APP, every=True)))
    where = f"redis at 127.0.0.1:{proxy.port} refused the connection"
    assert error.startswith(f"{where}; "), error
    known = int(error.split("; ")[1].split(" ")[0])
    assert error == (
        f"{where}; {known} letter(s) were replayed before it did; every other letter "
        "chosen is still stored, or was published once and removed as the connection "
        "went: replay again to finish (no letter is published twice)")
    assert took < PROMPT_S, f"the replay answered after {took:.1f}s"
    assert 100 <= known <= len(on_queues) <= known + 100  # the batch under way: unknown
    assert len(set(on_queues)) == len(on_queues)  # none twice
    assert len(on_queues) + left == LETTERS  # every letter: replayed, or still stored
    assert (len(again["replayed"]), again["gone"]) == (left, [])
    assert sorted(queued(redis_server)) == sorted(f"g{n}" for n in range(LETTERS))  # once each
    assert letters_left(direct) == 0


def proxied_letters(server: RedisServer, tmp_path: Path
                    ) -> tuple[Config, CuttableProxy, Config]:
    """:data:`LETTERS` letters of ``APP`` on ``server``; its config, a proxy to it (not
    started) and a config that reads it through the proxy."""
    direct = load_config(write_config(tmp_path / "direct.toml", server.url,
                                      queues={"total": 2}))
    put_letters(direct, APP, LETTERS)
    proxy = CuttableProxy(free_port(), server.port)
    config = load_config(write_config(tmp_path / "proxied.toml",
                                      f"redis://127.0.0.1:{proxy.port}/0", queues={"total": 2}))
    return direct, proxy, config


def letters_left(config: Config) -> int:
    async def count() -> int:
        adapter = create_adapter("redis", config)
        try:
            return await adapter.dead_letters.count(APP)
        finally:
            await adapter.close()

    return asyncio.run(count())


def test_requests_to_sentinels_that_refuse_answer_at_once_naming_them(tmp_path: Path) -> None:
    """``mode = "sentinel"``: the sentinels are probed (the primary is found through
    them), every one of them named."""
    ports = [free_port(), free_port()]
    config = load_config(None, environ={}, overrides={
        "queues": {"adapter": "redis", "total": 2}, "balancer": {"membership": "redis"},
        "redis": {"mode": "sentinel", "url": "redis:///0",
                  "sentinels": [f"127.0.0.1:{p}" for p in ports]}})
    with client_for(config, token=TOKEN) as api:
        listed = timed(lambda: api.get("/api/letters", params={"app": APP}))
        replayed = timed(lambda: write(api, "/api/letters/replay", {"all": True}))
    where = (f"BrokerConnectionError: redis at 127.0.0.1:{ports[0]}, 127.0.0.1:{ports[1]} "
             "refused the connection")
    assert listed[:2] == (502, where)
    assert replayed[:2] == (502, f"{where}; nothing was replayed")
    assert max(listed[2], replayed[2]) < PROMPT_S, (listed, replayed)


def test_a_cluster_whose_url_node_is_down_is_not_called_refusing_while_others_serve(
    fresh_redis_cluster: RedisClusterServers, tmp_path: Path,
) -> None:
    """The probe tried the URL's node alone: a poll slowed by that node's failover was
    reported as ``redis at NODE refused the connection`` while its replica took over.
    It now tries every node the poll's client knows."""
    cluster = fresh_redis_cluster
    host, port = cluster.primary_for_key("t:q:0")  # a node every poll reads
    config = load_config(None, environ={}, overrides={
        "queues": {"adapter": "redis", "total": 2}, "balancer": {"membership": "redis"},
        "redis": {"mode": "cluster", "url": f"redis://{host}:{port}/0", "prefix": "t"}})
    poller = Poller(config, None, timeout_s=20.0)

    async def polls() -> tuple[str | None, str | None, str | None]:
        try:
            await poller.poll()
            first = poller.reading.error
            cluster.kill(port)
            alone = await refused(config)
            await poller.poll()
            return first, alone, poller.reading.error
        finally:
            await poller.stop()

    first, alone, after_kill = asyncio.run(polls())
    assert first is None
    assert alone == f"{host}:{port}"  # the URL's node alone refuses, as a new client sees
    assert after_kill is None  # the poll rode out the failover through the other nodes
