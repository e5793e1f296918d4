"""Redis restarted empty under a running worker (no persistence: every key gone — the
streams, the consumer group, the leases, the fencing counters, the membership).

What was published before the restart is gone with the server; what is published after
it must be handled exactly once. Before the fix all 100 messages published right after
the restart ran twice (3 of 3 runs here): the worker re-created its group, pulled and
ran them on a lease the server no longer held, had every acknowledgement refused, then
took the queue again under a new lease — fencing token 1 again — and ran them again
from the pending list.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from conveyor.adapters.redis_conn import Keys
from conveyor.platform.client import Publish, SyncClient
from conveyor.platform.config import load_config
from tests.conftest import wait_until_sync
from tests.integration.redis.conftest import Worker, read_records, write_config
from tests.servers import RedisServer

pytestmark = pytest.mark.redis

TOTAL = 8
KEYS = Keys("t")


def leased(server: RedisServer) -> int:
    """Queues of app ``rec`` whose lease key exists."""
    with server.client() as client:
        return sum(1 for v in client.mget([KEYS.lease("rec", q) for q in range(TOTAL)]) if v)


def pending(server: RedisServer) -> int:
    """Entries of app ``rec`` not acknowledged (undelivered or pending), every queue."""
    total = 0
    with server.client() as client:
        for q in range(TOTAL):
            if client.exists(KEYS.queue(q)):
                for group in client.xinfo_groups(KEYS.queue(q)):
                    if group["name"] == b"rec":
                        total += int(group["lag"] or 0) + int(group["pending"])
    return total


def publish(config: Path, seqs: range) -> None:
    with SyncClient.from_config(load_config(config, environ={})) as client:
        client.publish_batch(Publish("items", f"s{i % 20}", {"seq": i}) for i in seqs)


@pytest.mark.parametrize("run", [1, 2, 3])
def test_messages_published_after_an_empty_restart_run_exactly_once(
    redis_server: RedisServer, tmp_path: Path, workers: list[Worker], run: int,
) -> None:
    config = write_config(tmp_path / "c.toml", redis_server.url,
                          balancer={"lease_ttl_s": 5.0, "rebalance_interval_s": 1.0})
    worker = Worker("w", config, tmp_path)
    workers.append(worker)
    wait_until_sync(lambda: leased(redis_server) == TOTAL, 30, "the worker to own every queue")
    publish(config, range(100))  # before: agents busy, then idle in their reads
    wait_until_sync(lambda: len(read_records([worker.record])) >= 100, 30, "100 handled")

    redis_server.stop()
    redis_server.aof = False  # the fixture's server keeps an AOF: this one starts empty
    redis_server.start()  # same port
    assert redis_server.client().dbsize() == 0
    after = range(1000, 1100)
    publish(config, after)  # at once: the worker has not noticed anything yet

    def done() -> bool:
        seqs = {r[4] for r in read_records([worker.record])}
        return set(after) <= seqs and leased(redis_server) == TOTAL and pending(redis_server) == 0

    wait_until_sync(done, 60, "every later message handled, acknowledged, queues re-owned")
    assert worker.alive(), worker.stderr
    assert worker.stop() == 0, worker.stderr
    counts = Counter(r[4] for r in read_records([worker.record]) if r[4] >= 1000)
    doubled = sorted(seq for seq, n in counts.items() if n > 1)
    # No duplicate allowed: nothing published after the restart was pulled under a lease
    # the server no longer held, so no acknowledgement of it could be refused.
    assert doubled == [], f"run {run}: {len(doubled)} of 100 ran twice or more: {doubled[:10]}"
    assert sorted(counts) == list(after), "lost"
