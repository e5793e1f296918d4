"""Plain ``def`` handlers on a real Redis: blocking calls run on threads up to the slot
bound while the event loop (pulls, acks, lease renewals) keeps running."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from conveyor import Client, WorkerDaemon
from conveyor.adapters.redis import RedisAdapter
from conveyor.platform.config import load_config
from tests.conftest import wait_until_sync
from tests.integration.redis.conftest import REPO, RedisServer
from tests.integration.redis.test_redis_stop import (
    config_file,
    drained_line,
    handled_once_by_next_owner,
    pending,
    publish,
    stop_and_time,
)
from tests.integration.test_sync_handlers import napping_app, run_naps


async def test_def_handlers_on_redis_sleep_concurrently_up_to_the_slots_without_stalling_the_loop(
    redis_server: RedisServer,
) -> None:
    """9 streams, one ``time.sleep(1)`` each, 3 slots: three rounds of three on three
    threads; the loop never goes 0.5 s without running (a nap on it: 1 s); each message handled and
    acknowledged once (a graceful run: no duplicate allowed)."""
    config = load_config(None, environ={}, overrides={
        "queues": {"adapter": "redis", "total": 4},
        "redis": {"url": redis_server.url, "prefix": "t"},
        "balancer": {"kind": "dynamic", "membership": "redis"},
        "slots": {"count": 3},
    })
    app, calls, handled = napping_app("sync-naps")
    daemon = WorkerDaemon(app, config)
    adapter = RedisAdapter(config.redis)
    try:
        elapsed, lag_s, report = await run_naps(daemon, Client(adapter, daemon.mapper), 9,
                                                handled)
    finally:
        await adapter.close()
    assert handled == Counter(range(9))
    assert calls.peak == 3 and daemon.threads.peak_threads == 3
    assert 2.9 < elapsed < 5.5  # three rounds of 1 s
    # A handler's time.sleep(1) on the loop would stall it a whole second; a loaded CI
    # machine (two test workers, servers) delays a turn past 0.1 s now and then (0.112).
    assert lag_s < 0.5, f"the event loop stalled {lag_s:.3f}s"
    assert report.acked == 9 and report.moved == 0


def test_a_worker_with_def_handlers_stuck_in_their_threads_exits_in_time(
    redis_server: RedisServer, tmp_path: Path,
) -> None:
    """Four slots, four plain ``def`` calls blocked in ``time.sleep(600)``: SIGTERM drains
    for drain_timeout_s (2 s), abandons the four threads (they cannot be interrupted) and
    the process exits at once — daemon threads keep nothing alive. The next owner handles
    every message exactly once (the four abandoned calls never finished)."""
    config = config_file(tmp_path, redis_server.url, worker__drain_timeout_s=2, slots__count=4)
    published = publish(config, keys=8, per_key=25)
    out = tmp_path / "out"
    started = tmp_path / "out.started"
    proc = subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "worker", "tests.apps.stop_app:sync_app",
         "--config", str(config)],
        cwd=REPO, env={**os.environ, "CONVEYOR_TEST_OUT": str(out),
                       "CONVEYOR_TEST_WORK_MS": "600000"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_until_sync(lambda: pending(redis_server) == 200 and started.exists()
                        and len(started.read_text().splitlines()) == 4,
                        30, what="200 pulled, 4 calls stuck on threads")
    finally:
        elapsed, err = stop_and_time(proc)
    assert proc.returncode == 0, err
    assert elapsed < 2 + 2, f"exit took {elapsed:.1f}s after SIGTERM"
    assert "abandoned=4 " in drained_line(err)
    assert "4 plain-def handler call(s) still running on threads at stop" in err
    handled_once_by_next_owner(config, out, published)
