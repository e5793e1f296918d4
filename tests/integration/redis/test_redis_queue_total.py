"""Producers and daemons of an app must use the same ``[queues] total``. Messages a
producer published with a larger one land on queue streams no daemon of the smaller
one reads: a worker's start says so, naming the streams and how many entries they
hold; with the same total it says nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conveyor.client import Publish, SyncClient
from conveyor.platform.config import load_config
from tests.conftest import wait_until_sync
from tests.integration.redis.conftest import REPO, Worker, write_config
from tests.servers import RedisServer

pytestmark = pytest.mark.redis

STRAY = "past [queues] total"


def publish(config: Path, n: int) -> None:
    with SyncClient.from_config(load_config(config, environ={})) as client:
        client.publish_batch(Publish("jobs", f"k{i}", {"i": i}) for i in range(n))


def ready(worker: Worker) -> None:
    wait_until_sync(lambda: "ready" in worker.stderr or not worker.alive(), 30,
                    "the worker ready")


def test_a_worker_says_when_messages_sit_past_its_queues_total(
    redis_server: RedisServer, tmp_path: Path, workers: list[Worker],
) -> None:
    producer = write_config(tmp_path / "p.toml", redis_server.url, queues={"total": 8})
    publish(producer, 200)
    lengths = {q: redis_server.client().xlen(f"t:q:{q}") for q in range(8)}
    beyond = sum(lengths[q] for q in range(4, 8))
    assert beyond > 0  # the hash ring put some of the 200 on queues 4-7

    same = Worker("same", producer, tmp_path, log_level="warning")
    workers.append(same)
    ready(same)
    assert same.stop() == 0, same.stderr
    assert STRAY not in same.stderr, same.stderr

    smaller = write_config(tmp_path / "w.toml", redis_server.url, queues={"total": 4})
    worker = Worker("w", smaller, tmp_path, log_level="warning")
    workers.append(worker)
    ready(worker)
    assert worker.stop() == 0, worker.stderr
    [line] = [x for x in worker.stderr.splitlines() if STRAY in x]
    assert f"[queues] total = 4 hold {beyond:,} entries" in line, line
    for q in range(4, 8):
        if lengths[q]:
            assert f"t:q:{q} ({lengths[q]:,})" in line, line
    assert "every producer and daemon of an app must use the same total" in line


def status(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "conveyor.cli", "status", "--config",
                           str(config), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60)


def test_status_says_when_messages_sit_past_its_queues_total(
    redis_server: RedisServer, tmp_path: Path,
) -> None:
    """As a worker's start does, in one line on stderr, with ``--app`` or without, and in
    ``--json`` (``beyond_total``); nothing with the producer's total."""
    producer = write_config(tmp_path / "p.toml", redis_server.url, queues={"total": 8})
    publish(producer, 200)
    lengths = {q: redis_server.client().xlen(f"t:q:{q}") for q in range(8)}
    beyond = {q: lengths[q] for q in range(4, 8) if lengths[q]}
    assert beyond  # the hash ring put some of the 200 on queues 4-7
    counts = ", ".join(f"queue {q}: {n:,}" for q, n in beyond.items())
    line = (f"conveyor: warning: queues past [queues] total = 4 hold "
            f"{sum(beyond.values()):,} entries ({counts}): a producer with a larger total "
            "put them where no daemon of this config reads; every producer and daemon of "
            "an app must use the same total")

    smaller = write_config(tmp_path / "w.toml", redis_server.url, queues={"total": 4})
    for args in ([], ["--app", "rec"], ["--json"], ["--app", "rec", "--json"]):
        result = status(smaller, *args)
        assert result.returncode == 0, result.stderr
        assert [x for x in result.stderr.splitlines() if STRAY in x] == [line], result.stderr
        if "--json" in args:
            assert json.loads(result.stdout)["beyond_total"] == {
                str(q): n for q, n in beyond.items()}
    for args in ([], ["--app", "rec", "--json"]):
        result = status(producer, *args)
        assert result.returncode == 0, result.stderr
        assert STRAY not in result.stderr, result.stderr
        if "--json" in args:
            assert json.loads(result.stdout)["beyond_total"] == {}


def test_every_queue_past_the_total_is_counted_and_the_first_eight_named(
    redis_server: RedisServer, tmp_path: Path, workers: list[Worker],
) -> None:
    """A producer with the largest total (4,096) fills thousands of streams past a
    daemon's 4: the worker's start and ``status`` count the entries of all of them (not
    of the first few looked at), name the first eight and count the rest, in one line;
    ``--json`` has every one."""
    producer = write_config(tmp_path / "p.toml", redis_server.url, queues={"total": 4096})
    publish(producer, 3000)
    client = redis_server.client()
    pipe = client.pipeline(transaction=False)
    for q in range(4096):
        pipe.xlen(f"t:q:{q}")
    lengths = dict(enumerate(pipe.execute()))
    beyond = {q: n for q, n in lengths.items() if q >= 4 and n}
    assert len(beyond) > 1000  # the hash ring spread the 3,000 over most of the 4,092
    first = sorted(beyond)[:8]
    more = len(beyond) - 8

    smaller = write_config(tmp_path / "w.toml", redis_server.url, queues={"total": 4})
    result = status(smaller, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["beyond_total"] == {str(q): n for q, n in beyond.items()}
    counts = ", ".join(f"queue {q}: {beyond[q]:,}" for q in first)
    [line] = [x for x in result.stderr.splitlines() if STRAY in x]
    assert (f"queues past [queues] total = 4 hold {sum(beyond.values()):,} entries "
            f"({counts} and {more:,} more queues): a producer") in line, line

    worker = Worker("w", smaller, tmp_path, log_level="warning")
    workers.append(worker)
    ready(worker)
    assert worker.stop() == 0, worker.stderr
    [line] = [x for x in worker.stderr.splitlines() if STRAY in x]
    names = ", ".join(f"t:q:{q} ({beyond[q]:,})" for q in first)
    assert (f"[queues] total = 4 hold {sum(beyond.values()):,} entries: {names} and "
            f"{more:,} more streams. Messages") in line, line
