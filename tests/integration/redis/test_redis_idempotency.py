"""Effectively-once handlers under faults, on a real Redis with real worker processes.

One queue, 200 messages over 4 streams. Message 20 (stream s0) waits at a gate in its
handler, so the queue's contiguous done prefix stops at 20 while the other streams'
messages run to completion: 155 messages are handled but not acknowledged — exactly
what at-least-once delivers again after a crash or a lost lease. Then the owner is
killed (SIGKILL) or paused past its lease (SIGSTOP), and a second daemon takes over.

A plain handler would run those 155 again (run with ``CONVEYOR_TEST_IDEMPOTENT=0`` to
see it); an ``idempotent=True`` one must not: every message's side effect (its ``end``
line) is recorded exactly once.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import msgspec
import redis

from conveyor import Client, Publish
from conveyor.platform.config import load_config
from tests.conftest import wait_until_sync
from tests.integration.redis.conftest import RedisServer, Worker, write_config

N = 200
STREAMS = 4
GATE_SEQ = 20  # stream s0: s0's later messages wait behind it; other streams run on
BLOCKED = {s for s in range(GATE_SEQ, N) if s % STREAMS == GATE_SEQ % STREAMS}


class Item(msgspec.Struct):
    seq: int


def records(path: Path) -> list[tuple[str, int, int, str]]:
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4:
                kind, pid, seq, mid = parts
                rows.append((kind, int(pid), int(seq), mid))
    return rows


def setup(redis_server: RedisServer, tmp_path: Path, workers: list[Worker],
          claim_s: float) -> tuple[Path, Path, dict[str, str]]:
    config = write_config(tmp_path / "once.toml", redis_server.url,
                          queues={"total": 1}, slots={"count": 8},
                          balancer={"lease_ttl_s": 2.0, "rebalance_interval_s": 0.2})
    record, gate = tmp_path / "once.rec", tmp_path / "gate"
    env = {"CONVEYOR_TEST_RECORD": str(record), "CONVEYOR_TEST_GATE": str(gate),
           "CONVEYOR_TEST_GATE_SEQ": str(GATE_SEQ), "CONVEYOR_TEST_CLAIM_S": str(claim_s),
           "CONVEYOR_TEST_IDEMPOTENT": os.environ.get("CONVEYOR_TEST_IDEMPOTENT", "1")}
    first = Worker("first", config, tmp_path, app="tests.apps.once_app:app", env=env)
    workers.append(first)
    wait_until_sync(lambda: "ready" in first.stderr, 30, "the first daemon ready")

    async def publish() -> None:
        async with Client.from_config(load_config(config, environ={})) as client:
            await client.publish_batch(
                Publish("items", f"s{i % STREAMS}", Item(i)) for i in range(N))

    asyncio.run(publish())
    ended = N - len(BLOCKED)

    def at_the_gate() -> bool:
        rows = records(record)
        return (sum(1 for r in rows if r[0] == "end") == ended
                and any(r[0] == "start" and r[2] == GATE_SEQ for r in rows))

    wait_until_sync(at_the_gate, 30, "every stream but s0 done, message 20 at the gate")
    pending = redis.Redis.from_url(redis_server.url).xpending("t:q:0", "once")
    assert pending["pending"] >= ended  # handled, not acknowledged: what comes again
    return config, gate, env


def check_each_side_effect_once(record: Path) -> list[tuple[str, int, int, str]]:
    rows = records(record)
    ends = sorted(r[2] for r in rows if r[0] == "end")
    assert ends == list(range(N)), (
        f"{len(ends) - len(set(ends))} side effects repeated, "
        f"{N - len(set(ends))} missing")
    assert len({r[3] for r in rows if r[0] == "end"}) == N
    return rows


def test_after_sigkill_the_next_owner_repeats_no_completed_handler(
    redis_server: RedisServer, tmp_path: Path, workers: list[Worker]
) -> None:
    """SIGKILL while message 20 is mid-handler: the second daemon skips the 155
    completed-but-unacknowledged messages, waits out the dead daemon's claim on 20
    (``idempotency_claim_s`` = 3), and runs 20 again — the one repeated *start*
    allowed, since its first run never completed — then s0's rest."""
    config, gate, env = setup(redis_server, tmp_path, workers, claim_s=3.0)
    first = workers[0]
    first.proc.kill()
    first.proc.wait()
    gate.touch()
    second = Worker("second", config, tmp_path, app="tests.apps.once_app:app", env=env)
    workers.append(second)
    record = Path(env["CONVEYOR_TEST_RECORD"])
    wait_until_sync(lambda: sum(1 for r in records(record) if r[0] == "end") >= N, 60,
                    "every message's side effect")
    assert second.stop() == 0
    rows = check_each_side_effect_once(record)
    starts = sorted(r[2] for r in rows if r[0] == "start")
    assert starts == sorted([*range(N), GATE_SEQ])  # 20 started twice, completed once


def test_a_paused_owner_and_the_next_owner_never_both_complete_a_message(
    redis_server: RedisServer, tmp_path: Path, workers: list[Worker]
) -> None:
    """SIGSTOP while message 20 is mid-handler, past the 2 s lease: the second daemon
    takes the queue, skips the 155 completed messages, and finds 20 claimed by the paused
    daemon (``idempotency_claim_s`` = 15), so it waits. SIGCONT: the paused handler
    completes 20 and marks it done; the second daemon then skips it and runs s0's rest.
    Every message completes exactly once, and starts once — but for 20 when the resumed
    daemon's abort wins the race with its handler: its keeper thread finds the lease
    lost the moment the process runs again and cancels the call before the handler's
    next poll sees the gate; the cancelled call releases its claim, so the second daemon
    runs 20 (a start that never completed: no side effect twice). Seen 3 times in about
    25 runs on a quiet machine."""
    config, gate, env = setup(redis_server, tmp_path, workers, claim_s=15.0)
    first = workers[0]
    first.signal(signal.SIGSTOP)
    second = Worker("second", config, tmp_path, app="tests.apps.once_app:app", env=env)
    workers.append(second)
    record = Path(env["CONVEYOR_TEST_RECORD"])
    wait_until_sync(lambda: "acquired queue 0" in second.stderr, 30,
                    "the second daemon to take the queue")
    gate.touch()
    first.signal(signal.SIGCONT)
    wait_until_sync(lambda: sum(1 for r in records(record) if r[0] == "end") >= N, 60,
                    "every message's side effect")
    assert second.stop() == 0
    rows = check_each_side_effect_once(record)
    starts = sorted(r[2] for r in rows if r[0] == "start" and r[2] != GATE_SEQ)
    assert starts == [s for s in range(N) if s != GATE_SEQ]
    gate_starts = [r[1] for r in rows if r[0] == "start" and r[2] == GATE_SEQ]
    by_pid = {r[2]: r[1] for r in rows if r[0] == "end"}
    if len(gate_starts) == 1:  # the paused run completed it
        assert gate_starts == [first.proc.pid] and by_pid[GATE_SEQ] == first.proc.pid
    else:  # the paused run was cancelled before it ended; the second ran it, once
        assert gate_starts == [first.proc.pid, second.proc.pid], gate_starts
        assert by_pid[GATE_SEQ] == second.proc.pid
