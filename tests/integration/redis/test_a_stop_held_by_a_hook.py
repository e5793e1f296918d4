"""A worker whose stop is held by a startup hook that catches its cancellation and goes
on (a poller: ``except asyncio.CancelledError: pass`` around an await, in a loop) still
drains, hands its queues to the others at once and exits 0 — naming the hook — on one
SIGTERM, on Redis: two ``conveyor worker`` processes, SIGTERM to one.

Its stop gives the hooks ``HOOKS_GRACE_S`` once cancelled, then goes on without them:
releases its leases, leaves the membership, prints its ``drained`` line; at the exit the
hook, still running, gets :data:`TASKS_GRACE_S` more and is left. (The stop used to wait
for the hook before releasing anything: held until ``drain_timeout_s`` + 3 s, abandoned,
then leaving with its leases and membership held — its queues handed on only once they
expired, 20 s at least here.)

Exactly what was published is handled once each (``done`` lines): no duplicates are
allowed — the first batch is all acknowledged before the SIGTERM, the second is
published once the stopped worker has exited, so nothing is redelivered.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from conveyor import load_config
from conveyor.workers.daemon import HOOKS_GRACE_S
from conveyor.workers.serve import TASKS_GRACE_S
from tests.conftest import wait_until_sync
from tests.integration.any_broker.test_a_stop_held_by_a_handler import (
    lag,
    lines,
    publish,
    shared,
    status,
)
from tests.integration.redis.conftest import Worker, write_config
from tests.servers.redis import RedisServer

pytestmark = pytest.mark.slow

APP = "tests.apps.held_hook_app:app"
DRAIN_S = 1.0
TTL_S = 30
"""The membership's and the leases' TTL: renewed every third, so 20 s at least before a
worker that left without releasing them hands its queues on."""
PUBLISHED = 40

EXIT_BOUND_S = HOOKS_GRACE_S + DRAIN_S + TASKS_GRACE_S + 3
"""SIGTERM -> exited: the hooks' grace, the drain (nothing in flight: at once), the wait
for the tasks left at the exit, and head-room for a loaded machine. Without the fix the
stop was abandoned at drain_timeout_s + 3 s, and did not close within 2 s more."""
HANDED_ON_BOUND_S = 5.0
"""The exit -> every queue held by the other worker: its next re-balance check (1 s),
with head-room; without the release, once the leases expire (20 s at least)."""


def test_a_worker_held_by_a_startup_hook_that_swallows_its_cancel_drains_and_leaves(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    app = f"hook-{tmp_path.name[-12:]}"
    config = write_config(tmp_path / "c.toml", redis_server.url,
                          worker={"drain_timeout_s": DRAIN_S},
                          balancer={"lease_ttl_s": TTL_S}, redis={"member_ttl_s": TTL_S})
    total = load_config(config, environ={}).queues.total
    out = tmp_path / "out"
    env = {"CONVEYOR_TEST_OUT": str(out), "CONVEYOR_TEST_APP": app}
    ws = [Worker(f"w{i}", config, tmp_path, app=APP, env=env) for i in range(2)]
    stopped, other = ws
    try:
        wait_until_sync(lambda: shared(config, app, {w.proc.pid for w in ws}, total), 60,
                        what="both workers holding queues, every queue held")
        wait_until_sync(lambda: out.read_text().count("hook ") == 2, 10,
                        what="both startup hooks running")
        publish(config, [{"seq": seq} for seq in range(PUBLISHED)])
        wait_until_sync(lambda: len(lines(out, "done")) == PUBLISHED, 30,
                        what="the first messages handled")
        wait_until_sync(lambda: lag(config, app) == 0, 30, what="all of them acknowledged")
        signalled = time.monotonic()
        stopped.signal(signal.SIGTERM)
        left_status = stopped.proc.wait(60)  # without the fix: drain_timeout_s + 6 s
        exited = time.monotonic()

        def handed_on() -> bool:
            report = status(config, app)
            held = {int(m["pid"]): m["queues"] for m in report["members"]} if report else {}
            return set(held) == {other.proc.pid} and len(held[other.proc.pid]) == total

        wait_until_sync(handed_on, 60, what="every queue held by the other worker")
        handed_on_s = time.monotonic() - exited
        print(f"\nexited {exited - signalled:.1f}s after SIGTERM, its queues held by the "
              f"other {handed_on_s:.1f}s later")
        publish(config, [{"seq": seq} for seq in range(PUBLISHED, 2 * PUBLISHED)])
        wait_until_sync(lambda: len(lines(out, "done")) == 2 * PUBLISHED, 30,
                        what="the second messages handled")
        other_status = other.stop()
    finally:
        for w in ws:
            w.kill()
    assert f"caught {stopped.proc.pid}" in out.read_text()  # the hook swallowed its cancel
    assert left_status == 0, stopped.stderr
    exit_s = exited - signalled
    assert exit_s < EXIT_BOUND_S, f"exited {exit_s:.1f}s after SIGTERM\n{stopped.stderr}"
    assert handed_on_s < HANDED_ON_BOUND_S, (
        f"the other worker held every queue {handed_on_s:.1f}s after the stopped one "
        f"exited\n{stopped.stderr}")
    assert "conveyor: drained " in stopped.stderr, stopped.stderr
    named = [line for line in stopped.stderr.splitlines()
             if "startup hook(s) still running after their cancellation" in line]
    assert len(named) == 1 and "poll_forever" in named[0], stopped.stderr
    assert "the stop took longer" not in stopped.stderr, stopped.stderr
    assert other_status == 0, other.stderr
    done = Counter(seq for _, seq in lines(out, "done"))
    assert sorted(done) == list(range(2 * PUBLISHED)) and set(done.values()) == {1}, done
