"""A worker whose stop is held by a handler that catches its cancellation and goes on
(a bare ``except:`` around an await, in a loop) still leaves in time, and leaves its
queues to the others at once, on each broker: two ``conveyor worker`` processes, one
gets stuck on a message, SIGTERM to it (and, in the ``twice`` case, another once it
drains).

Its drain times out at ``drain_timeout_s``; ``STOP_GRACE_S`` later the stop is abandoned:
its queues are aborted (nothing more acknowledged, the stuck call left running), then it
closes within ``CLOSE_AFTER_ABORT_S`` — leaves the consumer group (kafka-group) or its
membership and leases (Redis) — and exits. (It used to wait for the call for ever; and
a stop abandoned for a slow broker left without leaving the group.) A worker that exited
without leaving would hand its queues on only once its group session (Kafka, 12 s here:
then tansu's round, half a session) or its leases (Redis, 30 s here: renewed every third,
so 20 s at least) expire; one that left hands them on at the others' next turn. A
second signal abandons the stop at once, the same way: it closes too.

Exactly what was published is handled once each (``done`` lines). Duplicates: the stuck
message is started twice — by the stuck worker, never finished nor acknowledged, then
by the next owner — and nothing else (everything before it was acknowledged first).
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from conveyor import Client, Publish, load_config
from conveyor.workers.serve import CLOSE_AFTER_ABORT_S, STOP_GRACE_S, TASKS_GRACE_S
from tests.conftest import wait_until_sync
from tests.integration.any_broker.conftest import Broker
from tests.integration.redis.conftest import REPO, Worker

pytestmark = pytest.mark.slow

APP = "tests.apps.stuck_app:app"
DRAIN_S = 1.0
SESSION_S = 12
"""Kafka: the group's session timeout."""
TTL_S = 30
"""Redis: the membership's and the leases' TTL."""
PUBLISHED = 40

EXIT_BOUND_S = {"once": DRAIN_S + STOP_GRACE_S + CLOSE_AFTER_ABORT_S + TASKS_GRACE_S + 3,
                "twice": CLOSE_AFTER_ABORT_S + TASKS_GRACE_S + 3}
"""SIGTERM -> the stuck worker exited: the drain and the grace (not at a second signal),
the close after the abort, the wait for the tasks the stuck call holds, and head-room
for a loaded machine."""
HANDED_ON_BOUND_S = {"redis": 5.0, "kafka": SESSION_S / 2 + 4}
"""The stuck worker's exit -> its stuck message handled by the other: on Redis the next
re-balance check (1 s; 20 s at least without the release), on tansu the round after a
LeaveGroup (half a session, docs/kafka.md "Failover"; a session and a half without);
with head-room."""

SECTIONS: dict[str, dict[str, dict[str, object]]] = {
    "redis": {"balancer": {"lease_ttl_s": TTL_S}, "redis": {"member_ttl_s": TTL_S}},
    "kafka": {"balancer": {"kind": "kafka-group"}, "queues": {"total": 4},
              "kafka": {"session_timeout_ms": SESSION_S * 1000, "heartbeat_interval_ms": 500}},
}


def status(config: Path, app: str) -> dict[str, Any] | None:
    """``conveyor status --json`` for ``app`` (None if it fails: a worker still joining)."""
    done = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "status", "--config", str(config), "--json",
         "--app", app], cwd=REPO, capture_output=True, text=True, timeout=60)
    return json.loads(done.stdout) if done.returncode == 0 else None


def lag(config: Path, app: str) -> int | None:
    report = status(config, app)
    return None if report is None else sum(q["lag"] or 0 for q in report["queues"])


def shared(config: Path, app: str, pids: set[int], total: int) -> bool:
    """Both workers hold queues, and every queue is held: the balancing is done."""
    report = status(config, app)
    held = {int(m["pid"]): m["queues"] for m in report["members"]} if report else {}
    return (set(held) == pids and all(held.values())
            and sorted(q for qs in held.values() for q in qs) == list(range(total)))


