"""More than a hundred connections to one Redis: a daemon holds one per queue it reads (a
blocking ``XREADGROUP``), and a client that does not gather its calls one per
``publish`` in flight. redis-py 8's pool caps them at 100 unless told otherwise, and then
fails each call past that at once with ``Too many connections``, which Conveyor took for
an unreachable server: pulls failed and were retried every 0.5 s, and a daemon owning
160 queues handled 1,242 of 2,000 messages in 30 s; publishes were retried with back-off
and logged the server unreachable, then reachable again, tens of times."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

import pytest

from conveyor import App, Client, Publish, WorkerDaemon
from conveyor.platform.config import Config, load_config
from tests.conftest import wait_until
from tests.servers import RedisServer

pytestmark = pytest.mark.redis

MESSAGES = 1_000


def config(server: RedisServer, **sections: dict[str, Any]) -> Config:
    overrides: dict[str, dict[str, Any]] = {
        "queues": {"adapter": "redis"}, "redis": {"url": server.url},
        "balancer": {"kind": "static"}}
    for section, values in sections.items():
        overrides.setdefault(section, {}).update(values)
    return load_config(None, environ={}, overrides=overrides)


def complaints(caplog: Any) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
            and ("Too many connections" in r.getMessage() or "unreachable" in r.getMessage())]


async def test_a_daemon_reading_160_queues_handles_each_message_once(
    redis_server: RedisServer, caplog: Any,
) -> None:
    caplog.set_level("WARNING", logger="conveyor")
    redis_server.client().flushall()
    cfg = config(redis_server, queues={"total": 160}, worker={"poll_timeout_ms": 2000})
    handled: Counter[int] = Counter()
    app = App("many")

    @app.handler("jobs")
    async def job(body: dict[str, int]) -> None:
        handled[body["i"]] += 1

    daemon = WorkerDaemon(app, cfg)
    await daemon.client.publish_batch(
        [Publish("jobs", f"k{i}", {"i": i}) for i in range(MESSAGES)])
    await daemon.start()
    try:
        await wait_until(lambda: len(handled) >= MESSAGES, 30, interval_s=0.05,
                         what=f"{MESSAGES} messages handled")
    finally:
        await daemon.stop()
    assert handled == Counter(range(MESSAGES))  # each once, no duplicate allowed
    assert complaints(caplog) == []


async def test_300_publishes_at_once_not_gathered_each_store_once_quietly(
    redis_server: RedisServer, caplog: Any,
) -> None:
    caplog.set_level("WARNING", logger="conveyor")
    redis_server.client().flushall()
    cfg = config(redis_server, queues={"total": 4}, publish={"coalesce": False})
    async with Client.from_config(cfg) as client:
        tokens = await asyncio.gather(
            *(client.publish("jobs", f"k{i}", {"i": i}) for i in range(300)))
    assert len(set(tokens)) == 300
    stored = redis_server.client()
    assert sum(stored.xlen(f"conveyor:q:{q}") for q in range(4)) == 300
    assert complaints(caplog) == []
