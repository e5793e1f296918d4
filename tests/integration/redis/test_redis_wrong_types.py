"""Redis keys of another type where a worker keeps its dead letters or its balancer's
state (``SET t:dlq:rec x``, a list where the members belong): a worker names the key,
its type and what belongs there, once per episode, and loses nothing; ``status`` says
the same and shows the rest.

The workers are real ``conveyor worker`` subprocesses running tests/apps/recorder.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from conveyor import Client, Publish, load_config
from conveyor.backends import create_adapter
from conveyor.platform.message import DeadLetter
from tests.conftest import wait_until_sync
from tests.integration.redis.conftest import (
    REPO,
    RedisServer,
    Worker,
    read_records,
    write_config,
)

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


def ready_worker(cfg: Path, tmp_path: Path, workers: list[Worker]) -> Worker:
    """A worker of app rec (tests/apps/recorder.py), once it says it is ready."""
    worker = Worker("w", cfg, tmp_path)
    workers.append(worker)
    wait_until_sync(lambda: "ready" in worker.stderr, 30, "the worker ready")
    return worker


def started_over(redis_server: RedisServer, tmp_path: Path, workers: list[Worker],
                 queues: int, wrong: Callable[[redis.Redis], object]
                 ) -> tuple[Path, redis.Redis, Worker]:
    """A config of ``queues`` queues, the key ``wrong`` writes, and a worker started
    over it: the config, a client of the server, the worker once ready."""
    cfg = write_config(tmp_path / "c.toml", redis_server.url, queues={"total": queues})
    admin = redis_server.client()
    wrong(admin)
    return cfg, admin, ready_worker(cfg, tmp_path, workers)


def pending(admin: redis.Redis, queues: int) -> dict[int, int]:
    return {q: int(admin.xpending(f"t:q:{q}", "rec")["pending"]) for q in range(queues)
            if admin.exists(f"t:q:{q}")}


def test_a_dead_letter_key_of_another_type_is_named_once_and_the_letter_stored_once_fixed(
    redis_server: RedisServer, workers: list[Worker], tmp_path: Path
) -> None:
    # The worker said "the dead-letter store at the broker unreachable" for a string
    # where app rec's dead letters belong (and shortened the letter to its bare form on
    # the way, as if the letter were at fault).
    cfg, admin, worker = started_over(redis_server, tmp_path, workers, 2,
                                      lambda admin: admin.set("t:dlq:rec", "x"))
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


def handled(worker: Worker) -> list[int]:
    return sorted(seq for *_, seq, _ in read_records([worker.record]))


def error_lines(worker: Worker, text: str) -> list[str]:
    return [line.split(" ERROR ", 1)[1] for line in worker.stderr.splitlines()
            if " ERROR " in line and text in line]


def test_a_lease_key_of_another_type_leaves_its_queue_untaken_until_fixed_and_loses_nothing(
    redis_server: RedisServer, workers: list[Worker], tmp_path: Path
) -> None:
    # A list where queue 1's lease belongs: the worker's first re-balance failed on it,
    # and the worker exited (`redis error while acquiring the lease of queue 1:
    # WRONGTYPE ...`); met while it ran, each re-balance logged a traceback.
    cfg, admin, worker = started_over(redis_server, tmp_path, workers, 4,
                                      lambda admin: admin.rpush("t:app:rec:lease:1", "x"))
    asyncio.run(publish(cfg, [Publish("items", f"k{i}", {"seq": i}) for i in range(16)]))
    on_one = admin.xlen("t:q:1")
    assert 0 < on_one < 16
    wait_until_sync(lambda: len(handled(worker)) == 16 - on_one, 30,
                    "the messages of queues 0, 2 and 3 handled")
    refused = wrongtype_errors(admin)
    wait_until_sync(lambda: wrongtype_errors(admin) >= refused + 2, 30,
                    "two more attempts to take queue 1")
    line = ("conveyor.balancer: queue 1: not taken: redis key t:app:rec:lease:1 (app 'rec''s "
            "lease of queue 1) is a list, not a string: rename or delete the key (Conveyor "
            "writes it anew); tried again with back-off")
    assert error_lines(worker, "t:app:rec:") == [line]
    assert "Traceback" not in worker.stderr and len(handled(worker)) == 16 - on_one
    admin.delete("t:app:rec:lease:1")
    wait_until_sync(lambda: handled(worker) == list(range(16)), 30,
                    "queue 1 taken and its messages handled, once each")
    # Met while the worker holds the queue: the lease is lost, the queue given up and
    # its unacknowledged messages left pending; taken back once the key is fixed.
    admin.delete("t:app:rec:lease:1")
    admin.rpush("t:app:rec:lease:1", "x")
    wait_until_sync(lambda: len(error_lines(worker, "lease (token")) == 1, 30,
                    "the lease of queue 1 lost")
    asyncio.run(publish(cfg, [Publish("items", f"k{i}", {"seq": 100 + i})
                              for i in range(16)]))
    admin.delete("t:app:rec:lease:1")
    wait_until_sync(lambda: set(handled(worker)) == {*range(16), *range(100, 116)}, 30,
                    "every message handled")
    assert worker.stop() == 0
    assert pending(admin, 4) == {0: 0, 1: 0, 2: 0, 3: 0}
    assert "Traceback" not in worker.stderr, worker.stderr


def test_a_membership_key_of_another_type_is_named_and_the_worker_keeps_its_queues(
    redis_server: RedisServer, workers: list[Worker], tmp_path: Path
) -> None:
    # A string where app rec's members belong: a worker refused to start with `redis
    # error while registering this daemon: WRONGTYPE ...` (no key named); met while it
    # ran, every re-balance logged a traceback, status failed the same way, and the
    # worker's stop failed before handing its queues over (exit 1).
    cfg = write_config(tmp_path / "c.toml", redis_server.url, queues={"total": 2})
    admin = redis_server.client()
    admin.set("t:app:rec:members", "x")
    named = ("redis key t:app:rec:members (app 'rec''s members) is a string, not a zset: "
             "rename or delete the key (Conveyor writes it anew)")
    refused = Worker("refused", cfg, tmp_path)
    workers.append(refused)
    assert refused.proc.wait(30) == 1
    assert refused.stderr.splitlines()[-1] == f"conveyor: error: {named}"
    admin.delete("t:app:rec:members")
    worker = ready_worker(cfg, tmp_path, workers)
    admin.delete("t:app:rec:members")
    admin.set("t:app:rec:members", "x")
    wait_until_sync(lambda: len(error_lines(worker, "re-balance failed")) == 1, 30,
                    "the re-balance failing on the key")
    checks = wrongtype_errors(admin)
    wait_until_sync(lambda: wrongtype_errors(admin) >= checks + 3, 30,
                    "three more re-balances failing")
    assert error_lines(worker, "re-balance failed") == [
        f"conveyor.balancer: re-balance failed: {named}; this daemon keeps the queues it "
        "holds ([0, 1]) and tries again every 1.0s"]
    asyncio.run(publish(cfg, [Publish("items", f"k{i}", {"seq": i}) for i in range(8)]))
    wait_until_sync(lambda: handled(worker) == list(range(8)), 30,
                    "the messages handled meanwhile")
    status = subprocess.run([sys.executable, "-m", "conveyor.cli", "status", "--app", "rec",
                             "--config", str(cfg)], cwd=REPO, capture_output=True, text=True,
                            timeout=60)
    assert (status.returncode, status.stderr.splitlines()[-1]) == (
        1, f"conveyor: error: {named}"), status.stderr
    # Every app's status: the others are read (their keys are their own), this one's
    # daemons shown unknown, its key named in a warning.
    every = subprocess.run([sys.executable, "-m", "conveyor.cli", "status", "--config",
                            str(cfg)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert every.returncode == 0, every.stderr
    assert f"conveyor: warning: {named}" in every.stderr.splitlines(), every.stderr
    [row] = [line.split() for line in every.stdout.splitlines() if line.split()[:1] == ["rec"]]
    assert row[:3] == ["rec", "-", "0-1"], every.stdout
    assert worker.stop() == 0  # its queues handed over, though it could not leave
    assert "Traceback" not in worker.stderr, worker.stderr
    assert pending(admin, 2) == {0: 0, 1: 0}
