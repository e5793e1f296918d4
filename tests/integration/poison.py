"""A message whose handling kills its worker (``os._exit(1)``), under ``conveyor worker
--processes 2:2`` on a shipped config: run, then checked, on each broker by
tests/integration/any_broker/test_a_message_that_kills_its_worker.py
(tests/apps/blocking_app.py is the app; :func:`rows_of` reads its records).

Duplicates allowed: the messages a dying process had finished but not yet acknowledged
(each crash's batch) run again, never more than ``max_deliveries`` times; the poison
itself starts exactly ``max_deliveries`` times and ends as a ``DeliveryLimit`` letter.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from conveyor.backends import create_adapter
from conveyor.client import Publish, SyncClient
from conveyor.platform.config import Config, load_config
from conveyor.platform.message import DeadLetter
from tests.conftest import wait_until_sync

REPO = Path(__file__).resolve().parents[2]
POISON, N, STREAMS = 57, 200, 20


def rows_of(paths: list[Path]) -> list[list[str]]:
    """tests/apps/blocking_app.py's lines: time, pid, queue, stream key, seq, id, deliveries."""
    rows = []
    for path in paths:
        if path.exists():
            rows.extend(p for p in (line.split() for line in path.read_text().splitlines())
                        if len(p) == 7)
    return rows


def stored_letters(config: Config, app: str = "rec") -> list[DeadLetter]:
    """``app``'s dead letters as the broker of ``config`` stores them now (from a test's
    own thread: a loop of its own)."""
    async def read() -> list[DeadLetter]:
        adapter = create_adapter(config.queues.adapter, config)
        try:
            return list(await adapter.dead_letters.read(app))
        finally:
            await adapter.close()
    return asyncio.run(read())


def run_poison_under_supervisor(shipped: Path, env: dict[str, str], tmp: Path,
                                max_deliveries: int, exit_how: str = "os._exit") -> str:
    """Run the scenario; assert its outcome; return a one-line summary. ``exit_how``: how
    the poison ends its process (tests/apps/blocking_app.py); the supervisor's stderr is
    left in ``tmp / "supervisor.err"``."""
    env = {**os.environ, **env, "PYTHONUNBUFFERED": "1",
           "CONVEYOR_TEST_RECORD": str(tmp / "handled.rec"),
           "CONVEYOR_TEST_STARTS": str(tmp / "started.rec"),
           "CONVEYOR_TEST_EXIT_ON": str(POISON), "CONVEYOR_TEST_EXIT_HOW": exit_how,
           "CONVEYOR_TEST_MAX_DELIVERIES": str(max_deliveries)}
    config = load_config(shipped, environ=env)
    err_path = tmp / "supervisor.err"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "conveyor.cli", "worker", "tests.apps.blocking_app:app",
             "--config", str(shipped), "--processes", "2:2"],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err)

    def letters() -> list[DeadLetter]:
        return stored_letters(config)

    def handled() -> Counter[int]:
        return Counter(int(r[4]) for r in rows_of([tmp / "handled.rec"]))

    try:
        with SyncClient.from_config(config) as client:
            client.publish_batch(Publish("items", f"s{i % STREAMS}", {"seq": i})
                                 for i in range(N))
        wait_until_sync(lambda: set(handled()) == set(range(N)) - {POISON}
                        and len(letters()) >= 1, 120,
                        "every message handled and the poison dead-lettered")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, err_path.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    [letter] = letters()
    assert letter.error_type == "DeliveryLimit", letter
    assert b'"seq":%d' % POISON in letter.message.body
    assert f"max_deliveries = {max_deliveries}" in letter.error
    starts = Counter(int(r[4]) for r in rows_of([tmp / "started.rec"]))
    assert starts[POISON] == max_deliveries, starts[POISON]
    runs = handled()
    assert POISON not in runs and max(runs.values()) <= max_deliveries, runs
    return (f"{exit_how} poison started {max_deliveries} times, dead-lettered; duplicates "
            f"of the others: {sum(c - 1 for c in runs.values())}")
