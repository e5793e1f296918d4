"""Redis keys of another type where a worker keeps its dead letters or its balancer's
state (``SET t:dlq:rec x``, a list where the members belong): a worker names the key,
its type and what belongs there, once per episode, and loses nothing; ``status`` says
the same and shows the rest.

The workers are real ``conveyor worker`` subprocesses running tests/apps/recorder.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis

from conveyor import Client, Publish, load_config
from conveyor.backends import create_adapter
from conveyor.platform.message import DeadLetter
from tests.conftest import wait_until_sync
from tests.integration.redis.conftest import RedisServer, Worker, read_records, write_config

pytestmark = pytest.mark.redis


def wrongtype_errors(admin: redis.Redis) -> int:
    """How many commands the server refused with WRONGTYPE (``INFO errorstats``)."""
    stats = admin.info("errorstats")
    return int(stats.get("errorstat_WRONGTYPE", {}).get("count", 0))


async def publish(cfg: Path, items: list[Publish]) -> list[str]:
    async with Client.from_config(load_config(cfg)) as client:
        return [str(t) for t in await client.publish_batch(items)]


async def letters(cfg: Path) -> list[DeadLetter]:
    adapter = create_adapter("redis", load_config(cfg))
    try:
        return await adapter.dead_letters.read("rec")
    finally:
        await adapter.close()


def pending(admin: redis.Redis, queues: int) -> dict[int, int]:
    return {q: int(admin.xpending(f"t:q:{q}", "rec")["pending"]) for q in range(queues)
            if admin.exists(f"t:q:{q}")}


def test_a_dead_letter_key_of_another_type_is_named_once_and_the_letter_stored_once_fixed(
    redis_server: RedisServer, workers: list[Worker], tmp_path: Path
) -> None:
    # The worker said "the dead-letter store at the broker unreachable" for a string
    # where app rec's dead letters belong (and shortened the letter to its bare form on
    # the way, as if the letter were at fault).
    cfg = write_config(tmp_path / "c.toml", redis_server.url, queues={"total": 2})
    admin = redis_server.client()
    admin.set("t:dlq:rec", "x")
    worker = Worker("w", cfg, tmp_path)
    workers.append(worker)
    wait_until_sync(lambda: "ready" in worker.stderr, 30, "the worker ready")
    asyncio.run(publish(cfg, [Publish("items", "bad", {"seq": "not a number"})]
                        + [Publish("items", f"k{i}", {"seq": i}) for i in range(6)]))
    wait_until_sync(lambda: len(read_records([worker.record])) == 6, 30,
                    "the six good messages handled")
    refused_before = wrongtype_errors(admin)
    wait_until_sync(lambda: wrongtype_errors(admin) >= refused_before + 4, 30,
                    "four more attempts to store the letter")
    assert admin.get("t:dlq:rec") == b"x", "the key is left as it is"
    assert sum(pending(admin, 2).values()) >= 1, "the bad message waits unacknowledged"
    line = ("cannot store dead letters: redis key t:dlq:rec (app 'rec''s dead letters) is a "
            "string, not a stream: the app's dead letters cannot be stored (the messages "
            "wait unacknowledged) and dlq commands find none; rename or delete the key")
    said = [x.split(" conveyor.dead_letters: ", 1)[-1] for x in worker.stderr.splitlines()
            if "t:dlq:rec" in x or "unreachable" in x or "dead-letter store" in x]
    assert said == [f"{line} (retried with back-off: stored once it is fixed)"], (
        worker.stderr)
    admin.delete("t:dlq:rec")
    wait_until_sync(lambda: admin.exists("t:dlq:rec") and not sum(pending(admin, 2).values()),
                    30, "the letter stored and every message acknowledged")
    [letter] = asyncio.run(letters(cfg))
    assert (letter.error_type, letter.form, str(letter.message.stream)) == (
        "DecodeError", "full", "items/bad"), "stored as it was, not shortened"
    assert worker.stop() == 0
    stored_again = [x for x in worker.stderr.splitlines() if "dead letters stored again" in x]
    assert len(stored_again) == 1, worker.stderr