def publish(config: Path, jobs: list[dict[str, object]]) -> None:
    async def run() -> None:
        async with Client.from_config(load_config(config)) as client:
            await client.publish_batch([Publish("jobs", f"k{job['seq']}", job) for job in jobs])

    asyncio.run(run())


def lines(out: Path, what: str) -> list[tuple[int, int]]:
    """(pid, seq) of every whole ``what`` line (``start`` or ``done``)."""
    rows = []
    for line in out.read_text().splitlines() if out.exists() else []:
        parts = line.split()
        if len(parts) == 3 and parts[0] == what:
            rows.append((int(parts[1]), int(parts[2])))
    return rows


@pytest.mark.parametrize("signals", ["once", "twice"])
def test_a_worker_held_by_a_handler_that_swallows_its_cancel_leaves_its_queues_at_once(
    broker: Broker, tmp_path: Path, signals: str
) -> None:
    app = f"stuck-{broker.name}-{tmp_path.name[-12:]}"
    config = broker.config_file(tmp_path / "c.toml", worker={"drain_timeout_s": DRAIN_S},
                                **SECTIONS[broker.name])
    total = load_config(config, environ={}).queues.total
    out = tmp_path / "out"
    env = {"CONVEYOR_TEST_OUT": str(out), "CONVEYOR_TEST_APP": app}
    ws = [Worker(f"w{i}", config, tmp_path, app=APP, env=env) for i in range(2)]
    try:
        pids = {w.proc.pid for w in ws}
        wait_until_sync(lambda: shared(config, app, pids, total), 60,
                        what="both workers holding queues, every queue held")
        publish(config, [{"seq": seq} for seq in range(PUBLISHED)])
        wait_until_sync(lambda: len(lines(out, "done")) == PUBLISHED, 30,
                        what="the first messages handled")
        wait_until_sync(lambda: lag(config, app) == 0, 30, what="all of them acknowledged")
        publish(config, [{"seq": PUBLISHED, "stuck": True}])
        wait_until_sync(lambda: any(seq == PUBLISHED for _, seq in lines(out, "start")), 30,
                        what="the stuck call started")
        stuck_pid = next(pid for pid, seq in lines(out, "start") if seq == PUBLISHED)
        stuck, other = sorted(ws, key=lambda w: w.proc.pid != stuck_pid)
        signalled = time.monotonic()
        stuck.signal(signal.SIGTERM)
        if signals == "twice":
            wait_until_sync(lambda: "draining" in stuck.stderr, 10, what="the drain")
            stuck.signal(signal.SIGTERM)
        left_status = stuck.proc.wait(60)  # without the fix: for ever
        exited = time.monotonic()
        wait_until_sync(lambda: (other.proc.pid, PUBLISHED) in lines(out, "done"), 60,
                        what="the stuck message handled by the other worker")
        handed_on_s = time.monotonic() - exited
        print(f"\n{broker.name}, {signals}: exited {exited - signalled:.1f}s after SIGTERM, "
              f"the stuck message handled elsewhere {handed_on_s:.1f}s later")
        other_status = other.stop()
    finally:
        for w in ws:
            w.kill()
    assert left_status == 0, stuck.stderr
    exit_s = exited - signalled
    assert exit_s < EXIT_BOUND_S[signals], f"exited {exit_s:.1f}s after SIGTERM\n{stuck.stderr}"
    assert handed_on_s < HANDED_ON_BOUND_S[broker.name], (
        f"the other worker handled the stuck message {handed_on_s:.1f}s after the stuck "
        f"one exited\n{stuck.stderr}")
    assert "abandoned=1 " in stuck.stderr, stuck.stderr
    assert ("second stop signal" in stuck.stderr) is (signals == "twice")
    assert "task(s) still running after their cancellation: agent-" in stuck.stderr
    assert other_status == 0, other.stderr
    done = Counter(seq for _, seq in lines(out, "done"))
    assert sorted(done) == list(range(PUBLISHED + 1)) and set(done.values()) == {1}, done
    started = Counter(seq for _, seq in lines(out, "start"))
    assert {seq: n for seq, n in started.items() if n > 1} == {PUBLISHED: 2}  # the stuck one
