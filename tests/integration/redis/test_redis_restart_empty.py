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

from conveyor.adapters.redis.coordination import redis_coordination
from conveyor.adapters.redis.keys import Keys
from conveyor.client import Publish, SyncClient
from conveyor.platform.balancing.membership import MemberInfo
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


def restart_empty(server: RedisServer) -> None:
    """Stop the server and start it again on the same port with nothing kept (the
    fixture's server keeps an AOF: the restarted one does not read it)."""
    server.stop()
    server.aof = False
    server.start()


def publish(config: Path, seqs: range) -> None:
    with SyncClient.from_config(load_config(config, environ={})) as client:
        client.publish_batch(Publish("items", f"s{i % 20}", {"seq": i}) for i in seqs)


@pytest.mark.parametrize(
    ("run", "work_ms", "handled_before"),
    [
        (1, 0, 100), (2, 0, 100), (3, 0, 100),  # idle: every agent in its blocking read
        # Busy: 1,000 messages of 10 ms on 20 streams, 16 slots; the restart comes with
        # the caches full and their pulls waiting for room, not in a read.
        (4, 10, 50),
    ],
)
def test_messages_published_after_an_empty_restart_run_exactly_once(
    redis_server: RedisServer, tmp_path: Path, workers: list[Worker], run: int,
    work_ms: float, handled_before: int,
) -> None:
    config = write_config(tmp_path / "c.toml", redis_server.url,
                          balancer={"lease_ttl_s": 5.0, "rebalance_interval_s": 1.0},
                          slots={"count": 16}, worker={"cache_capacity": 16})
    worker = Worker("w", config, tmp_path, work_ms=work_ms)
    workers.append(worker)
    wait_until_sync(lambda: leased(redis_server) == TOTAL, 30, "the worker to own every queue")
    publish(config, range(100 if handled_before == 100 else 1000))
    wait_until_sync(lambda: len(read_records([worker.record])) >= handled_before, 30,
                    f"{handled_before} handled")

    restart_empty(redis_server)
    with redis_server.client() as client:  # the first 100 are gone with the server
        assert sum(client.xlen(KEYS.queue(q)) for q in range(TOTAL)) == 0
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
    assert doubled == [], (f"run {run}: {len(doubled)} of 100 ran twice or more: "
                           f"{doubled[:10]}\n{worker.stderr[-6000:]}")
    assert sorted(counts) == list(after), f"lost\n{worker.stderr[-6000:]}"


async def test_tokens_generation_and_version_never_repeat_across_an_empty_restart(
    redis_server: RedisServer, tmp_path: Path,
) -> None:
    """Every counter starts anew after the restart, past every value it had before: the
    old lease's value is never handed out again (a stale owner's renewals and acks stay
    refused), and a balancer comparing the generation and version sees them move."""
    config = load_config(write_config(tmp_path / "c.toml", redis_server.url), environ={})
    membership, leases = redis_coordination(config, "shop")
    me = MemberInfo("m", "h", 1, 0.0)
    try:
        await membership.join(me)
        old = await leases.acquire(0, "m", 5)
        assert old is not None
        before = (old.token, await leases.generation(), await membership.version())
        restart_empty(redis_server)
        await membership.join(me)
        new = await leases.acquire(0, "m", 5)  # the same owner takes the same queue
        assert new is not None
        after = (new.token, await leases.generation(), await membership.version())
        assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)
        assert await leases.renew(old, 5) is None  # was accepted with tokens from 1
        assert await leases.renew(new, 5) is not None
    finally:
        await membership.close()
        await leases.close()
