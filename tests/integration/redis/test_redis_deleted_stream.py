"""A queue's stream deleted (``DEL``) while its owner's ``XREADGROUP`` blocks on it: Redis
7 ends the read with ``UNBLOCKED the stream key no longer exists`` — the error a
reshard's ``MIGRATE`` of the stream's slot gives too. The worker names both causes in
one info line (no "pull failed", no back-off), creates the group again, and handles
what is published after; nothing it had handled is lost or run twice.

The worker is a real ``conveyor worker`` subprocess running tests/apps/recorder.py."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest
import redis

from conveyor import Client, Publish, load_config
from tests.conftest import wait_until_sync
from tests.integration.redis.conftest import RedisServer, Worker, read_records, write_config

pytestmark = pytest.mark.redis


async def publish(cfg: Path, items: list[Publish]) -> None:
    async with Client.from_config(load_config(cfg)) as client:
        await client.publish_batch(items)


def blocked_reads(admin: redis.Redis) -> int:
    """Clients blocked in an ``XREADGROUP`` right now."""
    return sum(1 for c in admin.client_list()
               if c.get("cmd") == "xreadgroup" and "b" in c.get("flags", ""))


def test_a_stream_deleted_under_a_blocked_read_is_named_and_the_queue_read_on(
    redis_server: RedisServer, workers: list[Worker], tmp_path: Path
) -> None:
    # Before: "queue 0: pull failed (BrokerError: redis error while reading queue 0:
    # UNBLOCKED the stream key no longer exists); retrying in 10.0s" — a warning that
    # says only "deleted", and a pause of a whole poll_timeout_ms.
    # A long block (10 s): the DEL lands while the read blocks, not between two reads,
    # and a back-off of that length would show.
    cfg = write_config(tmp_path / "c.toml", redis_server.url, queues={"total": 1},
                       worker={"poll_timeout_ms": 10_000},
                       redis={"socket_timeout_s": 15})
    admin = redis_server.client()
    worker = Worker("w", cfg, tmp_path)
    workers.append(worker)
    wait_until_sync(lambda: "ready" in worker.stderr, 30, "the worker ready")

    asyncio.run(publish(cfg, [Publish("items", f"k{i}", {"seq": i}) for i in range(5)]))
    wait_until_sync(lambda: len(read_records([worker.record])) == 5, 30,
                    "the five messages published before handled")
    wait_until_sync(lambda: not admin.xpending("t:q:0", "rec")["pending"], 30,
                    "the five acknowledged")
    wait_until_sync(lambda: blocked_reads(admin) == 1, 30, "the worker's read blocked")
    deleted_at = time.time()
    assert admin.delete("t:q:0") == 1
    wait_until_sync(lambda: "NOGROUP" in worker.stderr or "UNBLOCKED" in worker.stderr, 30,
                    "the read's end logged")
    # Published after the DEL: read once the group is created again (at the stream's
    # start, [queues] new_group_start = "earliest"), whenever that happens.
    asyncio.run(publish(cfg, [Publish("items", f"k{i}", {"seq": i}) for i in range(5, 10)]))
    wait_until_sync(lambda: len(read_records([worker.record])) >= 10, 30,
                    "the five messages published after handled")
    assert worker.stop() == 0

    # Every message handled once, with what was published: no duplicate is allowed (the
    # five before were acknowledged before the DEL; the read the DEL ended read nothing).
    rows = read_records([worker.record])
    assert sorted(seq for *_, seq, _ in rows) == list(range(10)), rows
    assert sorted((key, seq) for _, _, _, key, seq, _ in rows) == sorted(
        (f"k{i}", i) for i in range(10)), "each message's key and content"
    first_after = min(t for t, _, _, _, seq, _ in rows if seq >= 5)
    assert first_after - deleted_at < 8, "read again at once, not after a 10 s back-off"
    lines = worker.stderr.splitlines()
    said = [x.split(" conveyor.redis: ", 1)[-1] for x in lines
            if "t:q:0" in x or "UNBLOCKED" in x or "pull failed" in x]
    assert said == [
        "queue 0: the blocking read of t:q:0 ended: the stream's slot moved (a reshard) or "
        "the stream was deleted; reading again",
        "queue 0: t:q:0 or its group 'rec' was deleted (NOGROUP); creating the group again",
    ], worker.stderr
    assert not [x for x in lines if " WARNING " in x or " ERROR " in x], worker.stderr


@pytest.mark.parametrize("deletion", ["DEL", "XGROUP DESTROY"])
def test_a_group_deleted_under_its_reader_is_created_again_at_the_start(
    redis_server: RedisServer, workers: list[Worker], tmp_path: Path, deletion: str
) -> None:
    """``new_group_start = "latest"`` is where a *new* app starts. A group deleted under a
    running app (its stream deleted, or the group destroyed by an operator) is not new:
    created again at the stream's end, it skipped what was published and not yet read.
    Before: the five messages published while the worker was stopped (after the
    deletion) were never handled, and the worker said only, at info level, "creating the
    group again"."""
    cfg = write_config(tmp_path / "c.toml", redis_server.url,
                       queues={"total": 1, "new_group_start": "latest"},
                       worker={"poll_timeout_ms": 1_000})
    admin = redis_server.client()
    worker = Worker("w", cfg, tmp_path)
    workers.append(worker)
    wait_until_sync(lambda: blocked_reads(admin) == 1, 30, "the worker's read blocked")

    asyncio.run(publish(cfg, [Publish("items", f"k{i}", {"seq": i}) for i in range(5)]))
    wait_until_sync(lambda: len(read_records([worker.record])) == 5, 30,
                    "the five messages published before handled")
    wait_until_sync(lambda: not admin.xpending("t:q:0", "rec")["pending"], 30,
                    "the five acknowledged")
    worker.signal(signal.SIGSTOP)  # the deletion and the next publish land between reads
    try:
        if deletion == "DEL":
            assert admin.delete("t:q:0") == 1
        else:
            assert admin.xgroup_destroy("t:q:0", "rec") == 1
        asyncio.run(publish(cfg, [Publish("items", f"k{i}", {"seq": i})
                                  for i in range(5, 10)]))
    finally:
        worker.signal(signal.SIGCONT)
    wait_until_sync(lambda: {r[4] for r in read_records([worker.record])} == set(range(10)),
                    30, "the five messages published after the deletion handled")
    # The stream's whole content is delivered again: after a DEL only the five new ones;
    # after XGROUP DESTROY the five handled before too (the retained entries), each once
    # more. No other duplicate is allowed.
    again = 0 if deletion == "DEL" else 5
    wait_until_sync(lambda: len(read_records([worker.record])) >= 10 + again, 30,
                    "the retained entries delivered again")
    assert worker.stop() == 0
    rows = read_records([worker.record])
    assert sorted((key, seq) for _, _, _, key, seq, _ in rows) == sorted(
        [(f"k{i}", i) for i in range(10)] + [(f"k{i}", i) for i in range(again)]), rows
    said = [x.split(" conveyor.redis: ", 1)[-1] for x in worker.stderr.splitlines()
            if "NOGROUP" in x]
    assert said == [
        f"queue 0: t:q:0 or its group 'rec' was deleted (NOGROUP); creating the group again "
        f"at the stream's start, so its position is lost: the {5 + again} entries the "
        "stream holds are delivered, those handled already a second time"], worker.stderr
    assert " WARNING conveyor.redis: queue 0: t:q:0 or its group" in worker.stderr
